"""The history store, its series and change points, and ``gpubench history``: synthetic
histories built from the real records of ``tests/data/cpu-run.json`` (bert's cases, their
rounds resampled per run, with a run-wide machine factor and a between-run spread as measured
on the paired basis), one case slowed by 10% from a chosen commit."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from gpubench.analysis.history import (
    change_points,
    detect,
    history_series,
    machine_changes,
    read_history,
    save_run,
)
from gpubench.cli.main import main
from gpubench.measure.provenance import library_changes, recorded_machine

REAL = Path(__file__).parent / "data" / "cpu-run.json"
SLOWED = "bert-fp32-adam"
OTHER_CPU = "Intel(R) Xeon(R) Platinum 8480+"


def _real_bert() -> dict:
    data = json.loads(REAL.read_text())
    data["benchmarks"] = [b for b in data["benchmarks"]
                          if b["extra_info"].get("model") == "bert"
                          and b["extra_info"].get("kind") == "step"]
    return data


def synthetic_run(real: dict, i: int, *, slow_from: int | None = None, factor: float = 1.10,
                  machine: str | None = None, spread: float = 0.02, seed: int = 0) -> dict:
    """Run ``i`` of a history: every real record's rounds resampled (pairs kept together),
    times a machine factor common to the run (cancels on the paired basis) and a per-case
    between-run factor of ``spread``; ``SLOWED`` times ``factor`` from run ``slow_from`` on."""
    rng = np.random.default_rng(seed * 1000 + i)
    data = copy.deepcopy(real)
    machine_factor = float(np.exp(rng.normal(0, 0.08)))
    for bench in data["benchmarks"]:
        extra, stats = bench["extra_info"], bench["stats"]
        rounds = np.asarray(stats["data"], dtype=float)
        paired = np.asarray(extra["paired_baseline_rounds_s"], dtype=float)
        pick = rng.integers(0, rounds.size, rounds.size)
        case_factor = machine_factor * float(np.exp(rng.normal(0, spread)))
        if slow_from is not None and i >= slow_from and extra["case_id"] == SLOWED:
            case_factor *= factor
        rounds, paired = rounds[pick] * case_factor, paired[pick] * machine_factor
        stats.update(data=rounds.tolist(), median=float(np.median(rounds)),
                     min=float(rounds.min()), max=float(rounds.max()),
                     mean=float(rounds.mean()))
        extra.update(step_time_s=float(np.median(rounds)),
                     samples_per_s=extra["global_batch"] / float(np.median(rounds)),
                     paired_baseline_rounds_s=paired.tolist())
    data["commit_info"] = {"id": f"{i:04d}" + "ab" * 18, "dirty": False, "branch": "main",
                           "time": f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00+00:00"}
    data["datetime"] = data["commit_info"]["time"]
    if machine:
        data["machine_info"]["gpubench"]["cpu"] = machine
        data["machine_info"]["gpubench"]["device_name"] = machine
        data["machine_info"]["cpu"]["brand_raw"] = machine
    return data


def build_history(folder: Path, scratch: Path, runs: int, **kw) -> Path:
    real = _real_bert()
    machine_from = kw.pop("machine_from", None)
    for i in range(runs):
        data = synthetic_run(real, i, machine=OTHER_CPU if machine_from is not None
                             and i >= machine_from else None, **kw)
        path = scratch / f"run{i}.json"
        path.write_text(json.dumps(data))
        save_run(path, folder)
    return folder


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """30 runs, SLOWED 10% slower from run 20, then 6 runs on another machine."""
    root = tmp_path_factory.mktemp("history")
    (root / "scratch").mkdir()
    return build_history(root / "h", root / "scratch", 36, slow_from=20, machine_from=30)


def test_store_is_one_small_index_per_run_with_raw_apart(planted):
    indexes = sorted(p for p in planted.rglob("*.json") if "raw" not in p.parts)
    raws = sorted(planted.rglob("raw/*.json.gz"))
    assert len(indexes) == len(raws) == 36
    assert len({p.parent for p in indexes}) == 2  # a folder per machine fingerprint
    (path,) = [p for p in indexes if "_0000abab" in p.name]
    first = json.loads(path.read_text())
    assert first["commit"]["id"].startswith("0000") and first["commit"]["branch"] == "main"
    assert first["profiles"] == ["cpu"] and len(first["cases"]["case_id"]) == 30
    assert path.name.startswith("0001_0000abab")
    assert max(p.stat().st_size for p in indexes) < 12_000  # the index stays small


def test_planted_step_found_at_its_commit_and_nothing_else(planted):
    history = read_history(planted)
    assert list(history.runs["commit_id"].str[:4]) == [f"{i:04d}" for i in range(36)]
    series = history_series(history)
    adam = series[(series["case_id"] == SLOWED) & (series["metric"] == "time")]
    assert set(adam["on"]) == {"paired"}  # the default basis
    changes = detect(series)
    held = changes[changes["persistent"]]
    assert len(held) == 1, held[["case_id", "metric", "first_bad", "ratio", "p"]]
    cp = held.iloc[0]
    assert cp["case_id"] == SLOWED and cp["metric"] == "time"
    assert cp["last_good"].startswith("0019") and cp["first_bad"].startswith("0020")
    assert 1.05 < cp["ratio"] < 1.16 and cp["low"] < cp["ratio"] < cp["high"]
    assert cp["p"] < 0.01
    assert cp["machine_name"].startswith("AMD EPYC")


def test_machine_change_starts_its_own_series(planted):
    history = read_history(planted)
    lines = machine_changes(history)
    assert len(lines) == 1 and "0030" in lines[0] and OTHER_CPU in lines[0]
    series = history_series(history)
    adam = series[(series["case_id"] == SLOWED) & (series["metric"] == "time")]
    assert sorted(adam.groupby("machine_id").size()) == [6, 30]


def test_raw_basis_mixes_nothing_either(planted):
    series = history_series(read_history(planted), basis="raw")
    assert set(series[series["metric"] == "time"]["on"]) == {"raw"}
    # the machine factor moves raw times by ~8% per run; no time change point on the fp32
    # baseline survives the rank test and the magnitude together more than rarely
    assert len(series.groupby(["case_id", "metric", "machine_id"])) == 2 * 2 * 30


def test_window_and_case_filter(planted):
    history = read_history(planted, since="0005", until="2026-11-01T15:00:00+00:00",
                           cases="adam$")
    assert list(history.runs["commit_id"].str[:4]) == [f"{i:04d}" for i in range(5, 16)]
    assert set(history.cases["case_id"]) == {"bert-fp32-adam"}
    with pytest.raises(ValueError, match="--since 'yesterday'"):
        read_history(planted, since="yesterday")
    with pytest.raises(ValueError, match="matches no case"):
        read_history(planted, cases="nosuchcase")


def test_change_points_on_plain_series():
    rng = np.random.default_rng(3)
    flat = np.exp(rng.normal(0, 0.03, 40))
    assert change_points(flat) == []
    step = flat.copy()
    step[25:] *= 1.15
    (cp,) = change_points(step)
    assert cp.at == 25 and cp.persistent and cp.p < 0.01
    last = flat.copy()
    last[-1] *= 1.5  # only the latest run: pending, not a change
    (cp,) = change_points(last)
    assert cp.at == 39 and not cp.persistent
    small = flat.copy()
    small[25:] *= 1.03  # real but below the minimum magnitude
    assert change_points(small, min_magnitude=0.07) == []


def test_cli_writes_md_and_self_contained_html(planted, tmp_path, capsys):
    code = main(["history", str(planted), "-o", str(tmp_path), "--until", "0029"])
    out = capsys.readouterr().out
    assert code == 0
    md = (tmp_path / "history.md").read_text()
    assert "## Change points" in md and SLOWED in md and "0019abab" in md
    assert "## Latest value and trend of every case" in md
    page = (tmp_path / "history.html").read_text()
    assert page.count("data:image/png;base64,") == 1 and "<table>" in page
    assert "read 30 runs" in out


def test_reads_pytest_benchmark_storage(tmp_path):
    storage = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    storage.mkdir(parents=True)
    real = _real_bert()
    for i in range(3):
        data = synthetic_run(real, i)
        (storage / f"{i + 1:04d}_{data['commit_info']['id']}_20261101_000000.json").write_text(
            json.dumps(data))
    (storage / "notes.json").write_text("[]")
    history = read_history(tmp_path / ".benchmarks")
    assert len(history.runs) == 3 and len(history.skipped) == 1
    assert statistics.median(history.cases.groupby("run").size()) == 30


def test_add_and_run_option(tmp_path, capsys):
    data = synthetic_run(_real_bert(), 0)
    del data["commit_info"]
    result = tmp_path / "r.json"
    result.write_text(json.dumps(data))
    assert main(["history", str(tmp_path / "h"), "--add", str(result)]) == 0
    (index,) = [p for p in (tmp_path / "h").rglob("*.json") if "raw" not in p.parts]
    commit = json.loads(index.read_text())["commit"]
    assert commit["id"]  # this checkout's commit, from git
    assert "added" in capsys.readouterr().out


def test_empty_or_missing_history_is_one_line(tmp_path, capsys):
    assert main(["history", str(tmp_path / "none")]) == 2
    assert "no such history folder" in capsys.readouterr().err
    assert main(["history", str(tmp_path)]) == 2
    assert "holds no run" in capsys.readouterr().err


def test_the_machine_is_read_from_the_fingerprint_and_older_files_as_before():
    """One reading of a result file's machine (``recorded_machine``, beside the fingerprint's
    other readers): from the recorded fingerprint where there is one; a file written before it
    (``tests/data/cpu-run.json``) keeps the id its history folder is named by."""
    info = json.loads(REAL.read_text())["machine_info"]
    assert "fingerprint" not in info["gpubench"]
    old = recorded_machine(info)
    assert old["id"] == "11dd8782b3"  # a history saved before keeps its folder and series
    assert old["name"] == "AMD EPYC, 2 CPUs, 2 threads, AVX512"
    assert old["software"]["torch"] == "2.14.1+cu130" and old["software"]["python"] == "3.11.7"
    # pytest-benchmark's own record (no gpubench block): its CPU brand
    assert recorded_machine({"cpu": {"brand_raw": "AMD EPYC", "count": 2}})["name"] == (
        "AMD EPYC, 2 CPUs")
    g = info["gpubench"]
    fp = {"cpu": g["cpu"], "cpu_count": g["cpu_count"], "device": "cpu",
          "device_name": g["device_name"], "device_count": 1, "driver": None, "node": "other",
          "libraries": {"torch": "2.14.1+cu130", "numpy": "2.4.6"}, "commit": "abc",
          "date": "2026-12-01T00:00:00+00:00"}
    same = copy.deepcopy(info)
    same["gpubench"]["fingerprint"] = fp
    assert recorded_machine(same)["id"] == old["id"]  # the same machine either way
    assert recorded_machine(same)["software"] == fp["libraries"]
    gpu = copy.deepcopy(same)  # the fingerprint decides, not the fields beside it
    gpu["gpubench"]["fingerprint"] = {**fp, "device": "cuda", "device_name": "NVIDIA H200",
                                      "device_count": 8, "driver": "570.86"}
    machine = recorded_machine(gpu)
    assert machine["id"] != old["id"] and machine["name"] == "8 x NVIDIA H200, driver 570.86"
    newer = copy.deepcopy(gpu)
    newer["gpubench"]["fingerprint"]["driver"] = "575.51"
    assert recorded_machine(newer)["id"] != machine["id"]  # another driver: another series


def test_library_changes_name_what_both_runs_record():
    assert library_changes({"torch": "2.4.0", "cudnn": 92400, "python": "3.11"},
                           {"torch": "2.5.0", "cudnn": "92400", "numpy": "2.0"}) == (
        "torch 2.4.0 -> 2.5.0")
    assert library_changes({"torch": "2.4.0"}, {"torch": "2.4.0"}) == ""


def test_a_runs_own_results_folder_does_not_make_its_commit_dirty(tmp_path, monkeypatch):
    """A history keys on (commit, dirty): a run writing into a tracked results folder is still
    a run of its commit; a changed source file, or one moved into the results folder, makes it
    dirty, and a results file in the checkout's top folder sets nothing aside."""
    import subprocess

    from gpubench.measure import provenance

    repo = tmp_path / "repo"

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    (repo / "results").mkdir(parents=True)
    (repo / "results" / "benchmark.json").write_text("{}")
    (repo / "src.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    monkeypatch.setattr(provenance, "OUTPUT_FOLDERS", [])
    assert provenance.checkout_dirty(repo) is False
    (repo / "results" / "benchmark.json").write_text('{"new": 1}')
    assert provenance.checkout_dirty(repo) is True  # nothing set aside yet
    provenance.ignore_in_commit(repo / "results")
    assert provenance.checkout_dirty(repo) is False
    assert provenance.checkout_dirty(repo / "results") is False  # from inside too
    git("mv", "results/benchmark.json", "results/previous.json")  # a rename inside it
    assert provenance.checkout_dirty(repo) is False
    git("reset", "-q", "--hard")
    (repo / "src.py").write_text("x = 2\n")
    assert provenance.checkout_dirty(repo) is True
    git("checkout", "-q", "src.py")
    git("mv", "src.py", "results/src.py")  # moved into the results folder: gone from outside
    assert provenance.checkout_dirty(repo) is True
    git("reset", "-q", "--hard")
    (repo / "src.py").write_text("x = 3\n")
    provenance.ignore_in_commit(repo)  # results written to the top folder: nothing set aside
    assert provenance.checkout_dirty(repo) is True
    plain = tmp_path / "plain"
    plain.mkdir()
    assert provenance.checkout_dirty(plain) is None  # an existing folder, not a checkout
