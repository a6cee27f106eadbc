"""gpubench on a Slurm cluster: the node-list parser, the mapping of Slurm's variables to
torch's, ``gpubench submit``'s pieces, and (``slurm`` fixture) srun, sbatch and submit against a
real Slurm. Without one, those tests skip with the reason; with ``GPUBENCH_REQUIRE_SLURM=1``
(set by ``.ci/run``, which starts a single-node Slurm with ``scripts/slurm_local.sh``) a missing
Slurm fails them instead."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from records import results_file, step_record  # tests/ on sys.path

from gpubench.analysis.results import load_results
from gpubench.cli.main import build_parser, main
from gpubench.cli.submit import dist_argv, emit_sbatch
from gpubench.launchers.slurm import (
    AllocationError,
    derived_port,
    expand_hostlist,
    expand_tasks_per_node,
    job_place,
)
from gpubench.report.summary import nodes_markdown, summary_markdown

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "tests" / "data" / "fault_workloads.py"
CASE = ["--model", "bert", "--profile", "smoke", "--device", "cpu", "--warmup", "0"]
TINY = f"{ROOT / 'tests' / 'data' / 'tiny_workload.py'}:workload"
RUN = ["--model", TINY, *CASE[2:]]
"""What the jobs on a real Slurm run: a launcher's question needs no real model (a BERT rank
would import transformers, about 2 s of a core each)."""


# The node-list parser and the environment mapping


@pytest.mark.parametrize("text, hosts", [
    ("cn-d[003-004,006]", ["cn-d003", "cn-d004", "cn-d006"]),
    ("node1", ["node1"]),
    ("a1,b[1-2]", ["a1", "b1", "b2"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("x[1,3],y[001-002],z", ["x1", "x3", "y001", "y002", "z"]),
])
def test_hostlist_expands(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, why", [
    ("cn[1-2", "'[' without ']'"), ("cn1-2]", "']' without '['"), ("cn[3-1]", "reversed"),
    ("cn[a-b]", "not a number"), ("a,,b", "empty host"), ("", "empty"),
    ("cn[[1]]", "nested"),
])
def test_bad_hostlist_names_the_problem(text, why):
    with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
        expand_hostlist(text)


def test_tasks_per_node_expands():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match="N\\(xM\\)"):
        expand_tasks_per_node("2x3")


def slurm_env(**changes) -> dict:
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "cn-d[003-004,006-007]",
           "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_GPUS_ON_NODE": "2"}
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


def test_slurm_task_maps_to_torch_variables():
    place = job_place(slurm_env())
    assert place.launcher == "slurm"
    assert place.environ() == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "cn-d003",
                               "MASTER_PORT": str(derived_port("4242"))}
    assert place.record() == {"launcher": "slurm", "job_id": "4242", "nodes": 4,
                              "node_list": "cn-d003,cn-d004,cn-d006,cn-d007",
                              "tasks_per_node": 2, "gpus_per_node": 2}
    assert job_place(slurm_env(MASTER_PORT="31000")).master_port == 31000
    # The step's own variables (srun inside a bigger allocation) win over the job's.
    step = job_place(slurm_env(SLURM_STEP_NODELIST="cn-d[004,006]", SLURM_STEP_NUM_TASKS="4",
                               SLURM_PROCID="3", SLURM_STEP_TASKS_PER_NODE="2(x2)"))
    assert (step.world, step.master_addr, step.nodes) == (4, "cn-d004", 2)


def test_torchrun_variables_win_over_slurm():
    env = slurm_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    place = job_place(env)
    assert (place.launcher, place.rank, place.world, place.job_id, place.nodes) == (
        "torchrun", 0, 2, "4242", 4)
    assert "MASTER_ADDR" not in place.environ()  # torchrun's agent set it
    assert job_place({}) is None
    plain = job_place({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1",
                       "LOCAL_WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "2"})
    assert plain.record() == {"launcher": "torchrun", "job_id": None, "nodes": 2,
                              "node_list": None, "tasks_per_node": 8, "gpus_per_node": None}


def test_submitit_local_task_maps_to_torch_variables():
    env = {"SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1",
           "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_JOB_ID": "31337",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}  # an salloc's: the local job is its own
    place = job_place(env)
    assert place.launcher == "local" and place.record()["job_id"] == "31337"
    assert place.environ() == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": str(derived_port("31337"))}


def test_one_job_runs_several_cases():
    from gpubench.cli.torchrun import dist_cases

    args = build_parser().parse_args(["dist", *CASE, "--parallel", "ddp", "fsdp", "ddp",
                                      "--out", "x.json"])
    assert [c.id for c in dist_cases(args, "smoke", "cpu", 2)] == ["bert-fp32-ddp2",
                                                                   "bert-fp32-fsdp2"]
    args = build_parser().parse_args(["dist", *CASE, "--group", "parallel", "--out", "x.json"])
    group = dist_cases(args, "smoke", "cpu", 2)
    assert len(group) > 2 and all(c.multiprocess and c.world_size == 2 for c in group)
    assert {c.parallel for c in group} >= {"ddp", "fsdp"}
    with pytest.raises(ValueError, match="no multi-process case at world size 3"):
        dist_cases(args, "smoke", "cpu", 3)


@pytest.mark.parametrize("changes, message", [
    ({"SLURM_GPUS_ON_NODE": "1"}, "2 tasks on node cn-d004 but 1 GPUs"),
    ({"SLURM_NTASKS": "6"}, "SLURM_NTASKS is 6 but the tasks per node add up to 8"),
    ({"SLURM_TASKS_PER_NODE": "2(x3)"}, "names 4 nodes .* lists 3"),
    ({"SLURM_PROCID": "8"}, "task rank 8 is not in 0..7"),
    ({"SLURM_LOCALID": "2"}, "local rank 2 is not in 0..1"),
    ({"SLURM_NTASKS": "two"}, "SLURM_NTASKS must be an integer; got 'two'"),
    ({"SLURM_JOB_NODELIST": "cn[1-"}, "'\\[' without '\\]'"),
])
def test_inconsistent_allocation_is_one_line(changes, message):
    with pytest.raises(AllocationError, match=message) as err:
        job_place(slurm_env(**changes))
    assert "\n" not in str(err.value)


def test_dist_under_an_inconsistent_allocation_exits_2(monkeypatch, capsys):
    for k, v in slurm_env(SLURM_NTASKS="3").items():
        monkeypatch.setenv(k, v)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert main(["dist", *CASE, "--out", "x.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SLURM_NTASKS is 3" in err


def submit_args(*argv: str):
    return build_parser().parse_args(["submit", *argv])


def test_submit_passes_the_dist_options_on():
    args = submit_args(*CASE, "--parallel", "ddp", "fsdp", "--no-sync", "--rounds", "4",
                       "--nodes", "2", "--out", "x.json")
    argv = dist_argv(args, "/shared/x.json")
    assert argv == ["--model", "bert", "--profile", "smoke", "--device", "cpu", "--parallel",
                    "ddp", "fsdp", "--no-sync", "--rounds", "4", "--warmup", "0",
                    "--out", "/shared/x.json"]
    dist = build_parser().parse_args(["dist", *argv])
    assert dist.parallel == ["ddp", "fsdp"] and dist.no_sync and dist.rounds == 4


def test_emitted_sbatch_script():
    script = emit_sbatch(submit_args("--model", "bert", "--device", "cuda", "--nodes", "2",
                                     "--gpus-per-node", "8", "--partition", "gpu", "--account",
                                     "proj", "--time", "30", "--sbatch", "qos=high",
                                     "--out", "r.json"))
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --time=30",
                 "#SBATCH --qos=high"):
        assert line in script.splitlines()
    assert script.splitlines()[-1].startswith("srun --kill-on-bad-exit=1 ")
    assert "-m gpubench dist --model bert --device cuda --out r.json" in script
    with pytest.raises(ValueError, match="one task per GPU"):
        emit_sbatch(submit_args("--model", "bert", "--gpus-per-node", "8", "--tasks-per-node",
                                "4", "--out", "r.json"))


def test_bad_sbatch_option_is_one_line(capsys):
    assert main(["submit", "--emit-sbatch", "--model", "bert", "--sbatch", "qos",
                 "--out", "x.json"]) == 2
    assert "--sbatch 'qos': expected KEY=VALUE" in capsys.readouterr().err


def dist_record(world: int, nodes: int, step_s: float, mode: str = "ddp", job: str = "7") -> dict:
    return step_record(
        f"bert-fp32-{mode}{world}", [step_s] * 3, name=f"slurm[bert-fp32-{mode}{world}]",
        parallel=mode, world_size=world, global_batch=8 * world, is_baseline=False,
        samples_per_s=8 * world / step_s,
        launcher="slurm", job_id=job, nodes=nodes, tasks_per_node=world // nodes,
        node_list=",".join(f"cn{i}" for i in range(nodes)), gpus_per_node=world // nodes,
        nccl_version="2.27.5", ib_devices=["mlx5_0"], net_env=None)


def test_summary_shows_scaling_across_nodes(tmp_path):
    one = results_file(tmp_path / "one.json", dist_record(8, 1, 0.10, job="1"),
                       dist_record(8, 1, 0.20, "fsdp", job="1"))
    two = results_file(tmp_path / "two.json", dist_record(16, 2, 0.125, job="2"),
                       dist_record(16, 2, 0.20, "fsdp", job="2"))
    df = load_results([one, two])
    table = nodes_markdown(df)
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]):
            [c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("|")}
    # DDP: 640 samples/s on one node, 1024 on two (0.125 s): 512 per node, 0.8 of one's.
    assert rows[("bert-fp32-ddp", "1")][4:8] == ["640.0", "640.0", "1", "1"]
    assert rows[("bert-fp32-ddp", "2")][2:8] == ["16", "8", "1,024.0", "512.0", "0.8", "2"]
    assert rows[("bert-fp32-fsdp", "2")][6] == "1"  # the same per node: a full share
    assert "scaling across nodes" in summary_markdown(df)
    # One node count and one node: nothing to say about nodes.
    assert nodes_markdown(load_results([one])) == ""


# Against a real Slurm


# A node busy with another test's job (under xdist) still takes jobs: they queue.
USABLE_NODE_STATES = {"idle", "mixed", "allocated", "completing"}


def _slurm_reason() -> str | None:
    if shutil.which("sinfo") is None:
        return "Slurm is not installed (sinfo not found; .ci/run starts one)"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                         timeout=30)
    if out.returncode:
        return f"Slurm does not answer: {out.stderr.strip()}"
    states = out.stdout.split()
    if not any(state.rstrip("*~#!%$@^-") in USABLE_NODE_STATES for state in states):
        return f"no Slurm node that takes jobs (states: {' '.join(states) or 'none'})"
    return None


def require_slurm() -> None:
    """Skip where no Slurm answers, with the reason; fail instead under
    ``GPUBENCH_REQUIRE_SLURM=1`` (CI, where a skipped cluster test would go unnoticed)."""
    reason = _slurm_reason()
    if reason:
        if os.environ.get("GPUBENCH_REQUIRE_SLURM") == "1":
            pytest.fail(f"GPUBENCH_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def slurm():
    """The environment of jobs on the running Slurm (one thread per rank, this checkout's
    code)."""
    require_slurm()
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_a_second_local_slurm_is_refused_in_one_line(slurm, tmp_path):
    """``scripts/slurm_local.sh start`` beside a Slurm already running on this machine (whose
    daemons hold the ports) stops at once, naming the running daemon, and leaves it alone;
    it used to wait a minute for a node that never came up."""
    if not subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True).stdout:
        pytest.skip("the running Slurm's controller is not on this machine")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "start",
                           str(tmp_path / "second")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line and "a slurmctld is already running here (pid " in line, line
    assert not (tmp_path / "second" / "slurm.conf").exists()
    assert _slurm_reason() is None  # the running one still answers


def test_without_slurm_the_tests_skip_and_in_ci_fail(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("GPUBENCH_REQUIRE_SLURM", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Slurm is not installed"):
        require_slurm()
    monkeypatch.setenv("GPUBENCH_REQUIRE_SLURM", "1")
    with pytest.raises(pytest.fail.Exception, match="GPUBENCH_REQUIRE_SLURM=1 but Slurm is"):
        require_slurm()


def test_a_node_busy_with_another_job_counts_and_a_down_one_does_not(monkeypatch):
    def sinfo(states):
        done = subprocess.CompletedProcess([], 0, stdout=states, stderr="")
        monkeypatch.setattr(subprocess, "run", lambda *a, **k: done)

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/sinfo")
    for states in ("idle\n", "allocated\n", "mixed\n", "completing\n", "down*\nidle~\n"):
        sinfo(states)
        assert _slurm_reason() is None, states
    for states in ("down*\n", "drained\n", ""):
        sinfo(states)
        assert "no Slurm node that takes jobs" in _slurm_reason(), states


def records(path: Path) -> list[dict]:
    return [b["extra_info"] for b in json.loads(path.read_text())["benchmarks"]]


def same_fields(a: dict, b: dict) -> None:
    """Two records of one case, from different launchers: the same fields and configuration."""
    where = {"launcher", "job_id", "nodes", "node_list", "tasks_per_node", "gpus_per_node",
             "nccl_version", "ib_devices", "net_env"}
    assert set(a) == set(b)
    config = ("case_id", "parallel", "world_size", "global_batch", "micro_batch",
              "input_shape", "check_losses", "flops_per_step", "param_bytes")
    for key in config:
        if key in a:
            assert a[key] == b[key], key
    assert not where & {"nccl_version"} - set(a)


@pytest.mark.slow
def test_srun_dist_writes_the_records_of_torchrun(slurm, tmp_path):
    srun = subprocess.run(
        ["nice", "-n", "19", "srun", "-n", "2", sys.executable, "-m", "gpubench", "dist", *RUN,
         "--rounds", "2", "--out", str(tmp_path / "srun.json")],
        env=slurm, capture_output=True, text=True, timeout=600)
    assert srun.returncode == 0, srun.stderr[-3000:]
    torchrun = subprocess.run(
        ["nice", "-n", "19", sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", "2", "-m", "gpubench", "dist", *RUN, "--rounds", "2",
         "--out", str(tmp_path / "torchrun.json")],
        env=slurm, capture_output=True, text=True, timeout=600)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    (s,), (t,) = records(tmp_path / "srun.json"), records(tmp_path / "torchrun.json")
    same_fields(s, t)
    assert s["launcher"] == "slurm" and t["launcher"] == "torchrun"
    assert s["job_id"].isdigit() and s["nodes"] == 1 and s["tasks_per_node"] == 2
    assert s["node_list"] == subprocess.check_output(["hostname", "-s"], text=True).strip()
    data = json.loads((tmp_path / "srun.json").read_text())
    assert data["commit_info"].get("id") or data["commit_info"].get("error")


def _final_state(job_id: str, env: dict, timeout_s: float = 600) -> tuple[str, str]:
    """(JobState, ExitCode) of the job once it has ended, read from ``scontrol`` every 0.2 s.
    ``sbatch --wait`` would return the job's exit code too, but it looks at the job 2 s after
    submitting it and then 8 s later: a job of 4 s held the test for 10."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env,
                               capture_output=True, text=True, timeout=30).stdout
        fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
        if fields.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING",
                                          "COMPLETING", "SUSPENDED"):
            return fields["JobState"], fields.get("ExitCode", "")
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end within {timeout_s:g} s")


