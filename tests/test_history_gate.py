"""``gpubench compare --confirm``: slowdowns beyond a lower first-stage limit are flagged and
re-measured on the new code; a flagged case stays a regression only when the re-measurement is
flagged again and the new and re-measured rounds pooled pass the second stage's limit."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from records import results_file, step_record  # tests/ on sys.path

from gpubench.analysis.compare import (
    Thresholds,
    compare_main,
    compare_markdown,
    compare_runs,
    confirm_regressions,
    noise_line,
    pooled_spread_factor,
)
from gpubench.analysis.results import load_results
from gpubench.cli.compare import add_compare_arguments
from gpubench.util.verdicts import Kind


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_compare_arguments(p)
    return p.parse_args(list(argv))


def _record(case: str, scale: float, seed: int, baseline: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    paired = np.exp(rng.normal(0, 0.02, 10))
    rounds = paired * scale * np.exp(rng.normal(0, 0.02, 10))
    return step_record(case, rounds, is_baseline=baseline,
                       paired_baseline_rounds_s=paired.tolist())


def _run(path, slow: float, seed: int):
    return results_file(path, _record("bert-fp32", 1.0, seed, baseline=True),
                        _record("bert-bf16", 0.8 * slow, seed + 1))


def test_confirm_drops_a_flag_the_remeasurement_does_not_repeat(tmp_path, capsys):
    base, new = _run(tmp_path / "base.json", 1.0, 1), _run(tmp_path / "new.json", 1.5, 3)
    calm, slow = _run(tmp_path / "calm.json", 1.0, 5), _run(tmp_path / "slow.json", 1.5, 7)
    asked = []

    def remeasure(again):
        def run(new_file, rows, base_file):
            asked.append(sorted(rows["case_id"]))
            return again
        return run

    assert compare_main(_args(str(base), str(new))) == 1
    capsys.readouterr()
    assert compare_main(_args(str(base), str(new), "--confirm"), remeasure(calm)) == 0
    out = capsys.readouterr().out
    assert asked == [["bert-bf16"]]  # only the flagged case is re-measured
    assert "time re-measured" in out and re.search(r"\|\s+no\s+\|", out)
    assert compare_main(_args(str(base), str(new), "--confirm"), remeasure(slow)) == 1
    assert re.search(r"\|\s+yes\s+\|", capsys.readouterr().out)
    # nothing re-measured: the flag stands
    assert compare_main(_args(str(base), str(new), "--confirm"), lambda f, r, b: None) == 1


def test_each_remeasurement_run_is_its_own_file(tmp_path, monkeypatch):
    """--confirm-runs 2: the flagged cases are run twice, each run one result file (pooled by
    compare as two runs), with the profile, device and -k of the flagged cases."""
    import subprocess

    from gpubench.cli.compare import remeasure_cases

    new = _run(tmp_path / "new.json", 1.0, 1)
    commands = []

    def fake_run(cmd, **kwargs):
        commands.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        _run(out / "benchmark.json", 1.0, len(commands))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    rows = compare_runs(load_results([new]), load_results([new]))
    files = remeasure_cases(_args(str(new), str(new), "--confirm-runs", "2"))(new, rows[1:]).new
    assert len(files) == 2 and all(Path(f).is_file() for f in files)
    assert len({Path(f).parent for f in files}) == 2
    assert [c[c.index("-k") + 1] for c in commands] == ["[bert-bf16]"] * 2
    assert remeasure_cases(_args(str(new), str(new)))(new, rows[1:]).new[0].is_file()
    assert all("--threads" not in c for c in commands)  # NEW does not say its threads


def test_the_remeasurement_runs_at_the_new_runs_threads(tmp_path, monkeypatch):
    """A run measured at --threads 1 is re-measured at one thread, not at torch's default;
    --confirm-args can still set them."""
    import subprocess

    from records import MACHINE

    from gpubench.cli.compare import remeasure_cases

    machine = {**MACHINE, "gpubench": {**MACHINE["gpubench"], "torch_threads": 1}}
    new = results_file(tmp_path / "new.json", _record("bert-fp32", 1.0, 1, baseline=True),
                       _record("bert-bf16", 0.8, 2), machine=machine)
    commands = []

    def fake_run(cmd, **kwargs):
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    rows = compare_runs(load_results([new]), load_results([new]))
    remeasure_cases(_args(str(new), str(new)))(new, rows[1:])
    assert commands[-1][commands[-1].index("--threads") + 1] == "1"
    remeasure_cases(_args(str(new), str(new), "--confirm-args", "--threads 2"))(new, rows[1:])
    assert [a for a in commands[-1] if a == "--threads"] == ["--threads"]
    assert commands[-1][commands[-1].index("--threads") + 1] == "2"


def _git(repo: Path, *argv: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True,
                          text=True).stdout.strip()


def _scratch_repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository with two commits (a file ``code`` reading "A", then "B"); (its folder,
    the first commit, the second), checked out at the second."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    ids = []
    for text in ("A", "B"):
        (repo / "code").write_text(text)
        _git(repo, "add", "code")
        _git(repo, "commit", "-qm", text)
        ids.append(_git(repo, "rev-parse", "HEAD"))
    return repo, ids[0], ids[1]


def _with_commit(path: Path, commit: dict | None, workload: str = "bert") -> Path:
    import json

    path = _run(path, 1.0, 1)
    data = json.loads(path.read_text())
    if commit is not None:
        data["commit_info"] = commit
    for b in data["benchmarks"]:
        b["extra_info"]["workload"] = workload
    path.write_text(json.dumps(data))
    return path


def test_the_base_code_is_remeasured_alternating_with_the_new_code(tmp_path, monkeypatch):
    """--confirm re-measures the base's code too: its commit checked out in a worktree (the
    code as it was there), in runs alternating with the new code's (base, new, new, base),
    each side with its own run's workloads; the worktree is gone afterwards."""
    import subprocess

    from gpubench.cli.compare import remeasure_cases

    repo, first, second = _scratch_repo(tmp_path)
    (repo / "sub").mkdir()
    monkeypatch.chdir(repo / "sub")
    real_run = subprocess.run
    seen, labels = [], []

    def fake_run(cmd, **kwargs):
        if cmd[1:3] != ["-m", "gpubench"]:  # git, and what get_commit_info asks
            return real_run(cmd, **kwargs)
        cwd = Path(kwargs["cwd"])
        seen.append((cmd[cmd.index("--models") + 1], (cwd.parent / "code").read_text(), cwd))
        out = cwd / cmd[cmd.index("--out") + 1]  # as gpubench run reads --out: from its cwd
        labels.append(out.name)
        out.mkdir(parents=True)
        _run(out / "benchmark.json", 1.0, len(seen))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    new = _with_commit(tmp_path / "new.json", {"id": second, "dirty": False}, "planted.py:bert")
    base = _with_commit(tmp_path / "base.json", {"id": first, "dirty": False})
    rows = compare_runs(load_results([new]), load_results([new]))[1:]
    done = remeasure_cases(_args(str(base), str(new), "--confirm"))(new, rows, base)
    assert [(models, code) for models, code, _ in seen] == [
        ("bert", "A"), ("planted.py:bert", "B"), ("planted.py:bert", "B"), ("bert", "A")]
    assert seen[1][2] == repo / "sub" and seen[0][2].name == "sub"  # the same folder below
    assert not seen[0][2].exists()  # the worktree is removed
    assert len(done.new) == len(done.base) == 2 and done.base_note is None
    assert labels == ["base1-smoke-cpu", "new1-smoke-cpu", "new2-smoke-cpu", "base2-smoke-cpu"]
    # NEW named relative to this folder (CI's `.ci-results/benchmark.json`): the base code's
    # runs, started in its checkout, still write where the gate reads them.
    seen.clear()
    (repo / "sub" / "ci").mkdir()
    relative = Path("ci") / "new.json"
    relative.write_text(new.read_text())
    done = remeasure_cases(_args(str(base), str(relative), "--confirm"))(relative, rows, base)
    assert len(done.new) == len(done.base) == 2 and done.base_note is None
    assert all(Path(f).is_absolute() and Path(f).is_file() for f in done.new + done.base)
    # The base at this checkout's own commit runs here; --confirm-against run: the new code only.
    seen.clear()
    same = _with_commit(tmp_path / "same.json", {"id": second, "dirty": False})
    remeasure_cases(_args(str(same), str(new), "--confirm"))(new, rows, same)
    assert {cwd for _, _, cwd in seen} == {repo / "sub"} and len(seen) == 4
    seen.clear()
    done = remeasure_cases(_args(str(base), str(new), "--confirm", "--confirm-against", "run"))(
        new, rows, base)
    assert len(seen) == 2 and not done.base


