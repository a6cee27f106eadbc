"""Device telemetry during the timed rounds (``gpubench.measure.telemetry``): the CPU fields of a
real case, contention from a busy neighbour, NVML's absence reported cleanly, the GPU path against a
stand-in NVML, and the flags the summary and advice raise for a contended case."""

from __future__ import annotations

import copy
import os
import statistics
import subprocess
import sys
import time
import types

import pandas as pd
import pytest
import torch

from gpubench.analysis.results import load_results, with_baseline_ratios
from gpubench.measure.runner import run_case
from gpubench.measure.standalone import StandaloneBenchmark, write_benchmark_json
from gpubench.measure.telemetry import FIELDS, PERIOD_S, Sampler, sampling_cost
from gpubench.report.summary import summary_markdown
from gpubench.train.config import RunConfig


@pytest.fixture(scope="module")
def record():
    cfg = RunConfig(model="bert", profile="smoke")
    bench = StandaloneBenchmark(cfg.id, "bert-smoke-cpu")
    info = run_case(bench, cfg, rounds=6, warmup_rounds=0, timeout_s=120)
    return bench, info


def test_record_of_a_real_case_holds_the_cpu_telemetry(record):
    _, info = record
    assert set(FIELDS) <= set(info)
    assert info["telemetry_period_s"] == PERIOD_S
    assert info["telemetry_samples"] >= 1  # one on entry, then one per period
    assert 0 <= info["telemetry_cpu_util"] <= 100
    assert info["telemetry_load_avg"] >= 0 and info["telemetry_run_queue"] >= 0
    assert 0 <= info["telemetry_steal_pct"] <= 100 and info["telemetry_foreign_cpu"] >= 0
    assert isinstance(info["contended"], bool)
    assert (info["contention_reason"] is None) == (not info["contended"])
    # A CPU case opens no NVML: its GPU fields are unknown, and nothing needs saying about
    # them. A smoke case's rounds are too short to judge the CPU figures.
    assert info["telemetry_gpu_util"] is None and info["energy_j_per_step"] is None
    assert info["telemetry_note"] is None or info["telemetry_note"].startswith(
        "timed rounds too short")
    if info["telemetry_window_s"] < 0.5:
        assert not info["contended"]


def _contended_file(record, tmp_path):
    bench = copy.copy(record[0])
    bench.extra_info = {**bench.extra_info, "contended": True,
                        "contention_reason": "CPU steal 9% (test)"}
    write_benchmark_json(tmp_path / "r.json", [bench], {"device": "cpu"})
    return load_results([tmp_path / "r.json"])


def test_a_contended_case_is_flagged_in_the_summary(record, tmp_path):
    df = _contended_file(record, tmp_path)
    assert df["contended"].dtype == "boolean"  # a known field of the schema
    flags = with_baseline_ratios(df)["flags"].iloc[0]
    assert "measured under contention: CPU steal 9% (test)" in flags
    assert "measured under contention: CPU steal 9% (test)" in summary_markdown(df)


def test_advice_says_when_its_cases_were_contended():
    from gpubench.analysis.advice import _Cases

    def row(contended):
        return pd.Series({"rounds_s": [0.1, 0.11, 0.1, 0.12, 0.1, 0.1], "global_batch": 8,
                          "is_baseline": False, "contended": contended})

    cases = types.SimpleNamespace(pair=lambda claim, base, new: None)  # no interleaved pair
    _, basis = _Cases.speed(cases, "claim", row(False), row(True))
    assert basis.endswith("(measured under contention)")
    _, basis = _Cases.speed(cases, "claim", row(False), row(pd.NA))
    assert "contention" not in basis


def _busy(seconds: float) -> None:
    """Keep this process's cores busy (torch's threads) for ``seconds``."""
    a = torch.randn(256, 256)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a


