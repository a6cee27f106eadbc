"""``gpubench tune``: the fastest configuration of one model that keeps its global batch, fits a
memory budget and still trains, found by a search cheaper than measuring every combination.

The search, in the order it runs:

1. **Diagnosis** of the baseline step (``diagnose``): its model FLOP utilisation against the
   device's measured matmul peak, the share of the step its optimizer takes, and how much faster
   the device multiplies in reduced precision; from those, which techniques are predicted to
   help. The space is ordered by the prediction (a search stopped by ``--time`` has measured the
   likeliest first), and each prediction is scored against what was measured.
2. **The space** (``search_space``): precision x micro-batch (with accumulation keeping the
   global batch) x activation checkpointing x optimizer implementation x layout x transformers'
   attention x activation offloading x SDPA kernel x compile (``DIMENSIONS``), each where the
   device and the workload can use it (``left_out`` says why a value is not); a configuration
   the device cannot run is pruned with its reason.
3. **Memory pruning** before anything is timed (``MemoryModel``): parameters, gradients and
   optimizer state counted exactly once, the activations autograd saves counted at one
   micro-batch per precision, checkpointing, layout and attention and scaled with the
   micro-batch; a configuration
   predicted over the budget is pruned. The winner's real figure is measured and set beside its
   prediction.
4. **Successive halving** on rounds paired with the baseline's (the baseline's case stays built;
   each candidate's steps alternate with it in ABBA blocks, as a run pairs them,
   ``gpubench.measure.protocol.run_rounds``): every survivor gets ``RUNG_ROUNDS`` rounds, the
   fastest third (``KEEP``) twice as many more, and so on until ``FINALISTS`` are left.
5. **Confirmation** of the finalists with the suite's protocol: the training check (a finalist
   that fails it is dropped and the next one confirmed), then fresh paired rounds under the
   run's stopping rule at the profile's target width (``confirm_rule``; ``CONFIRM_ROUNDS``
   where the profile sets none) (not the rounds that selected it, which favour whoever was
   lucky in them),
   a speed ratio with its 95% interval (``gpubench.analysis``'s paired statistics) and its
   measured training memory. The winner is the fastest finalist that beats the baseline
   significantly by ``MIN_EFFECT``; the baseline when none does.
6. **Ablation** of the winner: each of its techniques set back to the baseline's in turn,
   measured the same way, so the table says what each is worth in this combination.

Everything measured is written to ``tune.json`` as soon as it is measured; ``resume=True``
continues a stopped tune from it.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gpubench.measure.machine import fingerprint
from gpubench.measure.memory import SavedActivations, state_breakdown
from gpubench.measure.protocol import StoppingRule, run_rounds
from gpubench.measure.provenance import describe_fingerprint
from gpubench.suite.cases import baseline, native_cpu_precisions
from gpubench.train.build import LEARNING_RATES, build, unsupported_reason
from gpubench.train.checks import TrainingCheckError, check_case
from gpubench.train.config import RunConfig
from gpubench.train.techniques import (
    ATTENTION_BACKENDS,
    ATTN_IMPLEMENTATIONS,
    DEFAULT_SEARCH,
    OPTIMIZER_IMPLS,
    SEARCH_DIMENSIONS,
)
from gpubench.util import atomic
from gpubench.util.stats import compare_paired
from gpubench.util.verdicts import ALPHA, MIN_EFFECT

DIMENSIONS = SEARCH_DIMENSIONS

RUNG_ROUNDS = 2
"""Paired rounds every candidate gets in the first rung; each later rung doubles them."""
KEEP = 1 / 3
"""The share of a rung's candidates that go on to the next."""
FINALISTS = 3
"""Candidates confirmed with the full protocol."""
CONFIRM_ROUNDS = 15
"""Paired rounds of a confirmation (and of each ablation)."""
WARMUP_STEPS = 1
"""Untimed steps after a candidate is built (allocator, autotuning; compilation)."""
VERSION = 1
"""The version of ``tune.json``; ``resume`` refuses another."""


class TuneError(ValueError):
    """Bad input to the tuner (a one-line message naming the bad value)."""


@dataclass
class Candidate:
    cfg: RunConfig
    predicted_bytes: float | None = None
    pruned: str | None = None
    """Why it is not measured (unsupported here, over the budget), or None."""
    ratios: list[float] = field(default_factory=list)
    """Per paired round: the baseline's step time / the candidate's (same global batch: >1 is
    faster)."""
    rung: int = -1
    """The last rung it was measured in (-1: none)."""

    @property
    def id(self) -> str:
        return self.cfg.id

    @property
    def speed(self) -> float:
        return statistics.median(self.ratios) if self.ratios else float("nan")


