"""The one measurement path: every case is checked, counted, timed and measured by one protocol.

A ``CaseProgram`` is one process's part of a case: the whole case for single-device, dp and
model-parallel cases, one rank for DDP and pipeline cases. Its methods are the protocol's
commands. A *launcher* sends each command to every process and returns their answers in rank
order, through the same ``call(command)`` interface:

- ``InProcess``: the program runs here (single, dp, model; the claims pairs; frontier tries);
- ``gpubench.launchers.workers.WorkerGroup``: one spawned worker process per rank (DDP, pipeline);
- ``gpubench.launchers.distributed.LocalRanks``: this process is one rank of a torchrun job.

``measure`` drives the protocol (like optimum-benchmark's launcher / scenario / tracker split):
prepare the data, check that the technique still trains, count FLOPs and saved activations,
warm up, time the rounds under the pytest-benchmark fixture, read the memory peaks, and
combine the processes' figures into one record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gpubench.launchers.workers import DEFAULT_TIMEOUT_S, WorkerTimeout, commanded
from gpubench.measure.flops import counting_flops, fp8_gemm_fraction
from gpubench.measure.memory import (
    SavedActivations,
    allocator_counters,
    freeze_long_lived,
    read_peak,
    release_free_memory,
    reset_peak,
    resident_base,
    state_breakdown,
    steady_malloc,
)
from gpubench.measure.telemetry import Sampler
from gpubench.train.build import build
from gpubench.train.checks import REFERENCE_GRADIENTS, check_case
from gpubench.train.config import RunConfig, count_config
from gpubench.train.data import LOADER_PROBE_FIELDS, measure_loader
from gpubench.util.watchdog import time_limit
from gpubench.workloads.api import prime_initial_module

LOADER_PROBE_BATCHES = 10
"""Batches the loader-only measurement reads after its first one."""

MIN_ROUNDS = 6
"""Timed rounds a case keeps however slow its step: the statistics need a sample (with 5 paired
rounds the Wilcoxon signed-rank test can never reach p < 0.05; with 6 it can)."""


EXTEND_FACTOR = 4
"""A fast case's timed rounds grow to at most this many times ``rounds`` (``budget_rounds``)."""


def budget_rounds(rounds: int, step_time_s: float, max_time_s: float | None,
                  min_time_s: float | None = None) -> int:
    """Timed rounds for a step of ``step_time_s``: ``rounds``, raised for a fast step until the
    timed rounds take ``min_time_s`` (at most ``EXTEND_FACTOR`` times ``rounds``), and reduced
    for a slow one (never below ``MIN_ROUNDS``) so that they take about ``max_time_s``, like
    pytest-benchmark's --benchmark-max-time. More rounds of a fast step cost little and
    tighten its paired interval: the median of 40 per-round ratios moves about half as much
    from run to run as that of 12. With a target width (``StoppingRule``) this is the most
    rounds a case runs."""
    if step_time_s <= 0:
        return rounds
    if min_time_s:
        rounds = max(rounds, min(EXTEND_FACTOR * rounds, math.ceil(min_time_s / step_time_s)))
    if max_time_s:
        rounds = max(min(rounds, MIN_ROUNDS), min(rounds, int(max_time_s / step_time_s)))
    return rounds


BLOCK_STEPS = 4
"""Steps of one side in a block of paired rounds that follows the other side's block, the
first of which is not timed. Alternating single steps of two models in one process slows both
(each step starts on caches, allocator free lists and page mappings the other side's step
left): the baseline paired that way ran 5-14% slower than the baseline case itself, and the
speedups moved by up to 11%. In blocks, the first step after a switch absorbs that; the others
run as in a process of its own. A block that follows its own side's (the middle of ABBA's
"case, case" and of "base, base" across two halves) has no switch to absorb: all of its
``BLOCK_STEPS - 1`` steps are timed."""


def block_order(blocks: int) -> list[str]:
    """The sides of ``blocks`` consecutive blocks in ABBA order ("base", "case", "case",
    "base", ...): each side goes first as often as second, so a trend over the rounds (a
    clock ramping, a neighbour starting) weighs on both alike."""
    pattern = ("base", "case", "case", "base")
    return [pattern[i % 4] for i in range(blocks)]


def relative_half_width(low: float, high: float, estimate: float) -> float:
    """Half the interval's width over the estimate (0.015: +-1.5%); inf where undefined."""
    if not (estimate and math.isfinite(low) and math.isfinite(high)):
        return math.inf
    return (high - low) / 2 / abs(estimate)


@dataclasses.dataclass(frozen=True)
class StoppingRule:
    """When a case's timed rounds stop: once the paired speedup's 95% interval has a relative
    half-width of at most ``target_width`` (0: never early), else at ``max_rounds`` or when the
    case's timed rounds have taken ``max_time_s`` (its time cap), whichever comes first; never
    before ``min_rounds``."""

    target_width: float
    min_rounds: int
    max_rounds: int
    max_time_s: float | None = None

    @classmethod
    def for_case(cls, rounds: int, step_time_s: float, max_time_s: float | None,
                 min_time_s: float | None, target_width: float) -> StoppingRule:
        """The rule of a case whose warm step took ``step_time_s``: without a target width,
        exactly ``budget_rounds`` rounds (as many as asked, fitted to the times); with one, at
        least ``MIN_ROUNDS`` (or ``rounds`` if fewer), at most ``EXTEND_FACTOR`` times
        ``rounds`` within ``max_time_s``, stopping at the width."""
        if not target_width:
            n = budget_rounds(rounds, step_time_s, max_time_s, min_time_s)
            return cls(0.0, n, n, None)
        most = max(rounds, EXTEND_FACTOR * rounds)
        return cls(target_width, min(rounds, MIN_ROUNDS), most, max_time_s or None)

    def stop_reason(self, rounds: int, width: float, timed_s: float) -> str | None:
        """Why the rounds stop after ``rounds`` rounds whose interval has half-width ``width``
        and which took ``timed_s`` seconds: "width", "rounds", "time", or None to go on."""
        if rounds < self.min_rounds:
            return None
        if self.target_width and width <= self.target_width:
            return "width"
        if rounds >= self.max_rounds:
            return "rounds"
        if self.max_time_s and timed_s >= self.max_time_s:
            return "time"
        return None


