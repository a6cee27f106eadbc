import json
import math
import warnings
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records import BASELINE, stats, step_record  # tests/ on sys.path

from gpubench.analysis.results import (
    REQUIRED_FIELDS,
    ResultsError,
    load_results,
    read_benchmark_json,
    with_baseline_ratios,
)

COMMITTED = Path(__file__).resolve().parent / "data" / "cpu-run.json"  # a frozen CPU run

STATS = stats([0.09, 0.1, 0.12])
EXTRA = BASELINE


def _record(**extra):
    return step_record(group="bert", **extra)


def _doc(*benchmarks):
    return {"machine_info": {"node": "n", "gpubench": {"cpu": "x", "torch": "2"}},
            "benchmarks": list(benchmarks), "datetime": "2026-01-01T00:00:00",
            "version": "5.1.0"}


def _write(path, benchmarks):
    path.write_text(json.dumps({"machine_info": {}, "benchmarks": benchmarks, "version": "5"}))
    return path


def test_not_json_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(ResultsError, match="bad.json"):
        load_results([bad])


def test_missing_fields_load_with_warning(tmp_path):
    old = _write(tmp_path / "old.json", [
        {"name": "test_x", "group": None, "stats": {"median": 0.1, "data": [0.1, 0.1]},
         "extra_info": {"model": "bert"}},
    ])
    with pytest.warns(UserWarning, match="old.json: records lack .*step_time_s"):
        df = load_results([old])
    assert len(df) == 1 and df.loc[0, "time_median"] == 0.1
    assert df.loc[0, "rounds_s"] == [0.1, 0.1]


def test_several_files_become_runs(tmp_path):
    info = {"case_id": "c", "model": "m"}
    a = _write(tmp_path / "a.json", [{"name": "c", "stats": {"median": 1}, "extra_info": info}])
    b = _write(tmp_path / "b.json", [{"name": "c", "stats": {"median": 1}, "extra_info": info}])
    with pytest.warns(UserWarning):
        df = load_results([a, b])
    assert list(df["run"]) == ["a", "b"]
    with pytest.warns(UserWarning):  # one file may be given as its path alone
        assert list(load_results(str(a))["run"]) == list(load_results(a)["run"]) == ["a"]


def test_committed_results_load_with_nullable_dtypes():
    df = load_results([COMMITTED])
    assert len(df) > 0 and set(df["kind"]) <= {"step", "claim", "overhead"}
    assert df["is_baseline"].dtype == "boolean"
    for col in ("accum_steps", "micro_batch", "global_batch", "world_size", "peak_memory_bytes",
                "flops_per_step", "time_rounds", "prefetch_factor"):
        assert df[col].dtype == "Int64", col
    for col in ("step_time_s", "samples_per_s", "time_median", "tflops"):
        assert df[col].dtype == "float64", col
    claims = df[df["kind"] == "claim"]
    assert claims["is_baseline"].isna().all()  # not a float NaN or None: <NA>
    steps = with_baseline_ratios(df[df["kind"] == "step"])
    assert (steps.loc[steps["is_baseline"] == True, "speedup"] == 1.0).all()  # noqa: E712


def test_required_columns_exist_even_when_no_record_has_them(tmp_path):
    path = _write(tmp_path / "f.json", [{"name": "x", "stats": {"median": 1.0}}])
    with pytest.warns(UserWarning):
        df = load_results([path])
    assert set(REQUIRED_FIELDS) <= set(df.columns)
    assert df["world_size"].dtype == "Int64" and df["is_baseline"].dtype == "boolean"
    assert df.loc[0, "kind"] == "step"


