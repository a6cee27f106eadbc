"""The regression decision on synthetic rounds (power and false-alarm rate at the defaults),
cases keyed by model, profile, device and id, the CI gate, and the github-action-benchmark
export."""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from records import MACHINE, results_file, step_record  # tests/ on sys.path

from gpubench.analysis.compare import (
    Thresholds,
    compare_main,
    compare_runs,
    environment_warnings,
    github_benchmark_json,
    time_verdict,
    write_github_json,
)
from gpubench.analysis.results import ResultsError, load_results
from gpubench.cli.compare import add_compare_arguments

ROUNDS = 10  # the cpu profile's default rounds per case
NOISE = 0.03  # relative spread of round times, typical of a quiet machine
TRIALS = 400


def _sample(rng, median, n=ROUNDS):
    return median * np.exp(rng.normal(0, NOISE, n))


def test_detects_slowdown_and_rarely_false_alarms():
    rng = np.random.default_rng(1)
    th = Thresholds()
    caught = sum(
        time_verdict(_sample(rng, 1.0), _sample(rng, 1.10), th)[0] == "regression"
        for _ in range(TRIALS)
    )
    false = sum(
        time_verdict(_sample(rng, 1.0), _sample(rng, 1.0), th)[0] == "regression"
        for _ in range(TRIALS)
    )
    print(f"10% slowdown caught in {caught / TRIALS:.1%}; false alarms {false / TRIALS:.1%}")
    assert caught / TRIALS >= 0.95
    assert false / TRIALS <= 0.05


def test_small_change_below_threshold_is_unchanged():
    rng = np.random.default_rng(2)
    verdict, change, _ = time_verdict(_sample(rng, 1.0, 50), _sample(rng, 1.03, 50), Thresholds())
    assert verdict == "unchanged" and 0 < change < 0.07


def _frame(cases: dict[str, float], scale=1.0, memory=1000):
    rng = np.random.default_rng(3)
    rows = []
    for case, median in cases.items():
        rounds = list(_sample(rng, median * scale))
        rows.append({
            "case_id": case, "model": "m", "profile": "cpu", "device": "cpu",
            "is_baseline": case == "base", "step_time_s": float(np.median(rounds)),
            "rounds_s": rounds, "peak_memory_bytes": memory, "mfu": 0.1,
        })
    return pd.DataFrame(rows)


def test_added_removed_and_regressed_cases():
    base = _frame({"base": 1.0, "a": 1.0, "gone": 1.0})
    new = _frame({"base": 1.0, "a": 1.3, "fresh": 1.0})
    table = compare_runs(base, new).set_index("case_id")
    assert table.loc["a", "status"] == "regression"
    assert table.loc["gone", "status"] == "removed"
    assert table.loc["fresh", "status"] == "added"
    assert table.loc["base", "status"] == "unchanged"


def test_memory_regression_is_flagged():
    table = compare_runs(_frame({"base": 1.0}), _frame({"base": 1.0}, memory=1100))
    assert table.loc[0, "status"] == "regression"
    assert table.loc[0, "memory_change"] == pytest.approx(0.1)


def test_normalized_compare_survives_a_slower_machine():
    base = _frame({"base": 1.0, "a": 0.5})
    slower = _frame({"base": 1.0, "a": 0.5}, scale=1.5)  # everything 50% slower
    raw = compare_runs(base, slower).set_index("case_id")
    norm = compare_runs(base, slower, basis="normalized").set_index("case_id")
    assert raw.loc["a", "status"] == "regression"
    assert norm.loc["a", "status"] == "unchanged"


def test_normalized_compare_uses_the_paired_baseline_rounds():
    # The machine slowed 30% while case "a" ran (its paired baseline rounds slowed with it),
    # not while the baseline case did: against the baseline's median "a" reads 30% slower,
    # against its own paired rounds it is unchanged.
    def frame(drift):
        rows = _frame({"base": 1.0, "a": 0.5}, scale=1.0)
        a = rows["case_id"] == "a"
        rounds = [list(np.asarray(r) * drift) for r in rows.loc[a, "rounds_s"]]
        rows.loc[a, "rounds_s"] = pd.Series(rounds, index=rows.index[a])
        rows.loc[a, "step_time_s"] = [float(np.median(r)) for r in rounds]
        rows["paired_baseline_rounds_s"] = [
            list(np.full(len(r), 1.0 * (drift if c == "a" else 1.0)))
            for c, r in zip(rows["case_id"], rows["rounds_s"], strict=True)]
        return rows
    table = compare_runs(frame(1.0), frame(1.3), basis="normalized").set_index("case_id")
    assert table.loc["a", "status"] == "unchanged"
    median_only = compare_runs(frame(1.0).drop(columns="paired_baseline_rounds_s"),
                               frame(1.3).drop(columns="paired_baseline_rounds_s"),
                               basis="normalized").set_index("case_id")
    assert median_only.loc["a", "status"] == "regression"