@pytest.mark.parametrize("commit, why", [
    (None, "records no commit"),
    ({"id": "unversioned", "dirty": False}, "records no commit"),
    ({"id": "FIRST", "dirty": True}, "uncommitted changes"),
    ({"id": "0" * 40, "dirty": False}, "not in this repository"),
])
def test_a_base_that_cannot_be_run_again_says_why(tmp_path, monkeypatch, capsys, commit, why):
    """A base whose code cannot be checked out is not re-measured; compare says why in one
    line and decides by the new code's re-measurement against the base run."""
    import subprocess

    from gpubench.cli.compare import remeasure_cases

    repo, first, _ = _scratch_repo(tmp_path)
    monkeypatch.chdir(repo)
    real_run = subprocess.run
    models = []

    def fake_run(cmd, **kwargs):
        if cmd[1:3] != ["-m", "gpubench"]:  # git, and what get_commit_info asks
            return real_run(cmd, **kwargs)
        models.append(cmd[cmd.index("--models") + 1])
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        _run(out / "benchmark.json", 1.5, len(models))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    if commit is not None and commit["id"] == "FIRST":
        commit = {**commit, "id": first}
    base = _with_commit(tmp_path / "base.json", commit)
    new = _run(tmp_path / "new.json", 1.5, 3)
    rows = compare_runs(load_results([base]), load_results([new]), screen=True)
    done = remeasure_cases(_args(str(base), str(new), "--confirm"))(new, rows[1:], base)
    assert why in done.base_note and not done.base and len(done.new) == 2
    capsys.readouterr()
    assert compare_main(_args(str(base), str(new), "--confirm"),
                        remeasure_cases(_args(str(base), str(new), "--confirm"))) == 1
    warning = [line for line in capsys.readouterr().err.splitlines() if "base code" in line]
    assert len(warning) == 1 and why in warning[0] and "compared with the base run" in warning[0]