@dataclasses.dataclass
class PairedRounds:
    """The outcome of ``run_rounds``: each side's timed seconds (``base_s[i]`` paired with
    ``case_s[i]``; no baseline: empty), why the rounds stopped and the interval's half-width
    then."""

    case_s: list[float]
    base_s: list[float]
    stop_reason: str
    width: float
    discarded: int = 0
    """Untimed first steps of blocks after a switch (both sides)."""

    @property
    def ratio(self) -> float:
        """The median per-round ratio, baseline over case (``compare_paired``'s figure)."""
        from gpubench.util.stats import per_round_ratios

        return float(statistics.median(per_round_ratios(self.base_s, self.case_s)))


def achieved_width(case_s: list[float], base_s: list[float] | None) -> float:
    """Relative half-width of the 95% interval the rounds give: of the paired speedup
    (``gpubench.util.stats.compare_paired``) with a baseline, of the median step time
    without."""
    from gpubench.util.stats import median_ci, paired_ratio_ci, per_round_ratios

    if len(case_s) < 2:
        return math.inf
    if base_s:  # the interval of compare_paired's ratio, without its test (not needed here)
        low, high = paired_ratio_ci(base_s, case_s, n_resamples=WIDTH_RESAMPLES)
        return relative_half_width(low, high, statistics.median(per_round_ratios(base_s, case_s)))
    low, high = median_ci(case_s, n_resamples=WIDTH_RESAMPLES)
    return relative_half_width(low, high, statistics.median(case_s))


WIDTH_RESAMPLES = 500
"""Bootstrap resamples of the width checks between blocks (a few ms each); the record's
interval is computed once at the end with the full count."""


def run_rounds(case_step, rule: StoppingRule, base_step=None,
               block_steps: int = BLOCK_STEPS, untimed=None) -> PairedRounds:
    """Timed rounds of ``case_step`` (a function of no arguments returning its seconds) until
    ``rule`` stops them. With ``base_step`` (the baseline's), in blocks of ``block_steps - 1``
    timed steps per side in ABBA order (``block_order``), each block that follows the other
    side's after an untimed step of its own (``BLOCK_STEPS``; the first two blocks follow the
    warm-up and the partner's build): the k-th timed step of a case block is paired with the
    k-th of the baseline block beside it. ``untimed`` wraps a function whose time the
    telemetry must not count as the case's (``Sampler.untimed``). The rule is asked after
    every pair of blocks (a whole ABBA half), and without a baseline after every
    ``block_steps`` rounds."""
    untimed = untimed or (lambda fn: fn)
    case_s: list[float] = []
    base_s: list[float] = []
    discarded = 0
    if base_step is None:
        while True:
            want = min(max(1, block_steps), max(1, rule.max_rounds - len(case_s)))
            case_s.extend(case_step() for _ in range(want))
            reason = _stop(rule, case_s, None)
            if reason:
                return PairedRounds(case_s, [], reason, achieved_width(case_s, None))
    per_block = max(1, block_steps - 1)
    base_discard = untimed(base_step)
    case_discard = untimed(case_step)
    base_timed = untimed(base_step)
    blocks, last = 0, None
    while True:
        # a block of each side, in ABBA order, then the rule
        want = min(per_block, max(1, rule.max_rounds - len(case_s)))
        for side in block_order(blocks + 2)[blocks:]:
            if side != last:  # a switch: its first step absorbs it, untimed
                (base_discard if side == "base" else case_discard)()
                discarded += 1
            if side == "base":
                base_s.extend(base_timed() for _ in range(want))
            else:
                case_s.extend(case_step() for _ in range(want))
            last = side
        blocks += 2
        reason = _stop(rule, case_s, base_s)
        if reason:
            return PairedRounds(case_s, base_s, reason, achieved_width(case_s, base_s),
                                discarded)


def _stop(rule: StoppingRule, case_s: list[float], base_s: list[float] | None) -> str | None:
    """``rule``'s reason after these rounds; the width is computed only where it can stop."""
    n = len(case_s)
    if n < rule.min_rounds:
        return None
    if n >= rule.max_rounds or (rule.max_time_s and sum(case_s) >= rule.max_time_s):
        width = math.inf  # cap reached: "width" still wins if the interval is tight
        if rule.target_width:
            width = achieved_width(case_s, base_s)
        return rule.stop_reason(n, width, sum(case_s))
    if not rule.target_width:
        return None
    return rule.stop_reason(n, achieved_width(case_s, base_s), sum(case_s))


def counted_step(case) -> tuple:
    """(model, step): the model and the training step (a function of no arguments) whose FLOPs
    and saved activations ``count`` measures.

    ``FlopCounterMode`` and ``saved_tensors_hooks`` see only the thread they were entered in,
    and ``nn.DataParallel`` runs each replica's forward in a thread of its own: counted
    through the wrapper, a DataParallel step would miss its forward FLOPs and all its saved
    activations (and count the replicas' broadcast weights as activations). The replicas
    compute the wrapped model's function on shards of the micro-batch, so for dp cases one
    step of the unwrapped model (``DataParallelLoss.dp.module``) on the full micro-batches, in
    this thread, counts the same FLOPs and the saved bytes of all replicas together. A compiled
    case is counted on its eager model (``_orig_mod``), whose ops its compiled code computes
    (fused kernels the counter would not see). Like the wrapped step, it trains the case's own
    parameters with the case's optimizer and batches."""
    model = case.model
    eager = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: its eager model
    inner = case.strategy.count_module(eager) or (eager if eager is not model else None)
    if inner is None:
        return model, case.step
    from gpubench.train.step import train_step

    def step():
        return train_step(inner, case.optimizer, case.batches, precision=case.precision,
                          accum_steps=case.cfg.accum_steps,
                          set_to_none=case.cfg.zero_grad_set_to_none,
                          after_step=case.after_step, forward=case.forward)

    return inner, step


_LAST_COUNT: dict = {}
"""The last FLOP and saved-activation count in this process, by ``count_key``: one entry, as a
run's cases of a model follow one another."""