def micro_batches(global_batch: int, min_batch: int) -> list[int]:
    """The micro-batches the space tries for ``global_batch``: it, its half and its quarter,
    where they divide it and are at least ``min_batch``."""
    found = [global_batch // d for d in (1, 2, 4)
             if global_batch % d == 0 and global_batch // d >= min_batch]
    return list(dict.fromkeys(found))


def with_micro(cfg: RunConfig, micro: int, global_batch: int) -> RunConfig:
    """``cfg`` at micro-batch ``micro`` with the accumulation that keeps ``global_batch`` (the
    profile's default micro-batch left implicit, so that ids stay the suite's)."""
    default = cfg.with_(micro_batch=None).resolved_micro_batch
    return cfg.with_(micro_batch=None if micro == default else micro,
                     accum_steps=global_batch // micro)


def space_values(base: RunConfig, global_batch: int, dims: tuple[str, ...],
                 compile_: bool) -> dict[str, list]:
    """Each dimension's values for ``base``'s workload on its device (the baseline's first)."""
    return _space(base, global_batch, dims, compile_)[0]


def left_out(base: RunConfig, global_batch: int, dims: tuple[str, ...],
             compile_: bool) -> list[str]:
    """The values of ``dims`` the space leaves out on this device and workload, each with why
    (what ``tune.md`` lists beside the pruned configurations)."""
    return _space(base, global_batch, dims, compile_)[1]


def _space(base: RunConfig, global_batch: int, dims: tuple[str, ...], compile_: bool
           ) -> tuple[dict[str, list], list[str]]:
    from gpubench.train.implementations import sdpa_reason
    from gpubench.train.precision import fp8_reason, fp8_units

    w, cuda = base.workload, base.device == "cuda"
    out: list[str] = []
    reduced = ["bf16", "fp16"] if cuda else (
        [p for p in ("bf16", "fp16") if p in native_cpu_precisions()])
    out += [f"precision {p}: this CPU has no native {p} matmul (emulated, slower than fp32)"
            for p in ("bf16", "fp16") if p not in reduced]
    fp8 = []
    why = fp8_reason()
    if why is None and not (cuda and fp8_units("cuda")):
        why = ("FP8 would be emulated in higher precision here (FP8 units: CUDA compute "
               "capability 8.9+)")
    if why is None:
        fp8 = ["fp8"]
    else:
        out.append(f"precision fp8: {why}")
    hf = w.facts.hf_attention
    # the model's own attention code, and one other (eager for an sdpa model, and back)
    other_attn = ([v for v in ATTN_IMPLEMENTATIONS if v not in ("default", hf)][:1]
                  if hf else [])
    if not hf:
        out.append("attn_implementation: not a Hugging Face transformers model")
    # the fused kernels this device has (math is the unfused reference: never faster)
    backends = []
    for b in (ATTENTION_BACKENDS if w.facts.uses_sdpa else ()):
        if b in ("default", "math"):
            continue
        why = sdpa_reason(b, base.device, "bf16" if cuda else "fp32")
        if why is None:
            backends.append(b)
        else:
            out.append(f"attention {b}: {why.split(':')[0].removeprefix(f'attention {b} has ')}")
    if not w.facts.uses_sdpa:
        out.append("attention: the model's forward calls no scaled_dot_product_attention")
    if not cuda:
        out.append("offload: activations already live in host memory on the CPU (only the "
                   "copies would remain)")
    if not w.uses_channels_last:
        out.append("channels_last: the model's input is not one 4-D tensor")
    values = {
        "precision": ["fp32", *reduced, *fp8],
        "micro_batch": micro_batches(global_batch, w.min_batch),
        "checkpointing": [False, True] if (w.checkpointing or w.facts.blocks) else [False],
        "optimizer_impl": list(OPTIMIZER_IMPLS),
        "channels_last": [False, True] if w.uses_channels_last else [False],
        "attn_implementation": ["default", *other_attn],
        "offload": [False, True] if cuda else [False],
        "attention": ["default", *backends],
        "compile": [False, True] if compile_ else [False],
    }
    out = [line for line in out if line.split(" ")[0].rstrip(":") in dims]
    return {d: values[d] if d in dims else values[d][:1] for d in DIMENSIONS}, out


def search_space(base: RunConfig, global_batch: int, dims: tuple[str, ...] = DEFAULT_SEARCH,
                 compile_: bool = False) -> list[RunConfig]:
    """Every combination of ``dims`` (the others at the baseline's values), the baseline first;
    the micro-batch comes with the accumulation that keeps ``global_batch``."""
    values = space_values(base, global_batch, dims, compile_)
    out = []
    for combo in itertools.product(*(values[d] for d in DIMENSIONS)):
        fields = dict(zip(DIMENSIONS, combo, strict=True))
        micro = fields.pop("micro_batch")
        if fields["attn_implementation"] == "eager" and fields["attention"] != "default":
            continue  # eager attention calls no SDPA kernel to pin: refused by RunConfig
        out.append(with_micro(base.with_(**fields), micro, global_batch))
    return list(dict.fromkeys(out))


WORKSPACE_MARGIN = 1.10
"""Device memory beyond the counted state and saved activations: cuBLAS/cuDNN workspaces, the
autograd graph's transients, the allocator's rounding (5-10% at the GPU shapes); a prediction
is the counted bytes times this."""


class MemoryModel:
    """Predicted training memory of a configuration (parameters + gradients + optimizer state +
    the activations its largest micro-batch saves, times ``WORKSPACE_MARGIN``), from exact
    counts: the state once, the saved activations once per (precision, checkpointing, layout,
    attention) at one micro-batch, scaled linearly with the micro-batch. Offloading moves the
    saved activations to host memory (``predict_host``): the device holds one block's of them
    at a time (the one being copied), the rest is host memory, which must fit too."""

    def __init__(self) -> None:
        self._state: float | None = None
        self._activations: dict[tuple, tuple[int, float]] = {}
        self.counted = 0

    def _count(self, cfg: RunConfig) -> tuple[int, float]:
        # Counted without offloading's hooks (the saved tensors themselves); where they live
        # is ``predict``'s and ``predict_host``'s business.
        key = (cfg.precision, cfg.checkpointing, cfg.channels_last, cfg.attn_implementation,
               cfg.attention)
        if key not in self._activations:
            probe = cfg.with_(compile=False, optimizer_impl="default", accum_steps=1,
                              offload=False)
            with build(probe) as case, case.precision.math_mode():
                with SavedActivations(case.model) as saved:
                    case.step()
                if self._state is None:
                    self._state = float(sum(state_breakdown(case.model,
                                                            case.optimizer).values()))
            self._activations[key] = (probe.resolved_micro_batch, saved.per_micro_batch_bytes)
            self.counted += 1
        return self._activations[key]

    def _saved(self, cfg: RunConfig) -> float:
        micro, saved = self._count(cfg)
        return saved * cfg.resolved_micro_batch / micro

    def predict(self, cfg: RunConfig) -> float:
        """Device bytes."""
        saved = self._saved(cfg)
        if cfg.offload:
            saved /= max(1, cfg.workload.facts.blocks)
        return (self._state + saved) * WORKSPACE_MARGIN

    def predict_host(self, cfg: RunConfig) -> float:
        """Pinned host bytes: the saved activations of an offloading configuration, else 0."""
        return self._saved(cfg) if cfg.offload else 0.0


def host_memory_free() -> float | None:
    """Bytes of host memory available (psutil), or None where unknown."""
    try:
        import psutil
    except ImportError:
        return None
    return float(psutil.virtual_memory().available)


def over_budget(entry: dict, budget: float | None) -> str | None:
    """Why a confirmed candidate's *measured* peak breaks the budget, or None: the prediction
    prunes, the measurement decides."""
    peak = entry.get("peak_memory_bytes")
    if budget is None or peak is None or peak <= budget:
        return None
    return f"over budget: measured peak {_size(peak)} > {_size(budget)}"


def confirm_rule(cfg: RunConfig) -> StoppingRule:
    """The rounds of a confirmation (and of each ablation and exhaustive entry), by the run's
    stopping rule at ``cfg``'s profile: ``CONFIRM_ROUNDS`` exactly where the profile sets no
    target width (smoke); else at least ``MIN_ROUNDS``, stopping once the paired interval's
    half-width reaches the profile's target, at most ``EXTEND_FACTOR`` times
    ``CONFIRM_ROUNDS`` within the profile's time cap."""
    from gpubench.workloads.profiles import PROFILE_TABLE

    profile = PROFILE_TABLE[cfg.profile]
    if not profile.target_width:
        return StoppingRule(0.0, CONFIRM_ROUNDS, CONFIRM_ROUNDS)
    return StoppingRule.for_case(CONFIRM_ROUNDS, 0.0, profile.max_time_s, None,
                                 profile.target_width)


def _timed(case) -> float:
    """One synchronized step of ``case`` in its own math mode; its seconds."""
    with case.precision.math_mode():
        start = time.perf_counter()
        case.synced_step()
        return time.perf_counter() - start


def paired_ratios(base_case, cfg: RunConfig, rounds: int, *, check: bool = False,
                  rule: StoppingRule | None = None
                  ) -> tuple[list[float], list[float], list[float], dict]:
    """Build ``cfg`` (its training check first, with ``check``), warm it up, then paired rounds
    with the baseline's case as a run pairs them (``gpubench.measure.protocol.run_rounds``:
    blocks of each side in ABBA order, the first step after each switch untimed): exactly
    ``rounds``, or until ``rule`` stops them (``confirm_rule``: the profile's target width and
    time cap).
    Returns (ratios, baseline seconds, candidate seconds, facts: its training memory)."""
    with build(cfg) as case:
        if check:
            check_case(case)
        for _ in range(WARMUP_STEPS):
            case.synced_step()
        measured = run_rounds(lambda: _timed(case), rule or StoppingRule(0.0, rounds, rounds),
                              base_step=lambda: _timed(base_case))
        base_s, new_s = measured.base_s, measured.case_s
        facts = {}
        if check:
            if cfg.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            forward, case.forward = case.forward, case.counted_forward  # as the suite counts
            try:
                with SavedActivations(case.model) as saved:
                    case.step()
            finally:
                case.forward = forward
            facts["training_memory_bytes"] = float(
                sum(state_breakdown(case.model, case.optimizer).values())
                + saved.per_micro_batch_bytes)
            if cfg.device == "cuda":
                facts["peak_memory_bytes"] = float(torch.cuda.max_memory_allocated())
    return [b / n for b, n in zip(base_s, new_s, strict=True)], base_s, new_s, facts


@dataclass
class Diagnosis:
    mfu: float | None
    optimizer_share: float
    reduced_speedup: float | None
    """How much faster the device multiplies in bf16 than in fp32 (measured matmul peaks)."""
    step_s: float
    bound: str
    predictions: dict[str, str]
    """Technique -> "helps", "hurts" or "neutral", with the reason after a colon."""


def diagnose(base: RunConfig, base_case) -> Diagnosis:
    """What bounds the baseline's step and which techniques that predicts will help."""
    from gpubench.measure.flops import counting_flops, matmul_peak_flops

    with base_case.precision.math_mode():
        steps = [_timed(base_case) for _ in range(3)]
        step_s = min(steps)
        with counting_flops() as counted:
            base_case.step()
        opt = []
        for _ in range(3):
            start = time.perf_counter()
            base_case.optimizer.step()
            base_case.synchronize()
            opt.append(time.perf_counter() - start)
    fp32 = matmul_peak_flops(str(base_case.device), "fp32")
    mfu = counted.result.model_total / step_s / fp32 if fp32 else None
    reduced = None
    if base.device == "cuda" or "bf16" in native_cpu_precisions():
        reduced = matmul_peak_flops(str(base_case.device), "bf16") / fp32
    share = min(1.0, min(opt) / step_s)
    if mfu is not None and mfu >= 0.3:
        bound = f"compute (matmuls at {mfu:.0%} of the fp32 peak)"
    elif base.device == "cuda" and step_s < 0.01:
        bound = f"launch and host overhead (a {step_s * 1e3:.1f} ms step of small kernels)"
    else:
        bound = ("memory traffic and small ops (matmuls at "
                 f"{mfu:.0%} of the fp32 peak)" if mfu is not None else "unknown")
    p = {}
    if reduced is not None:
        p["precision"] = (("helps" if reduced > 1.3 and (mfu or 0) > 0.05 else "neutral")
                          + f": reduced-precision matmuls run {reduced:.1f}x fp32's here")
    p["optimizer_impl"] = (("helps" if share > 0.1 else "neutral")
                           + f": the optimizer takes {share:.0%} of the step")
    p["checkpointing"] = "hurts: it re-runs each block's forward in backward (memory, not speed)"
    p["micro_batch"] = ("hurts: smaller micro-batches run more, smaller kernels for the same "
                        "samples")
    p["channels_last"] = ("helps: NHWC convolutions on tensor cores" if base.device == "cuda"
                          else "neutral: the CPU's convolutions gain little from NHWC")
    hf = base.workload.facts.hf_attention
    if hf:
        p["attn_implementation"] = (
            "hurts: eager attention materialises the scores and runs softmax as separate ops"
            if hf != "eager" else "helps: sdpa fuses attention into one kernel")
    p["offload"] = "hurts: every saved activation is copied to the host and back (memory, not " \
        "speed)"
    p["attention"] = "neutral: torch's default already picks the fastest supported kernel"
    p["compile"] = ("helps: fused kernels and fewer launches" if not bound.startswith("compute")
                    else "neutral: a compute-bound step leaves little for fusion")
    return Diagnosis(mfu, share, reduced, step_s, bound, p)


def _changed(cfg: RunConfig, base: RunConfig) -> list[str]:
    """The search dimensions in which ``cfg`` differs from ``base``."""
    return [d for d in DIMENSIONS
            if (cfg.resolved_micro_batch if d == "micro_batch" else getattr(cfg, d))
            != (base.resolved_micro_batch if d == "micro_batch" else getattr(base, d))]


def _priority(cfg: RunConfig, base: RunConfig, diagnosis: Diagnosis) -> float:
    """Higher for configurations made of techniques predicted to help."""
    score = {"helps": 1.0, "neutral": 0.0, "hurts": -1.0}
    return sum(score[diagnosis.predictions.get(d, "neutral").split(":")[0]]
               for d in _changed(cfg, base))


def _speed_summary(base_s: list[float], new_s: list[float]) -> dict:
    """The paired speed ratio with its interval and p, and the median step seconds of each
    side (``step_time_s``: the candidate's, whose throughput a price turns into a cost)."""
    est = compare_paired(np.asarray(base_s), np.asarray(new_s))
    return {"speedup": est.ratio, "low": est.low, "high": est.high, "p_value": est.p_value,
            "step_time_s": float(np.median(new_s)),
            "baseline_step_time_s": float(np.median(base_s))}


def _significant(conf: dict) -> bool:
    """Faster by ``MIN_EFFECT`` at least, with the test and the whole interval agreeing."""
    return conf["p_value"] < ALPHA and conf["speedup"] >= 1 + MIN_EFFECT and conf["low"] > 1


@dataclass
class TuneResult:
    model: str
    device: str
    profile: str
    global_batch: int
    budget_bytes: float | None
    baseline: str
    diagnosis: dict
    candidates: list[dict]
    confirmed: list[dict]
    winner: dict
    ablation: list[dict]
    measured_s: float
    """Seconds of the search's measurements: building, checking and timing candidates, the
    memory model's counts included (what an exhaustive sweep of the space is compared on)."""
    complete: bool
    ablation_s: float = 0.0
    left_out: list[str] = field(default_factory=list)
    """Values of the searched techniques this device or workload cannot use, each with why."""
    name: str = ""
    """The workload's name (the model column of the suite's records)."""
    diagnosis_s: float = 0.0
    """Seconds of the diagnosis (the device's matmul peaks, a counted baseline step): a fixed
    cost of the device and model, whatever the space."""
    fingerprint: dict | None = None
    """Where, with what and when the tune measured (``gpubench.measure.machine.fingerprint``):
    the answer of a run uses the tune only when the run's machine and libraries are the
    same."""
    input_shape: list[int] | None = None
    """The shape of the workload's first input at the baseline's micro-batch (a language
    model's ``[batch, sequence]``: its tokens per sample)."""
    baseline_step_time_s: float | None = None
    """The baseline's step seconds in the confirmation rounds (the median of each
    confirmation's median); None where no finalist was confirmed."""


class Tuner:
    """One tune of ``spec`` into ``out`` (``tune.json``, ``tune.md``); ``progress`` receives a
    line per measurement."""

    def __init__(self, spec: str, profile: str, device: str, out: Path, *,
                 global_batch: int | None = None, budget_bytes: float | None = None,
                 time_s: float | None = None, dims: tuple[str, ...] = DEFAULT_SEARCH,
                 compile_: bool = False, resume: bool = False, ablate: bool = True,
                 progress: Callable[[str], None] = print):
        self.base = baseline(spec, profile, device)
        if global_batch is None:
            global_batch = self.base.global_batch
        if not isinstance(global_batch, int) or global_batch < 1:
            raise TuneError(f"--global-batch must be a positive integer; got {global_batch!r}")
        if not micro_batches(global_batch, self.base.workload.min_batch):
            raise TuneError(
                f"--global-batch {global_batch}: no micro-batch of {self.base.name} divides it "
                f"(its smallest micro-batch is {self.base.workload.min_batch}: BatchNorm needs "
                "two samples)")
        bad = [d for d in dims if d not in DIMENSIONS]
        if bad or not dims:
            raise TuneError(f"techniques must be from {', '.join(DIMENSIONS)}; got "
                            f"{','.join(dims)!r}")
        if budget_bytes is None and device == "cuda":
            budget_bytes = float(torch.cuda.get_device_properties(0).total_memory)
        self.base = with_micro(self.base, global_batch, global_batch)
        self.spec, self.profile, self.device, self.out = spec, profile, device, Path(out)
        self.global_batch, self.budget = global_batch, budget_bytes
        self.time_s, self.dims, self.compile = time_s, tuple(dims), compile_
        self.progress = progress
        self.path = self.out / "tune.json"
        self.state = self._load() if resume else None
        if resume and self.state is None:
            raise TuneError(f"--resume: no tune to continue in {self.out}/ (no tune.json)")
        self.measured_s = self.state["measured_s"] if self.state else 0.0
        self.ablation_s = 0.0
        self.ablate = ablate

    # -- the journal --------------------------------------------------------------------------
    def _identity(self) -> dict:
        return {"version": VERSION, "model": self.spec, "profile": self.profile,
                "device": self.device, "global_batch": self.global_batch,
                "budget_bytes": self.budget, "dims": list(self.dims), "compile": self.compile}

    def _load(self) -> dict | None:
        if not self.path.exists():
            return None
        try:
            state = json.loads(self.path.read_text())
        except (OSError, ValueError) as err:
            why = err.strerror if isinstance(err, OSError) else "not valid JSON (truncated?)"
            raise TuneError(f"--resume: cannot read {self.path}: {why}; start a new tune "
                            "without --resume") from None
        if not isinstance(state, dict):
            raise TuneError(f"--resume: {self.path} holds no tune; start a new tune without "
                            "--resume")
        if state.get("identity") != self._identity():
            raise TuneError(f"--resume: {self.path} is a tune of another search "
                            f"({state.get('identity')}); start a new one in another --out")
        return state

    def _save(self, **parts) -> None:
        state = self.state or {"identity": self._identity(), "rungs": {}, "confirmed": {},
                               "ablation": {}}
        state.update(parts)
        state["measured_s"] = self.measured_s
        self.state = state
        self.out.mkdir(parents=True, exist_ok=True)
        atomic.write_json(self.path, state, indent=1)

    # -- the search ---------------------------------------------------------------------------
    def _measure(self, base_case, cfg: RunConfig, rounds: int, check: bool = False,
                 ablation: bool = False, rule: StoppingRule | None = None):
        start = time.perf_counter()
        try:
            return paired_ratios(base_case, cfg, rounds, check=check, rule=rule)
        finally:
            if ablation:
                self.ablation_s += time.perf_counter() - start
            else:
                self.measured_s += time.perf_counter() - start

    def _out_of_time(self, started: float) -> bool:
        return self.time_s is not None and time.perf_counter() - started > self.time_s

    def run(self) -> TuneResult:
        started = time.perf_counter()
        setup_start = started
        base = self.base
        reason = unsupported_reason(base)
        if reason:
            raise TuneError(f"the baseline {base.id} cannot run here: {reason}")
        memory = MemoryModel()
        with build(base) as base_case:
            base_case.synced_step()
            self.progress(f"gpubench tune: {base.id}, global batch {self.global_batch}: "
                          "diagnosing the baseline step ...")
            diagnosis = diagnose(base, base_case)
            searched = space_values(base, self.global_batch, self.dims, self.compile)
            diagnosis.predictions = {d: v for d, v in diagnosis.predictions.items()
                                     if len(searched.get(d, ())) > 1}
            diagnosis_s = time.perf_counter() - setup_start
            setup_start = time.perf_counter()
            self.progress(f"gpubench tune: bound by {diagnosis.bound}")
            cands = [Candidate(c) for c in search_space(base, self.global_batch, self.dims,
                                                        self.compile)]
            for c in cands:
                if c.cfg != base:
                    c.pruned = unsupported_reason(c.cfg)
            if self.budget is not None:
                for c in cands:
                    if c.pruned is None:
                        c.predicted_bytes = memory.predict(c.cfg)
                        host = memory.predict_host(c.cfg)
                        free = host_memory_free() if host else None
                        if c.predicted_bytes > self.budget:
                            c.pruned = (f"predicted {_size(c.predicted_bytes)}, over the "
                                        f"budget of {_size(self.budget)}")
                        elif free is not None and host > free:
                            c.pruned = (f"offloads {_size(host)} to host memory, which has "
                                        f"{_size(free)} available")
                if base.id in {c.id for c in cands if c.pruned}:
                    raise TuneError(
                        f"--budget {_size(self.budget)}: not even the baseline fits "
                        f"(predicted {_size(cands[0].predicted_bytes)})")
            alive = sorted([c for c in cands if c.pruned is None and c.cfg != base],
                           key=lambda c: -_priority(c.cfg, base, diagnosis))
            self.measured_s += time.perf_counter() - setup_start
            self.progress(f"gpubench tune: {len(cands)} configurations, "
                          f"{sum(c.pruned is not None for c in cands)} pruned, {len(alive)} to "
                          "search")
            rung, rounds = 0, RUNG_ROUNDS
            done = (self.state or {}).get("rungs", {})
            while alive:
                for i, c in enumerate(alive):
                    key = f"{rung}:{c.id}"
                    if key in done:
                        c.ratios += done[key]
                    elif not self._out_of_time(started):
                        try:
                            ratios, _, _, _ = self._measure(base_case, c.cfg, rounds)
                        except (RuntimeError, TrainingCheckError) as err:
                            c.pruned = f"failed to run: {str(err).splitlines()[0][:200]}"
                            ratios = []
                        c.ratios += ratios
                        done[key] = ratios
                        self._save(rungs=done)
                    c.rung = rung
                    self.progress(f"gpubench tune: rung {rung} [{i + 1}/{len(alive)}] {c.id}: "
                                  + (f"{c.speed:.2f}x" if c.ratios else "not measured ("
                                     + (c.pruned or "out of --time") + ")"))
                alive = [c for c in alive if c.pruned is None and c.ratios]
                if len(alive) <= FINALISTS + 1 or self._out_of_time(started):
                    break
                alive = sorted(alive, key=lambda c: -c.speed)[:max(FINALISTS,
                                                                   math.ceil(len(alive) * KEEP))]
                if len(alive) <= FINALISTS:
                    break  # each is a finalist whatever another rung measured
                rung, rounds = rung + 1, rounds * 2
            finalists = sorted(alive, key=lambda c: -c.speed)[:FINALISTS]
            confirmed = self._confirm(base_case, finalists, cands)
            winner = max((c for c in confirmed if c.get("check") == "passed"
                          and _significant(c)), key=lambda c: c["speedup"], default=None)
            if winner is None:
                best = max((c for c in confirmed if c.get("check") == "passed"),
                           key=lambda c: c["speedup"], default=None)
                winner = {"case_id": base.id, "speedup": 1.0, "low": 1.0, "high": 1.0,
                          "p_value": 1.0, "config": base, "check": "baseline",
                          "why": "no configuration beat the baseline significantly by "
                          f"{MIN_EFFECT:.0%}" + ("" if best is None else (
                              f" (the fastest confirmed, {best['case_id']}: "
                              f"{best['speedup']:.2f}x [{best['low']:.2f}-"
                              f"{best['high']:.2f}], p={best['p_value']:.2g})"))}
            ablation = self._ablate(base_case, winner) if self.ablate else []
        base_times = [c["baseline_step_time_s"] for c in confirmed
                      if isinstance(c.get("baseline_step_time_s"), float)]
        base_step_s = statistics.median(base_times) if base_times else None
        if winner["case_id"] == base.id:
            winner["step_time_s"] = base_step_s
        self.winner_config = winner["config"]
        result = TuneResult(
            self.spec, self.device, self.profile, self.global_batch, self.budget, base.id,
            {**diagnosis.__dict__, "memory_counts": memory.counted},
            [{"case_id": c.id, "speed": c.speed if c.ratios else None,
              "rounds": len(c.ratios), "rung": c.rung,
              "pruned": c.pruned or (None if c.ratios or c.rung < 0 else "out of --time"),
              "predicted_bytes": c.predicted_bytes,
              "changed": _changed(c.cfg, base)} for c in cands],
            [{k: v for k, v in c.items() if k != "config"} for c in confirmed],
            {k: v for k, v in winner.items() if k != "config"} | {
                "config": _config_fields(winner["config"])}, ablation,
            self.measured_s, not self._out_of_time(started), self.ablation_s,
            left_out(base, self.global_batch, self.dims, self.compile), base.name, diagnosis_s,
            fingerprint(self.device), base.workload.input_shape(base.resolved_micro_batch),
            base_step_s)
        self._save(result=result.__dict__)
        return result

    def _confirm(self, base_case, finalists: list[Candidate],
                 cands: list[Candidate]) -> list[dict]:
        """The finalists through the check and ``CONFIRM_ROUNDS`` paired rounds; one that fails
        the check is replaced by the next-fastest candidate."""
        out, done = [], (self.state or {}).get("confirmed", {})
        queue = list(finalists)
        reserve = sorted([c for c in cands if c.ratios and c not in finalists],
                         key=lambda c: -c.speed)
        while queue and len([c for c in out if c["check"] == "passed"]) < FINALISTS:
            c = queue.pop(0)
            if c.id in done:
                entry = done[c.id]
            else:
                try:
                    _, base_s, new_s, facts = self._measure(base_case, c.cfg, CONFIRM_ROUNDS,
                                                            check=True,
                                                            rule=confirm_rule(c.cfg))
                    entry = {"case_id": c.id, "check": "passed", **_speed_summary(base_s, new_s),
                             **facts, "predicted_bytes": c.predicted_bytes}
                    over = over_budget(entry, self.budget)
                    if over:
                        entry["check"] = over
                        if reserve:
                            queue.append(reserve.pop(0))
                except TrainingCheckError as err:
                    entry = {"case_id": c.id, "check": f"failed: {str(err).splitlines()[0]}"}
                    if reserve:
                        queue.append(reserve.pop(0))
                done[c.id] = entry
                self._save(confirmed=done)
            self.progress(f"gpubench tune: confirmed {c.id}: " + (
                f"{entry['speedup']:.2f}x [{entry['low']:.2f}-{entry['high']:.2f}]"
                if entry["check"] == "passed" else entry["check"]))
            out.append({**entry, "config": c.cfg})
        return out

    def _ablate(self, base_case, winner: dict) -> list[dict]:
        cfg, base = winner["config"], self.base
        done, out = (self.state or {}).get("ablation", {}), []
        for d in _changed(cfg, base):
            back = (with_micro(cfg, base.resolved_micro_batch, self.global_batch)
                    if d == "micro_batch" else cfg.with_(**{d: getattr(base, d)}))
            if back == base:
                entry = {"removed": d, "case_id": back.id, "speedup": 1.0, "low": 1.0,
                         "high": 1.0, "p_value": 1.0}
            elif d in done:
                entry = done[d]
            else:
                try:
                    _, base_s, new_s, _ = self._measure(base_case, back, CONFIRM_ROUNDS,
                                                        ablation=True,
                                                        rule=confirm_rule(back))
                    entry = {"removed": d, "case_id": back.id, **_speed_summary(base_s, new_s)}
                except (RuntimeError, ValueError) as err:
                    entry = {"removed": d, "case_id": back.id,
                             "error": str(err).splitlines()[0]}
                done[d] = entry
                self._save(ablation=done)
            self.progress(f"gpubench tune: without {d}: " + (
                f"{entry['speedup']:.2f}x" if "speedup" in entry else entry["error"]))
            out.append(entry)
        return out


def exhaustive(spec: str, profile: str, device: str, *, global_batch: int | None = None,
               dims: tuple[str, ...] = DEFAULT_SEARCH, progress: Callable[[str], None] = print
               ) -> dict:
    """Every configuration of the tuner's space measured as the tuner confirms its finalists
    (the training check, then ``CONFIRM_ROUNDS`` rounds paired with the baseline's): what a
    search has to beat. Returns the entries, the winner (the fastest significant one, else
    the baseline) and the measured seconds."""
    tuner = Tuner(spec, profile, device, Path("."), global_batch=global_batch, dims=dims,
                  progress=progress)
    base, entries, start = tuner.base, [], time.perf_counter()
    with build(base) as base_case:
        base_case.synced_step()
        for cfg in search_space(base, tuner.global_batch, tuner.dims):
            if cfg == base or unsupported_reason(cfg):
                continue
            try:
                _, base_s, new_s, _ = paired_ratios(base_case, cfg, CONFIRM_ROUNDS, check=True,
                                                    rule=confirm_rule(cfg))
            except (TrainingCheckError, RuntimeError):
                continue
            entries.append({"case_id": cfg.id, "check": "passed",
                            **_speed_summary(base_s, new_s)})
            progress(f"gpubench tune (exhaustive): {cfg.id}: {entries[-1]['speedup']:.2f}x")
    winner = max((e for e in entries if _significant(e)), key=lambda e: e["speedup"],
                 default={"case_id": base.id, "speedup": 1.0, "low": 1.0, "high": 1.0})
    return {"entries": entries, "winner": winner, "baseline": base.id,
            "measured_s": time.perf_counter() - start}


def _config_fields(cfg: RunConfig) -> dict:
    return {**{d: getattr(cfg, d) for d in DIMENSIONS if d != "micro_batch"},
            "micro_batch": cfg.resolved_micro_batch, "accum_steps": cfg.accum_steps,
            "optimizer": cfg.optimizer, "compile_mode": cfg.compile_mode}


def case_command(result: TuneResult) -> str:
    """The ``gpubench case`` command that re-measures the winner."""
    c = result.winner["config"]
    flags = [f"--model {result.model}", f"--profile {result.profile}",
             f"--device {result.device}", f"--precision {c['precision']}",
             f"--micro-batch {c['micro_batch']}", f"--accum-steps {c['accum_steps']}",
             f"--optimizer-impl {c['optimizer_impl']}"]
    flags += [f"--{f.replace('_', '-')}" for f in ("checkpointing", "channels_last", "offload",
                                                   "compile") if c.get(f)]
    flags += [f"--{f.replace('_', '-')} {c[f]}" for f in ("attn_implementation", "attention")
              if c.get(f, "default") != "default"]
    return "gpubench case " + " ".join(flags)


def snippet(result: TuneResult) -> str:
    """A training loop with the winner's settings, to paste into the user's script."""
    c = result.winner["config"]
    dev = result.device
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp8": "torch.bfloat16",
             "fp8-rowwise": "torch.bfloat16"}.get(c["precision"])
    opt_kw = {"default": "", "foreach": ", foreach=True", "fused": ", fused=True"}[
        c["optimizer_impl"]]
    lr = LEARNING_RATES[c["optimizer"]]  # the suite's (``build_optimizer``): yours may differ
    optimizer = {"sgd": f"torch.optim.SGD(model.parameters(), lr={lr:g}, momentum=0.9{opt_kw})",
                 "adam": f"torch.optim.Adam(model.parameters(), lr={lr:g}{opt_kw})",
                 "adamw": f"torch.optim.AdamW(model.parameters(), lr={lr:g}, "
                          f"weight_decay=0.01{opt_kw})"}[c["optimizer"]]
    lines = ["import torch", ""]
    if c.get("attention", "default") != "default":
        lines.insert(1, "from torch.nn.attention import SDPBackend, sdpa_kernel")
    from gpubench.train.precision import Precision

    # The math settings the measured case ran with (``Precision.math_settings``).
    math = Precision(c["precision"], dev).math_settings()
    lines.append(f'torch.set_float32_matmul_precision("{math["float32_matmul_precision"]}")')
    if dev == "cuda":
        lines += [f"torch.backends.cudnn.allow_tf32 = {math['cudnn_allow_tf32']}"
                  + ("" if math["cudnn_allow_tf32"] else "  # PyTorch's default is True"),
                  f"torch.backends.cudnn.benchmark = {math['cudnn_benchmark']}"]
    layout = ", memory_format=torch.channels_last" if c["channels_last"] else ""
    lines += [f'model = build_model().to("{dev}"{layout})']
    if c.get("attn_implementation", "default") != "default":
        lines.append(f'model.set_attn_implementation("{c["attn_implementation"]}")  '
                     "# transformers")
    if c["precision"] in ("fp8", "fp8-rowwise"):
        name = "tensorwise" if c["precision"] == "fp8" else "rowwise"
        recipe = "" if name == "tensorwise" else (
            ', config=Float8LinearConfig.from_recipe_name("rowwise")')
        lines += ["from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
                  "from torchao.float8 import _auto_filter_for_recipe",
                  "# the linears torchao's filter picks (the measured case's fp8_layers auto),",
                  "# under bf16 autocast",
                  f'convert_to_float8_training(model{recipe}, module_filter_fn='
                  f'_auto_filter_for_recipe("{name}", filter_fqns=[]))']
    if c["checkpointing"]:
        lines += ["# activation checkpointing: wrap each block's forward, for example",
                  "# from torch.utils.checkpoint import checkpoint",
                  "# block.forward = functools.partial(checkpoint, block.forward, "
                  "use_reentrant=False)"]
    lines.append(f"optimizer = {optimizer}")
    if c["precision"] == "fp16":
        lines.append(f'scaler = torch.amp.GradScaler("{dev}")')
    if c.get("offload") and dev == "cuda":
        # The hooks the case measured (pinned copies on a side stream, non_blocking), not
        # save_on_cpu, whose copies block on some torch versions.
        lines += ["from gpubench.train.implementations import ActivationOffload",
                  "# the measured case's activation offload: each saved tensor copied to pinned",
                  "# host memory on a side stream, non_blocking, and back in backward",
                  'offload = ActivationOffload("cuda")']
    if c["compile"]:
        mode = "" if c["compile_mode"] == "default" else f', mode="{c["compile_mode"]}"'
        lines.append(f"model = torch.compile(model{mode})")
    k = c["accum_steps"]
    lines += [f"accum_steps, micro_batch = {k}, {c['micro_batch']}  # "
              f"global batch {result.global_batch}", "",
              "for batches in loader_of(micro_batch):  # accum_steps micro-batches per step",
              "    optimizer.zero_grad(set_to_none=True)",
              "    for inputs, targets in batches:"]
    cl = ".to(memory_format=torch.channels_last)" if c["channels_last"] else ""
    lines.append(f'        inputs = inputs.to("{dev}", non_blocking=True){cl}')
    body = "loss = loss_fn(model(inputs), targets)" + (f" / {k}" if k > 1 else "")
    contexts = []
    if dtype:
        contexts.append(f'torch.autocast("{dev}", dtype={dtype})')
    if c.get("attention", "default") != "default":
        backend = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                   "cudnn": "CUDNN_ATTENTION", "math": "MATH"}[c["attention"]]
        contexts.append(f"sdpa_kernel(SDPBackend.{backend})")
    if c.get("offload"):  # the forward's saved tensors go to host memory, and come back in
        # backward, which runs outside the contexts (as autocast wants): on CUDA the measured
        # case's hooks (``ActivationOffload``), on the CPU the save_on_cpu they run there
        contexts.append("offload.saved_tensors()" if dev == "cuda"
                        else "torch.autograd.graph.save_on_cpu(pin_memory=False)")
    backward = "loss.backward()" if c["precision"] != "fp16" else "scaler.scale(loss).backward()"
    if contexts:
        lines += [f"        with {', '.join(contexts)}:", f"            {body}"]
    else:
        lines.append(f"        {body}")
    lines.append(f"        {backward}")
    if c["precision"] == "fp16":
        lines += ["    scaler.step(optimizer)", "    scaler.update()"]
    else:
        lines.append("    optimizer.step()")
    return "\n".join(lines)


