"""scripts/gpu_check.sh: the first GPU run's script, rehearsed on the CPU (its --rehearse mode
runs the same steps with the smoke profile, one resnet18 case each), so that its plumbing is
tested on every CI run: OUT holds at most 8 files of allowed names, two folders deep at most,
each under 16 MiB (what the GPU machine brings back); the tarball holds every step's results,
is rewritten after every step (a kill mid-step keeps the steps before), a step over its box is
stopped with all its processes and the next one runs. The summary's GPU figures (the headline
tables, MFU against the bf16 peak, what was not reached) are checked on made-up records."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ["00-setup", "01-peaks", "02-headline", "03-more", "04-loader", "05-transfer",
         "06-claims"]
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
OUT_FILES = {"gpu_check.md", "gpu_check.json", "gpu_check.tar.gz"}

_spec = importlib.util.spec_from_file_location("gpu_check_tool",
                                               ROOT / "scripts" / "gpu_check_tool.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def _env(tmp_path: Path, run: str, **env) -> dict:
    return {
        **os.environ,
        # python3 in the script is this interpreter (the one with gpubench's dependencies).
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GPUBENCH_DATA_DIR": str(tmp_path / "data"),
        "GPU_CHECK_WORK": str(tmp_path / "work"),
        "GPU_CHECK_RUN": run,
        **env,
    }


def _hold(step: str) -> dict:
    """The environment that holds ``step``'s cases until a signal stops them
    (tests/data/hold_step.py): the step outlasts anything, however fast the machine."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / "data"),
                                                        os.environ.get("PYTHONPATH")])),
            "PYTEST_PLUGINS": "hold_step", "HOLD_STEP": step}


def _rehearse(tmp_path: Path, timeout: float, **env) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    run = uuid.uuid4().hex
    try:
        proc = subprocess.run(["bash", str(SCRIPT), "--rehearse", str(out)],
                              env=_env(tmp_path, run, **env), cwd=tmp_path,
                              capture_output=True, text=True, timeout=timeout)
    finally:
        _kill_marked(run)
    assert not tool.marked_pids(run, "GPU_CHECK_RUN"), "the rehearsal left processes running"
    return proc, out


def _kill_marked(run: str) -> None:
    """SIGKILL every process of the rehearsal ``run`` (its marker is in their environment)."""
    for pid in tool.marked_pids(run, "GPU_CHECK_RUN"):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while tool.marked_pids(run, "GPU_CHECK_RUN") and time.monotonic() < deadline:
        time.sleep(0.1)


