"""What to run: curated, named case lists per profile (not the exponential cross product).

Each list answers one question against the model's FP32 baseline. ``profile_cases`` assembles the
default run of a profile; ``slow`` cases (torch.compile) run only when asked for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from gpubench.train.config import PROFILES, LoaderConfig, RunConfig
from gpubench.train.techniques import TECHNIQUES
from gpubench.workloads.profiles import PROFILE_TABLE

PROFILE_MODELS = {name: p.models for name, p in PROFILE_TABLE.items()}
"""The built-in models of each profile (``gpubench.workloads.profiles``)."""


@dataclass(frozen=True)
class BenchCase:
    """A config plus how the benchmark suite treats it."""

    cfg: RunConfig
    group: str
    """The question the case answers: one of ``GROUPS``."""
    slow: bool = False

    @property
    def id(self) -> str:
        return self.cfg.id

    def skip_reason(self) -> str | None:
        """Why this machine does not run the case in its profile (``build.unsupported_reason``,
        or ``budget_reason``), or None."""
        from gpubench.train.build import unsupported_reason

        return unsupported_reason(self.cfg) or budget_reason(self.cfg)


def native_cpu_precisions() -> set[str]:
    """Reduced precisions this CPU computes in hardware (AVX512-BF16 or AMX for bf16, AMX-FP16
    for fp16); the others torch emulates, 5-15x slower than fp32."""
    import torch

    native = set()
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        native.add("bf16")
    if torch.cpu._is_amx_fp16_supported():
        native.add("fp16")
    return native


def budget_reason(cfg: RunConfig) -> str | None:
    """Why the profile leaves out a case on this machine to keep within its time budget: on a
    CPU that emulates the case's reduced precision, the precision group measures it alone
    (answering the AMP claim) and its combinations with other techniques are left out (each
    emulated step costs seconds and says nothing about a device with the units). ``gpubench
    case`` runs any of them on request."""
    precision = emulated_precision(cfg)
    if precision is None or cfg == cfg.baseline.with_(precision=cfg.precision):
        return None
    return (f"{precision} is emulated on this CPU (no AVX512-BF16/AMX units), about 10x "
            f"slower than fp32: the precision group measures it alone, its combinations are "
            f"left out of the {cfg.profile} profile's time budget (run it with gpubench case)")


GROUPS = ("precision", "accumulation", "optimizer", "memory", "layout", "parallel", "loader",
          "recipe", "compile", "attention")
"""The case groups, each answering one question against the FP32 baseline."""

PROFILE_SKIPS = {
    ("cpu", "gpt2", group) for group in ("optimizer", "parallel", "loader", "recipe")} | {
    ("cpu", "bert", "loader"), ("cpu", "bert", "recipe")}
"""(profile, model, group) left out to keep a profile within its time budget on 2 cores: bert
covers gpt2's techniques; the loader knobs are swept, and the recipe stacked, on resnet18's JPEG
files (the token loader is exercised by the smoke profile)."""


def baseline(model: str, profile: str, device: str) -> RunConfig:
    return RunConfig(model=model, profile=profile, device=device)


def precision_cases(base: RunConfig) -> list[RunConfig]:
    return [base.with_(precision=p) for p in ("fp32", "tf32", "fp16", "bf16")]


def accumulation_cases(base: RunConfig) -> list[RunConfig]:
    """k micro-batches per step at constant effective batch (micro = B/k, the memory-saving use)
    and at constant micro-batch (effective batch k*B, the larger-batch use)."""
    batch = base.resolved_micro_batch
    same_global = [
        base.with_(accum_steps=k, micro_batch=batch // k) for k in (2, 4)
        if batch % k == 0 and batch // k >= base.workload.min_batch
    ]
    same_micro = [base.with_(accum_steps=k) for k in (2, 4)]
    return [*same_global, *same_micro, base.with_(precision="bf16", accum_steps=4)]


def optimizer_cases(base: RunConfig) -> list[RunConfig]:
    return [
        base.with_(optimizer=opt, optimizer_impl=impl)
        for opt in ("sgd", "adam", "adamw")
        for impl in ("default", "foreach", "fused")
        if (opt, impl) != ("sgd", "default")  # the baseline itself
    ]


def parallel_cases(base: RunConfig) -> list[RunConfig]:
    """DDP (also with k=2 accumulation, with and without no_sync, and bf16), FSDP2 (also with its
    bf16 ``MixedPrecisionPolicy``), DataParallel (also at twice the micro-batch: DDP's global
    batch and samples per GPU), and for workloads with ``stages`` model and
    pipeline parallelism. On CUDA, DDP and FSDP also at 4 and 8 GPUs: those cases skip with
    their requirement on a smaller machine."""
    world_sizes = (2, 4, 8) if base.device == "cuda" else (2,)
    ddp = [base.with_(parallel="ddp", world_size=n) for n in world_sizes]
    ddp += [
        base.with_(parallel="ddp", world_size=2, accum_steps=2),
        base.with_(parallel="ddp", world_size=2, accum_steps=2, ddp_no_sync=True),
        base.with_(parallel="ddp", world_size=2, precision="bf16"),
    ]
    fsdp = [
        *(base.with_(parallel="fsdp", world_size=n) for n in world_sizes),
        base.with_(parallel="fsdp", world_size=2, fsdp_mixed_precision=True),
    ]
    dp = [base.with_(parallel="dp", world_size=n) for n in (1, 2)]
    # DataParallel splits one micro-batch over its GPUs: at twice the micro-batch it has DDP's
    # global batch and samples per GPU (the DataParallel-vs-DDP claim).
    dp.append(base.with_(parallel="dp", world_size=2, micro_batch=2 * base.resolved_micro_batch))
    split = []
    workload = base.workload
    if workload.stages is not None and workload.loss_fn is not None:
        # Chunks of at least min_batch samples: BatchNorm needs more than one value per channel.
        batch = base.resolved_micro_batch
        chunks = max(2, min(4, batch // workload.min_batch))
        while batch % chunks:
            chunks -= 1
        split = [
            base.with_(parallel="model", world_size=2),
            base.with_(parallel="pipeline", world_size=2, chunks=chunks),
            base.with_(parallel="pipeline", world_size=2, chunks=chunks, schedule="1f1b"),
        ]
    # The cases of this process first, then those of rank processes one after another, so
    # that a run starts the ranks once and rebuilds each case in them (``runner.RankPool``).
    here = [*dp, *(c for c in split if not c.multiprocess)]
    return [*here, *ddp, *fsdp, *(c for c in split if c.multiprocess)]


MAX_WORKERS_PER_CORE = 2
"""The worker sweep goes up to twice the machine's cores (the "2 to 4 times the CPU cores" tip
of the source articles is tested at its lower end; at most 32 workers)."""


def worker_counts() -> list[int]:
    """0, 1, 2, 4, ... up to ``MAX_WORKERS_PER_CORE`` times this machine's cores (32 at most)."""
    cores = os.cpu_count() or 1
    return [0, 1] + [n for n in (2, 4, 8, 16, 32) if n <= MAX_WORKERS_PER_CORE * cores]