def _runs(rng, cases, *, between, paired, regressed=(), slowdown=1.3, machine=1.0):
    """Two runs of ``cases`` cases whose rounds spread by NOISE within a run, while each case
    also moves by a random factor of spread ``between`` from one run to the next that no run's
    rounds show (on a shared machine: which core, which neighbour, what the caches hold), and
    by as much again that its paired baseline rounds, taken right before its own, share. The new
    run is ``machine`` times slower throughout and the ``regressed`` cases ``slowdown`` times
    slower still; ``paired``: the records carry their paired baseline rounds."""
    def run(scale, slow):
        own, shared = (np.exp(rng.normal(0, between, cases)) for _ in range(2))
        rows = []
        for i in range(cases):
            name = "base" if i == 0 else f"c{i}"
            rounds = _sample(rng, (1 + i / cases) * scale * own[i] * shared[i]
                             * (slowdown if name in slow else 1.0))
            row = {"case_id": name, "model": "m", "profile": "cpu", "device": "cpu",
                   "is_baseline": i == 0, "step_time_s": float(np.median(rounds)),
                   "rounds_s": list(rounds), "peak_memory_bytes": 1000}
            if paired:
                row["paired_baseline_rounds_s"] = list(_sample(rng, scale * shared[i]))
            rows.append(row)
        return pd.DataFrame(rows)
    return run(1.0, ()), run(machine, regressed)


@pytest.mark.parametrize("paired", [False, True])
def test_between_run_noise_raises_no_false_alarms_and_a_regression_still_shows(paired):
    """Cases that move 8% between runs of one commit (3% within a run) trip a gate that tests
    the rounds alone, as two runs on a shared machine did; the between-run spread of all
    compared cases keeps at least 95% of them clean, and a 30% slowdown of one case is still
    a regression."""
    rng = np.random.default_rng(7)
    alarms = {0.0: 0, 3.0: 0}
    compared = 0
    for _ in range(20):
        base, new = _runs(rng, 40, between=0.08, paired=paired)
        for sigmas in alarms:
            table = compare_runs(base, new, Thresholds(noise_sigmas=sigmas))
            alarms[sigmas] += int((table["status"] == "regression").sum())
        compared += 40
    print(f"false alarms: {alarms[0.0]} of {compared} without the noise term, "
          f"{alarms[3.0]} with it")
    assert alarms[3.0] / compared <= 0.05
    assert alarms[0.0] / compared > 0.10  # the noise that was there to be absorbed
    base, new = _runs(rng, 40, between=0.02, paired=paired, regressed={"c5"}, slowdown=1.3)
    table = compare_runs(base, new).set_index("case_id")
    assert table.loc["c5", "status"] == "regression"
    assert (table["status"] == "regression").sum() == 1
    assert table.loc["c5", "basis"] == ("paired" if paired else "raw")
    assert table.loc["base", "basis"] == "raw"  # the baseline anchors the others


def test_paired_basis_survives_a_machine_state_change_the_raw_one_reports():
    """The new run 40% slower throughout: over paired baseline rounds nothing regresses, the
    baseline's raw time does, and the shift is said in one line."""
    from gpubench.analysis.compare import common_shift, noise_line

    rng = np.random.default_rng(8)
    base, new = _runs(rng, 12, between=0.01, paired=True, machine=1.4)
    table = compare_runs(base, new).set_index("case_id")
    assert table.loc["base", "status"] == "regression"
    assert (table.drop(index="base")["status"] == "unchanged").all()
    assert "40% slower across the board" in common_shift(table.reset_index())
    line = noise_line(table.reset_index())
    assert "over paired baseline rounds (11 cases): beyond 7.0%" in line
    assert "raw (1 case)" in line
    raw = compare_runs(base, new, basis="raw")
    assert (raw["status"] == "regression").all()  # raw: the machine, in every case


# --- cases keyed by (model, profile, device, case id); thresholds; several bases; the CI gate ---

def _record(case, rounds, *, model="m", profile="cpu", device="cpu", memory=1000,
            baseline=False, mfu=0.1):
    return step_record(
        case, rounds, group=model, model=model, profile=profile, device=device,
        is_baseline=baseline, mfu=mfu, input_shape=[8, 4], flops_per_step=1, tflops=0.1,
        step_time_iqr_s=0.01, peak_memory_bytes=900 * 2**20, param_bytes=memory,
        grad_bytes=memory, optimizer_state_bytes=0, activation_bytes=memory)


def _write(path, records, machine=MACHINE):
    return results_file(path, *records, machine=machine)


def _rounds(seed, median, n=ROUNDS):
    return list(_sample(np.random.default_rng(seed), median, n))