def test_a_busy_neighbour_makes_the_window_contended():
    """Spinning processes that are not the case's (started detached: not descendants of this
    process), one per core, take the cores the case wants."""
    # One per core the sampler counts (the machine's, as /proc/stat's figures are), however
    # many: fewer would leave a many-core host idle, which is no contention.
    spin = "yes >/dev/null 2>&1 </dev/null & echo $!"
    launcher = subprocess.run(
        ["sh", "-c", f"({'; '.join([spin] * (os.cpu_count() or 1))})"],
        capture_output=True, text=True, timeout=60, check=True)
    pids = [int(p) for p in launcher.stdout.split()]
    try:
        time.sleep(0.3)
        with Sampler("cpu") as sampler:
            _busy(1.5)
        info = sampler.summary()
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    assert info["contended"] is True, info
    assert info["telemetry_foreign_cpu"] >= 0.25, info
    # Sampled during the window (every 0.1 s, by a thread that competes with the spinners for
    # a core: how many samples it takes in 1.5 s is the machine's)
    assert info["telemetry_samples"] >= 2


def test_the_case_own_child_processes_are_not_foreign():
    """A child of this process (a loader worker, a rank) is the case itself: its CPU time is
    the case's utilisation."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        with Sampler("cpu") as sampler:
            time.sleep(1.0)
    finally:
        child.kill()
        child.wait()
    info = sampler.summary()
    cores = os.cpu_count() or 1
    assert info["telemetry_cpu_util"] * cores / 100 >= 0.2, info  # the child's spinning


def test_without_nvml_or_an_nvidia_device_the_note_says_so(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with Sampler("cuda", gpus=[0], steps=4, samples_per_step=8) as sampler:
        time.sleep(0.15)
    info = sampler.summary()
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert "no GPU telemetry: NVML bindings not installed" in info["telemetry_note"]
    else:
        if torch.cuda.is_available():
            pytest.skip("this machine has an NVIDIA device")
        assert "no NVIDIA device (NVML: " in info["telemetry_note"], info
    assert info["telemetry_gpu_util"] is None and info["samples_per_kj"] is None
    assert info["telemetry_cpu_util"] is not None  # the CPU side still reports


class _Proc:
    def __init__(self, pid):
        self.pid, self.usedGpuMemory = pid, 1 << 30


def fake_nvml(watts: float = 500.0, pids=None, reasons: int = 0x4 | 0x40):
    """A stand-in ``pynvml`` with one device: a counter of ``watts`` since import, ``pids`` on
    the device, clock-event ``reasons``."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's names
        pass

    m.NVMLError, m.NVMLError_NotSupported = NVMLError, NVMLError_NotSupported
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    start = time.perf_counter()
    m.calls = []
    m.nvmlInit = lambda: m.calls.append("init")
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90, memory=40)
    m.nvmlDeviceGetClockInfo = lambda h, clock: {1: 1980, 2: 3201}[clock]
    m.nvmlDeviceGetPowerUsage = lambda h: int(watts * 1000)
    m.nvmlDeviceGetTemperature = lambda h, sensor: 71

    def reasons_fn(h):
        raise NVMLError_NotSupported("old driver")

    m.nvmlDeviceGetCurrentClocksEventReasons = reasons_fn  # falls back to the old name
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: reasons
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [_Proc(p) for p in (pids or [])]
    m.nvmlDeviceGetTotalEnergyConsumption = lambda h: int(
        1e9 + watts * 1000 * (time.perf_counter() - start))
    return m