def assert_within_limits(out: Path) -> None:
    """What the GPU machine brings back: at most 8 files, 16 MiB each, at most two folders
    down, names of letters, digits, '.', '_' and '-'."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8, files
    for p in out.rglob("*"):
        rel = p.relative_to(out)
        assert all(NAME.match(part) for part in rel.parts), rel
        assert len(rel.parts) <= 3, rel  # OUT/a/b/file
        if p.is_file():
            assert p.stat().st_size < 16 * 2**20, (rel, p.stat().st_size)


def _tar(out: Path) -> dict[str, bytes]:
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _json(members: dict[str, bytes], name: str) -> dict:
    return json.loads(members[f"gpu_check/{name}"])


def _case_ids(members: dict[str, bytes], step: str) -> list[str]:
    data = _json(members, f"{step}/benchmark.json")
    return [b["extra_info"]["case_id"] for b in data["benchmarks"] if b.get("extra_info")]


@pytest.mark.slow
def test_rehearsal_brings_back_every_step_within_the_file_limits(tmp_path):
    proc, out = _rehearse(tmp_path, timeout=5500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == OUT_FILES
    assert_within_limits(out)
    members = _tar(out)
    statuses = [_json(members, f"{step}.json") for step in STEPS]
    for step, status in zip(STEPS, statuses, strict=True):
        assert status["status"] == "ok", (step, status.get("log_tail"))
        assert f"gpu_check/{step}.log" in members
        assert status["seconds"] <= status["box_s"]
        assert status["leftovers"] == {"found_after_exit": 0, "killed": 0, "still_alive": 0}
    stamps = [s["written_at"] for s in statuses]  # each written when its step ended
    assert stamps == sorted(stamps) and stamps[0] < stamps[-1]
    setup = _json(members, "setup/setup.json")
    assert setup["problems"] == [] and setup["selections"]["headline"]["ids"] == ["resnet18-fp32"]
    driver = _json(members, "peaks/driver.json")
    assert driver["cuda_usable"] is False and driver["torch"]
    assert _json(members, "peaks/peaks.json")["peak_tflops"]["fp32"] > 0
    # Every step's results: its JSON, journal, summary and advice.
    assert _case_ids(members, "headline") == ["resnet18-fp32"]
    assert _case_ids(members, "more") == ["resnet18-fp32-ckpt"]
    assert _case_ids(members, "loader") == ["resnet18-fp32-images-jpeg-w2"]
    assert _case_ids(members, "claims") == ["claim-adamw-resnet18"]
    for step in ("headline", "more", "loader", "claims"):
        for name in ("cases.jsonl", "summary.md", "advice.md"):
            assert f"gpu_check/{step}/{name}" in members, (step, name)
    assert "host-to-device copies need a CUDA device" in members[
        "gpu_check/05-transfer.log"].decode()
    md = (out / "gpu_check.md").read_text()
    assert md.startswith("# gpubench gpu_check (rehearsal on the CPU)")
    assert md.index("## Headline") < md.index("## Not reached") < md.index("## Steps")
    assert "| resnet18-fp32 | fp32 | NCHW |" in md and "Measured matmul peaks" in md
    assert members["gpu_check/gpu_check.md"].decode() == md
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["final"] and summary["cases"] == 4
    assert [s["step"] for s in summary["steps"]] == STEPS
    assert not (out / "data").exists() and (tmp_path / "data").is_dir()  # data kept out of OUT


@pytest.mark.slow
def test_a_rehearsal_killed_mid_step_keeps_the_previous_steps_in_the_tarball(tmp_path):
    out, run = tmp_path / "out", uuid.uuid4().hex
    work = tmp_path / "work"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--rehearse", str(out)],
                            env=_env(tmp_path, run, GPU_CHECK_STEPS="setup,peaks,headline",
                                     GPU_CHECK_REPUBLISH_S="2", **_hold("02-headline")),
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 3000  # however slow the machine: no speed is tested
        while time.monotonic() < deadline and proc.poll() is None:
            status = work / "02-headline.json"
            if status.exists() and '"running"' in status.read_text() \
                    and (work / "02-headline.log").exists():
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the rehearsal ended before its headline step ran"
        # Inside the step (its case held until the kill): gpubench run and its pytest child
        # running, the status republished.
        while time.monotonic() < deadline and proc.poll() is None \
                and len(tool.marked_pids(run, "GPU_CHECK_RUN")) < 3:
            time.sleep(0.5)
        time.sleep(3)  # a republish (every 2 s) after the child started
        assert proc.poll() is None and len(tool.marked_pids(run, "GPU_CHECK_RUN")) >= 3
    finally:
        _kill_marked(run)  # SIGKILL to the script and everything it started, at once
        proc.wait(timeout=30)
    assert not tool.marked_pids(run, "GPU_CHECK_RUN")
    assert_within_limits(out)
    members = _tar(out)
    for step in ("00-setup", "01-peaks"):
        assert _json(members, f"{step}.json")["status"] == "ok"
        assert f"gpu_check/{step}.log" in members
    assert _json(members, "peaks/peaks.json")["peak_tflops"]
    assert _json(members, "setup/setup.json")["selections"]
    # Republished while the step ran: the kill found it running.
    assert _json(members, "02-headline.json")["status"] == "running"
    md = (out / "gpu_check.md").read_text()
    assert "in progress" in md and "| 01-peaks | ok |" in md
    assert "step 02-headline was cut off while running" in md


@pytest.mark.slow
def test_a_step_over_its_box_is_stopped_with_its_processes_and_the_next_step_runs(tmp_path):
    # The headline step's case waits until a signal stops it (tests/data/hold_step.py): the
    # step outlasts its 12 s box on any machine, however fast.
    proc, out = _rehearse(tmp_path, timeout=3000, GPU_CHECK_STEPS="setup,headline,transfer",
                          GPU_CHECK_BUDGET_headline="12", GPU_CHECK_BANK="0",
                          **_hold("02-headline"))
    # The timed-out headline produced no case: nothing to bring back, hence exit 1.
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no step produced a case" in proc.stderr
    assert_within_limits(out)
    members = _tar(out)
    headline = _json(members, "02-headline.json")
    assert headline["status"] == "timed out" and headline["box_s"] == 12
    assert headline["exit_code"] in (124, 137) and headline["seconds"] <= 14
    assert headline["leftovers"]["still_alive"] == 0
    assert _json(members, "05-transfer.json")["status"] == "ok"  # the next step ran
    assert "gpu_check/01-peaks.json" not in members
    md = (out / "gpu_check.md").read_text()
    assert "resnet18-fp32: not reached: step 02-headline stopped at its 12 s box" in md


def test_usage_error():
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: scripts/gpu_check.sh [--rehearse] OUT" in proc.stderr


# -- the summary, on made-up GPU records ---------------------------------------------------


def _record(cid, model, precision, samples, tflops=None, mfu=None, peak=None, **extra):
    memory = {"peak_memory_bytes": 3 * 2**30 * (2 if precision == "fp32" else 1),
              "step_memory_bytes": 2**30 * (2 if precision == "fp32" else 1),
              "peak_memory_method": "allocator"}
    return {"extra_info": {"kind": "step", "case_id": cid, "model": model,
                           "precision": precision, "parallel": "single",
                           "samples_per_s": samples, "step_time_s": 256 / samples,
                           "tflops": tflops, "mfu": mfu, "peak_tflops": peak, **memory,
                           **extra},
            "stats": {"median": 256 / samples}}


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_the_summary_puts_the_headline_first_and_says_what_was_not_reached(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    ids = tool.GPU_STEPS["headline"]["ids"]
    _write(work / "setup" / "setup.json", {"selections": {"headline": {
        "ids": ids, "missing": [], "profile": "gpu-small"}}, "problems": []})
    _write(work / "peaks" / "driver.json", {"devices": [{"name": "NVIDIA H200"}],
                                            "torch": "2.11.0", "problems": []})
    _write(work / "peaks" / "peaks.json", {"peak_tflops": {"bf16": 800.0, "fp16": 810.0,
                                                           "tf32": 400.0, "fp32": 50.0}})
    image = [224, 3, 224, 224]
    records = [
        _record("resnet50-fp32", "resnet50", "fp32", 1000.0, input_shape=image),
        _record("resnet50-tf32", "resnet50", "tf32", 2000.0, input_shape=image),
        _record("resnet50-bf16", "resnet50", "bf16", 3000.0, input_shape=image),
        _record("resnet50-bf16-cl", "resnet50", "bf16", 3200.0, channels_last=True,
                input_shape=image),
        # The fp32 case's MFU (against the fp32 peak) is the highest of all: not the headline.
        _record("bert-fp32", "bert", "fp32", 600.0, tflops=40.0, mfu=0.8, peak=50.0,
                input_shape=[128, 128]),
        _record("bert-bf16", "bert", "bf16", 3000.0, tflops=200.0, mfu=0.26, peak=780.0,
                input_shape=[128, 128]),
        _record("gpt2-fp32", "gpt2", "fp32", 45.0, tflops=39.0, mfu=0.78, peak=50.0,
                input_shape=[16, 1024]),
    ]
    _write(work / "headline" / "benchmark.json", {"benchmarks": records})
    finished = [r["extra_info"]["case_id"] for r in records]
    _write(work / "02-headline.json", {
        "step": "02-headline", "status": "timed out", "exit_code": 124, "seconds": 145,
        "budget_s": 145, "box_s": 145, "selected": ids, "finished": finished, "outcomes": {}})
    _write(work / "03-more.json", {
        "step": "03-more", "status": "failed", "exit_code": 1, "seconds": 50, "budget_s": 105,
        "box_s": 105, "selected": ["gpt2-fp32-expseg"], "finished": [],
        "outcomes": {"gpt2-fp32-expseg": {"outcome": "failed",
                                          "reason": "RuntimeError: rank 0 died"}}})
    _write(work / "04-loader.json", {"step": "04-loader", "status": "skipped",
                                     "budget_s": 85, "note": "no time left"})
    assert tool.main(["publish", str(work), str(out), "gpu", "--elapsed", "300",
                      "--total", "525", "--final"]) == 0
    md = (out / "gpu_check.md").read_text()
    assert md.startswith("# gpubench gpu_check (GPU): NVIDIA H200")
    assert md.index("## Headline") < md.index("## Not reached") < md.index("## Steps")
    assert "bf16 800.0, fp16 810.0, tf32 400.0, fp32 50.0" in md
    assert "| resnet50-tf32 | tf32 | NCHW | 2,000 |" in md
    assert "| H200 2,259 img/s (Lambda, TF32) | 89% |" in md
    assert "| resnet50-bf16-cl | bf16 | channels_last | 3,200 |" in md
    assert "AMP speedup of resnet50-bf16: 3.00x over fp32, 1.50x over tf32." in md
    # bert bf16: 200 TFLOP/s against the measured bf16 peak (800): 25%, 5x fp32's samples/s.
    assert ("| bert [128, 128] | 3,000.0 | 384,000 | 200.0 | 800.0 | 25.0% | 26.0% | 5.00x | "
            "80.0% |") in md
    # Peak and per-step memory of every headline case, beside the figures and in a table.
    assert "| resnet50-bf16 | bf16 | NCHW | 3,000 | 85.3 | - | 3.00 | 1.00 |" in md
    assert "| gpt2-fp32 | 6.00 | 2.00 | allocator |" in md
    assert "gpt2-bf16: not reached: step 02-headline stopped at its 145 s box" in md
    assert "gpt2-fp32-expseg: failed: RuntimeError: rank 0 died" in md
    assert "step 04-loader did not run: no time left" in md
    report = json.loads((out / "gpu_check.json").read_text())
    bert = next(t for t in report["headline"]["transformers"] if t["model"] == "bert")
    assert bert["mfu_vs_bf16_peak"] == pytest.approx(0.25)
    assert report["cases"] == 7
    names = set(_tar(out))
    assert {"gpu_check/headline/benchmark.json", "gpu_check/02-headline.json",
            "gpu_check/gpu_check.md"} <= names


def test_publish_fails_without_a_case_and_the_tarball_leaves_out_the_largest_files(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    _write(work / "02-headline.json", {"step": "02-headline", "status": "failed",
                                       "budget_s": 145, "selected": [], "finished": []})
    (work / "headline").mkdir()
    (work / "headline" / "trace.json").write_bytes(os.urandom(3 * 2**20))  # incompressible
    assert tool.main(["publish", str(work), str(out), "gpu", "--final"]) == 1
    packed = tool.pack(work, out / "gpu_check.tar.gz", limit=2**20)
    assert packed["left_out"] == ["headline/trace.json"]
    assert (out / "gpu_check.tar.gz").stat().st_size < 2**20
    members = _tar(out)
    assert "gpu_check/02-headline.json" in members
    assert b"headline/trace.json" in members["gpu_check/left_out.txt"]


def test_the_gpu_selections_are_cases_of_the_gpu_small_profile_picked_exactly():
    from _pytest.mark.expression import Expression

    from gpubench.suite.cases import knob_workers, profile_cases

    selections = tool.selections("gpu")
    assert selections["headline"]["ids"] == tool.GPU_STEPS["headline"]["ids"]
    assert tool.knob_workers("cuda") == knob_workers("cuda")  # the same rule, without torch
    for step, sel in selections.items():
        if sel["test"] != "test_step":
            continue
        models = tuple(sel["models"].split(",")) if sel["models"] else None
        # The cases gpubench run collects with the step's --groups and --models.
        every = [c.id for c in profile_cases("gpu-small", "cuda", models,
                                             tuple(sel["groups"].split(",")))]
        assert set(sel["ids"]) <= set(every), (step, set(sel["ids"]) - set(every))
        expr = Expression.compile(sel["k"])
        picked = [cid for cid in every if expr.evaluate(
            lambda s, cid=cid: any(s.lower() in n.lower() for n in (
                f"test_step[{cid}]", "test_training_step.py", "benchmarks")))]
        assert sorted(picked) == sorted(sel["ids"]), step


def test_setup_builds_no_model(tmp_path):
    """Setup's selections come from the script's own lists: the setup command imports neither
    torch nor a workload module, so no model can be built in it (the probe builds of ResNet-50,
    BERT and GPT-2 took 10-20 s of a fresh machine's start). Run in a fresh interpreter, the
    modules it imported are checked."""
    path = str(ROOT / "scripts" / "gpu_check_tool.py")
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('t', {path!r})\n"
            "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)\n"
            "rc = t.main(['setup', sys.argv[1], 'gpu'])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision',"
            " 'transformers') or m.startswith(('gpubench.workloads', 'gpubench.train',"
            " 'gpubench.suite')))\n"
            "print('IMPORTED', heavy); sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "work")], cwd=tmp_path,
                          capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "IMPORTED []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    setup = json.loads((tmp_path / "work" / "setup" / "setup.json").read_text())
    assert setup["selections"]["headline"]["k"].startswith("test_step[resnet50-fp32] or ")


def test_the_other_steps_tables_list_their_records():
    """The more, loader, transfer and claims sections of gpu_check.md, each only when it has
    records."""
    records = {
        "a": {"_step": "more", "case_id": "gpt2-fp32-ckpt", "samples_per_s": 10.0,
              "step_time_s": 0.1, "peak_memory_bytes": 2**30, "mfu": 0.2, "model": "gpt2"},
        "f": {"_step": "headline", "case_id": "gpt2-fp32", "samples_per_s": 20.0,
              "model": "gpt2"},
        "b": {"kind": "claim", "case_id": "claim-adamw-bert", "case_id_base": "bert-fp32-adam",
              "case_id_new": "bert-fp32-adamw", "rounds_base_s": [1.0, 2.0],
              "rounds_new_s": [1.0, 1.0]},
        "c": {"kind": "transfer", "case_id": "pinned-64MB", "bandwidth_gb_s": 50.0,
              "overlap_fraction": 0.9},
    }
    text = "\n".join(tool._other_tables({"records": records}))
    assert "## Loader" not in text
    assert ("## More cases\n\n| case | samples/s | step (ms) | peak memory (GiB) | MFU | "
            "speedup over its fp32 | measured |\n|---|---:|---:|---:|---:|---:|---:|\n"
            "| gpt2-fp32-ckpt | 10.0 | 100.0 | 1.00 | 20.0% | 0.50x | separate process "
            "(headline step) |") in text
    assert "| pinned-64MB | 50.0 | 0.90 |" in text
    assert ("|---|---|---|---:|\n| claim-adamw-bert | bert-fp32-adam | bert-fp32-adamw | "
            "1.50 |") in text
