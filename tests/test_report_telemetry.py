"""The report uses the telemetry: a per-case table of what the machine did during the timed
rounds, and on CUDA a chart of energy per sample against throughput for the precision cases,
left out (``CannotPlot``, with the reason) where there is no energy to draw."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from gpubench.analysis.results import load_results
from gpubench.report.charts import CannotPlot, energy_per_sample, plot_energy
from gpubench.report.page import telemetry_markdown, write_report

COMMITTED = Path(__file__).resolve().parent / "data" / "cpu-run.json"  # a frozen CPU run
CONTENDED = "resnet18-fp32-zerofill"
REASON = "run queue 6.0 threads on 2 cores, above what the case's own 2 process(es) explain"


def _cpu_telemetry(extra: dict) -> dict:
    """What ``gpubench.measure.telemetry.Sampler.summary`` records for a CPU case."""
    contended = extra["case_id"] == CONTENDED
    return {
        "telemetry_period_s": 0.1, "telemetry_samples": 25, "telemetry_window_s": 2.5,
        "telemetry_cpu_util": 97.5, "telemetry_cpu_freq_mhz": 2445.0,
        "telemetry_load_avg": 2.1, "telemetry_run_queue": 6.0 if contended else 2.2,
        "telemetry_steal_pct": 0.3, "telemetry_foreign_cpu": 0.02,
        **dict.fromkeys(("telemetry_gpu_util", "telemetry_sm_clock_mhz",
                         "telemetry_mem_clock_mhz", "telemetry_power_w", "telemetry_temp_c",
                         "telemetry_energy_j", "energy_j_per_step", "samples_per_kj")),
        "telemetry_throttle_reasons": None, "telemetry_foreign_processes": None,
        "telemetry_sampler_cpu_s": 0.006,
        "telemetry_note": "no NVIDIA device (NVML: not a CUDA case)",
        "contended": contended, "contention_reason": REASON if contended else None,
    }


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[str, Page]:
    """The report of the committed CPU run's resnet18 cases, each given CPU telemetry."""
    data = json.loads(COMMITTED.read_text())
    data["benchmarks"] = [b for b in data["benchmarks"]
                          if (b.get("extra_info") or {}).get("model") == "resnet18"]
    for bench in data["benchmarks"]:
        extra = bench["extra_info"]
        if extra.get("kind", "step") == "step" and "case_id" in extra:
            extra.update(_cpu_telemetry(extra))
    folder = tmp_path_factory.mktemp("report")
    src = folder / "telemetry.json"
    src.write_text(json.dumps(data))
    write_report([src], folder)
    page = Page()
    page.feed((folder / "report.html").read_text())
    return (folder / "report.md").read_text(), page


def test_report_has_a_telemetry_table_per_case(report):
    markdown, page = report
    assert "## Telemetry: the machine during the timed rounds" in markdown
    section = markdown.split("## Telemetry: the machine")[1].split("\n## ")[0]
    assert "CPU util (%)" in section and "CPU clock (MHz)" in section
    # No GPU here: the GPU's columns are left out, not filled with dashes.
    assert "GPU util (%)" not in section and "power (W)" not in section
    headers = [line for line in section.splitlines() if line.startswith("| case ")]
    assert headers and not any("J/sample" in line for line in headers)
    rows = {line.split("|")[1].strip(): line for line in section.splitlines()
            if line.startswith("| resnet18-")}
    assert "resnet18-fp32" in rows and len(rows) >= 10
    assert f"yes: {REASON}" in rows[CONTENDED]
    assert rows["resnet18-fp32"].rstrip(" |").endswith("no")
    assert "97.5" in rows["resnet18-fp32"] and "2,445" in rows["resnet18-fp32"]
    assert "no NVIDIA device" in section  # the sampler's note
    assert "telemetry" in page.ids


def test_report_leaves_out_the_energy_chart_on_the_cpu(report):
    markdown, page = report
    assert "- energy: not drawn: no CUDA cases" in markdown
    assert "energy" not in page.ids