def _args(*argv):
    p = argparse.ArgumentParser()
    add_compare_arguments(p)
    return p.parse_args(list(argv))


def test_cases_of_different_profiles_are_never_matched():
    base = _frame({"base": 1.0, "a": 1.0})
    smoke = _frame({"base": 1.0, "a": 1.0}, memory=40).assign(profile="smoke")
    table = compare_runs(base, smoke)
    assert set(table["status"]) == {"added", "removed"}
    assert len(table) == 4
    # The same case ids in the same profile on another device: not matched either.
    cuda = _frame({"base": 1.0}).assign(device="cuda")
    assert set(compare_runs(_frame({"base": 1.0}), cuda)["status"]) == {"added", "removed"}


def test_too_few_rounds_is_not_unchanged():
    rng = np.random.default_rng(4)
    three, slower = _sample(rng, 1.0, 3), _sample(rng, 2.0, 3)
    verdict, change, _ = time_verdict(three, slower, Thresholds())
    assert verdict == "too few rounds to decide" and change > 0.5  # 2x slower, yet no test
    assert time_verdict(three, slower, Thresholds(alpha=0.2))[0] == "regression"
    assert time_verdict([1.0], [1.0], Thresholds())[0] == "too few rounds to decide"
    # Four rounds each can reach p = 0.029 < 0.05.
    assert time_verdict(_sample(rng, 1.0, 4), _sample(rng, 2.0, 4), Thresholds())[0] \
        == "regression"


@pytest.mark.parametrize("kwargs", [{"alpha": 0}, {"alpha": 1}, {"alpha": math.nan},
                                    {"time": -0.1}, {"memory": math.inf}, {"time": math.nan}])
def test_thresholds_are_validated(kwargs):
    with pytest.raises(ValueError):
        Thresholds(**kwargs)


@pytest.mark.parametrize("option", ["--alpha=nan", "--alpha=0", "--alpha=1.5", "--alpha=x",
                                    "--time-threshold=-1", "--time-threshold=inf",
                                    "--memory-threshold=nan"])
def test_bad_thresholds_are_one_line_argparse_errors(option, capsys):
    with pytest.raises(SystemExit) as exit_:
        _args(option, "a.json", "b.json")
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error" in err[-1] and option.split("=")[0] in err[-1]


def test_new_run_without_comparable_case_fails(tmp_path, capsys):
    base = _write(tmp_path / "base.json", [_record("base", _rounds(1, 1.0), baseline=True)])
    crashed = _write(tmp_path / "crashed.json", [])
    other = _write(tmp_path / "smoke.json",
                   [_record("base", _rounds(2, 1.0), profile="smoke", baseline=True)])
    # A run whose cases all crashed holds no case at all: the reader refuses it, exit 2.
    from gpubench.cli.main import main

    assert main(["compare", str(base), str(crashed), "--report-only"]) == 2
    assert "holds no cases" in capsys.readouterr().err
    assert compare_main(_args(str(base), str(other), "--report-only")) == 2
    out, err = capsys.readouterr()
    assert "compared 0 case(s)" in out
    assert len([line for line in err.splitlines() if "no case comparable" in line]) == 1
    assert "profile differs: cpu vs smoke" in "\n".join(environment_warnings(base, other))


def test_compare_prints_the_count_and_gates_on_regressions(tmp_path, capsys):
    base = _write(tmp_path / "base.json", [_record("base", _rounds(1, 1.0), baseline=True),
                                           _record("a", _rounds(2, 1.0))])
    new = _write(tmp_path / "new.json", [_record("base", _rounds(3, 1.0), baseline=True),
                                         _record("a", _rounds(4, 1.5))])
    assert compare_main(_args(str(base), str(new))) == 1
    assert "compared 2 case(s): 1 regression, 1 unchanged" in capsys.readouterr().out
    assert compare_main(_args(str(base), str(new), "--report-only")) == 0


def test_several_base_files_pool_their_rounds(tmp_path, capsys):
    """Three 3-round bases against a 3-round run: alone too few rounds, pooled decisive."""
    bases = [_write(tmp_path / f"base{i}.json", [_record("a", _rounds(i, 1.0, 3))])
             for i in range(3)]
    new = _write(tmp_path / "new.json", [_record("a", _rounds(9, 1.5, 3))])
    assert compare_main(_args(str(bases[0]), str(new))) == 0
    assert "too few rounds to decide" in capsys.readouterr().out
    assert compare_main(_args(*map(str, bases), str(new))) == 1
    assert "1 regression" in capsys.readouterr().out
    repeated = [arg for b in bases for arg in ("--base", str(b))]
    assert compare_main(_args(*repeated, str(new))) == 1
    table = compare_runs(load_results(bases), load_results([new]))
    assert table.loc[0, "base_rounds"] == 9 and table.loc[0, "new_rounds"] == 3