def count_key(cfg: RunConfig, rank: int) -> tuple:
    """What a step's FLOPs and saved activations depend on: ``cfg`` less the techniques that
    change neither the ops a step runs nor the tensors autograd saves (``count_config``, from
    their declarations in ``gpubench.train.techniques``), and the rank. The optimizer's own
    arithmetic is no matmul, convolution or attention: FLOP counting leaves it out either way."""
    return (rank, count_config(cfg))


class CaseProgram:
    """One process's part of a case; each method is a command of the measurement protocol."""

    def __init__(self, rank: int, world_size: int, cfg: RunConfig,
                 local_rank: int | None = None, local_world_size: int | None = None,
                 data_dir: str | Path | None = None):
        local_rank = rank if local_rank is None else local_rank
        if cfg.multiprocess:
            if cfg.device == "cuda":
                torch.cuda.set_device(local_rank)
            # The ranks of a machine share its CPU cores (on CUDA too: the host side of each
            # step, the loader's collation, the optimizer's CPU work): split them instead of
            # every rank starting a thread per core.
            per_machine = local_world_size or world_size
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // per_machine))
        self.rank = rank
        steady_malloc()  # a step's time must not depend on what this process ran before
        import_lazy_modules()
        # The CPU peak's base, before the case's model: the suite's own state first (the
        # workload's facts, a probe build or a read of the run's facts cache, its libraries'
        # imports, the initial weights every case of the model copies), so that the training
        # peak above it is what a user's loop holds.
        cfg.workload.facts  # noqa: B018 - cached: its probe build (or read) happens now
        prime_initial_module(cfg.workload, cfg.seed)
        # gc.collect() in every reset_peak and resident_base scans only what cases create
        freeze_long_lived((cfg.workload.spec, cfg.seed))
        self.base_bytes = resident_base(cfg.device)
        self.case = build(cfg, rank, local_rank, Path(data_dir) if data_dir else None)
        self.start_bytes: list[int | None] = []
        self.start_counters: list[dict | None] = []
        self.times: list[float] = []
        self.waits_at_reset = 0
        self.last_loss: torch.Tensor | None = None
        self._counted: dict | None = None  # what the check's first step counted

    @property
    def cfg(self) -> RunConfig:
        return self.case.cfg

    def prepare(self) -> dict:
        """Bring the data path to its steady state and measure the loader alone: a decoded-sample
        cache is filled by one epoch (where the loading process survives the epoch: no workers,
        or persistent workers); then time to first batch, loader-only samples/s, epoch restart."""
        if self.cfg.loader.cached:
            for _ in self.case.loader:
                pass
        evictor = self.case.evictor
        if self.case.loader is None:  # device-resident data: no loader to measure
            info = dict.fromkeys(LOADER_PROBE_FIELDS)
        else:
            info = measure_loader(self.case.loader, LOADER_PROBE_BATCHES, evictor)
        info.update(self.case.facts)
        if evictor is not None:
            # Whether the files really left the page cache (a filesystem may ignore the drop).
            info["cold_resident_fraction"] = evictor.resident_after_eviction()
            info["cold_evict_s"] = statistics.median(evictor.evict_s)
            info["cold_files"] = len(evictor.files)
        return info

    def check(self) -> dict:
        """The training check (``gpubench.train.checks.check_case``). Its first training step also
        counts the case's FLOPs and saved activations (``count`` then returns them), unless
        the previous case's count is this one's (``count_key``), a technique that changes
        neither has a context around the step (activation offloading: the check's step runs
        under it, the count's without it), the case is compiled (its first step compiles, and
        is timed for ``compile_time_s``; the count runs the eager model, whose ops the
        compiled one computes), the case is DataParallel
        (counted on the unwrapped model, ``counted_step``) or a pipeline, whose first step
        sets its stages up with ``autograd.grad`` calls that saved-tensor hooks do not allow
        (it is counted over a step of its own)."""
        self._counted = None
        counting = (self.cfg.parallel not in ("dp", "pipeline") and not self.cfg.compile
                    and self.case.counted_forward is self.case.forward
                    and count_key(self.cfg, self.rank) not in _LAST_COUNT)
        held = REFERENCE_GRADIENTS.nbytes()
        with self.case.precision.math_mode():
            result = check_case(self.case,
                                around_first_step=self._counting if counting else None)
        # The reference gradients the check cached for later cases are the suite's state, not
        # the case's: on the CPU they join the resident base the training peak is taken above,
        # and the entries of another model the cache let go of (freed now) leave it.
        if self.base_bytes is not None and self.cfg.device == "cpu":
            self.base_bytes += REFERENCE_GRADIENTS.nbytes() - held
        out = dataclasses.asdict(result)
        if self.case.compile_cache is not None:  # what the check's compilation found cached
            out.update(self.case.compile_cache.counts())
        return out

    @contextlib.contextmanager
    def _counting(self, model=None):
        """Count the FLOPs and saved activations of what runs inside (on ``model``, default the
        case's) into ``self._counted``."""
        forward, self.case.forward = self.case.forward, self.case.counted_forward
        try:
            with (SavedActivations(model or self.case.model) as saved,
                  counting_flops() as counted):
                yield
        finally:
            self.case.forward = forward
        self._counted = {"flops": counted.result.total,
                         "model_flops": counted.result.model_total,
                         "uncounted_ops": counted.result.uncounted_ops,
                         "attention_kernels": counted.result.attention_kernels,
                         "fp8_flops": counted.result.fp8_flops,
                         "gemm_flops": counted.result.gemm_flops,
                         "activation_bytes": saved.per_micro_batch_bytes}

    def count(self) -> dict:
        """FLOPs of one step (ops counted as zero listed) and the saved activations of its
        largest micro-batch, on this process: those the check's first step counted, else the
        previous case's where they are this one's (``count_key``: an optimizer form, a memory
        or loader knob; ``count_reused``), else counted over one more step. DataParallel
        cases are counted on the unwrapped model (``counted_step``)."""
        key = count_key(self.cfg, self.rank)
        if self._counted is None and key in _LAST_COUNT:
            return dict(_LAST_COUNT[key], count_reused=True)
        if self._counted is None:
            model, step = counted_step(self.case)
            with self.case.precision.math_mode(), self._counting(model):
                step()
        _LAST_COUNT.clear()
        _LAST_COUNT[key] = self._counted
        return self._counted

    def step(self) -> float:
        """One synchronized training step; returns its seconds."""
        with self.case.precision.math_mode():
            start = time.perf_counter()
            loss = self.case.synced_step()
            elapsed = time.perf_counter() - start
        self.times.append(elapsed)
        self.last_loss = loss
        return elapsed

    def reset_peak(self) -> None:
        """Start the measured window: memory peaks, step times and loader waits."""
        self.times = []
        self.waits_at_reset = len(self.case.batches.waits)
        self.start_bytes = [reset_peak(d) for d in self.case.devices]
        self.start_counters = [allocator_counters(d) for d in self.case.devices]

    def reset_window(self) -> None:
        """Start a timed window whose memory an earlier window measured (an in-process case
        paired in this process): step times and loader waits restart; garbage is collected,
        but no freed memory is handed back to the system (which ``reset_peak`` does, and which
        makes the next step fault its pages in again)."""
        gc.collect()
        self.times = []
        self.waits_at_reset = len(self.case.batches.waits)

    def read_peak(self) -> dict:
        """Figures of the measured window on this process: each device's peak memory (on CUDA
        with the allocator's health over the window, ``gpubench.measure.memory.read_peak``), the
        exact state breakdown, the median step time and the loader's waits."""
        waits = list(self.case.batches.waits)[self.waits_at_reset:]
        loss = None if self.last_loss is None else self.last_loss.float().item()
        return {
            "devices": [read_peak(d, s, c, self.base_bytes) for d, s, c in zip(
                self.case.devices, self.start_bytes, self.start_counters, strict=True)],
            **state_breakdown(self.case.model, self.case.optimizer),
            "rank_step_time_s": statistics.median(self.times) if self.times else None,
            "loader_wait_s": sum(waits) / len(self.times) if self.times else None,
            "loader_stall_fraction": sum(waits) / sum(self.times) if self.times else None,
            "last_loss": loss,
        }

    def allreduce_probe(self, repeats: int = 5) -> float:
        """Median seconds of one all-reduce of a buffer the size of this rank's gradients: the
        communication one synchronized DDP backward performs (measured in isolation)."""
        numel = sum(p.numel() for p in self.case.model.parameters() if p.requires_grad)
        buf = torch.zeros(numel, device=self.case.device)
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            if buf.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])  # the first includes connection setup

    def noop(self) -> None:
        """Nothing: timing it measures gpubench's per-step process-management cost."""

    def trace(self, path_prefix: str) -> dict:
        """Profile a few steps, after the timed rounds: a Chrome trace ``<path_prefix>.json``
        (``-rank<r>.json`` per rank of a multi-process case) and this process's top operators
        (``gpubench.measure.trace``)."""
        from gpubench.measure.trace import trace_steps

        return trace_steps(self, path_prefix)

    def close(self) -> None:
        self.case.close()