def test_the_alternated_remeasurement_decides_a_flag():
    """A flag whose new-code re-measurement is as slow as the new run, but no slower than the
    base code re-measured beside it (the machine slowed since the base run), is dropped; a
    slowdown the base code does not share is confirmed; memory likewise, against the base code
    re-measured."""
    rng = np.random.default_rng(0)

    def frame(scale: float, runs: int, label: str) -> pd.DataFrame:
        records = []
        for _ in range(runs):
            for case, s in (("bert-fp32", 1.0), ("bert-bf16", 0.8 * scale)):
                paired = np.exp(rng.normal(0, 0.01, 12))
                rounds = paired * s * np.exp(rng.normal(0, 0.01, 12))
                records.append(step_record(case, rounds, is_baseline=case == "bert-fp32",
                                           paired_baseline_rounds_s=paired.tolist()))
        return pd.concat([load_results([results_file(
            Path(pytest_tmp) / f"{label}{i}.json", *records[2 * i:2 * i + 2])],
            labels=[f"{label}{i}"]) for i in range(runs)])

    import tempfile

    with tempfile.TemporaryDirectory() as pytest_tmp:
        base, new = frame(1.0, 1, "base"), frame(1.2, 1, "new")
        table = compare_runs(base, new, screen=True)
        assert (table["status"] == Kind.REGRESSION).sum() == 1
        slow_machine = confirm_regressions(base, new, table, frame(1.2, 2, "again"),
                                           again_base=frame(1.18, 2, "again_base"))
        row = slow_machine.set_index("case_id").loc["bert-bf16"]
        assert row["status"] == Kind.UNCHANGED and row["confirmed"] is False
        assert row["confirm_against"] == "base code, re-measured"
        assert abs(row["confirm_change"] - (1.2 / 1.18 - 1)) < 0.02
        # the same re-measurement against the base run alone confirms it
        assert confirm_regressions(base, new, table, frame(1.2, 2, "again")).set_index(
            "case_id").loc["bert-bf16", "status"] == Kind.REGRESSION
        real = confirm_regressions(base, new, table, frame(1.2, 2, "again"),
                                   again_base=frame(1.0, 2, "again_base"))
        row = real.set_index("case_id").loc["bert-bf16"]
        assert row["status"] == Kind.REGRESSION and row["confirmed"] is True
        assert "re-measured against" in compare_markdown(real)