# Every malformed file: (what, file content, expected field in the one-line message)
MALFORMED = {
    "not an object": ([1, 2], "top level: expected an object"),
    "no benchmarks": ({"machine_info": {}}, "benchmarks: expected a list"),
    "benchmarks null": ({"benchmarks": None}, "benchmarks: expected a list, got null"),
    "empty benchmarks": (_doc(), "benchmarks: empty"),
    "null entry": (_doc(None), r"benchmarks\[0\]: expected an object, got null"),
    "name missing": (_doc({"stats": STATS}), r"benchmarks\[0\].name"),
    "stats null": (_doc({**_record(), "stats": None}), r"benchmarks\[0\].stats: expected"),
    "median missing": (_doc({**_record(), "stats": {"min": 1.0}}), r"stats.median: missing"),
    "extra_info a list": (_doc({**_record(), "extra_info": [1]}),
                          r"benchmarks\[0\].extra_info: expected an object"),
    "extra_info a string": (_doc({**_record(), "extra_info": "x"}), r"extra_info: expected"),
    "zero time": (_doc({**_record(), "stats": {**STATS, "median": 0}}),
                  r"stats.median: expected a positive number, got 0"),
    "negative time": (_doc(_record(step_time_s=-1.0)), r"extra_info.step_time_s: expected a "
                      r"positive number, got -1.0"),
    "NaN time": (_doc({**_record(), "stats": {**STATS, "mean": math.nan}}), r"stats.mean:.*nan"),
    "infinite throughput": (_doc(_record(samples_per_s=math.inf)), r"samples_per_s:.*inf"),
    "NaN in rounds": (_doc({**_record(), "stats": {**STATS, "data": [0.1, math.nan]}}),
                      r"stats.data: item 1"),
    "string number": (_doc(_record(accum_steps="2")), r"extra_info.accum_steps: expected a "
                      r"positive integer, got \"2\""),
    "bool as int": (_doc(_record(world_size=True)), r"world_size: expected a positive integer"),
    "float as int": (_doc(_record(global_batch=8.5)), r"global_batch: expected"),
    "int as bool": (_doc(_record(is_baseline=1)), r"is_baseline: expected true or false"),
    "huge integer": (_doc(_record(peak_memory_bytes=10**30)),
                     r"peak_memory_bytes: .*integer of 31 digits"),
    "huge unknown integer": (_doc(_record(custom=[10**20])), r"extra_info.custom: holds an "
                             "integer beyond 64 bits"),
    "null required field": (_doc(_record(model=None)), r"extra_info.model: is null"),
    "model a number": (_doc(_record(model=3)), r"extra_info.model: expected a string"),
    "unknown kind": (_doc(_record(kind="weird")), r"extra_info.kind: expected one of"),
    "machine_info a list": ({**_doc(_record()), "machine_info": []}, r"machine_info: expected"),
    "input_shape of strings": (_doc(_record(input_shape=["a"])), r"input_shape: item 0"),
    "rounds zero": (_doc({**_record(), "stats": {**STATS, "rounds": 0}}), r"stats.rounds"),
    "phases a number": (_doc(_record(harness_s=-1)), r"harness_s: expected a mapping"),
    "a phase infinite": (_doc(_record(harness_s={"build": 0.5, "check": float("-inf")})),
                         r"harness_s: check: expected a non-negative number, got -inf"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_is_one_line_naming_file_and_field(tmp_path, case):
    content, field = MALFORMED[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))  # Python's json writes NaN/Infinity as pytest-benchmark
    with pytest.raises(ResultsError, match=field) as err:
        load_results([path])
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message


@pytest.mark.parametrize("content,reason", [
    (b"\xff\xfe junk", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"benchmarks": [' + b"9" * 5000 + b"]}", "not usable JSON"),
    (b"", "not JSON"),
])
def test_unreadable_content(tmp_path, content, reason):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(ResultsError, match=reason):
        read_benchmark_json(path)


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(ResultsError, match="is a directory"):
        load_results([tmp_path])
    with pytest.raises(ResultsError, match="no such file"):
        load_results([tmp_path / "nope.json"])


def test_valid_record_loads():
    assert read_benchmark_json(COMMITTED)["benchmarks"]


# -- property: whatever is malformed, the reader says so with ResultsError and nothing else ----

JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.text(max_size=5),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8)
KEYS = [*EXTRA, "custom", "time_median", "run", "rounds_base_s", "check_losses"]


@st.composite
def mutated_documents(draw):
    """A valid result document with a few parts replaced by random JSON values."""
    doc = _doc(_record(), _record(kind="claim", claim="c"))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["doc", "machine", "bench", "stats", "extra", "extra"]))
        value = draw(JSON)
        benches = doc.get("benchmarks")
        bench = (benches[draw(st.integers(0, len(benches) - 1))]
                 if isinstance(benches, list) and benches else None)
        if where == "doc":
            doc[draw(st.sampled_from(["benchmarks", "machine_info", "datetime", "version"]))] = \
                value
        elif where == "machine" and isinstance(doc.get("machine_info"), dict):
            doc["machine_info"][draw(st.sampled_from(["node", "cpu", "gpubench"]))] = value
        elif isinstance(bench, dict) and where == "bench":
            bench[draw(st.sampled_from(["name", "group", "stats", "extra_info"]))] = value
        elif isinstance(bench, dict) and where == "stats" and isinstance(bench.get("stats"),
                                                                        dict):
            bench["stats"][draw(st.sampled_from([*STATS, "ops"]))] = value
        elif isinstance(bench, dict) and isinstance(bench.get("extra_info"), dict):
            bench["extra_info"][draw(st.sampled_from(KEYS))] = value
    return doc


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=st.one_of(mutated_documents(), JSON))
def test_random_malformed_records_raise_only_results_error(tmp_path, doc):
    path = tmp_path / "random.json"
    path.write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            df = load_results([path])
        except ResultsError as err:
            assert str(err).startswith(f"{path}: ") and "\n" not in str(err)
            return
        assert isinstance(df, pd.DataFrame) and len(df) == len(doc["benchmarks"])
        assert df["kind"].isin(["step", "claim", "overhead"]).all()
        assert (df["time_median"] > 0).all()
        with_baseline_ratios(df)