def test_environment_warnings_name_cpu_capability_gpu_and_versions(tmp_path):
    base = _write(tmp_path / "base.json", [_record("a", _rounds(1, 1.0))])
    other = json.loads(json.dumps(MACHINE))
    other["cpu"]["flags"] = ["avx2", "fma"]
    other["gpubench"].update(cpu_capability="AVX2", torch="2.15.0", device_name="NVIDIA H100")
    new = _write(tmp_path / "new.json", [_record("a", _rounds(2, 1.0))], machine=other)
    text = "\n".join(environment_warnings(base, new))
    assert "only the base has avx512bw, avx512f" in text
    assert "'AVX512' vs 'AVX2'" in text
    assert "NVIDIA H100" in text and "2.15.0" in text
    assert environment_warnings(base, base) == []


def _valid_series(entries):
    """github-action-benchmark's custom format: a list of objects with name (str), unit (str),
    value (number), optional range (str) and extra (str)."""
    assert isinstance(entries, list) and entries
    for e in entries:
        assert isinstance(e, dict)
        assert set(e) <= {"name", "unit", "value", "range", "extra"}
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["unit"], str) and e["unit"]
        assert isinstance(e["value"], int | float) and not isinstance(e["value"], bool)
        assert math.isfinite(e["value"])
        for opt in ("range", "extra"):
            assert opt not in e or isinstance(e[opt], str)
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names))  # one series per name


def test_github_json_matches_the_action_format(tmp_path):
    src = _write(tmp_path / "run.json", [
        _record("resnet18-fp32", _rounds(1, 1.0), model="resnet18", baseline=True),
        _record("resnet18-fp32", _rounds(2, 1.0), model="resnet18", profile="smoke",
                baseline=True)])
    written = write_github_json(load_results([src]), tmp_path / "gh")
    assert [p.name for p in written] == ["smaller_is_better.json", "bigger_is_better.json"]
    smaller, bigger = (json.loads(p.read_text()) for p in written)
    _valid_series(smaller)
    _valid_series(bigger)
    names = [e["name"] for e in smaller]
    assert "resnet18-fp32 [cpu profile, cpu] median step time" in names
    assert "resnet18-fp32 [smoke profile, cpu] median step time" in names  # never mixed
    memory = [e for e in smaller if e["name"].endswith("training memory")]
    assert memory and all(e["unit"] == "MiB" and e["value"] == 3000 / 2**20 for e in memory)
    assert not [e for e in smaller if e["value"] == 900]  # never the CPU process peak
    assert any(e["name"].endswith("throughput") for e in bigger)


def test_github_json_of_committed_results_is_valid():
    committed = Path(__file__).resolve().parent / "data" / "cpu-run.json"  # a frozen CPU run
    payload = github_benchmark_json(load_results([committed]))
    for series in payload.values():
        _valid_series(series)


def test_export_without_gpubench_records_raises(tmp_path):
    empty = _write(tmp_path / "empty.json", [])
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"benchmarks": [
        {"name": "test_sum", "stats": {"data": [1.0, 1.1], "median": 1.05}}]}))
    with pytest.raises(ResultsError, match="holds no cases"):  # refused by the reader
        load_results([empty])
    df = load_results([foreign])  # loads: a pytest-benchmark file without gpubench records
    with pytest.raises(ResultsError, match="no measured gpubench case"):
        write_github_json(df, tmp_path / "gh")
    assert not (tmp_path / "gh").exists()


def test_a_machine_that_got_slower_everywhere_is_said_in_one_line(tmp_path, capsys):
    """A speed offset common to all cases (a throttled or busier machine) is the machine's:
    compare says so once, and points to --normalized; a single case's regression is not."""
    from gpubench.analysis.compare import common_shift

    names = {"base": 1.0, "a": 0.5, "b": 0.8, "c": 0.3}
    slower = compare_runs(_frame(names), _frame(names, scale=1.5))
    line = common_shift(slower)
    assert line and "50% slower across the board" in line and "--basis normalized" in line
    one = compare_runs(_frame(names), _frame({**names, "a": 0.75}))
    assert (one.set_index("case_id").loc["a", "status"] == "regression"
            and common_shift(one) is None)
    base = _write(tmp_path / "base.json", [_record(n, _rounds(i, 1.0), baseline=n == "base")
                                           for i, n in enumerate(names)])
    new = _write(tmp_path / "new.json", [_record(n, _rounds(9 + i, 1.6), baseline=n == "base")
                                         for i, n in enumerate(names)])
    assert compare_main(_args(str(base), str(new), "--report-only")) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "across the board" in ln]
    assert len(warned) == 1 and warned[0].startswith("warning: the new run is 60% slower")