def _size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the figure at 1 or more."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def _mib(value) -> str:
    return "-" if value is None or value != value else f"{value / 2**20:,.1f} MiB"


def _money(value) -> str:
    return "-" if value is None or value != value else f"{value:.4g}"


def _cost_line(result: TuneResult, cost: dict) -> str:
    """The winner's cost per million samples (and tokens) beside the baseline's."""
    cases = cost["cases"]
    w, b = cases.get(result.winner["case_id"], {}), cases.get(result.baseline, {})
    tokens = cost.get("tokens_header") is not None

    def one(c: dict) -> str:
        return (f"{_money(c.get('cost_per_m_samples'))} per million samples"
                + (f" ({_money(c.get('cost_per_m_tokens'))} per million tokens)" if tokens
                   else ""))

    if result.winner["case_id"] == result.baseline:
        return f"At {cost['price']}, the baseline costs {one(b)}."
    return f"At {cost['price']}, the winner costs {one(w)}; the baseline {one(b)}."


def tune_markdown(result: TuneResult, cost: dict | None = None) -> str:
    """``tune.md``: the answer first, then why. ``cost``: what each confirmed configuration
    costs at a price per hour (``gpubench.analysis.cost.tune_cost``), as columns of the
    finalists' table beside the baseline's row."""
    w = result.winner
    n = len(result.candidates)
    pruned = [c for c in result.candidates if c["pruned"]]
    searched = [c for c in result.candidates if c["rounds"]]
    head = (f"**{w['case_id']}**: {w['speedup']:.2f}x the baseline's speed (95% CI "
            f"{w['low']:.2f}-{w['high']:.2f}) at global batch {result.global_batch}"
            if w["case_id"] != result.baseline else
            f"**the baseline ({result.baseline})**: {w.get('why', '')}")
    lines = [f"# gpubench tune: {result.model} ({result.device}, {result.profile})", "",
             f"Winner: {head}.", "",
             *([_cost_line(result, cost), ""] if cost else []),
             f"Measured on {describe_fingerprint(result.fingerprint)}. A `gpubench run` report "
             "beside it answers with this winner only on the same machine with the same "
             "library versions.", ""]
    if not result.complete:
        lines += ["The search stopped at its time limit (`--time`): later rungs were not "
                  "measured.", ""]
    lines += [f"Searched {len(searched)} of {n} configurations ({len(pruned)} pruned) in "
              f"{result.measured_s:.0f} s of measurement (diagnosis {result.diagnosis_s:.0f} s, "
              f"ablation {result.ablation_s:.0f} s on top).", "",
              "## Use it", "", "```python", snippet(result), "```", "",
              f"Re-measure it: `{case_command(result)}`", "",
              "## Diagnosis of the baseline step", "",
              f"Bound by **{result.diagnosis['bound']}**; the optimizer takes "
              f"{result.diagnosis['optimizer_share']:.0%} of the step.", "",
              "| technique | predicted | measured alone | right? |", "|---|---|---|---|"]
    alone = {tuple(c["changed"]): c for c in result.candidates if len(c["changed"]) == 1}
    for tech, pred in result.diagnosis["predictions"].items():
        c = alone.get((tech,))
        measured = (f"{c['speed']:.2f}x ({c['case_id']})" if c and c["rounds"] else "-")
        verdict = "-"
        if c and c["rounds"]:
            word = pred.split(":")[0]
            gain = c["speed"] >= 1 + MIN_EFFECT
            loss = c["speed"] <= 1 - MIN_EFFECT
            verdict = ("yes" if (word == "helps" and gain) or (word == "hurts" and loss)
                       or (word == "neutral" and not gain and not loss) else "no")
        lines.append(f"| {tech} | {pred} | {measured} | {verdict} |")
    heads = ["case", "check", "speedup", "95% CI", "training memory", "predicted"]
    costs = (cost or {}).get("cases", {})
    if cost:
        heads += ["samples/s", cost["samples_header"],
                  *([cost["tokens_header"]] if cost.get("tokens_header") else [])]

    def priced(case_id: str) -> str:
        if not cost:
            return ""
        c = costs.get(case_id, {})
        rate = c.get("samples_per_s")
        return (f" {'-' if rate is None else f'{rate:,.1f}'} | "
                f"{_money(c.get('cost_per_m_samples'))} |"
                + (f" {_money(c.get('cost_per_m_tokens'))} |" if cost.get("tokens_header")
                   else ""))

    lines += ["", "## Confirmed finalists", "", "| " + " | ".join(heads) + " |",
              "|" + "---|" * len(heads)]
    if cost:
        mark = " (the winner)" if result.baseline == w["case_id"] else ""
        lines.append(f"| {result.baseline} (the baseline){mark} | - | 1.00x | - | - | - |"
                     + priced(result.baseline))
    for c in result.confirmed:
        if c["check"] == "passed":
            mark = " (the winner)" if c["case_id"] == w["case_id"] else ""
            lines.append(f"| {c['case_id']}{mark} | passed | {c['speedup']:.2f}x | {c['low']:.2f}-"
                         f"{c['high']:.2f} | {_mib(c.get('training_memory_bytes'))} | "
                         f"{_mib(c.get('predicted_bytes'))} |" + priced(c["case_id"]))
        else:
            lines.append(f"| {c['case_id']} | {c['check']} | - | - | - | - |"
                         + " - |" * (len(heads) - 6))
    lines += ["", "## Ablation of the winner (each technique set back in turn)", ""]
    if result.ablation:
        lines += ["Each row is another configuration, the winner with one technique set back, "
                  "measured in rounds of its own: the winner's figure is the one above.", "",
                  "| without | case | speedup | 95% CI |", "|---|---|---|---|"]
        for a in result.ablation:
            lines.append(f"| {a['removed']} | {a['case_id']} | " + (
                f"{a['speedup']:.2f}x | {a['low']:.2f}-{a['high']:.2f} |" if "speedup" in a
                else f"{a['error']} | - |"))
    else:
        lines.append("The winner is the baseline: nothing to take away.")
    if result.left_out:
        lines += ["", "## Left out of the space", "",
                  *(f"- {line}" for line in result.left_out)]
    lines += ["", "## Every configuration", "",
              "| case | rounds | last rung | speed (paired rounds) | pruned |",
              "|---|---|---|---|---|"]
    for c in sorted(result.candidates, key=lambda c: -(c["speed"] if c["rounds"] else -1)):
        speed = f"{c['speed']:.2f}x" if c["rounds"] else "-"
        lines.append(f"| {c['case_id']} | {c['rounds']} | {c['rung'] if c['rung'] >= 0 else '-'}"
                     f" | {speed} | {c['pruned'] or ''} |")
    return "\n".join(lines) + "\n"


def write_tune(result: TuneResult, out: Path, parity: str = "", cost: dict | None = None
               ) -> Path:
    """``tune.md`` into ``out``; ``parity``: the Markdown of the winner's convergence parity
    (``gpubench tune --parity``), appended; ``cost``: as ``tune_markdown``'s."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tune.md"
    text = tune_markdown(result, cost)
    if parity:
        text += "\n## Convergence parity of the winner\n\n" + parity
    atomic.write_text(path, text)
    return path
