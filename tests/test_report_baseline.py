"""``gpubench report`` on a file without the FP32 baseline record of a model (a filtered run, a
torchrun file) reports what it can and says plainly what is missing, instead of a pandas
error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubench.analysis.results import load_results
from gpubench.cli import main as cli
from gpubench.report.charts import CannotPlot, plot_accumulation

COMMITTED = Path(__file__).resolve().parent / "data" / "cpu-run.json"  # a frozen CPU run


def _file(tmp_path: Path, keep, name: str = "partial.json") -> Path:
    data = json.loads(COMMITTED.read_text())
    data["benchmarks"] = [b for b in data["benchmarks"] if keep(b["extra_info"])]
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _accumulation(with_baseline: bool):
    def keep(info):
        return info.get("model") == "resnet18" and (
            info.get("group") == "accumulation" or (with_baseline and info.get("is_baseline")))
    return keep


def test_the_accumulation_chart_needs_the_baseline(tmp_path):
    without = load_results([_file(tmp_path, _accumulation(False))])
    with pytest.raises(CannotPlot, match="no FP32 baseline record"):
        plot_accumulation(without)
    assert plot_accumulation(load_results([_file(tmp_path, _accumulation(True), "b.json")]))


def test_report_without_a_baseline_says_so(tmp_path, capsys):
    path = _file(tmp_path, _accumulation(False))
    assert cli.main(["report", str(path), "-o", str(tmp_path / "report")]) == 0
    assert capsys.readouterr().err == ""
    text = (tmp_path / "report" / "report.md").read_text()
    assert ("- no fp32 baseline record of model resnet18 in partial.json: its cases are shown "
            "with the speedups of their paired baseline rounds") in text
    assert "- accumulation: not drawn: no FP32 baseline record beside the" in text
    assert (tmp_path / "report" / "report.html").is_file()


def test_a_report_with_its_baseline_has_no_such_note(tmp_path):
    from gpubench.report.page import baseline_notes

    assert baseline_notes(load_results([_file(tmp_path, _accumulation(True))])) == ""