def stop_loader_workers() -> None:
    """Stop the DataLoader workers of this process's live loader iterators at once (those of a
    case that timed out, ``InProcess``): torch's own shutdown waits 5 s for each worker stuck
    in the dataset before it terminates it. Each is terminated after its pids are taken out
    of torch's SIGCHLD check (which would raise about them later, anywhere), then the
    iterator's shutdown runs. Rank processes and other children are left alone."""
    import gc

    from torch.utils.data import _utils
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    for it in [o for o in gc.get_objects() if isinstance(o, _MultiProcessingDataLoaderIter)]:
        try:
            if getattr(it, "_shutdown", True):
                continue
            if getattr(it, "_worker_pids_set", False):
                _utils.signal_handling._remove_worker_pids(id(it))
                it._worker_pids_set = False
            for worker in getattr(it, "_workers", []):
                if worker.is_alive():
                    worker.terminate()
            it._shutdown_workers()
        except Exception:  # noqa: BLE001 - never hide the timeout behind a clean-up error
            pass


class CaseTimeout(WorkerTimeout):
    """A command of an in-process case did not finish within the timeout (``InProcess``)."""


PHASES = {
    "build": "building the case (model, data, optimizer)",
    "prepare": "preparing its data (the loader's first batches)",
    "check": "the training check",
    "count": "counting FLOPs",
    "step": "a training step",
    "read_peak": "reading its memory peaks",
    "trace": "profiling steps",
    "close": "closing the case (its loader workers)",
}
"""What each command of the protocol is doing, for the timeout's message."""


def import_lazy_modules() -> None:
    """Import what a case imports on first use, before its time limit is armed and before the
    CPU training peak's base is taken: torch's optimizers import ``torch._dynamo`` when the
    first one is made (about 2 s and 150 MB resident on a 2-core CPU), and the stopping rule's
    interval imports scipy between timed rounds (60 MB) in the process that runs the rounds:
    every process but a ``WorkerGroup`` rank (``commanded``: a DDP rank or baseline worker
    stepped by its host), which saves 0.7 s of a 2-core CPU per rank started. A limit that
    fires inside an import leaves modules half made (every later case of the process would
    fail on an unrelated ``AttributeError``), and an import inside the memory window would
    count as the case's."""
    import torch._dynamo  # noqa: F401

    if not commanded():
        import gpubench.util.stats  # noqa: F401  (scipy)