def test_gpu_telemetry_energy_throttling_and_foreign_processes(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = fake_nvml(pids=[os.getpid(), 1])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with Sampler("cuda", gpus=[0], steps=10, samples_per_step=32) as sampler:
        time.sleep(0.3)
        sampler.untimed(lambda: time.sleep(0.3))()  # a paired baseline's step: left out
        time.sleep(0.2)
    info = sampler.summary()
    assert info["telemetry_note"] is None, info
    assert info["telemetry_gpu_util"] == 90 and info["telemetry_sm_clock_mhz"] == 1980
    assert info["telemetry_mem_clock_mhz"] == 3201 and info["telemetry_temp_c"] == 71
    assert info["telemetry_power_w"] == pytest.approx(500)
    # 500 W over the window less the baseline's step (at least its 0.3 s sleep, however long
    # the sleeps took here): about 250 J, 25 J per step.
    covers_s = info["energy_covers_s"]
    assert covers_s <= info["telemetry_window_s"] - 0.3 and info["energy_covers_steps"] == 10
    assert info["energy_j_per_step"] == pytest.approx(500 * covers_s / 10, rel=0.15)
    assert info["samples_per_kj"] == pytest.approx(320 / (info["energy_covers_j"] / 1e3))
    assert "hw_thermal_slowdown 100%" in info["telemetry_throttle_reasons"]
    assert "sw_power_cap 100%" in info["telemetry_throttle_reasons"]
    assert info["contended"] is True
    reason = info["contention_reason"]
    assert "GPU throttled: hw_thermal_slowdown" in reason and "sw_power_cap" not in reason
    assert "other processes on the GPU: pid 1 " in reason  # ours is not listed
    foreign = info["telemetry_foreign_processes"]
    assert len(foreign) == 1 and foreign[0].startswith("pid 1 ("), foreign
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_process_ids_of_another_pid_namespace_are_not_called_foreign(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(pids=[4_000_000], reasons=0x4))
    with Sampler("cuda", gpus=[0], steps=2, samples_per_step=8) as sampler:
        time.sleep(0.15)
    info = sampler.summary()
    assert "another PID namespace" in info["telemetry_note"]
    assert info["telemetry_foreign_processes"] is None
    assert not info["contended"] or "GPU" not in info["contention_reason"]


def test_sampling_costs_well_under_one_percent_of_a_step():
    cost = sampling_cost(lambda: time.sleep(0.02), rounds=15)
    assert len(cost["rounds_on_s"]) == len(cost["rounds_off_s"]) == 15
    # the figure with its paired interval over the rounds around it
    assert cost["telemetry_overhead_low"] <= cost["telemetry_overhead"] \
        <= cost["telemetry_overhead_high"]
    # The sampling thread's own CPU time per period: the share of one core it takes.
    assert 0 < cost["telemetry_cpu_share"] < 0.01, cost


def _burn(cpu_s: float) -> None:
    """Busy this thread for ``cpu_s`` seconds of its process's CPU time."""
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


class _LaggingCounter:
    """An energy counter in "joules" that are this process's CPU seconds, updated only every
    ``period_s`` (as NVML's counter may be): a step's energy is the CPU time it burns."""

    def __init__(self, period_s: float = 0.1):
        import threading

        self.value, self.period_s = time.process_time(), period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.period_s):
            self.value = time.process_time()

    def __call__(self, first_only: bool = False) -> float:
        return self.value

    def close(self):
        self._stop.set()
        self._thread.join()


def test_energy_blocks_give_each_side_its_own_joules_per_step_despite_a_lagging_counter():
    counter = _LaggingCounter(0.1)
    try:
        with Sampler("cpu", steps=20, samples_per_step=8, energy_counter=counter) as sampler:
            assert sampler.has_energy_counter
            for _ in range(20):  # paired rounds, alternating faster than the counter updates
                sampler.untimed(lambda: _burn(0.01))()
                _burn(0.02)
            with sampler.block("case", 50, 8):
                for _ in range(50):
                    _burn(0.02)
            with sampler.block("baseline", 100, 4):
                for _ in range(100):
                    _burn(0.01)
    finally:
        counter.close()
    info = sampler.summary()
    assert info["energy_source"] == "block of the case's own rounds"
    assert info["energy_covers_steps"] == 50 and info["baseline_energy_covers_steps"] == 100
    # One update period (0.1 "J") of error at most on each edge of a 1 "J" block.
    assert info["energy_j_per_step"] == pytest.approx(0.02, rel=0.25)
    assert info["baseline_energy_j_per_step"] == pytest.approx(0.01, rel=0.25)
    assert info["energy_power_w"] == pytest.approx(
        info["energy_covers_j"] / info["energy_covers_s"])
    assert info["baseline_energy_power_w"] == pytest.approx(
        info["baseline_energy_covers_j"] / info["baseline_energy_covers_s"])
    assert info["samples_per_kj"] == pytest.approx(50 * 8 / (info["energy_covers_j"] / 1000))
    assert info["baseline_samples_per_kj"] == pytest.approx(
        100 * 4 / (info["baseline_energy_covers_j"] / 1000))