@pytest.mark.parametrize("later, calls, code", [(1.0, 2, 0), (1.5, 3, 1)])
def test_a_flag_confirmed_against_the_base_code_gets_more_pairs_of_runs(
        tmp_path, capsys, later, calls, code):
    """Confirmed against the base code re-measured (two runs a side, the new code's slower),
    a flag gets one more pair of runs (base, new) at a time, up to CONFIRM_EXTRA_PAIRS: where
    the new code's next run is as fast as the base code's, the runs no longer agree and the
    flag is dropped; where it stays slower, it stays confirmed after every pair."""
    from gpubench.analysis.compare import Remeasurement
    from gpubench.util.verdicts import CONFIRM_EXTRA_PAIRS

    base, new = _run(tmp_path / "base.json", 1.0, 1), _run(tmp_path / "new.json", 1.5, 3)
    asked = []

    def remeasure(new_file, rows, base_file, runs=None):
        asked.append(runs)
        k = len(asked)
        scale = 1.5 if k == 1 else later
        return Remeasurement(
            new=[_run(tmp_path / f"n{k}-{i}.json", scale, 10 * k + i) for i in range(runs or 2)],
            base=[_run(tmp_path / f"b{k}-{i}.json", 1.0, 50 * k + i) for i in range(runs or 2)])

    assert compare_main(_args(str(base), str(new), "--confirm"), remeasure) == code
    assert asked == [None] + [1] * (calls - 1) and calls - 1 <= CONFIRM_EXTRA_PAIRS
    err = capsys.readouterr().err
    assert err.count("one more pair of runs (base, new)") == calls - 1


def test_the_alternated_decision_counts_runs_not_rounds():
    """confirm_alternated judges the re-measurement runs' levels: a slowdown every new run
    shows beyond the threshold is confirmed; one within the threshold is not; a case whose
    runs land on two levels 12% apart (base low, low, low; new high, high, low) is not,
    though most of its new rounds are 12% slower; the moderation keeps two runs that happen
    to agree closely from claiming more certainty than the typical spread gives."""
    from gpubench.analysis.compare import confirm_alternated

    th = Thresholds()
    held, change, limit = confirm_alternated([1.0, 1.0], [1.2, 1.2], th, 0.02, 100, 1)
    assert held and abs(change - 0.2) < 1e-9 and 0.07 <= limit < 0.2
    assert not confirm_alternated([1.0, 1.01], [1.05, 1.06], th, 0.02, 100, 1)[0]
    assert not confirm_alternated([1.0, 1.0, 1.0], [1.12, 1.12, 1.0], th, 0.02, 100, 1)[0]
    assert confirm_alternated([1.0, 1.0, 1.0], [1.12, 1.12, 1.12], th, 0.02, 100, 1)[0]
    # identical runs a side: the typical spread (8% between runs) still sets the limit
    held, _, limit = confirm_alternated([1.0, 1.0], [1.1, 1.1], th, 0.08, 100, 1)
    assert not held and limit > 0.1
    # no run on a side, or nothing to judge by: not confirmed
    assert not confirm_alternated([], [1.5], th, 0.02, 100, 1)[0]
    assert not confirm_alternated([1.0], [1.5], th, float("nan"), 3, 1)[0]


