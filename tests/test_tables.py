"""Dependencies doing the work: every Markdown table is pandas' ``to_markdown`` (tabulate), the
CPU name is py-cpuinfo's; and the Python API's columns are documented in docs/api.md with their
units and nullable dtypes."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from gpubench.analysis.results import EXTRA_SCHEMA, load_results, with_baseline_ratios
from gpubench.cli import main as cli
from gpubench.measure import machine
from gpubench.util.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "tests" / "data" / "cpu-run.json"  # a frozen CPU run


@pytest.fixture(scope="module")
def resnet(tmp_path_factory) -> pd.DataFrame:
    """The committed CPU results of one model."""
    data = json.loads(COMMITTED.read_text())
    data["benchmarks"] = [b for b in data["benchmarks"]
                          if (b.get("extra_info") or {}).get("model") == "resnet18"]
    path = tmp_path_factory.mktemp("resnet") / "resnet.json"
    path.write_text(json.dumps(data))
    return load_results([path])


@pytest.fixture
def pandas_tables(monkeypatch) -> list[str]:
    """Every table ``DataFrame.to_markdown`` writes while the test runs."""
    written, original = [], pd.DataFrame.to_markdown

    def spy(self, *args, **kwargs):
        written.append(original(self, *args, **kwargs))
        return written[-1]

    monkeypatch.setattr(pd.DataFrame, "to_markdown", spy)
    return written


def assert_tables_from_pandas(text: str, written: list[str]) -> None:
    """Every table line of ``text`` comes from a table pandas wrote, and there is one."""
    table_lines = [line for line in text.splitlines() if line.startswith("|")]
    assert table_lines and written
    from_pandas = {line for table in written for line in table.splitlines()}
    assert set(table_lines) <= from_pandas
    for table in written:
        widths = {len(line) for line in table.splitlines()}
        assert len(widths) == 1, table  # padded columns: the lines line up


def test_summary_advice_compare_and_runs_tables_are_pandas(resnet, pandas_tables):
    from gpubench.analysis.advice import advice_markdown
    from gpubench.analysis.compare import compare_markdown, compare_runs
    from gpubench.report.page import runs_markdown
    from gpubench.report.summary import summary_markdown

    for write in (summary_markdown, advice_markdown, runs_markdown,
                  lambda df: compare_markdown(compare_runs(df, df))):
        before = len(pandas_tables)
        text = write(resnet)
        assert_tables_from_pandas(text, pandas_tables[before:])
    summary = summary_markdown(resnet)
    separator = next(line for line in summary.splitlines() if line.startswith("|:"))
    assert re.fullmatch(r"\|:-+(\|-+:)+\|:-+\|", separator)  # case left, figures right, flags


def test_trace_and_memory_tables_are_pandas(monkeypatch, pandas_tables, capsys):
    import gpubench.diagnostics.frontier
    import gpubench.diagnostics.leaks
    from gpubench.diagnostics.frontier import Frontier, Try
    from gpubench.diagnostics.leaks import LeakResult
    from gpubench.measure.trace import op_changes_markdown

    ops = [{"name": "aten::mm", "self_time_s": 0.01, "share": 0.5, "calls": 1, "flops": None}]
    frame = pd.DataFrame([
        {"run": "r", "model": "m", "case_id": "m-fp32", "is_baseline": True,
         "group": "precision", "top_ops": ops, "top_ops_time": "cpu"},
        {"run": "r", "model": "m", "case_id": "m-bf16", "is_baseline": False,
         "group": "precision", "top_ops": ops, "top_ops_time": "cpu"}])
    assert_tables_from_pandas(op_changes_markdown(frame), pandas_tables)

    budgets = []

    def find_frontier(cfg, budget, limit):
        budgets.append(budget)
        return Frontier(cfg.id, 8, [Try(8, True, 100)])

    monkeypatch.setattr(gpubench.diagnostics.frontier, "find_frontier", find_frontier)
    monkeypatch.setattr(gpubench.diagnostics.leaks, "check_loops", lambda build, budget_bytes: [
        LeakResult("sum | of losses", 0.0, 2**20, [1, 1])])
    monkeypatch.setattr(gpubench.diagnostics.leaks, "allocator_stats", lambda device: {
        "reserved_bytes": None})
    pandas_tables.clear()
    assert cli.main(["memory", "--model", "bert", "--profile", "smoke", "--device", "cpu",
                     "--techniques", "fp32", "--budget", "2G"]) == 0
    out = capsys.readouterr().out
    assert budgets == [2 * 2**30]
    assert_tables_from_pandas(out, pandas_tables)
    assert "sum \\| of losses" in out  # a pipe in a cell does not break its row


def test_markdown_table_escapes_and_aligns():
    text = markdown_table([{"case": "a|b", "n": "1"}, {"case": None, "n": "22"}],
                          ["left", "right"])
    assert text.splitlines() == ["| case   |   n |", "|:-------|----:|",
                                 "| a\\|b   |   1 |", "| -      |  22 |"]
    assert markdown_table([], columns=("a", "b")).splitlines()[0] == "| a   | b   |"


def test_cpu_name_comes_from_py_cpuinfo(monkeypatch):
    import cpuinfo

    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: {"brand_raw": "Test CPU 9000"})
    machine.cpu_model.cache_clear()
    try:
        assert machine.cpu_model() == "Test CPU 9000"

        def broken():
            raise RuntimeError("no cpuid")

        monkeypatch.setattr(cpuinfo, "get_cpu_info", broken)
        machine.cpu_model.cache_clear()
        assert machine.cpu_model()  # falls back to what platform knows
    finally:
        machine.cpu_model.cache_clear()


def _api_section() -> str:
    return re.sub(r"```.*?```", "", (ROOT / "docs" / "api.md").read_text(), flags=re.S)


def test_readme_documents_every_column_of_the_python_api():
    names = set(re.findall(r"`([^`\n]+)`", _api_section()))
    patterns = [n for n in names if "*" in n]
    df = with_baseline_ratios(load_results([COMMITTED]))
    assert set(EXTRA_SCHEMA) <= set(df.columns)
    # Record fields are documented once, by the schema (reference/metrics.md) and the
    # techniques' declarations (reference/techniques.md); docs/api.md adds the reader's own.
    from gpubench.analysis.schema import METRICS
    from gpubench.train.techniques import TECHNIQUES

    names |= {f for m in METRICS for f in m.fields} | {t.field for t in TECHNIQUES}
    undocumented = [c for c in df.columns
                    if c not in names and not any(fnmatch.fnmatchcase(c, p) for p in patterns)]
    assert not undocumented, f"docs/api.md: document {undocumented}"
    assert "reference/metrics.md" in _api_section()
    for kind in ("step", "claim", "overhead", "transfer"):
        assert f"`{kind}`" in _api_section()


def test_integer_and_boolean_fields_have_nullable_dtypes():
    df = load_results([COMMITTED])
    for column, (kind, _) in EXTRA_SCHEMA.items():
        expected = {"int": "Int64", "bool": "boolean", "float": "float64"}.get(kind)
        if expected:
            assert df[column].dtype == expected, column
    raw = json.loads(COMMITTED.read_text())["benchmarks"]
    for column in {k for b in raw for k in b["extra_info"]}:
        values = [b["extra_info"][column] for b in raw
                  if b["extra_info"].get(column) is not None]
        if values and all(isinstance(v, bool) for v in values):
            assert df[column].dtype == "boolean", column
        elif values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            assert df[column].dtype == "Int64", column