def test_no_telemetry_no_section():
    df = load_results([COMMITTED])
    assert telemetry_markdown(df) != ""  # the committed run has telemetry
    # Files written before the telemetry (or kinds other than steps) have none.
    assert telemetry_markdown(df.drop(columns=["telemetry_samples"])) == ""
    assert telemetry_markdown(df.assign(telemetry_samples=pd.NA)) == ""


@pytest.fixture(scope="module")
def cuda_like():
    """The committed resnet18 cases as CUDA records, the precision cases with GPU energy:
    fp32 through energy per step, bf16 through samples per kJ only."""
    df = load_results([COMMITTED])
    df = df[(df["model"] == "resnet18") & (df["kind"] == "step")].copy()
    df["device"] = "cuda"
    df["energy_j_per_step"] = np.nan
    df["samples_per_kj"] = np.nan
    energy = {"resnet18-fp32": 40.0, "resnet18-tf32": 30.0, "resnet18-fp16": 16.0}
    for case, joules in energy.items():
        df.loc[df["case_id"] == case, "energy_j_per_step"] = joules
    df.loc[df["case_id"] == "resnet18-bf16", "samples_per_kj"] = 500.0  # 2 J per sample
    return df


def test_energy_per_sample_from_either_field(cuda_like):
    per_sample = energy_per_sample(cuda_like).set_axis(cuda_like["case_id"])
    batch = int(cuda_like.loc[cuda_like["case_id"] == "resnet18-fp32", "global_batch"].iloc[0])
    assert per_sample["resnet18-fp32"] == pytest.approx(40.0 / batch)
    assert per_sample["resnet18-bf16"] == pytest.approx(2.0)
    assert np.isnan(per_sample["resnet18-fp32-ckpt"])


def test_energy_chart_draws_the_precision_cases(cuda_like):
    fig = plot_energy(cuda_like)
    try:
        (ax,) = fig.axes
        points = np.vstack([c.get_offsets() for c in ax.collections])
        assert len(points) == 4  # fp32, tf32, fp16, bf16: the cases with energy
        per_sample = energy_per_sample(cuda_like).set_axis(cuda_like["case_id"])
        speed = cuda_like.set_index("case_id")["samples_per_s"]
        expected = {(round(speed[c], 6), round(per_sample[c], 9))
                    for c in ("resnet18-fp32", "resnet18-tf32", "resnet18-fp16",
                              "resnet18-bf16")}
        assert {(round(x, 6), round(y, 9)) for x, y in points} == expected
        assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0
        assert "J per sample" in ax.get_ylabel() and "samples/s" in ax.get_xlabel()
        labels = {t.get_text() for t in ax.texts}
        assert {"fp32", "tf32", "fp16", "bf16"} <= labels
        legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
        assert {"fp32", "bf16"} <= set(legend)
    finally:
        plt.close(fig)


def test_energy_chart_cannot_plot_without_energy(cuda_like):
    with pytest.raises(CannotPlot, match="no CUDA precision case recorded its GPU energy"):
        plot_energy(cuda_like.assign(energy_j_per_step=np.nan, samples_per_kj=np.nan))
    with pytest.raises(CannotPlot, match="no CUDA cases"):
        plot_energy(load_results([COMMITTED]))


def test_telemetry_table_shows_gpu_columns_and_energy_on_cuda(cuda_like):
    df = cuda_like.assign(telemetry_samples=50, telemetry_cpu_util=12.0,
                          telemetry_gpu_util=98.0, telemetry_sm_clock_mhz=1980.0,
                          telemetry_mem_clock_mhz=2619.0, telemetry_power_w=650.0,
                          contended=False)
    table = telemetry_markdown(df)
    for header in ("GPU util (%)", "SM clock (MHz)", "mem clock (MHz)", "power (W)",
                   "energy (J/sample)"):
        assert header in table
    (bf16,) = [line for line in table.splitlines() if line.startswith("| resnet18-bf16 ")]
    cells = [c.strip() for c in bf16.split("|")]
    assert "2" in cells and "650" in cells  # J/sample from samples_per_kj; watts