def test_the_two_stages_limits():
    """The first stage flags below the plain limit (never above it, never below half the time
    threshold); the second scales the spread to the pooled change's standard deviation."""
    th = Thresholds()
    assert th.time_limit(0.03, 140) == pytest.approx(0.09)
    assert th.screen_limit(0.03, 140) == pytest.approx(0.075)
    assert th.screen_limit(0.005, 140) == pytest.approx(0.035)  # half the 7% threshold
    assert th.screen_limit(0.03, 5) == th.time_limit(0.03, 5) == 0.07  # too few for a spread
    assert Thresholds(noise_sigmas=0).screen_limit(0.05, 140) == 0.07  # never above plain
    assert pooled_spread_factor(1, 1, 1) == pytest.approx(0.75 ** 0.5)
    assert pooled_spread_factor(2, 1, 1) == pytest.approx((1 / 1.5) ** 0.5)
    assert pooled_spread_factor(1, 1, 10**6) == pytest.approx(0.5 ** 0.5, abs=1e-5)
    factor = pooled_spread_factor(1, 1, 1)
    assert th.confirm_limit(0.03, 140, factor) == pytest.approx(0.03 * 4.2 * factor)
    assert th.confirm_limit(0.01, 140, factor) == 0.07
    assert th.confirm_limit(0.03, 5, factor) == 0.07
    with pytest.raises(ValueError):
        Thresholds(confirm_sigmas=-1)


def _spread_runs(rng, cases: int, slow: float = 1.0) -> pd.DataFrame:
    """Rounds of ``cases`` cases whose changes spread by about 2.4%; case c0 ``slow``."""
    rounds = _gate_sim().runs(rng, 1, cases, 1, "gaussian")[0]
    rounds[0] *= slow
    return _frame(rounds, "run")


def test_without_confirm_the_gate_is_the_plain_one_and_a_flag_not_remeasured_is_too():
    """compare_runs without screen flags at the plain limit (screen_limit NaN); with screen, a
    case between the two limits is flagged, and decided by the plain limit when nothing
    re-measured it."""
    rng = np.random.default_rng(2)
    base = _spread_runs(rng, 60)
    new = _spread_runs(rng, 60, slow=1.0)
    plain = compare_runs(base, new)
    screened = compare_runs(base, new, screen=True)
    assert plain["screen_limit"].isna().all()
    limit, screen = screened["time_limit"].iloc[0], screened["screen_limit"].iloc[0]
    assert screen < limit
    # plant a change between the two limits in c0
    rounds = np.asarray(new.loc[0, "rounds_s"]) * (1 + (limit + screen) / 2) / (
        1 + screened["time_change"].iloc[0])
    new.at[0, "rounds_s"] = list(rounds)
    plain, screened = compare_runs(base, new), compare_runs(base, new, screen=True)
    assert plain.loc[0, "status"] == Kind.UNCHANGED
    assert screened.loc[0, "status"] == Kind.REGRESSION
    kept = confirm_regressions(base, new, screened, None)
    assert kept.loc[0, "status"] == Kind.UNCHANGED and "not re-measured" in kept.loc[0, "note"]
    assert list(kept["status"]) == list(plain["status"])


def _gate_sim():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import gate_false_alarms
    finally:
        sys.path.pop(0)
    return gate_false_alarms


def _frame(rounds: np.ndarray, run: str) -> pd.DataFrame:
    """One run's records of ``rounds`` (cases x rounds, over paired baseline rounds of 1)."""
    return pd.DataFrame([
        {"case_id": f"c{i}", "model": "m", "profile": "cpu", "device": "cpu",
         "is_baseline": False, "step_time_s": float(np.median(r)), "rounds_s": list(r),
         "paired_baseline_rounds_s": [1.0] * len(r), "peak_memory_bytes": 1000, "run": run}
        for i, r in enumerate(rounds)])


def _runs(rounds: np.ndarray, count: int, prefix: str) -> pd.DataFrame:
    """``count`` runs' frames of pooled ``rounds`` (cases x count * rounds)."""
    per = rounds.shape[1] // count
    return pd.concat([_frame(rounds[:, k * per:(k + 1) * per], f"{prefix}{k}")
                      for k in range(count)], ignore_index=True)