def knob_workers(device: str) -> int:
    """The worker count the loader knobs (pinning, prefetch, persistence, cache) are measured
    at: where loading nearly keeps up. On a CUDA host, the cores available per GPU (capped at
    8, the common recipe), so that the knobs act on a loader that can feed the device rather
    than on a starved one; on a CPU-only machine 2, since the workers take the cores the
    training step itself computes on."""
    cores = os.cpu_count() or 1
    if device != "cuda":
        return min(2, cores)
    import torch

    gpus = max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
    return max(2, min(8, cores // gpus))


def loader_cases(base: RunConfig) -> list[RunConfig]:
    """The data path: real on-disk data through every DataLoader knob, and in-memory samples
    through the loader, against the baseline's batches already on the device (the upper
    bound). The on-disk data is read warm (from the page cache after its first epoch) and, at
    0 and the knob workers, cold (``LoaderConfig.cold``: from the disk every epoch)."""
    synthetic = base.with_(loader=LoaderConfig(dataset="synthetic"))
    workload = base.workload
    # The workload's own data path, else samples made by make_batch, through the loader.
    names = workload.dataset_names
    main = names[0] if names else "synthetic"
    if workload.dataset is None and names:  # only extra datasets: each with the defaults
        return [synthetic] + [base.with_(loader=LoaderConfig(dataset=n)) for n in names]
    files = LoaderConfig(dataset=main)
    many = LoaderConfig(dataset=main, num_workers=knob_workers(base.device))
    batch = base.resolved_micro_batch
    if main == "synthetic":
        return [synthetic, *(base.with_(loader=replace(synthetic.loader, num_workers=n))
                              for n in worker_counts() if n)]
    sweep = worker_counts()
    # The knobs' pageable base at their worker count, where the sweep does not have it.
    knob_base = [] if many.num_workers in sweep else [base.with_(loader=many)]
    return [
        synthetic,
        *(base.with_(loader=replace(files, num_workers=n)) for n in sweep),
        *knob_base,
        base.with_(loader=replace(many, pin_memory=True)),
        base.with_(loader=replace(many, pin_memory=True, non_blocking=True)),
        base.with_(loader=replace(many, prefetch_factor=4)),
        base.with_(loader=replace(many, persistent_workers=True)),
        base.with_(loader=replace(files, cached=True)),
        base.with_(loader=replace(many, cached=True, persistent_workers=True)),
        # Cold storage: every file read from the disk each epoch, not from the page cache.
        base.with_(loader=replace(files, cold=True)),
        base.with_(loader=replace(many, cold=True)),
        *(base.with_(loader=LoaderConfig(dataset=n)) for n in workload.extra_datasets),
        base.with_(loader=many, micro_batch=2 * batch),
    ]


RECIPE_ACCUM_STEPS = 4
"""The recipe's accumulation: k micro-batches of the baseline's size per step (S1: "simulate a
larger batch"), the accumulation group's constant-micro-batch k = 4 case."""


def recipe_precision(device: str) -> str:
    """The recipe's precision: bf16 where the device computes it (CUDA, a CPU with AVX512-BF16
    or AMX units), else fp32 (an emulated bf16 step is 5-15x slower: no reader would stack it)."""
    if device == "cuda" or "bf16" in native_cpu_precisions():
        return "bf16"
    return "fp32"


def recipe_cases(base: RunConfig) -> list[RunConfig]:
    """S1's case study stacked, as a reader would build it: the precision of
    ``recipe_precision``, the workload's own data through ``knob_workers`` loader workers
    (pinned, ``non_blocking`` copies on CUDA), k = ``RECIPE_ACCUM_STEPS`` accumulation at the
    baseline's micro-batch; then the same over DDP on 2 ranks (``no_sync`` on the non-final
    micro-batches). Each ingredient is also a case of its own group (precision, loader,
    accumulation, parallel), so the advice compares the stack with the product of their
    speedups. Workloads without data of their own stack the rest on device-resident batches."""
    names = base.workload.dataset_names
    loader = base.loader
    if base.workload.dataset is not None and names:
        cuda = base.device == "cuda"
        loader = LoaderConfig(dataset=names[0], num_workers=knob_workers(base.device),
                              pin_memory=cuda, non_blocking=cuda)
    stack = base.with_(precision=recipe_precision(base.device), loader=loader,
                       accum_steps=RECIPE_ACCUM_STEPS)
    # DDP first: it runs right after the parallel group (``model_cases``), in its ranks.
    return [stack.with_(parallel="ddp", world_size=2, ddp_no_sync=True), stack]


COMPILE_TIMEOUT_S = {"default": 600.0, "reduce-overhead": 600.0,
                     "max-autotune-no-cudagraphs": 1800.0}
"""The least time limit of one command of a compiled case, by compile mode: its first step
compiles forward and backward (Inductor: a minute or two for ResNet-50 or GPT-2 on a fresh
cache), reduce-overhead also records its CUDA graphs, and max-autotune-no-cudagraphs benchmarks
every GEMM and convolution candidate of each shape (10-25 minutes on an H200 for ResNet-50,
whose 53 convolutions each have dozens of candidates): the run's ``--timeout`` (300 s by
default), sized for eager steps, would fail them as hung."""


def case_timeout(cfg: RunConfig, timeout_s: float | None) -> float | None:
    """The time limit of one command of ``cfg``: ``timeout_s`` (``--timeout``), raised for a
    compiled case to ``COMPILE_TIMEOUT_S`` of its mode; None (no limit) stays None."""
    if timeout_s is None or not cfg.compile:
        return timeout_s
    return max(timeout_s, COMPILE_TIMEOUT_S[cfg.compile_mode])


SLOW_GROUPS = ("compile",)
"""Groups whose cases run only when asked for (torch.compile: minutes of compilation)."""


def declared_cases(base: RunConfig, group: str) -> list[RunConfig]:
    """The cases the techniques of ``group`` declare (``Technique.cases``) for ``base``'s
    profile, in declaration order."""
    return [cfg for t in TECHNIQUES if t.group == group and t.cases is not None
            and base.profile in t.profiles for cfg in t.cases(base)]


def model_cases(model: str, profile: str, device: str) -> list[BenchCase]:
    """Every case of one workload (``model`` is its spec) in ``profile`` on ``device``: each
    group's own cases, then those its techniques declare."""
    base = baseline(model, profile, device)
    own = {
        "precision": precision_cases(base),
        "accumulation": accumulation_cases(base),
        "optimizer": optimizer_cases(base),
        "memory": [],
        "layout": [],
        "parallel": parallel_cases(base),
        "recipe": recipe_cases(base),  # its DDP case in the parallel group's ranks
        "loader": loader_cases(base),
        "compile": [],
        "attention": [],
    }
    return [BenchCase(cfg, group, group in SLOW_GROUPS)
            for group, cfgs in own.items() for cfg in [*cfgs, *declared_cases(base, group)]]


def profile_cases(
    profile: str, device: str, models: tuple[str, ...] | None = None,
    groups: tuple[str, ...] | None = None,
) -> list[BenchCase]:
    """Every case of ``profile`` for ``models`` (workload specs; default: the profile's
    built-in models) in ``groups`` (default: all), ids unique."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
    bad = [g for g in groups or () if g not in GROUPS]
    if bad:
        raise ValueError(f"groups must be from {', '.join(GROUPS)}; got {', '.join(bad)}")
    chosen = models or PROFILE_MODELS[profile]
    cases = [
        c for m in chosen for c in model_cases(m, profile, device)
        if (profile, m, c.group) not in PROFILE_SKIPS and (not groups or c.group in groups)
    ]
    if profile == "smoke":
        cases = smoke_cases(cases)
    if profile == "gpu-small":
        cases = [c for c in cases if in_gpu_small(c)]
    seen: dict[str, str] = {}
    for c in cases:
        if seen.setdefault(c.id, c.cfg.model) != c.cfg.model:
            raise ValueError(f"workloads {seen[c.id]!r} and {c.cfg.model!r} share the name "
                             f"{c.cfg.name!r}; give one of them another Workload.name")
    return list({c.id: c for c in cases}.values())


def in_gpu_small(case: BenchCase) -> bool:
    """gpu-small runs the questions users ask first, at the real shapes; gpu-full adds the
    rest: k=2 accumulation, SGD's and Adam's foreach/fused forms (AdamW's stay), DataParallel
    over one GPU, the 1F1B schedule, and the loader's prefetch, persistence, pinning without
    non_blocking and doubled-batch cases."""
    cfg, loader = case.cfg, case.cfg.loader
    match case.group:
        case "accumulation":
            return cfg.accum_steps != 2
        case "optimizer":
            return cfg.optimizer_impl == "default" or cfg.optimizer == "adamw"
        case "parallel":
            return not (cfg.parallel == "dp" and cfg.world_size == 1) and cfg.schedule == "gpipe"
        case "loader":
            return not (loader.prefetch_factor is not None or loader.persistent_workers
                        or cfg.micro_batch is not None
                        or (loader.pin_memory and not loader.non_blocking))
    return True


def emulated_precision(cfg: RunConfig) -> str | None:
    """The reduced precision ``cfg`` computes in that this CPU emulates (``budget_reason``),
    or None (on CUDA, or in FP32 or a precision the CPU has units for)."""
    precision = "bf16" if cfg.fsdp_mixed_precision else cfg.precision
    if cfg.device != "cpu" or precision not in ("bf16", "fp16"):
        return None
    return None if precision in native_cpu_precisions() else precision


def smoke_cases(cases: list[BenchCase]) -> list[BenchCase]:
    """The smoke profile's cases among ``cases``: those ``SMOKE_VARIANTS`` lists, a precision
    this CPU emulates on the last workload only. The smoke profile checks code paths, which
    autocast and GradScaler take alike on every workload, while an emulated step costs
    seconds (ResNet-18's FP16 step on a CPU without AMX-FP16: about 5 s at the smoke batch,
    a third of the smoke run)."""
    cases = [c for c in cases if smoke_variant(c.cfg) in SMOKE_VARIANTS]
    last = {}
    for c in cases:
        if emulated_precision(c.cfg):
            last[emulated_precision(c.cfg)] = c.cfg.model
    return [c for c in cases
            if not emulated_precision(c.cfg) or last[emulated_precision(c.cfg)] == c.cfg.model]


def smoke_variant(cfg: RunConfig) -> str:
    """The case id without the workload's name and with its main dataset called ``files``
    (what ``SMOKE_VARIANTS`` lists)."""
    variant = cfg.id.removeprefix(cfg.name)
    names = cfg.workload.dataset_names
    if names and cfg.loader.dataset == names[0]:
        variant = variant.replace(names[0], "files", 1)
    return variant


SMOKE_VARIANTS = frozenset({
    "-fp32", "-bf16", "-fp16", "-fp32-accum2-mb4", "-fp32-accum2-mb2", "-fp32-accum2-mb1",
    "-fp32-adamw_fused", "-fp32-zerofill", "-fp32-ckpt", "-fp32-cl", "-fp32-ddp2", "-fp32-dp2",
    "-fp32-pipeline2-chunks4", "-fp32-pipeline2-chunks2", "-fp32-model2",
    "-fp32-synthetic", "-fp32-files", "-fp32-files-w2", "-fp32-files-cached",
    "-fp32-synthetic-w2",
})
"""The smoke profile (tests, CI): a few cases per workload covering every code path of the
step (``smoke_variant`` of each case)."""

