"""The claims of the source articles as data (``CLAIMS``), and the interleaved pairs of those
whose comparison side is not the baseline.

Two cases measured one after the other see different machine conditions: on a shared 2-core
machine, blocks of steps taken tens of seconds apart differ by 10-20%, more than most of the
effects the claims are about. Every case's rounds are already paired with baseline rounds
(``measure.PairedBaseline``); a claim comparing two other configurations (Adam against AdamW,
uncached against cached data) has its two sides built side by side and timed in alternating
rounds (A B, B A, A B, ...), one benchmark in the ``claims`` group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubench.train.config import LoaderConfig, RunConfig


def _own_dataset(base: RunConfig) -> str | None:
    names = base.workload.dataset_names
    return names[0] if names else None


def _quarter_batch(base: RunConfig) -> int:
    return max(base.workload.min_batch, base.resolved_micro_batch // 4)


def _double_batch(base: RunConfig) -> int:
    return 2 * base.resolved_micro_batch


def _knob_workers(base) -> int:
    """The worker count the loader knobs are measured at (``cases.knob_workers``); a baseline
    described from records (``gpubench.analysis.advice``) carries the count its records were
    measured at as ``knob_workers``."""
    known = getattr(base, "knob_workers", None)
    if known is not None:
        return known
    from gpubench.suite.cases import knob_workers

    return knob_workers(base.device)


def _knob_loader(**knobs):
    """The loader of the knob cases (the workload's own data at the knob worker count) with
    ``knobs``; None for a workload without data of its own."""
    def fields(base):
        if _own_dataset(base) is None:
            return None
        return {"dataset": _own_dataset(base), "num_workers": _knob_workers(base), **knobs}
    return fields


def _attention_precision(base) -> str:
    """The attention kernels' cases' precision (``techniques``' attention cases): bf16 on
    CUDA, the baseline's elsewhere (a baseline described from records is the fp32 one)."""
    return "bf16" if base.device == "cuda" else getattr(base, "precision", "fp32")


def _launch_bound_batch(base) -> int:
    from gpubench.train.techniques import launch_bound_batch

    return launch_bound_batch(base)


_LAUNCH_BOUND = {"precision": "bf16", "micro_batch": _launch_bound_batch}


@dataclass(frozen=True)
class Claim:
    """One claim of the source articles, as data: what it says, how large each part of the
    effect is claimed to be, and which two configurations it compares. The verdicts
    (``gpubench.analysis.advice``) and the interleaved pairs (``claim_pairs``) both read it."""

    key: str
    text: str
    parts: dict
    """Part -> claimed range: speed ratios (above 1 is faster) for ``time``, ratios to the
    base's for ``memory``."""
    new: dict
    """Fields of the technique's configuration (values may be functions of the baseline
    ``RunConfig``; a ``loader`` dict becomes a ``LoaderConfig``)."""
    base: dict = field(default_factory=dict)
    """Fields of the side it is compared with ({}: the model's baseline)."""
    interleaved: bool = False
    """Timed as its own pair in alternating rounds (``claim_pairs``): for a base that is not
    the baseline (whose rounds every case is already paired with)."""
    devices: tuple[str, ...] = ("cpu", "cuda")
    """Where the claim can show (elsewhere: *not testable here*)."""
    sources: tuple[str, ...] = ()
    """The source articles that make it (keys of ``SOURCES``)."""
    loop: tuple[str, str] = ()
    """For a claim about the training loop rather than its configuration (``no_grad``,
    ``del``): the base and new loops, both run on the configuration (``new`` and ``base``: {},
    the baseline's) by ``gpubench.diagnostics.hygiene``, whose figures ``gpubench memory``
    records."""

    def fields(self, side: str, base: RunConfig) -> dict | None:
        """The side's configuration fields for ``base`` (None: not applicable to it)."""
        out = {}
        for name, value in (self.new if side == "new" else self.base).items():
            value = value(base) if callable(value) else value
            if value is None:
                return None
            out[name] = value
        return out

    def config(self, side: str, base: RunConfig) -> RunConfig | None:
        fields = self.fields(side, base)
        if fields is None:
            return None
        loader = fields.pop("loader", None)
        if loader is not None:
            fields["loader"] = LoaderConfig(**loader)
        return base.with_(**fields)


SOURCES = {
    "S0": "PyTorch在GPU加速训练中的常见问题及解决方案有哪些？ (common problems of GPU-accelerated "
          "PyTorch training and their solutions)",
    "S1": "PyTorch 训练加速技巧 (PyTorch training acceleration tips)",
    "S4": "PyTorch多GPU训练的自定义操作详解 (PyTorch multi-GPU training, in detail)",
    "PT": "PyTorch's own documentation of the technique (``scaled_dot_product_attention``: fused "
          "kernels faster and leaner than the math one; ``torch.compile``: faster steps after a "
          "compilation, CUDA graphs against launch overhead; ``torch.autograd.graph.save_on_cpu``: "
          "saved tensors moved to the CPU, trading GPU memory for copies)",
}
"""The articles gpubench's claims come from, by the key the code's comments use."""
SOURCES["AO"] = ("torchao's float8 training (``convert_to_float8_training``: +25% tensorwise and "
                 "+10% rowwise over bf16 in its README's Llama 3 runs) and torchtitan's "
                 "(+28% for Llama 3 8B on H100 with float8 and torch.compile)")

_CACHED = {"loader": lambda b: None if _own_dataset(b) is None
           else {"dataset": _own_dataset(b), "cached": True}}
_FILES = {"loader": lambda b: None if _own_dataset(b) is None else {"dataset": _own_dataset(b)}}

CLAIMS = {c.key: c for c in (
    Claim("amp-fp16", "AMP cuts training time ~30% and memory ~50%",
          {"time": (1.25, 1.67), "memory": (0.4, 0.6)}, {"precision": "fp16"}, sources=("S0",)),
    Claim("amp-bf16", "AMP cuts training time ~30% and memory ~50%",
          {"time": (1.25, 1.67), "memory": (0.4, 0.6)}, {"precision": "bf16"}, sources=("S0",)),
    Claim("accumulation", "gradient accumulation keeps the effective batch at lower memory",
          {"memory": (0.0, 0.95)}, {"accum_steps": 4, "micro_batch": _quarter_batch},
          sources=("S0", "S1", "S4")),
    Claim("loader-workers",
          "more DataLoader workers and pinned, asynchronous copies speed training ~30%",
          {"time": (1.2, 1.5)}, {"loader": lambda b: None if _own_dataset(b) is None
                                 else {"dataset": _own_dataset(b), "num_workers": 2}},
          base=_FILES, sources=("S0", "S1")),
    Claim("cache", "caching decoded samples removes the loading cost",
          {"time": (0.95, float("inf"))}, _CACHED, base=_FILES, interleaved=True, sources=("S0",)),
    Claim("ddp", "DDP cuts training time to ~1/N",
          {"efficiency": (0.8, float("inf"))}, {"parallel": "ddp", "world_size": 2},
          devices=("cuda",), sources=("S4",)),
    Claim("empty-cache", "torch.cuda.empty_cache() after every step helps",
          {"time": (1.05, float("inf")), "reserved": (0.0, 0.95)}, {"empty_cache": True},
          devices=("cuda",), sources=("S0", "S4")),
    Claim("adamw", "AdamW is faster than Adam", {"time": (1.05, float("inf"))},
          {"optimizer": "adamw"}, base={"optimizer": "adam"}, interleaved=True, sources=("S1",)),
    Claim("no-sync", "no_sync during accumulation saves communication",
          {"time": (1.05, float("inf"))},
          {"parallel": "ddp", "world_size": 2, "accum_steps": 2, "ddp_no_sync": True},
          base={"parallel": "ddp", "world_size": 2, "accum_steps": 2}, sources=("S4",)),
    # S4 and S0: DistributedDataParallel rather than DataParallel. DataParallel splits one
    # micro-batch over its GPUs, DDP gives each rank a micro-batch: DataParallel at twice the
    # micro-batch has the same global batch and the same samples per GPU as DDP.
    Claim("dp-vs-ddp", "DDP is faster than DataParallel and balances memory over the GPUs",
          {"time": (1.05, float("inf")), "peak": (0.0, 0.95), "imbalance": (0.0, 0.95)},
          {"parallel": "ddp", "world_size": 2},
          base={"parallel": "dp", "world_size": 2, "micro_batch": _double_batch},
          devices=("cuda",), sources=("S0", "S4")),
    Claim("sharding", "DDP keeps each GPU's optimizer state apart, reducing memory",
          {"memory": (0.0, 0.95)}, {"parallel": "ddp", "world_size": 2}, sources=("S4",)),
    # torch.compile: faster steps, after a compile time the record states (break-even steps);
    # CUDA graphs (compile mode reduce-overhead) against compile's default mode.
    Claim("compile", "torch.compile speeds up training", {"time": (1.05, float("inf"))},
          {"compile": True}, sources=("PT",)),
    # Both at bf16 on a launch-bound step (``techniques.launch_bound_batch``): at the
    # profile's compute-bound fp32 steps the claim could not hold by construction.
    Claim("cuda-graphs", "CUDA graphs (torch.compile mode reduce-overhead) help launch-bound "
          "steps", {"time": (1.05, float("inf"))},
          {"compile": True, "compile_mode": "reduce-overhead", **_LAUNCH_BOUND},
          base={"compile": True, **_LAUNCH_BOUND}, devices=("cuda",), sources=("PT",)),
    # Attention kernels: FlashAttention against the unfused math kernel (eager attention's
    # computation: the score matrix materialised and saved for backward); on CUDA both at
    # bf16, the dtype FlashAttention has kernels for (none for fp32: the claim could not hold
    # there by construction).
    Claim("flash-attention", "flash attention is faster and uses less memory than eager "
          "attention", {"time": (1.05, float("inf")), "memory": (0.0, 0.95)},
          {"attention": "flash", "precision": _attention_precision},
          base={"attention": "math", "precision": _attention_precision}, sources=("PT",)),
    # FP8 training (torchao float8) against bf16 autocast, per recipe (``fp8``: per-tensor
    # scales, ``fp8-rowwise``: per-row), on GPUs with FP8 units; the converted linears are
    # torchao's filter's on CUDA, every eligible one elsewhere (emulated: no speed verdict).
    # On CUDA both sides compiled, as torchao measures it (eager float8 pays its casts and
    # scaling as separate kernels).
    Claim("fp8", "FP8 speeds up training over bf16 by ~1.25-1.5x on Hopper",
          {"time": (1.25, 1.5)},
          {"precision": "fp8", "fp8_layers": lambda b: "auto" if b.device == "cuda" else "all",
           "compile": lambda b: b.device == "cuda"},
          base={"precision": "bf16", "compile": lambda b: b.device == "cuda"},
          devices=("cuda",), sources=("AO",)),
    # Activation offloading: a larger batch fits (the frontier) at a modest step-time cost
    # (speed at least 0.8 of the baseline's).
    Claim("offload", "offloading activations to the CPU lets larger batches fit at a modest "
          "cost", {"max_batch": (1.05, float("inf")), "time": (0.8, float("inf"))},
          {"offload": True}, devices=("cuda",), sources=("PT",)),
    # S0 and S1: the loader's knobs, each at the same worker count as its pageable base.
    Claim("pin-memory", "pin_memory makes host-to-device copies asynchronous and training "
          "faster", {"pin_memory": (1.05, float("inf")), "non_blocking": (1.05, float("inf"))},
          {"loader": _knob_loader(pin_memory=True, non_blocking=True)},
          base={"loader": _knob_loader()}, devices=("cuda",), sources=("S0", "S1")),
    Claim("prefetch", "prefetch_factor loads the next batches while the step computes, "
          "speeding training", {"time": (1.05, float("inf"))},
          {"loader": _knob_loader(prefetch_factor=4)}, base={"loader": _knob_loader()},
          sources=("S0", "S1")),
    # S0: "use an SSD instead of an HDD". The faster storage is the page cache (warm files);
    # the disk the data is on is read cold (files dropped from the cache before each epoch),
    # at 0 and at the knob workers: storage limits loading where warm beats cold. Not timed in
    # alternating rounds: both sides read the same files, which each cold eviction drops.
    Claim("storage", "use an SSD instead of an HDD: storage speed limits data loading",
          {"time": (1.05, float("inf"))}, _FILES,
          base={"loader": lambda b: None if _own_dataset(b) is None
                else {"dataset": _own_dataset(b), "cold": True}}, sources=("S0",)),
    # S0 and S4: memory hygiene. The frontier (gpubench memory) is the largest micro-batch that
    # fits; the loop claims are measured by gpubench.diagnostics.hygiene on the baseline's
    # configuration.
    Claim("empty-cache-oom", "calling torch.cuda.empty_cache() avoids running out of memory",
          {"max_batch": (1.05, float("inf"))}, {"empty_cache": True}, devices=("cuda",),
          sources=("S0", "S4")),
    Claim("no-grad", "torch.no_grad() in evaluation saves memory",
          {"no_grad": (0.0, 0.95), "inference_mode": (0.0, 0.95)}, {},
          loop=("evaluation with autograd on", "evaluation under no_grad / inference_mode"),
          sources=("S0", "S4")),
    Claim("del", "deleting intermediates (del) frees memory in the training loop",
          {"graph": (0.0, 0.95), "outputs": (0.0, 0.95)}, {},
          loop=("the loop keeps the tensor", "the loop deletes it"), sources=("S0", "S4")),
    # Convergence parity (gpubench parity, parity.json): each technique trained for N steps from
    # FP32's initial weights on the same data; a part holds when its final loss is within the
    # range of FP32's, as a share of FP32's initial loss (gpubench.analysis.parity).
    Claim("parity", "training accuracy is unaffected by AMP, DDP and gradient accumulation",
          {t: (-0.02, 0.02) for t in ("bf16", "fp16", "accum4", "ddp2")}, {},
          loop=("FP32 training", "training under the technique, same weights and data"),
          sources=("S0", "S1", "S4")),
    # S1 section 6: the case study stacks loader workers, mixed precision, DDP and accumulation.
    # The stacks are the recipe group's cases (gpubench.suite.cases.recipe_cases), judged against
    # their best single ingredient, with the product of the ingredients' speedups beside them.
    Claim("recipe", "stacking loader workers, mixed precision, DDP and gradient accumulation "
          "speeds training up beyond each technique alone",
          {"single": (1.05, float("inf")), "ddp": (1.05, float("inf"))}, {}, sources=("S1",)),
)}
"""Every claim the verdicts judge; the interleaved ones also get their own paired benchmark."""


@dataclass(frozen=True)
class ClaimPair:
    claim: str
    """Key of the claim in ``CLAIMS``."""
    base: RunConfig
    new: RunConfig

    @property
    def id(self) -> str:
        return f"claim-{self.claim}-{self.new.name}"


def claim_pairs(model: str, profile: str, device: str) -> list[ClaimPair]:
    """The interleaved pairs of ``CLAIMS`` that apply to ``model`` on ``device``."""
    baseline = RunConfig(model=model, profile=profile, device=device)
    pairs = []
    for claim in CLAIMS.values():
        if not claim.interleaved or device not in claim.devices:
            continue
        base, new = claim.config("base", baseline), claim.config("new", baseline)
        if base is not None and new is not None:
            pairs.append(ClaimPair(claim.key, base, new))
    return pairs


def measure_pair(benchmark, pair: ClaimPair, rounds: int, warmup_rounds: int,
                 timeout_s: float | None = None) -> dict:
    """Check both sides, then time them in alternating rounds; fill ``benchmark.extra_info``.
    Each side's commands must finish within ``timeout_s`` (default: ``--timeout``'s)."""
    from gpubench.launchers.workers import DEFAULT_TIMEOUT_S
    from gpubench.measure.protocol import InProcess
    from gpubench.train.build import Unsupported, unsupported_reason

    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    for cfg in (pair.base, pair.new):
        reason = unsupported_reason(cfg)
        if reason:
            raise Unsupported(reason)
    # The same protocol as every case, in this process: prepare, check, count, then steps.
    sides = []
    try:
        for cfg in (pair.base, pair.new):
            sides.append(InProcess(cfg, timeout_s=timeout_s))
        activation, global_batch = [], []
        for side in sides:
            side.call("prepare")
            side.call("check")
            activation.append(side.call("count")[0]["activation_bytes"])
            global_batch.append(side.program.cfg.global_batch)
        times: list[list[float]] = [[], []]
        order = [0]

        def alternate():
            first = order[0]
            order[0] = 1 - first
            for i in (first, 1 - first):
                times[i].append(sides[i].call("step")[0])

        benchmark.pedantic(alternate, rounds=rounds, warmup_rounds=warmup_rounds)
    finally:
        for side in sides:
            side.close()
    info = {
        "kind": "claim",
        "claim": pair.claim,
        "case_id": pair.id,
        "model": pair.base.name,
        "workload": pair.base.model,
        "profile": pair.base.profile,
        "device": pair.base.device,
        "case_id_base": pair.base.id,
        "case_id_new": pair.new.id,
        "accum_steps_new": pair.new.accum_steps,
        "global_batch_base": global_batch[0],
        "global_batch_new": global_batch[1],
        "rounds_base_s": times[0][warmup_rounds:],
        "rounds_new_s": times[1][warmup_rounds:],
        "activation_bytes_base": activation[0],
        "activation_bytes_new": activation[1],
        "note": "benchmark time is one step of each side; the sides alternate in order",
    }
    benchmark.extra_info.update(info)
    return info