def test_the_simulation_decides_as_compare_does():
    """scripts/gate_false_alarms.py decides on the simulated rounds as compare_runs and
    confirm_regressions do on the same rounds as records: the same cases fail the plain gate
    and --confirm, with one base run or two, including same-commit pairs whose flags the
    re-measurement drops; and --confirm against the base code re-measured likewise."""
    sim = _gate_sim()
    rng = np.random.default_rng(3)
    checked = dropped = 0
    for base_runs, again_runs, slow in ((1, 1, 1.0), (1, 1, 1.10), (2, 2, 1.10)):
        sides = sim.simulate(rng, 40, 60, base_runs=base_runs, again_runs=again_runs,
                             slow=slow)
        out = sim.decide(*sides, Thresholds(), base_runs, again_runs, extra_pairs=0)
        # the pairs where something was flagged, and one where nothing was
        pairs = [*np.flatnonzero(out["flagged"].any(axis=1))[:3],
                 *np.flatnonzero(~out["flagged"].any(axis=1))[:1]]
        for p in pairs:
            base = _runs(sides[0][p], base_runs, "base")
            new, again = _frame(sides[1][p], "new"), _runs(sides[2][p], again_runs, "again")
            plain = compare_runs(base, new)
            table = confirm_regressions(base, new, compare_runs(base, new, screen=True),
                                        again)
            assert list(plain["status"] == Kind.REGRESSION) == list(out["plain"][p])
            assert list(table["status"] == Kind.REGRESSION) == list(out["confirmed"][p])
            assert list(table["confirmed"].notna()) == list(out["flagged"][p])
            alternated = confirm_regressions(
                base, new, compare_runs(base, new, screen=True), again,
                again_base=_runs(sides[3][p][:, :again_runs * sim.ROUNDS], again_runs,
                                 "again_base"))
            assert list(alternated["status"] == Kind.REGRESSION) == list(out["alternated"][p])
            checked += 1
            dropped += int((out["flagged"][p] & ~out["confirmed"][p]).sum())
    assert checked >= 8 and dropped >= 1


@pytest.mark.slow
def test_confirmed_gate_false_alarms_and_power():
    """140 cases whose changes between two runs of one commit spread by about 2.4% over their
    paired rounds (scripts/gate_false_alarms.py's Gaussian noise; docs/history.md has the
    full-size table): with one re-measurement, same-commit pairs fail --confirm in under 1 in
    100 (0.72% there; plain: 19%), and a 10% slowdown of one case is caught in about 9 of 10
    pairs with two base runs, 2 of 3 with one (69% there)."""
    sim = _gate_sim()
    rng = np.random.default_rng(7)
    one = sim.measure(rng, 1500, 300, 140, "gaussian", 1, 1, 1.10, chunk=300)
    two = sim.measure(rng, 300, 300, 140, "gaussian", 2, 1, 1.10, chunk=300)
    print(one, two)
    assert one["failed"]["confirmed"] <= 0.015 * 1500
    assert one["failed"]["plain"] >= 0.1 * 1500  # what --confirm is for
    assert one["flagged"] <= 2 * 1500  # about one case per pair is re-measured
    assert one["caught"]["confirmed"] >= 0.62 * 300
    assert two["failed"]["confirmed"] <= 0.01 * 300
    assert two["caught"]["confirmed"] >= 0.87 * 300
    # with two base runs the two stages catch more than the plain limit applied twice did
    assert two["caught"]["confirmed"] >= two["caught"]["before"] + 0.04 * 300


def test_confirm_keeps_memory_regressions_that_repeat(tmp_path):
    base = load_results([results_file(tmp_path / "b.json", step_record(
        "bert-fp32", rounds=(0.1,) * 5, is_baseline=True, peak_memory_bytes=1000))])
    new = load_results([results_file(tmp_path / "n.json", step_record(
        "bert-fp32", rounds=(0.1,) * 5, is_baseline=True, peak_memory_bytes=1500))])
    table = compare_runs(base, new)
    assert table.loc[0, "status"] == Kind.REGRESSION
    assert confirm_regressions(base, new, table, new).loc[0, "status"] == Kind.REGRESSION
    assert confirm_regressions(base, new, table, base).loc[0, "status"] == Kind.UNCHANGED