@pytest.mark.slow
def test_emitted_sbatch_script_runs_to_completion(slurm, tmp_path):
    out = tmp_path / "sbatch.json"
    script = tmp_path / "job.sh"
    script.write_text(emit_sbatch(submit_args(*RUN, "--tasks-per-node", "2", "--rounds", "2",
                                              "--time", "10", "--out", str(out))))
    done = subprocess.run(["sbatch", "--parsable", "--nice=19", f"--chdir={tmp_path}",
                           str(script)], env=slurm, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    state = _final_state(done.stdout.strip().split(";")[0], slurm)
    logs = "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("gpubench-dist-*.log"))
    assert state == ("COMPLETED", "0:0"), f"{state}\n{logs}"
    (info,) = records(out)
    assert info["launcher"] == "slurm" and info["world_size"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_submit_brings_the_results_back(slurm, tmp_path, monkeypatch, capsys, executor):
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "results" / f"{executor}.json"
    code = main(["submit", "--executor", executor, *RUN, "--tasks-per-node", "2",
                 "--rounds", "2", "--time", "10", "--deadline", "500", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    (info,) = records(out)
    assert info["launcher"] == executor and info["world_size"] == 2
    assert info["job_id"] in capsys.readouterr().out


def _rank_process(folder: Path, rank: int) -> int | None:
    """The pid of ``rank``'s submitit task whose job folder is under ``folder``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "submitit.core._submit" in cmd and str(folder) in cmd and \
                f"SLURM_PROCID={rank}".encode() in env:
            return int(entry)
    return None


@pytest.mark.slow
def test_a_task_killed_mid_job_ends_submit_in_one_line(slurm, tmp_path, monkeypatch, capsys):
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    out, jobs = tmp_path / "killed.json", tmp_path / "jobs"
    result: dict = {}
    # Each step of this workload sleeps 0.2 s: the FSDP case's rounds (at least 6 a side)
    # outlast the 0.2 s poll below however fast the machine is.
    argv = ["submit", "--model", f"{FAULTS}:slow_step", *CASE[2:], "--parallel", "ddp",
            "fsdp", "--rounds", "10", "--tasks-per-node", "2", "--time", "10", "--deadline",
            "240", "--folder", str(jobs), "--out", str(out)]
    thread = threading.Thread(target=lambda: result.update(code=main(argv)))
    start = time.monotonic()
    thread.start()
    remote = jobs / "results" / out.name
    killed = None
    while thread.is_alive() and time.monotonic() - start < 400:
        if killed is None and remote.exists() and len(records(remote)) == 1:
            killed = _rank_process(jobs, 1)
            if killed:
                os.kill(killed, signal.SIGKILL)  # rank 1 dies during the FSDP case
        time.sleep(0.2)
    thread.join(60)
    assert killed, "the DDP case never finished, or rank 1's process was not found"
    assert result.get("code") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert "job " in err and "kept 1 finished case(s)" in err, err
    # The killed task is named as the cause, and its log given.
    assert re.search(r"tasks? (0, )?1 ended without a result", err), err
    log = Path(err.split("log: ")[1].split(";")[0])
    assert log.exists() and log.is_relative_to(jobs) and "_1_log" in log.name, err
    (info,) = records(out)
    assert info["case_id"].endswith("ddp2")
    assert time.monotonic() - start < 240 + 60


@pytest.mark.slow
def test_a_job_past_its_deadline_is_cancelled(slurm, tmp_path, monkeypatch, capsys):
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "late.json"
    start = time.monotonic()
    # A workload whose data never comes: the job outlasts its deadline however fast the
    # machine is.
    code = main(["submit", "--model", f"{FAULTS}:blocking", *CASE[2:], "--tasks-per-node", "2",
                 "--time", "10", "--deadline", "3", "--folder", str(tmp_path / "jobs"),
                 "--out", str(out)])
    assert code == 1 and time.monotonic() - start < 60
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not finished within --deadline 3 s (cancelled); log: " in err
    job_id = err.split("job ")[1].split()[0]
    # Cancelled: gone from the queue, or completing (its processes being ended).
    state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%t"], capture_output=True,
                           text=True).stdout.strip()
    assert state in ("", "CG", "CA"), state
    assert not out.exists()
