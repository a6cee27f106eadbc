"""Convergence parity: does a technique train to the same loss as FP32?

The benchmark cases check each technique's first step against FP32 (``gpubench.train.checks``); this
module checks where training *ends up*. Every technique trains the same model for ``steps``
optimizer steps from the same initial weights (``workload.initial_train_module``, digested and
compared) on the same data in the same order, through the suite's own ``build(cfg)`` and
``Case.step`` (no second training loop), and the loss curves are compared with FP32's
(``gpubench.analysis.parity``).

The task is learnable by construction: a fixed set of ``PARITY_BATCHES`` global batches of the
workload's ``make_batch`` samples (random inputs, random targets), cycled in the same order,
which the model must memorise, so the loss falls steadily for every workload (images, tokens,
a user's model) without knowing its output format. Every technique sees the same global batch
at step t; it only splits it differently: k micro-batches of G/k samples (accumulation), one
shard of G/w samples per rank (DDP), so that, in exact arithmetic, every technique computes the
same mean gradient over the same G samples (BatchNorm's per-micro-batch statistics excepted:
a real effect of splitting, which parity then measures).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpubench.train.config import RunConfig
from gpubench.train.techniques import variants
from gpubench.workloads.profiles import PROFILE_TABLE

if TYPE_CHECKING:  # torch is imported when used: the command line's --help stays fast
    import torch

PARITY_BATCHES = 4
"""Global batches in the fixed training set, cycled in order (one pass = this many steps)."""

DEFAULT_STEPS = {name: p.parity_steps for name, p in PROFILE_TABLE.items()}
"""Optimizer steps per technique by profile (``gpubench.workloads.profiles``; ``--steps``
overrides it)."""

CHUNK_STEPS = 20
"""Steps per command sent to a technique's process (the progress line moves between them)."""

REFERENCE = "fp32"

TECHNIQUES = {"fp32": {}, "fp32-repeat": {},
              **{name: dict(v.changes) for name, v in variants("parity").items()}}
"""Techniques parity can train, by name: FP32 (the reference) and a second FP32 run (the
determinism check: bit-identical on the CPU), then every variant the techniques declare for it
(``Technique.variants``: AMP bf16 and fp16, k = 4 gradient accumulation at the same effective
batch (micro-batch G/4), DDP over 2 ranks (gloo on the CPU, each rank G/2 samples))."""

DESCRIPTIONS = {"fp32": "FP32 (reference)", "fp32-repeat": "FP32 again (determinism)",
                **{name: v.description for name, v in variants("parity").items()}}


def technique_config(base: RunConfig, name: str) -> RunConfig:
    """``name``'s configuration, at the baseline's global batch G (its micro-batch split over
    accumulation steps and ranks). ``ValueError`` (one line) for an unknown name or a G that
    does not split."""
    if name not in TECHNIQUES:
        raise ValueError(f"technique must be one of {', '.join(TECHNIQUES)}; got {name!r}")
    fields = TECHNIQUES[name]
    if not fields:
        return base
    trial = base.with_(**fields)
    parts = trial.accum_steps * trial.parallelism.replicas
    global_batch = base.resolved_micro_batch
    micro = global_batch // parts
    if global_batch % parts or micro < base.workload.min_batch:
        raise ValueError(f"{name}: the global batch {global_batch} does not split into {parts} "
                         f"micro-batches of at least {base.workload.min_batch} samples")
    return trial if micro == global_batch else trial.with_(micro_batch=micro)


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-1 of the parameters' bytes, in order: equal digests are equal initial weights."""
    import torch

    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class DataPlan:
    """The fixed training set: ``batches`` global batches of ``global_batch`` samples made by
    the workload's ``make_batch`` with ``seed``."""

    global_batch: int
    batches: int = PARITY_BATCHES
    seed: int = 0


def _slice(tree, start: int, stop: int):
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t[start:stop] if isinstance(t, torch.Tensor) else t, tree)