def test_run_cost_splits_the_cases_time_into_timed_rounds_and_each_untimed_part(tmp_path):
    from gpubench.report.summary import PHASES, run_cost, run_cost_markdown, summary_markdown

    harness = {"build": 0.5, "check": 0.3, "count": 0.1, "warmup": 0.1, "rounds": 0.9}
    rec = _record(harness_s=harness, paired_baseline_rounds_s=[0.1, 0.1, 0.1])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_doc(rec)))
    df = load_results([path])
    cost = run_cost(df).set_index("part")["seconds"]
    assert cost["timed rounds of the cases"] == pytest.approx(0.31)  # STATS' rounds
    assert cost["paired baseline rounds"] == pytest.approx(0.3)
    assert cost[PHASES["untimed_rounds"]] == \
        pytest.approx(0.9 - 0.61)
    assert cost.sum() == pytest.approx(sum(harness.values()))
    text = run_cost_markdown(df)
    assert "32% of it timed rounds" in text  # 0.61 of 1.9 s
    assert "Where the cases' time went" in summary_markdown(df)
    old = tmp_path / "old.json"  # results from before harness_s: no section
    old.write_text(json.dumps(_doc(_record())))
    assert run_cost_markdown(load_results([old])) == ""


def test_the_overhead_tables_show_each_figures_interval_and_a_dash_before_it_was_recorded(
        tmp_path):
    from gpubench.report.summary import summary_markdown

    def rows(doc) -> dict[str, str]:  # the two overhead tables' lines, by their first cell
        path = tmp_path / "run.json"
        path.write_text(json.dumps(doc))
        text = summary_markdown(load_results([path])).split("### Harness overhead")[1]
        return {line.split("|")[1].strip(): line for line in text.splitlines()
                if line.startswith("| ")}

    def interval(line: str) -> str:
        return line.split("|")[5].strip()

    doc = json.loads(COMMITTED.read_text())  # written before the intervals were recorded
    before = rows(doc)
    assert interval(before["overhead-bert"]) == interval(before["telemetry-bert"]) == "-"
    records = {b["extra_info"].get("case_id"): b["extra_info"] for b in doc["benchmarks"]}
    records["overhead-bert"].update(harness_overhead_low=-0.031, harness_overhead_high=0.0042)
    records["telemetry-bert"].update(telemetry_overhead_low=-0.02, telemetry_overhead_high=0.05)
    after = rows(doc)
    assert interval(after["overhead-bert"]) == "-3.10% to +0.42%"
    assert interval(after["telemetry-bert"]) == "-2.00% to +5.00%"
    assert interval(after["overhead-resnet18"]) == interval(after["telemetry-resnet18"]) == "-"
