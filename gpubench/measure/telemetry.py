"""Device telemetry during the timed rounds: what the machine was doing while a case was timed.

A ``Sampler`` is a context manager around the timed rounds (``measure`` wraps only the
``benchmark.pedantic`` call in one). A background thread takes a sample every ``PERIOD_S``
(0.1 s); the window's start and end are read in the calling thread, outside the timed rounds.
``summary()`` turns the window into the record's ``telemetry_*`` fields (all of them always
present, None where this machine cannot tell), plus ``contended`` and ``contention_reason``.

CPU (``psutil``): the case's own processes' CPU use (this process and its descendants: worker
ranks, loader workers, the paired baseline's worker) as a percent of the machine's cores, the
CPU frequency, the 1-minute load average, the run queue (runnable threads, sampled), steal time
(hypervisor) and the CPU the *other* processes of the machine used. GPU (NVML, ``pynvml`` from
the optional ``nvidia-ml-py``, imported only for CUDA cases): utilisation, SM and memory
clocks, power, temperature, clock-event (throttle) reasons, other processes on the case's
devices, and the energy counter at the window's start and end (joules per step, samples per
kJ). Without NVML or an NVIDIA device the GPU fields are None and ``telemetry_note`` says why.

A case counts as **contended** (the summary flags it) when, during its timed rounds (the CPU
criteria only for windows of at least ``MIN_JUDGED_WINDOW_S``):

- steal time exceeded ``STEAL_LIMIT_PCT`` of the CPU time (the hypervisor ran other guests);
- other processes used at least ``FOREIGN_CPU_MIN_CORES`` cores (or 5% of them) while the
  machine's cores were at least ``SATURATED`` busy: they took cores the case wanted (what the
  case itself runs, ranks and loader workers included, is measured and not counted);
- the run queue exceeded the cores plus the case's own processes (its ranks, loader workers
  and paired baseline): more threads wanted to run than the case explains. The run queue is
  sampled during the window, not the 1-minute load average, which still carries the previous
  cases (it is recorded as ``telemetry_load_avg`` all the same);
- another process ran on one of the case's GPUs;
- a GPU slowed its clocks for heat or an external power brake (``CONTENDING_THROTTLE``). Holding
  its own power limit (``sw_power_cap``) is how a GPU runs at full load, the same in every run:
  it is recorded, not flagged.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

try:  # a dependency; the sampler still reports cleanly without it
    import psutil
except ImportError:  # pragma: no cover - psutil is installed with gpubench
    psutil = None

PERIOD_S = 0.1
"""Seconds between two samples of the background thread."""

PROCESS_EVERY = 5
"""The GPUs' process lists are read every this many samples (and at the window's start)."""

STEAL_LIMIT_PCT = 5.0
"""Steal time (percent of the machine's CPU time) above which a case counts as contended."""

FOREIGN_CPU_MIN_CORES = 0.25
"""Cores other processes must use (at least; or 5% of the cores) to count as contention."""

SATURATED = 0.9
"""Share of the machine's cores busy above which foreign CPU use takes cores from the case."""

MIN_JUDGED_WINDOW_S = 0.5
"""Shortest window whose CPU figures are judged for contention: the kernel counts CPU time in
10 ms ticks and the run queue is sampled every ``PERIOD_S``, too coarse for shorter windows
(smoke-profile cases); their figures are still recorded."""

THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""NVML clock-event (throttle) reason bits, ``nvmlClocksEventReason*``."""

CONTENDING_THROTTLE = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                       "hw_power_brake_slowdown")
"""Throttle reasons that mark a case as contended: heat and external power brakes."""

FIELDS = (
    "telemetry_period_s", "telemetry_samples", "telemetry_window_s", "telemetry_cpu_util",
    "telemetry_cpu_freq_mhz", "telemetry_load_avg", "telemetry_run_queue", "telemetry_steal_pct",
    "telemetry_foreign_cpu", "telemetry_gpu_util", "telemetry_sm_clock_mhz",
    "telemetry_mem_clock_mhz", "telemetry_power_w", "telemetry_temp_c",
    "telemetry_throttle_reasons", "telemetry_foreign_processes", "telemetry_energy_j",
    "energy_j_per_step", "samples_per_kj", "energy_power_w", "energy_source",
    "energy_covers_j", "energy_covers_s", "energy_covers_steps", "baseline_energy_j_per_step",
    "baseline_samples_per_kj", "baseline_energy_power_w", "baseline_energy_covers_j",
    "baseline_energy_covers_s", "baseline_energy_covers_steps", "telemetry_sampler_cpu_s",
    "telemetry_note", "contended", "contention_reason",
)
"""Every field ``Sampler.summary`` returns (None where unknown), in order."""


def _mean(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _run_queue() -> int | None:
    """Runnable threads of the whole machine now, less the one reading it (``/proc/loadavg``'s
    fourth field); None where there is no such file."""
    try:
        with open("/proc/loadavg") as f:
            return max(0, int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        return None


class _CpuFrequency:
    """The current frequency (MHz) of the core this process last ran on (one sysfs file per
    sample, cheap on a 200-core host); where the kernel exposes no cpufreq files (many VMs),
    ``psutil.cpu_freq()`` read at the window's start and end only (it parses /proc/cpuinfo)."""

    def __init__(self):
        self.per_sample = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq").exists()
        self.proc = psutil.Process() if psutil is not None else None

    def sample(self) -> float | None:
        if not self.per_sample or self.proc is None:
            return None
        try:
            cpu = self.proc.cpu_num()
            with open(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq") as f:
                return int(f.read()) / 1000  # kHz
        except (OSError, ValueError, psutil.Error):
            return None

    def edge(self) -> float | None:
        if self.per_sample or psutil is None:
            return None
        try:
            freq = psutil.cpu_freq()
        except (OSError, NotImplementedError, RuntimeError):
            return None
        return freq.current if freq and freq.current else None


def _tree(roots: Iterable[int]) -> list:
    """``psutil.Process`` objects of ``roots`` and all their descendants."""
    procs, seen = [], set()
    for pid in roots:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in family:
            if p.pid not in seen:
                seen.add(p.pid)
                procs.append(p)
    return procs


def _tree_cpu(roots: Iterable[int]) -> tuple[float, set[int]]:
    """CPU seconds used so far by ``roots`` and their descendants, and their pids. A reaped
    child's time moves into its parent's ``children_*`` times, so the sum survives loader
    workers that exit between two readings."""
    total, pids = 0.0, set()
    for p in _tree(roots):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        pids.add(p.pid)
        total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(
            t, "children_system", 0.0)
    return total, pids


def _own_roots() -> list[int]:
    """This process, and under torchrun the other ranks of this machine (the launcher's other
    children): their load is the case's own, not contention."""
    roots = [os.getpid()]
    if psutil is not None and "TORCHELASTIC_RUN_ID" in os.environ:
        with contextlib.suppress(psutil.Error):
            roots += [p.pid for p in psutil.Process().parent().children()]
    return roots


class _Gpus:
    """NVML handles of the case's devices; every reading returns None where unsupported."""

    def __init__(self, indices: list[int]):
        self.note: str | None = None
        self.handles: list = []
        self.unsupported: set[str] = set()
        try:
            import pynvml
        except ImportError:
            self.note = ("no GPU telemetry: NVML bindings not installed "
                         "(pip install 'gpubench[gpu]', i.e. nvidia-ml-py)")
            return
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as err:  # OSError: a broken library
            self.note = f"no NVIDIA device (NVML: {err})"
            return
        self._initialized = True
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                self.note = "no NVIDIA device (NVML: 0 devices)"
            else:
                self.handles = [self._handle(i) for i in indices if i < count] or []
                if not self.handles:
                    self.note = f"no NVIDIA device (NVML: devices {indices} not present)"
        except pynvml.NVMLError as err:
            self.note = f"no NVIDIA device (NVML: {err})"
            self.handles = []
        if not self.handles:
            self.close()

    def _handle(self, cuda_index: int):
        """The NVML handle of CUDA device ``cuda_index`` as this process numbers it: by UUID
        when CUDA is initialized here, else through CUDA_VISIBLE_DEVICES (torch's own mapping),
        else the same index."""
        nvml = self.nvml
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            with contextlib.suppress(Exception):
                uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
                uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
                return nvml.nvmlDeviceGetHandleByUUID(uuid)
        index = cuda_index
        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            with contextlib.suppress(Exception):
                index = torch.cuda._get_nvml_device_index(cuda_index)
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def read(self, name: str, *args):
        """``pynvml.<name>(handle, *args)`` for every device (None for a device that fails);
        a function the driver does not support is not called again."""
        if name in self.unsupported or not hasattr(self.nvml, name):
            return [None] * len(self.handles)
        out = []
        for h in self.handles:
            try:
                out.append(getattr(self.nvml, name)(h, *args))
            except self.nvml.NVMLError as err:
                never = tuple(getattr(self.nvml, e) for e in ("NVMLError_NotSupported",
                                                              "NVMLError_FunctionNotFound")
                              if hasattr(self.nvml, e))
                if isinstance(err, never):
                    self.unsupported.add(name)
                out.append(None)
        return out

    def sample(self, processes: bool = True) -> dict:
        n = self.nvml
        util = self.read("nvmlDeviceGetUtilizationRates")
        reasons = self.read("nvmlDeviceGetCurrentClocksEventReasons")
        if all(r is None for r in reasons):
            reasons = self.read("nvmlDeviceGetCurrentClocksThrottleReasons")
        power = self.read("nvmlDeviceGetPowerUsage")
        procs = [None] * len(self.handles)
        if processes:  # the newest struct version the driver knows
            for name in ("nvmlDeviceGetComputeRunningProcesses",
                         "nvmlDeviceGetComputeRunningProcesses_v2"):
                procs = self.read(name)
                if name not in self.unsupported:
                    break
        return {
            "util": [u.gpu if u is not None else None for u in util],
            "sm": self.read("nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM),
            "mem": self.read("nvmlDeviceGetClockInfo", n.NVML_CLOCK_MEM),
            "power_w": [p / 1000 if p is not None else None for p in power],
            "temp": self.read("nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU),
            "reasons": reasons,
            "pids": [[p.pid for p in ps] if ps is not None else None for ps in procs],
        }

    def energy_j(self, first_only: bool = False) -> float | None:
        """The devices' energy counters summed (joules since the driver loaded; NVML counts
        mJ), or the first device's alone; None if one lacks a counter (before Volta)."""
        values = self.read("nvmlDeviceGetTotalEnergyConsumption")
        if first_only:
            values = values[:1]
        return None if any(v is None for v in values) else float(sum(values)) / 1000

    def close(self) -> None:
        """Release this sampler's NVML initialisation (once: NVML counts them)."""
        if getattr(self, "_initialized", False):
            self._initialized = False
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()


class Sampler:
    """Samples the machine every ``period_s`` in a background thread while the block runs.

    ``device``: "cpu" or "cuda" (only CUDA cases open NVML); ``gpus``: the CUDA indices of the
    case's devices (default: 0); ``own_processes``: how many processes the case itself runs
    (ranks, loader workers, paired baseline: the run queue may exceed the cores by that much);
    ``exclude_pids``: processes whose CPU time is part of the window but not of the case's
    utilisation (the paired baseline's worker); ``steps`` and ``samples_per_step``: the timed
    rounds and their global batch, for energy per step and samples per kJ.
    ``energy_counter(first_only)``: a cumulative energy reading in joules (of all the case's
    devices, or of the first alone), None where there is none; default: the NVML counters of
    the case's GPUs (CUDA), none on the CPU."""

    def __init__(self, device: str = "cpu", *, own_processes: int = 1,
                 gpus: Iterable[int] | None = None, steps: int | None = None,
                 samples_per_step: int | None = None, exclude_pids: Iterable[int] = (),
                 period_s: float = PERIOD_S,
                 energy_counter: Callable[[bool], float | None] | None = None,
                 warmup_steps: int = 0):
        self.device = device
        self.warmup_steps = warmup_steps
        """Steps the window runs before its ``steps`` (pytest-benchmark's warm-up rounds inside
        it): the window's energy is theirs too, so it is divided over both."""
        self.own_processes = own_processes
        self.gpu_indices = list(gpus) if gpus is not None else [0]
        self.steps, self.samples_per_step = steps, samples_per_step
        self.exclude_pids = list(exclude_pids)
        self.period_s = period_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._active = threading.Event()
        self._active.set()
        self._untimed = False
        self._untimed_s = 0.0
        self._untimed_j = 0.0
        self._counter = energy_counter
        self._block: str | None = None
        self.blocks: dict[str, dict] = {}
        """``block`` results by side ("case", "baseline"): steps, seconds, joules, samples."""
        self._thread_cpu = 0.0
        self._thread: threading.Thread | None = None
        self._gpus: _Gpus | None = None
        self._summary: dict | None = None

    @classmethod
    def for_case(cls, cfg, group=None, baseline=None, rounds: int | None = None,
                 warmup_rounds: int = 0) -> Sampler:
        """The sampler of one case's timed rounds: its devices and own processes from ``cfg``
        (and the launcher ``group``), the paired ``baseline`` worker excluded from its CPU
        utilisation."""
        processes = cfg.parallelism.processes
        own = processes * (1 + cfg.loader.num_workers) + (1 if baseline is not None else 0)
        if cfg.device == "cuda":
            if type(group).__name__ == "LocalRanks":  # one rank of torchrun: its own device
                import torch

                gpus = [torch.cuda.current_device()]
            else:
                gpus = list(range(max(1, cfg.parallelism.devices_needed("cuda"))))
        else:
            gpus = []
        exclude = list(getattr(getattr(baseline, "group", None), "pids", None) or [])
        return cls(cfg.device, own_processes=own, gpus=gpus, steps=rounds,
                   samples_per_step=cfg.global_batch, exclude_pids=exclude,
                   warmup_steps=warmup_rounds)

    # -- the window ----------------------------------------------------------------------

    def __enter__(self) -> Sampler:
        self._cores = os.cpu_count() or 1
        self._freq = _CpuFrequency()
        if self.device == "cuda" and self.gpu_indices:
            self._gpus = _Gpus(self.gpu_indices)
        self._edge_freq = [self._freq.edge()]
        self._own_pids: set[int] = set()
        self._start_edges()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="gpubench-telemetry",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._end_edges()
        self._edge_freq.append(self._freq.edge())
        if self._gpus is not None:
            self._gpus.close()

    def _start_edges(self) -> None:
        self._t0 = time.perf_counter()
        if psutil is not None:
            self._cpu0 = psutil.cpu_times()
            self._own0, pids = _tree_cpu(_own_roots())
            self._own_pids |= pids
            self._excl0, _ = _tree_cpu(self.exclude_pids)
        self._energy0 = self._energy_now()

    def _end_edges(self) -> None:
        self._t1 = time.perf_counter()
        self._energy1 = self._energy_now()
        if psutil is not None:
            self._cpu1 = psutil.cpu_times()
            self._own1, pids = _tree_cpu(_own_roots())
            self._own_pids |= pids
            self._excl1, _ = _tree_cpu(self.exclude_pids)
            self._load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            if self._active.is_set():
                start = time.thread_time()
                self._sample()
                self._thread_cpu += time.thread_time() - start

    def _sample(self) -> None:
        sample = {"untimed": self._untimed, "block": self._block, "run_queue": _run_queue(),
                  "cpu_freq": self._freq.sample()}
        if self._gpus is not None and self._gpus.handles:
            sample["gpu"] = self._gpus.sample(len(self.samples) % PROCESS_EVERY == 0)
        self.samples.append(sample)

    def untimed(self, fn: Callable[[], object]) -> Callable[[], object]:
        """``fn`` (pytest-benchmark's untimed ``setup``, the paired baseline's step) wrapped so
        that its time, energy and GPU samples are left out of the case's figures."""

        def wrapped():
            start, energy = time.perf_counter(), self._energy_now()
            self._untimed = True
            try:
                return fn()
            finally:
                self._untimed = False
                self._untimed_s += time.perf_counter() - start
                end = self._energy_now()
                if energy is not None and end is not None:
                    self._untimed_j += end - energy

        return wrapped

    def _energy_now(self, first_only: bool = False) -> float | None:
        if self._counter is not None:
            return self._counter(first_only)
        if self._gpus is not None and self._gpus.handles:
            return self._gpus.energy_j(first_only)
        return None

    @property
    def has_energy_counter(self) -> bool:
        """Whether energy can be read around a block of rounds (``block``)."""
        return self._energy_now() is not None

    @contextlib.contextmanager
    def block(self, side: str, steps: int, samples_per_step: int | None):
        """A block of ``steps`` consecutive rounds of one side alone, ``"case"`` or
        ``"baseline"``, with the energy counter read at its edges: the energy and power of that
        side, no round of the other in between (NVML averages power over about a second and
        may update its counter only every few tens of milliseconds, longer than a paired round).
        The baseline's block is untimed for the window's figures, as its paired rounds are, and
        reads the first device alone (the baseline runs on one)."""
        baseline = side == "baseline"
        self._block = side
        if baseline:
            self._untimed = True
        start, energy, total = (time.perf_counter(), self._energy_now(baseline),
                                self._energy_now())
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            end, total_end = self._energy_now(baseline), self._energy_now()
            self._block = None
            if baseline:  # out of the window's figures, as the paired rounds are
                self._untimed = False
                self._untimed_s += seconds
                if total is not None and total_end is not None:
                    self._untimed_j += total_end - total
            self.blocks[side] = {
                "steps": steps, "seconds": seconds, "samples_per_step": samples_per_step,
                "joules": (max(0.0, end - energy)
                           if energy is not None and end is not None else None)}

    def pause(self) -> None:
        """Stop sampling (the thread keeps waking), e.g. to measure the sampling's cost."""
        self._active.clear()

    def resume(self) -> None:
        self._active.set()

    # -- the figures ---------------------------------------------------------------------

    def summary(self) -> dict:
        """The window's ``telemetry_*`` fields, energy per step, ``contended`` and
        ``contention_reason`` (see the module docstring); every field of ``FIELDS``."""
        if self._summary is None:
            self._summary = self._summarize()
        return dict(self._summary)

    def _summarize(self) -> dict:
        out = dict.fromkeys(FIELDS)
        wall = self._t1 - self._t0
        timed_wall = max(wall - self._untimed_s, 1e-9)
        out.update(telemetry_period_s=self.period_s, telemetry_samples=len(self.samples),
                   telemetry_window_s=wall, telemetry_sampler_cpu_s=self._thread_cpu)
        reasons = []
        notes = []
        cores = self._cores
        if psutil is None:
            notes.append("no CPU telemetry: psutil not installed")
        else:
            own_cpu = max(0.0, self._own1 - self._own0)
            excluded = max(0.0, self._excl1 - self._excl0)
            # (CPU time is counted in 10 ms ticks: a short window can read above all cores)
            out["telemetry_cpu_util"] = min(
                100.0, 100 * max(0.0, own_cpu - excluded) / (timed_wall * cores))
            total, busy, steal = self._cpu_split()
            judged = wall >= MIN_JUDGED_WINDOW_S
            if not judged:
                notes.append(f"timed rounds too short ({wall:.2f} s) to judge CPU contention")
            if total > 0:
                steal_pct = 100 * steal / total
                busy_cores = cores * busy / total
                foreign = max(0.0, busy_cores - own_cpu / max(wall, 1e-9))
                out["telemetry_steal_pct"] = steal_pct
                out["telemetry_foreign_cpu"] = foreign
                if judged and steal_pct > STEAL_LIMIT_PCT:
                    reasons.append(f"CPU steal {steal_pct:.0f}% (the hypervisor ran other "
                                   "guests on these cores)")
                if (judged and foreign >= max(FOREIGN_CPU_MIN_CORES, 0.05 * cores)
                        and busy_cores >= SATURATED * cores):
                    reasons.append(f"other processes used {foreign:.2f} of {cores} cores while "
                                   "all were busy")
            out["telemetry_load_avg"] = self._load_avg
        queue = _mean(s["run_queue"] for s in self.samples)
        out["telemetry_run_queue"] = queue
        if (queue is not None and wall >= MIN_JUDGED_WINDOW_S
                and queue > cores + self.own_processes):
            reasons.append(f"run queue {queue:.1f} threads on {cores} cores, above what the "
                           f"case's own {self.own_processes} process(es) explain")
        freqs = [s["cpu_freq"] for s in self.samples] + self._edge_freq
        out["telemetry_cpu_freq_mhz"] = _mean(freqs)
        if self._gpus is not None:
            if self._gpus.note:
                notes.append(self._gpus.note)
            else:
                reasons += self._gpu_figures(out, notes)
        elif self._counter is not None:
            self._energy(out, notes)
        out["telemetry_note"] = "; ".join(notes) or None
        out["contended"] = bool(reasons)
        out["contention_reason"] = "; ".join(reasons) or None
        return out

    def _cpu_split(self) -> tuple[float, float, float]:
        """(total, busy, steal) CPU time of the machine over the window, all cores."""
        a, b = self._cpu0, self._cpu1

        def delta(name):
            return max(0.0, getattr(b, name, 0.0) - getattr(a, name, 0.0))

        fields = [f for f in a._fields if f not in ("guest", "guest_nice")]  # inside user/nice
        total = sum(delta(f) for f in fields)
        idle = delta("idle") + delta("iowait")
        steal = delta("steal")
        return total, max(0.0, total - idle - steal), steal

    def _gpu_figures(self, out: dict, notes: list[str]) -> list[str]:
        """The GPU fields from the timed samples (those outside the paired baseline's steps);
        returns contention reasons."""
        reasons = []
        timed = [s["gpu"] for s in self.samples if "gpu" in s and not s["untimed"]]
        timed = timed or [s["gpu"] for s in self.samples if "gpu" in s]

        def per_sample(key, combine, rows=timed):
            values = []
            for g in rows:
                known = [v for v in g[key] if v is not None]
                if known:
                    values.append(combine(known))
            return values

        out["telemetry_gpu_util"] = _mean(per_sample("util", lambda v: sum(v) / len(v)))
        out["telemetry_sm_clock_mhz"] = _mean(per_sample("sm", lambda v: sum(v) / len(v)))
        out["telemetry_mem_clock_mhz"] = _mean(per_sample("mem", lambda v: sum(v) / len(v)))
        # Power, summed over the case's GPUs: NVML averages it over about a second, longer than
        # a paired round, so from the samples of the case's own block where one ran.
        own = [s["gpu"] for s in self.samples if "gpu" in s and s.get("block") == "case"]
        out["telemetry_power_w"] = _mean(per_sample("power_w", sum, own or timed))
        temps = per_sample("temp", max)
        out["telemetry_temp_c"] = max(temps) if temps else None
        counts: dict[str, int] = {}
        masks = 0
        for g in timed:
            bits = 0
            for mask in g["reasons"]:
                bits |= mask or 0
            masks += 1
            for bit, name in THROTTLE_REASONS.items():
                if bits & bit:
                    counts[name] = counts.get(name, 0) + 1
        out["telemetry_throttle_reasons"] = [f"{name} {100 * n / masks:.0f}%"
                                             for name, n in counts.items()] if masks else []
        hot = [f"{name} in {100 * counts[name] / masks:.0f}% of samples"
               for name in CONTENDING_THROTTLE if counts.get(name)]
        if hot:
            reasons.append("GPU throttled: " + ", ".join(hot))
        reasons += self._foreign_gpu(out, notes)
        self._energy(out, notes)
        return reasons

    def _foreign_gpu(self, out: dict, notes: list[str]) -> list[str]:
        listed: dict[int, int] = {}  # pid -> device position
        for s in self.samples:
            for dev, pids in enumerate(s.get("gpu", {}).get("pids") or []):
                for pid in pids or []:
                    listed.setdefault(pid, dev)
        if listed and not (set(listed) & self._own_pids):
            # The case runs on these devices, yet none of their processes is ours: NVML sees
            # the host's process ids, this process lives in a container's PID namespace.
            notes.append("NVML lists process ids of another PID namespace (a container): "
                         "other processes on the GPU cannot be told apart")
            return []
        foreign = sorted(pid for pid in listed if pid not in self._own_pids)
        names = []
        for pid in foreign:
            name = "?"
            with contextlib.suppress(Exception):
                name = psutil.Process(pid).name()
            names.append(f"pid {pid} ({name}) on cuda:{self.gpu_indices[listed[pid]]}")
        out["telemetry_foreign_processes"] = names
        return [f"other processes on the GPU: {', '.join(names)}"] if names else []

    def _energy(self, out: dict, notes: list[str]) -> None:
        """Energy per step and average power: from a block of the case's own rounds where one
        ran (``block``), else from the timed window (its paired baseline's steps taken out by
        the counter read around each), else from the sampled power; with what each covers."""
        case, base = self.blocks.get("case"), self.blocks.get("baseline")
        timed_wall = max(self._t1 - self._t0 - self._untimed_s, 0.0)
        if case is not None and case["joules"] is not None:
            joules, seconds, steps = case["joules"], case["seconds"], case["steps"]
            samples = case["samples_per_step"]
            out["energy_source"] = "block of the case's own rounds"
        elif self._energy0 is not None and self._energy1 is not None:
            joules = max(0.0, self._energy1 - self._energy0 - self._untimed_j)
            # The window's warm-up rounds ran in it too: their steps share its energy.
            seconds, samples = timed_wall, self.samples_per_step
            steps = self.steps + self.warmup_steps if self.steps else self.steps
            out["energy_source"] = ("timed rounds, the paired baseline's steps read out"
                                    if self._untimed_s else "timed rounds")
        elif out["telemetry_power_w"] is not None:
            seconds, samples = timed_wall, self.samples_per_step
            steps = self.steps + self.warmup_steps if self.steps else self.steps
            joules = out["telemetry_power_w"] * seconds
            out["energy_source"] = "sampled power"
            notes.append("energy from sampled power (no energy counter on this GPU)")
        else:
            return
        out["telemetry_energy_j"] = joules
        out.update(energy_covers_j=joules, energy_covers_s=seconds, energy_covers_steps=steps)
        out["energy_power_w"] = joules / seconds if seconds > 0 else None
        if steps:
            out["energy_j_per_step"] = joules / steps
            if samples and joules > 0:
                out["samples_per_kj"] = steps * samples / (joules / 1000)
        if base is not None and base["joules"] is not None and base["steps"]:
            j, s, n = base["joules"], base["seconds"], base["steps"]
            out.update(baseline_energy_covers_j=j, baseline_energy_covers_s=s,
                       baseline_energy_covers_steps=n, baseline_energy_j_per_step=j / n,
                       baseline_energy_power_w=j / s if s > 0 else None)
            if base["samples_per_step"] and j > 0:
                out["baseline_samples_per_kj"] = n * base["samples_per_step"] / (j / 1000)


def sampling_cost(step: Callable[[], object], rounds: int = 40, device: str = "cpu",
                  gpus: Iterable[int] | None = None) -> dict:
    """What sampling costs a step: ``rounds`` steps with the sampler sampling and ``rounds``
    with it paused, alternating (AB BA ...) so that machine drift hits both alike, one sampler
    thread throughout.

    A sample lands in only some of the steps shorter than ``PERIOD_S``, so the cost is the
    ratio of the *total* times, ``telemetry_overhead`` = time on / time off - 1 (the medians'
    ratio is returned too), with its 95% bootstrap interval over the pairs of rounds
    (``telemetry_overhead_low``, ``telemetry_overhead_high``). ``telemetry_sample_cpu_s`` is
    the sampling thread's own CPU time per sample and ``telemetry_cpu_share`` that over the
    period: the share of one core it takes, noise-free."""
    import statistics

    from gpubench.util.stats import paired_ratio_ci

    times: dict[str, list[float]] = {"on": [], "off": []}
    with Sampler(device, gpus=gpus) as sampler:
        for i in range(rounds):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            for side in order:
                (sampler.resume if side == "on" else sampler.pause)()
                start = time.perf_counter()
                step()
                times[side].append(time.perf_counter() - start)
        sampler.resume()
    ticks = max(1, len(sampler.samples) - 1)  # the first sample is taken on entry
    per_sample = sampler.summary()["telemetry_sampler_cpu_s"] / ticks
    on, off = sum(times["on"]), sum(times["off"])
    low, high = paired_ratio_ci(times["on"], times["off"], of="total")
    return {"telemetry_on_step_time_s": on / rounds, "telemetry_off_step_time_s": off / rounds,
            "telemetry_overhead": on / off - 1,
            "telemetry_overhead_low": low - 1, "telemetry_overhead_high": high - 1,
            "telemetry_overhead_median": (statistics.median(times["on"])
                                          / statistics.median(times["off"]) - 1),
            "telemetry_sample_cpu_s": per_sample,
            "telemetry_cpu_share": per_sample / sampler.period_s,
            "rounds_on_s": times["on"], "rounds_off_s": times["off"]}