def test_a_case_whose_runs_spread_widely_is_judged_by_its_own_spread():
    """Two base runs: a case whose level moved 40% between them (an emulated precision's step)
    is not called slower by a change the typical case's spread would count, while a steady
    case with the same change still is; the table says which limit was the case's own."""
    rng = np.random.default_rng(11)
    levels = np.exp(rng.normal(0, 0.01, (2, 12)))  # 12 cases, two base runs, 1% apart
    levels[:, 0] = [1.0, 1.4]  # c0 swings between processes
    new_levels = np.exp(rng.normal(0, 0.01, 12))
    new_levels[0] = 1.2 * 1.3  # 30% above the base runs' middle
    new_levels[1] = levels[:, 1].mean() * 1.3  # c1 steady, the same 30%

    def rounds(level):
        return level * np.exp(rng.normal(0, 0.005, (12, 10)))

    base = _runs(np.concatenate([rounds(levels[0][:, None]), rounds(levels[1][:, None])],
                                axis=1), 2, "base")
    new = _frame(rounds(new_levels[:, None]), "new")
    table = compare_runs(base, new).set_index("case_id")
    assert table.loc["c1", "status"] == Kind.REGRESSION
    assert not table.loc["c1", "own_limit"]
    assert table.loc["c0", "status"] == Kind.UNCHANGED
    assert table.loc["c0", "own_limit"] and table.loc["c0", "time_limit"] > 0.3
    assert table.loc["c0", "case_spread_dof"] == 1
    assert "1 case by its own spread between runs" in noise_line(table.reset_index())
    shown = compare_markdown(table.reset_index())
    assert "own spread between runs" in shown
    assert re.search(r"\| c0 .*\|\s+\d+\.\d% \(limit \d+\.\d%\) \|$", shown, re.M)
    assert re.search(r"\| c1 .*\|\s+- \|$", shown, re.M)
    # one base run: no case has two runs of one side, every limit is the basis's
    one = compare_runs(_frame(rounds(levels[0][:, None]), "base"), new)
    assert not one["own_limit"].any() and one["case_spread"].isna().all()
    assert one.set_index("case_id").loc["c1", "status"] == Kind.REGRESSION


def test_the_remeasurement_brings_the_cases_own_spread_to_the_confirmation():
    """One base run: a flagged case whose re-measurement lands far from the new run (its level
    moves between processes) is judged by the spread the two show; one whose re-measurement
    repeats the new run is confirmed."""
    rng = np.random.default_rng(5)
    flat = np.exp(rng.normal(0, 0.01, (12, 1)))

    def run(level_c0, name):
        rounds = flat * np.exp(rng.normal(0, 0.005, (12, 10)))
        rounds[0] *= level_c0
        return _frame(rounds, name)

    base = run(1.0, "base")
    new, steady = run(1.25, "new"), run(1.24, "again")
    screened = compare_runs(base, new, screen=True)
    assert screened.loc[0, "status"] == Kind.REGRESSION
    held = confirm_regressions(base, new, screened, steady)
    assert held.loc[0, "status"] == Kind.REGRESSION
    # 60% slower, re-measured 20% slower: without the case's own spread both stages pass
    new, swinging = run(1.6, "new"), run(1.2, "again")
    screened = compare_runs(base, new, screen=True)
    dropped = confirm_regressions(base, new, screened, swinging)
    assert dropped.loc[0, "status"] == Kind.UNCHANGED
    assert dropped.loc[0, "confirm_limit"] > held.loc[0, "confirm_limit"] + 0.1


def test_run_spread_and_its_moderation():
    from gpubench.util.stats import moderated_spread, run_spread

    spread, dof = run_spread([[1.0, np.e ** 0.2], [2.0]])  # logs 0 and 0.2: sd 0.1414
    assert dof == 1 and spread == pytest.approx(np.expm1(0.2 / 2 ** 0.5))
    assert run_spread([[1.0], [2.0]]) == (pytest.approx(np.nan, nan_ok=True), 0)
    # two sides pool their squares about their own means: (2 x 0.1^2 + 2 x 0.1^2) / 2
    assert run_spread([[np.e ** -0.1, np.e ** 0.1], [1, np.e ** 0.2]])[0] == pytest.approx(
        np.expm1((0.04 / 2) ** 0.5))
    typical = np.expm1(0.02)
    # a chance difference of twice the typical spread moves a little, ten times most of the way
    assert moderated_spread(np.expm1(0.04), 1, typical, 4) == pytest.approx(
        np.expm1(((4 * 0.02 ** 2 + 0.04 ** 2) / 5) ** 0.5))
    assert np.log1p(moderated_spread(np.expm1(0.2), 1, typical, 4)) > 0.08
    assert moderated_spread(0.3, 1, np.nan, 4) == 0.3
    assert np.isnan(moderated_spread(np.nan, 0, typical, 4))