class ParityProgram:
    """One process's part of a technique's training run (the whole of it, or one DDP rank):
    the case built by ``gpubench.train.build.build``, and this process's micro-batches of every
    global batch of the fixed set, placed on the device once. Commands: ``digest``, ``train``."""

    def __init__(self, rank: int, world_size: int, cfg: RunConfig, plan: DataPlan):
        import torch

        from gpubench.train.build import build
        from gpubench.train.data import Placement

        if cfg.multiprocess:  # the ranks share this machine's cores (as CaseProgram does)
            import os

            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
            if cfg.device == "cuda":
                torch.cuda.set_device(rank)
        self.case = build(cfg, rank)
        self.initial_digest = weights_digest(self.case.model)
        place = Placement(self.case.device, non_blocking=False, channels_last=cfg.channels_last)
        inputs, targets = cfg.workload.sample_batch(plan.global_batch * plan.batches, plan.seed)
        replicas = cfg.parallelism.replicas
        share = plan.global_batch // replicas
        micro = share // cfg.accum_steps
        self.steps: list[list] = []
        for b in range(plan.batches):
            start = b * plan.global_batch + rank * share  # this rank's shard of batch b
            self.steps.append([place((_slice(inputs, s, s + micro), _slice(targets, s, s + micro)))
                               for s in range(start, start + share, micro)])
        self.done = 0
        self.skipped = 0

    def digest(self) -> str:
        return self.initial_digest

    def train(self, n: int) -> dict:
        """``n`` more optimizer steps; their losses (this process's mean micro-batch loss) and
        the steps ``GradScaler`` skipped (fp16: gradients that overflowed)."""
        import torch

        losses = []
        scaler = self.case.precision.scaler
        with self.case.precision.math_mode():
            for _ in range(n):
                batches = iter(self.steps[self.done % len(self.steps)])
                before = scaler.get_scale() if scaler.is_enabled() else None
                loss = self.case.step(batches)
                if before is not None and scaler.get_scale() < before:
                    self.skipped += 1  # the scale backs off only when the step was skipped
                losses.append(loss)
                self.done += 1
        return {"losses": [float(x) for x in torch.stack(losses).float().cpu()],
                "skipped_steps": self.skipped}

    def close(self) -> None:
        self.case.close()


def launcher(cfg: RunConfig, plan: DataPlan, timeout_s: float):
    """The benchmark cases' launcher (``gpubench.measure.runner.launcher``) running a
    ``ParityProgram``: worker processes per rank for multi-process techniques, one of its own
    for a technique that configures the CUDA allocator, this process otherwise; every command
    within ``timeout_s``."""
    from gpubench.measure.runner import launcher as case_launcher

    return case_launcher(cfg, timeout_s, program=ParityProgram, args=(cfg, plan))


class OverBudget(Exception):
    """A technique's first steps project a run longer than its budget; the message says so."""


PROBE_STEPS = (1, 2)
"""Steps a budgeted technique trains first: one warm-up step (kernel set-up), then two timed
steps that project the whole run's time."""

EMULATED_BUDGET_S = 120.0
"""Seconds a default technique in a reduced precision this CPU emulates may take (projected
from its first steps); beyond it the technique is left out, with the figures, unless named
with ``--techniques``. Emulated fp16 convolutions run about 30x slower than fp32 (ResNet-18,
smoke profile: 1.7 s per step, 3.5 minutes for 120 steps), while bf16 steps here take about
fp32's time and BERT's fp16 steps 3x it (cpu profile: 0.24 s, 73 s for 300 steps)."""


def train_technique(cfg: RunConfig, plan: DataPlan, steps: int, *, timeout_s: float = 300.0,
                    on_chunk=lambda n: None, budget_s: float | None = None) -> dict:
    """Train ``cfg`` for ``steps`` steps on ``plan``'s data: the loss per step (averaged over
    ranks, each holding an equal shard: the global batch's mean), the initial weights' digest
    and the steps GradScaler skipped. ``on_chunk(n)`` after every ``n`` steps (progress).
    With ``budget_s``, the steps after a warm-up step (``PROBE_STEPS``) project the run's
    time, and a run projected over the budget stops there (``OverBudget``)."""
    import time

    start = time.perf_counter()
    with launcher(cfg, plan, timeout_s) as group:
        digests = group.call("digest")
        per_rank: list[list[float]] = [[] for _ in digests]
        skipped = 0
        done, chunk = 0, 0
        probe = list(PROBE_STEPS) if budget_s is not None else []
        while done < steps:
            n = min(probe[chunk] if chunk < len(probe) else CHUNK_STEPS, steps - done)
            chunk_start = time.perf_counter()
            for rank, result in enumerate(group.call("train", n)):
                per_rank[rank] += result["losses"]
                skipped = max(skipped, result["skipped_steps"])
            chunk += 1
            if chunk == len(probe):  # the timed probe steps, after the warm-up step
                per_step = (time.perf_counter() - chunk_start) / n
                if per_step * steps > budget_s:
                    raise OverBudget(
                        f"{per_step:.2f} s per step here, about {per_step * steps:.0f} s for "
                        f"{steps} steps, over the {budget_s:.0f} s budget of a default "
                        f"technique in a precision this CPU emulates (--techniques ...,"
                        f"{cfg.precision} trains it)")
            done += n
            on_chunk(n)
    losses = [sum(xs) / len(xs) for xs in zip(*per_rank, strict=True)]
    return {"case_id": cfg.id, "losses": losses, "initial_weights": digests[0],
            "rank_initial_weights": digests, "skipped_steps": skipped,
            "micro_batch": cfg.resolved_micro_batch, "accum_steps": cfg.accum_steps,
            "world_size": cfg.world_size, "precision": cfg.precision,
            "seconds": time.perf_counter() - start}