def test_an_unpaired_window_is_its_own_energy_block():
    with Sampler("cpu", steps=30, samples_per_step=8,
                 energy_counter=lambda first_only=False: time.process_time()) as sampler:
        for _ in range(30):
            _burn(0.01)
    info = sampler.summary()
    assert info["energy_source"] == "timed rounds"
    assert info["energy_covers_steps"] == 30
    assert info["energy_j_per_step"] == pytest.approx(0.01, rel=0.3)
    assert info["baseline_energy_j_per_step"] is None


def test_the_warm_up_rounds_inside_the_window_share_its_energy():
    """pytest-benchmark runs the window's warm-up rounds inside it: 2 warm-up and 10 timed
    steps of 1 J each read 12 J, which is 1 J per step, not 1.2."""
    joules = [0.0]

    def step():
        joules[0] += 1.0

    with Sampler("cpu", steps=10, samples_per_step=4, warmup_steps=2,
                 energy_counter=lambda first_only=False: joules[0]) as sampler:
        for _ in range(12):
            step()
    info = sampler.summary()
    assert info["energy_covers_j"] == 12.0 and info["energy_covers_steps"] == 12
    assert info["energy_j_per_step"] == pytest.approx(1.0)
    assert info["samples_per_kj"] == pytest.approx(4000.0)


@pytest.mark.slow
def test_a_paired_case_runs_its_energy_blocks_after_its_paired_rounds(monkeypatch):
    from gpubench.measure import protocol
    from gpubench.measure.protocol import (
        InProcess,
        PairedBaseline,
        Phases,
        energy_block_rounds,
        measure,
    )

    for_case = Sampler.for_case.__func__

    def with_counter(cls, *args, **kwargs):  # the CPU time of this process as its energy
        sampler = for_case(cls, *args, **kwargs)
        sampler._counter = lambda first_only=False: time.process_time()
        return sampler

    monkeypatch.setattr(protocol.Sampler, "for_case", classmethod(with_counter))
    sized_from = []  # the case's step seconds its block was sized from
    blocks = protocol._energy_blocks

    def recorded(telemetry, cfg, group, partner, case_step_s, block_s):
        sized_from.append(case_step_s)
        return blocks(telemetry, cfg, group, partner, case_step_s, block_s)

    monkeypatch.setattr(protocol, "_energy_blocks", recorded)
    cfg = RunConfig(model="resnet18", profile="smoke", precision="tf32")
    baseline, phases = PairedBaseline(cfg, timeout_s=60), Phases()
    try:
        with InProcess(cfg) as group:
            info = measure(StandaloneBenchmark(cfg.id), cfg, group, rounds=6, warmup_rounds=1,
                           baseline=baseline, phases=phases, energy_block_s=0.3)
    finally:
        baseline.close()
    assert info["energy_source"] == "block of the case's own rounds"
    assert len(info["paired_baseline_rounds_s"]) == 6  # the blocks' steps are not pairs
    # Each block is 0.3 s of its side's steps by the step time it was sized from (the case's
    # last warm-up step, the median of the baseline's paired rounds), however long the steps
    # then take on a loaded machine.
    assert sized_from and info["energy_covers_steps"] == energy_block_rounds(sized_from[0], 0.3)
    assert info["baseline_energy_covers_steps"] == energy_block_rounds(
        statistics.median(info["paired_baseline_rounds_s"]), 0.3)
    assert info["energy_covers_s"] > 0 and info["baseline_energy_covers_s"] > 0
    assert info["energy_j_per_step"] > 0 and info["baseline_energy_j_per_step"] > 0
    assert phases.seconds["energy"] > 0  # charged to a phase of its own
    assert energy_block_rounds(0.01, 0.3) == 30 and energy_block_rounds(10.0, 0.3) == 3


def test_a_case_on_the_cpu_runs_no_energy_block():
    from gpubench.measure.protocol import InProcess, PairedBaseline, Phases, measure

    cfg = RunConfig(model="resnet18", profile="smoke", precision="tf32")
    baseline, phases = PairedBaseline(cfg, timeout_s=60), Phases()
    try:
        with InProcess(cfg) as group:
            info = measure(StandaloneBenchmark(cfg.id), cfg, group, rounds=6, warmup_rounds=1,
                           baseline=baseline, phases=phases, energy_block_s=5.0)
    finally:
        baseline.close()
    assert "energy" not in phases.seconds  # no block's steps ran
    assert info["energy_source"] is None and info["energy_covers_steps"] is None