class InProcess:
    """The launcher of a single-process case: the program runs in this process. Like a rank's,
    each of its commands (the build, data preparation, check, count, every step, the close)
    must finish within ``timeout_s`` (``--timeout``; None: no limit), else the case fails with
    ``CaseTimeout``, one line naming the case and what hung (``gpubench.util.watchdog``: a call that
    cannot be interrupted ends the process instead)."""

    def __init__(self, cfg: RunConfig, data_dir: str | Path | None = None,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S, program: type | None = None,
                 args: tuple | None = None):
        """``program`` (default ``CaseProgram``) is built as ``program(0, 1, *args)``, as a
        rank of a ``WorkerGroup`` would be (``args`` default ``(cfg,)``, with ``data_dir``
        for a ``CaseProgram``)."""
        self.cfg, self.timeout_s = cfg, timeout_s
        self._id = cfg.id  # a computed property (~50 us): not in every step's limit
        self._in_rounds = False
        if timeout_s:
            import_lazy_modules()
        if program is None:
            self.program = self._bounded("build", CaseProgram, 0, 1, cfg, data_dir=data_dir)
        else:
            self.program = self._bounded("build", program, 0, 1, *(args or (cfg,)))

    @contextlib.contextmanager
    def timed_rounds(self, steps: int):
        """One limit for a block of ``steps`` timed steps (``timeout_s`` each) instead of one
        per step: arming a limit costs about 25 us, which the case's rounds (timed from
        outside) would carry and its paired baseline's (timed inside the step) would not."""
        if not self.timeout_s:
            yield
            return
        seconds = self.timeout_s * max(1, steps)
        self._in_rounds = True
        try:
            with time_limit(seconds, f"{self._id}: its timed rounds did not finish within "
                            f"{seconds:g} s (hung?); --timeout sets the limit per step",
                            error=CaseTimeout):
                yield
        except CaseTimeout:
            stop_loader_workers()
            raise
        finally:
            self._in_rounds = False

    def _bounded(self, command: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` within the timeout; past it, the case's loader workers are
        stopped too (their own shutdown would wait 5 s for each worker stuck in the data).
        Inside ``timed_rounds`` the block's own limit holds."""
        if not self.timeout_s or self._in_rounds:
            return fn(*args, **kwargs)
        what = PHASES.get(command, f"its {command!r} command")
        try:
            with time_limit(self.timeout_s,
                            f"{self._id}: {what} did not finish within {self.timeout_s:g} s "
                            "(hung?); --timeout sets the limit", error=CaseTimeout):
                return fn(*args, **kwargs)
        except CaseTimeout:
            stop_loader_workers()
            raise

    def call(self, command: str, *payload) -> list:
        return [self._bounded(command, getattr(self.program, command), *payload)]

    def close(self) -> None:
        self._bounded("close", self.program.close)

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # the case failed already: that failure is the one to report
            self.close()
        except Exception:  # noqa: BLE001
            pass


OFFSET_RULE = StoppingRule(target_width=0.01, min_rounds=MIN_ROUNDS, max_rounds=120,
                           max_time_s=3.0)
"""When ``PairedBaseline.measure_offset``'s rounds stop: a paired interval of +-1%, else 120
rounds a side or 3 s of the worker's steps, whichever comes first (once per model; about 4 s
for BERT's cpu-profile step, 7 s for ResNet-18's and, on a GPU profile, 8 s of both sides'
steps and the switches at most). The offset scales every worker-paired case of the model, and
its width joins each one's interval: on the 2-core CPU 48 rounds a side read it to +-1.9-2.6%."""


WINDOW_WARMUP_ROUNDS = 1
"""Untimed rounds at the start of a measured window (after a peak reset, which returns freed
memory to the system on the CPU and empties the allocator cache on CUDA, so the first step
after it allocates afresh and would read slow)."""


class PairedBaseline:
    """The model's FP32 baseline, stepped right before every timed round of a case
    (pytest-benchmark's untimed ``setup``), so that each round of the case has a baseline round
    measured under the same machine conditions a moment earlier. Machine drift (other jobs,
    clocks, thermal state) then cancels in the per-round ratios, which a baseline measured
    minutes apart cannot offer.

    Where it runs: every case gets a partner built in this process (``local``), the process
    the model's baseline case ran in: two processes running the very same step can differ by
    several percent for their whole lives on a shared machine (heap state, page placement),
    which no pairing of rounds removes. A case measured in this process (single device, dp,
    model parallel) has its memory window before the partner is built, so its peaks stay its
    own; a multi-process case (DDP, FSDP, pipeline) and a case in a process of its own
    (``expandable_segments``) measure memory in their own processes, which the partner does not
    share. With ``in_process`` False (``--partner worker``) every case pairs with one baseline
    worker process instead, started on first use and kept while consecutive cases share it,
    whose own speed against this process's is measured when it starts (``measure_offset``).
    Measured against each configuration run alone (``scripts/paired_vs_separate.py``), the
    worker agreed no better and its intervals were wider."""

    def __init__(self, cfg: RunConfig, timeout_s: float, warmup_rounds: int = 2,
                 spare=None, in_process: bool = True):
        """``spare``: the worker of a previous ``PairedBaseline`` (``handoff``), which builds
        this baseline in place of starting a process of its own. ``in_process`` False: every
        case pairs with the worker (``--partner worker``)."""
        self.cfg = cfg.baseline
        self.in_process = in_process
        self.timeout_s, self.warmup_rounds = timeout_s, max(1, warmup_rounds)
        self.group = None
        self.spare = spare
        self.times: list[float] = []
        self.offset: PairedRounds | None = None
        """The worker's own speed against this process's (``measure_offset``), once started."""

    def matches(self, cfg: RunConfig) -> bool:
        return cfg.baseline == self.cfg

    def step(self) -> float:
        """One baseline step in the worker (pytest-benchmark calls this untimed before each
        timed round)."""
        if self.group is None:
            from gpubench.launchers.workers import WorkerGroup, start_method

            spare, self.spare = self.spare, None
            if spare is not None and spare.alive and spare.timeout_s == self.timeout_s:
                spare.rebuild(CaseProgram, (self.cfg,))
                self.group = spare
            else:
                if spare is not None:
                    spare.close()
                self.group = WorkerGroup(1, CaseProgram, (self.cfg,), backend="gloo",
                                         timeout_s=self.timeout_s,
                                         start_method=start_method(self.cfg.device))
            for _ in range(self.warmup_rounds):
                self.group.call("step")
            self.offset = self.measure_offset()
        seconds = self.group.call("step")[0]
        self.times.append(seconds)
        return seconds

    def measure_offset(self) -> PairedRounds | None:
        """The worker's lifelong speed against this process's, where the baseline case ran:
        the same baseline built here (``LocalBaseline``) and the worker's, stepped in paired
        blocks (``run_rounds``, ``OFFSET_RULE``) right after the worker started. Two processes
        of the very same step differ by several percent for their whole lives (heap state,
        page placement), which a worker-paired case's ratio carries and the offset removes,
        as a paired ratio of its own: the machine's speed, which moves for minutes at a time on
        a shared machine, cancels in it, as it does in the case's rounds (the baseline case,
        measured minutes earlier, would bring it back in). None where the baseline does not
        fit beside the worker's (a device out of memory, in its build or its steps): the
        baseline case is the reference then (``gpubench.analysis.results.with_baseline_ratios``)."""
        local = None
        try:
            local = LocalBaseline(self.cfg, 1, self.timeout_s)
            return run_rounds(lambda: self.group.call("step")[0], OFFSET_RULE, local.step)
        except torch.OutOfMemoryError:
            return None
        finally:
            if local is not None:
                local.close()
            release_free_memory()

    def local(self) -> LocalBaseline:
        """A partner in this process (``LocalBaseline``), built, warmed up (one step) and timed
        at rest (``STEADY_STEPS`` steps) now."""
        return LocalBaseline(self.cfg, 1, self.timeout_s)

    def handoff(self):
        """This baseline's worker process, for the next model's baseline (``spare``), or
        None; this one then holds none."""
        group, self.group = self.group, None
        if group is None:
            group, self.spare = self.spare, None
        return group

    def close(self) -> None:
        for group in (self.group, self.spare):
            if group is not None:
                group.close()
        self.group = self.spare = None


STEADY_STEPS = 3
"""Steps the in-process baseline runs back to back after its warm-up, before the paired rounds
(``LocalBaseline.steady_s``)."""


class LocalBaseline:
    """The baseline built in this process beside an in-process case, for its timed rounds
    (``PairedBaseline``); ``close`` frees it.

    ``steady_s``: the median of ``STEADY_STEPS`` steps it runs back to back once warm, beside
    the case at rest, seconds before the rounds. Its rounds are read against this figure, not
    against the baseline case measured minutes earlier, to tell a pairing the case disturbed
    (its loader workers refilling during the baseline's blocks, say) from a machine whose speed
    moved meanwhile, which slows both sides alike and which the pairing cancels
    (``gpubench.analysis.results.partner_drift``)."""

    def __init__(self, cfg: RunConfig, warmup_rounds: int,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S):
        self.cfg = cfg
        self.times: list[float] = []
        self.partner = InProcess(cfg, timeout_s=timeout_s)
        try:
            for _ in range(max(1, warmup_rounds)):
                self.partner.call("step")
            self.steady_s = statistics.median(self.partner.call("step")[0]
                                              for _ in range(STEADY_STEPS))
        except BaseException:
            self.close()
            raise

    def step(self) -> float:
        seconds = self.partner.call("step")[0]
        self.times.append(seconds)
        return seconds

    def close(self) -> None:
        if self.partner is not None:
            partner, self.partner = self.partner, None
            partner.close()


def check_step_times(checks: list[dict]) -> list[float]:
    """Each training-check step's seconds, the slowest rank's (``checks``: every process's
    ``check`` answer)."""
    return [max(ts) for ts in zip(*(c.get("step_times_s") or [] for c in checks),
                                  strict=False)]


def combine(prepared: list[dict], checks: list[dict], counts: list[dict],
            memories: list[dict]) -> dict:
    """One record from all processes. Time is measured by the launcher (a step ends when the
    slowest rank has finished it); memory is per device plus the fullest one, whose state
    breakdown is reported; FLOPs add up over ranks, saved activations are the largest rank's; the
    training check is the loss-computing rank's; the loader figures are rank 0's, its stall the
    worst rank's."""
    devices = [d for m in memories for d in m["devices"]]
    top_device = max(range(len(devices)), key=lambda i: devices[i]["peak_memory_bytes"] or 0)
    top_rank = max(range(len(memories)), key=lambda r: max(
        (d["peak_memory_bytes"] or 0) for d in memories[r]["devices"]))
    with_loss = [c for c in checks if c["first_loss"] is not None]
    check = with_loss[-1]
    last_losses = [m["last_loss"] for m in memories if m["last_loss"] is not None]
    stalls = [m["loader_stall_fraction"] for m in memories
              if m["loader_stall_fraction"] is not None]
    flops = [c["flops"] for c in counts]
    info = {
        **prepared[0],
        **devices[top_device],
        "param_bytes": memories[top_rank]["param_bytes"],
        "grad_bytes": memories[top_rank]["grad_bytes"],
        "optimizer_state_bytes": memories[top_rank]["optimizer_state_bytes"],
        "flops_per_step": sum(flops),  # hardware FLOPs, as before they had a name
        "hardware_flops_per_step": sum(flops),
        "model_flops_per_step": sum(c.get("model_flops", c["flops"]) for c in counts),
        "uncounted_ops": sorted({op for c in counts for op in c["uncounted_ops"]}),
        # The attention kernel that ran, and the share of the GEMM FLOPs run in float8.
        "attention_kernels": sorted({k for c in counts for k in c.get("attention_kernels", [])}),
        "fp8_gemm_flops_fraction": fp8_gemm_fraction(counts),
        "activation_bytes": max(c["activation_bytes"] for c in counts),
        # taken from the previous case, whose count this one's equals (``count_key``)
        "count_reused": all(c.get("count_reused", False) for c in counts),
        "loader_wait_s": max((m["loader_wait_s"] or 0) for m in memories),
        "loader_stall_fraction": max(stalls) if stalls else None,
        "loss_reference": check["reference_loss"],
        "loss_first": check["first_loss"],
        "loss_rtol": check["rtol"],
        "check_losses": check["losses"],
        "check_skipped_steps": check["skipped_steps"],
        "first_step_s": max((c.get("first_step_s") or 0.0) for c in checks) or None,
        # each check step's seconds, the slowest rank's (compile_time_s reads them)
        "check_step_times_s": check_step_times(checks),
        "last_loss": last_losses[-1] if last_losses else None,
    }
    for name in ("compile_cache_hits", "compile_cache_misses"):
        if any(name in c for c in checks):
            info[name] = sum(c.get(name, 0) for c in checks)
    # The gradient check of every rank (pipeline: each its own stage): the worst agreement.
    for what in ("grad", "update"):
        rows = [c for c in checks if c.get(f"{what}_cosine") is not None]
        if rows:
            info[f"check_{what}_cosine"] = min(c[f"{what}_cosine"] for c in rows)
            info[f"check_{what}_norm_ratio"] = max(
                (c[f"{what}_norm_ratio"] for c in rows), key=lambda r: abs(r - 1))
    if len(devices) > 1:
        info["device_peak_memory_bytes"] = [d["peak_memory_bytes"] for d in devices]
    if len(memories) > 1:
        info["rank_peak_memory_bytes"] = [max((d["peak_memory_bytes"] or 0)
                                              for d in m["devices"]) for m in memories]
        info["rank_step_memory_bytes"] = [max((d["step_memory_bytes"] or 0)
                                              for d in m["devices"]) for m in memories]
        info["rank_step_time_s"] = [m["rank_step_time_s"] for m in memories]
        info["rank_flops_per_step"] = flops
    return info


class Phases:
    """Wall seconds of each part of a case's measurement (``harness_s`` in the record): where a
    profile's time goes besides the timed rounds (``gpubench summary`` totals them)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        """Charge the time since the previous lap to ``name``."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now


ENERGY_BLOCK_MAX_ROUNDS = 2000
"""At most this many rounds in one energy block (``energy_block_rounds``)."""


def energy_block_rounds(step_time_s: float, block_s: float) -> int:
    """Rounds of one side in an energy block of about ``block_s`` seconds: at least 3, at
    most ``ENERGY_BLOCK_MAX_ROUNDS``."""
    return max(3, min(ENERGY_BLOCK_MAX_ROUNDS, math.ceil(block_s / max(step_time_s, 1e-6))))


STEADY_TOLERANCE = 0.1
"""Two consecutive warm-up steps within this fraction of each other: the step is steady."""


def is_steady(times: list[float], tolerance: float = STEADY_TOLERANCE) -> bool:
    """Whether the last two step times agree within ``tolerance`` of the faster one."""
    if len(times) < 2:
        return False
    a, b = times[-2], times[-1]
    return abs(a - b) <= tolerance * min(a, b)


def warm_up(step, most: int, tolerance: float = STEADY_TOLERANCE,
            settled: float | None = None) -> list[float]:
    """Run ``step`` (returning its seconds) until it is steady (``is_steady``: the first
    steps of a case fault in memory, fill caches and autotune) or ``most`` times (at least
    one); the times. ``settled``: the seconds of the same step once it had settled before
    (the training check's last step): a step that agrees with it within ``tolerance`` is back
    at that speed, steady too. A peak reset between the two (the memory window's start, which
    hands freed memory back) slows the first step after it, so without ``settled`` the
    warm-up takes three steps where two show the case is back: the slow one and one at the
    check's speed (about 6 s of the cpu profile's 115 cases)."""
    times: list[float] = []
    while len(times) < max(1, most):
        times.append(step())
        if is_steady(times, tolerance) or (
                settled is not None and is_steady([settled, times[-1]], tolerance)):
            break
    return times


def _timed_call(group) -> float:
    """Seconds of one ``step`` command timed from here, as pytest-benchmark times a round (a
    multi-process step ends when its slowest rank has finished)."""
    start = time.perf_counter()
    group.call("step")
    return time.perf_counter() - start


def record_rounds(benchmark, times: list[float]) -> None:
    """Hand the timed rounds to ``benchmark`` (pytest-benchmark's fixture, or one with a
    ``record_rounds`` method such as ``StandaloneBenchmark``) as its rounds of one iteration
    each, as ``pedantic`` would have timed them: the rounds' count is the stopping rule's, which
    ``pedantic``'s fixed count cannot follow."""
    inner = benchmark
    while hasattr(inner, "_benchmark"):  # a wrapper (the progress line)
        inner = inner._benchmark
    own = getattr(inner, "record_rounds", None)
    if own is not None:
        own(times)
        return
    from pytest_benchmark.fixture import FixtureAlreadyUsed

    if inner._mode:
        raise FixtureAlreadyUsed(f"Fixture can only be used once. Previously it was used in "
                                 f"{inner._mode} mode.")
    inner._mode = "benchmark.pedantic(...)"
    stats = inner._make_stats(1)
    for t in times:
        stats.update(t)


def measure(benchmark, cfg: RunConfig, group, rounds: int, warmup_rounds: int,
            max_time_s: float | None = None, baseline: PairedBaseline | None = None,
            phases: Phases | None = None, min_time_s: float | None = None,
            energy_block_s: float = 0.0, target_width: float = 0.0) -> dict:
    """Drive the protocol through ``group.call`` (any launcher) and return the combined figures.

    The warm-up rounds run before the measured window until the step is steady (``warm_up``,
    at most ``warmup_rounds``), so peaks, loader waits and per-rank times cover the timed
    rounds only. The timed rounds stop by ``StoppingRule``: at ``target_width`` (the paired
    speedup's relative half-width; 0: a fixed count), at the time cap ``max_time_s`` or at the
    most rounds, never below the minimum (``rounds`` grows for fast steps and shrinks for
    slow ones without a target, ``budget_rounds``, from the last warm-up round's time).
    With ``baseline`` (a ``PairedBaseline``), the rounds run in blocks of each side in ABBA
    order, each block's first step untimed (``run_rounds``), the baseline's in this process
    (in its worker with ``--partner worker``); an in-process case's peaks then come from its
    warm-up rounds, measured before the partner is built. The paired times are
    recorded as ``paired_baseline_rounds_s``, round i paired with the case's round i; the
    record says why the rounds stopped (``rounds_stop``: "width", "time" or "rounds") and the
    width the rule saw (``rounds_width``). ``phases`` (a
    ``Phases``) is charged with each part's wall time.

    Energy: where the devices have an energy counter (NVML on CUDA) and the case is paired,
    ``energy_block_s`` seconds of the case's rounds back to back follow the paired rounds, then
    as long of the baseline's (``Sampler.block``): each side's joules per step and power come
    from its own block, not from rounds that alternate faster than the counter and NVML's
    power average follow. An unpaired case's energy is its timed rounds'."""
    phases = phases or Phases()
    prepared = group.call("prepare")
    phases.lap("prepare")
    checks = group.call("check")
    phases.lap("check")
    counts = group.call("count")
    phases.lap("count")
    # A partner in this process (``PairedBaseline.local``) for every case with
    # ``in_process``; an in-process case then measures its memory in a window of its own
    # before the partner is built (``own_window``), a multi-process case in its ranks, which
    # the partner does not share.
    local = baseline is not None and baseline.in_process
    own_window = local and isinstance(group, InProcess)
    if own_window:
        # The case's memory window: its warm-up rounds, the case alone in this process.
        group.call("reset_peak")
    # Warm-up rounds until the step is steady (``warm_up``): two agree, or one agrees with the
    # check's last step (the slowest rank's); the last of them sizes the timed rounds.
    # Both readings are the slowest rank's step seconds, which every rank of a torchrun job
    # receives alike (``LocalRanks`` gathers them): each rank must stop after as many
    # collective steps as the others, which rank-local clocks cannot promise.
    check_steps = check_step_times(checks)
    warm = warm_up(lambda: max(group.call("step")), warmup_rounds,
                   settled=check_steps[-1] if check_steps else None)
    warm_step_s = warm[-1]
    rule = StoppingRule.for_case(rounds, warm_step_s, max_time_s, min_time_s, target_width)
    partner, memory = baseline, None
    if own_window:
        memory = group.call("read_peak")
    phases.lap("warmup")
    if local:
        partner = _local_partner(baseline)  # built beside the case only now
        phases.lap("partner")
    if own_window and isinstance(partner, LocalBaseline):
        # Memory was measured in the case's own window: the timed one only restarts the
        # times, and with no memory handed back there is nothing for a warm-up round to
        # re-fault (each block's first step, untimed, is the switch's own warm-up).
        group.call("reset_window")
        window_warmup = 0
    else:
        group.call("reset_peak")  # the timed window, which is also the memory window
        window_warmup = WINDOW_WARMUP_ROUNDS
    disabled = getattr(benchmark, "disabled", False)
    outcome = None
    try:
        # the partner's steps and each block's untimed first step too
        steps = 2 * (rule.max_rounds + window_warmup) * BLOCK_STEPS // max(1, BLOCK_STEPS - 1)
        steps += 2 * BLOCK_STEPS
        if partner is not None and energy_block_s:
            steps += 2 * ENERGY_BLOCK_MAX_ROUNDS
        bounded = (group.timed_rounds(steps) if isinstance(group, InProcess)
                   else contextlib.nullcontext())
        with Sampler.for_case(cfg, group, partner, rule.max_rounds) as telemetry, bounded:
            for _ in range(window_warmup):
                telemetry.untimed(lambda: group.call("step"))()
            if disabled:  # --benchmark-disable: one step, checked, not timed
                group.call("step")
            else:
                if partner is not None:
                    partner.times = []
                outcome = run_rounds(lambda: _timed_call(group), rule,
                                     None if partner is None else partner.step,
                                     untimed=telemetry.untimed)
                telemetry.steps = len(outcome.case_s)
                record_rounds(benchmark, outcome.case_s)
                if partner is not None:
                    partner.times = list(outcome.base_s)
                    if energy_block_s and telemetry.has_energy_counter:
                        phases.lap("rounds")
                        _energy_blocks(telemetry, cfg, group, partner, warm_step_s,
                                       energy_block_s)
                        phases.lap("energy")
        phases.lap("rounds")
        timing = group.call("read_peak")
    finally:
        if isinstance(partner, LocalBaseline):
            partner.close()
    if memory is not None:  # memory from the case's own window, the rest from the timed one
        timing = [{**t, **{k: m[k] for k in ("devices", "param_bytes", "grad_bytes",
                                              "optimizer_state_bytes")}}
                  for t, m in zip(timing, memory, strict=True)]
    info = combine(prepared, checks, counts, timing)
    info.update(telemetry.summary())
    info["warmup_steps"] = len(warm)
    if outcome is not None:
        info.update(rounds_stop=outcome.stop_reason, rounds_width=outcome.width,
                    rounds_target_width=rule.target_width, rounds_min=rule.min_rounds,
                    rounds_max=rule.max_rounds, rounds_max_time_s=rule.max_time_s,
                    paired_block_steps=BLOCK_STEPS if partner is not None else None,
                    paired_order="ABBA" if partner is not None else None)
    if partner is not None:
        info["paired_baseline_rounds_s"] = list(partner.times)
        info["paired_baseline_case_id"] = partner.cfg.id
        info["paired_partner"] = ("this process" if isinstance(partner, LocalBaseline)
                                  else "worker process")
        info["paired_baseline_steady_s"] = getattr(partner, "steady_s", None)
        offset = getattr(partner, "offset", None)  # a worker's: this process's step over its
        info["paired_worker_offset"] = None if offset is None else offset.ratio
        info["paired_worker_offset_width"] = None if offset is None else offset.width
    if cfg.parallel == "ddp":
        allreduce_s = max(group.call("allreduce_probe"))
        syncs = 1 if cfg.ddp_no_sync else cfg.accum_steps
        info["allreduce_time_s"] = allreduce_s
        info["comm_time_s"] = allreduce_s * syncs
    phases.lap("finish")
    return info


def _energy_blocks(telemetry: Sampler, cfg: RunConfig, group, partner, case_step_s: float,
                   block_s: float) -> None:
    """The case's energy block, then its baseline's (``Sampler.block``), sized from each
    side's step time; the partner's paired times are kept as they were."""
    paired = list(partner.times)
    rounds = energy_block_rounds(case_step_s, block_s)
    with telemetry.block("case", rounds, cfg.global_batch):
        for _ in range(rounds):
            group.call("step")
    base_step_s = statistics.median(paired) if paired else case_step_s
    rounds = energy_block_rounds(base_step_s, block_s)
    with telemetry.block("baseline", rounds, partner.cfg.global_batch):
        for _ in range(rounds):
            partner.step()
    partner.times = paired


def _local_partner(baseline: PairedBaseline):
    """The in-process partner; the worker where it does not fit beside the case (a device
    out of memory), so a large case is still measured."""
    try:
        return baseline.local()
    except torch.OutOfMemoryError:
        release_free_memory()
        return baseline