def emulated(cfg: RunConfig) -> bool:
    """Whether ``cfg``'s reduced precision is emulated on this CPU (``cases.budget_reason``)."""
    if cfg.device != "cpu" or cfg.precision not in ("bf16", "fp16"):
        return False
    from gpubench.suite.cases import native_cpu_precisions

    return cfg.precision not in native_cpu_precisions()


def run_parity(model: str, profile: str, device: str, techniques: list[str] | None = None,
               steps: int | None = None, seed: int = 0, timeout_s: float = 300.0,
               progress=None, extra: dict[str, RunConfig] | None = None,
               micro_batch: int | None = None) -> dict:
    """Train every technique (FP32 first, as the reference; default: all of ``TECHNIQUES``)
    for ``steps`` steps (default per profile, ``DEFAULT_STEPS``) and return the report
    (``gpubench.analysis.parity.judge`` adds the verdicts). A technique this machine cannot run
    is left out with the reason, and so is a default one in a precision this CPU emulates
    whose first steps project more than ``EMULATED_BUDGET_S``.
    ``progress``: a tqdm-like bar (``total``, ``update``, ``set_description_str``) or None.
    ``extra``: configurations trained beside them by name (``gpubench tune --parity``'s
    winner), each at the global batch ``micro_batch`` (default: the profile's) that the
    reference trains with one micro-batch.
    Ctrl-C or SIGTERM once the reference has trained: the interruption carries, as its
    ``partial``, the report of the techniques that finished (the others in ``left_out``)."""
    import time

    from gpubench.train.build import LEARNING_RATES, unsupported_reason
    from gpubench.util.signals import Interrupted

    start = time.perf_counter()
    steps = DEFAULT_STEPS[profile] if steps is None else steps
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps!r}")
    chosen = techniques is not None
    techniques = list(TECHNIQUES) if techniques is None else techniques
    left_out: dict[str, str] = {}
    techniques = list(dict.fromkeys([REFERENCE, *techniques]))  # the reference first, once
    base = RunConfig(model=model, profile=profile, device=device, seed=seed)
    if micro_batch not in (None, base.resolved_micro_batch):  # the default stays implicit
        base = base.with_(micro_batch=micro_batch)
    plan = DataPlan(base.resolved_micro_batch, seed=seed)
    for name, cfg in (extra or {}).items():
        split = cfg.resolved_micro_batch * cfg.accum_steps * cfg.parallelism.replicas
        if split != plan.global_batch:
            raise ValueError(f"{name}: {cfg.id} trains a global batch of {split}, the "
                             f"reference {plan.global_batch}")
    configs = {}
    for name in techniques:
        try:
            cfg = technique_config(base, name)
        except ValueError as err:
            if name not in TECHNIQUES:
                raise
            left_out[name] = str(err)
            continue
        reason = unsupported_reason(cfg)
        if reason:
            if name == REFERENCE:
                raise ValueError(f"the fp32 reference cannot run here: {reason}")
            left_out[name] = reason
            continue
        configs[name] = cfg
    for name, cfg in (extra or {}).items():
        reason = unsupported_reason(cfg)
        if reason:
            left_out[name] = reason
        else:
            configs[name] = cfg.with_(seed=seed)
    if progress is not None:
        progress.reset(total=steps * len(configs))
    runs = []

    def report() -> dict:
        return {"kind": "parity", "model": base.name, "workload": model, "profile": profile,
                "device": device, "steps": steps, "global_batch": plan.global_batch,
                "learning_rate": LEARNING_RATES[base.optimizer],
                "batch_norm": base.workload.facts.batch_norm,
                "batches": plan.batches, "seed": seed, "optimizer": base.optimizer,
                "reference": REFERENCE, "techniques": runs, "left_out": left_out,
                "seconds": time.perf_counter() - start}

    for name, cfg in configs.items():
        if progress is not None:
            progress.set_description_str(f"parity {base.name} {name}")
        budget = None if chosen or not emulated(cfg) else EMULATED_BUDGET_S
        try:
            run = train_technique(cfg, plan, steps, timeout_s=timeout_s, budget_s=budget,
                                  on_chunk=(progress.update if progress is not None
                                            else lambda n: None))
        except OverBudget as why:
            left_out[name] = f"{cfg.precision} is emulated on this CPU: {why}"
            if progress is not None:
                progress.total -= steps - PROBE_STEPS[0]  # the warm-up step counted
            continue
        except (KeyboardInterrupt, Interrupted) as err:
            if runs:  # the reference finished: the report of what did, on the interruption
                trained = {r["technique"] for r in runs}
                for rest in configs:
                    if rest not in trained and rest not in left_out:
                        left_out[rest] = f"interrupted ({_signal_of(err)}) before it finished"
                err.partial = {**report(), "interrupted": _signal_of(err)}
            raise
        runs.append({"technique": name, "description": DESCRIPTIONS.get(name, cfg.id), **run})
    return report()


def _signal_of(err: BaseException) -> str:
    return "SIGINT" if isinstance(err, KeyboardInterrupt) else str(err.args[0])
