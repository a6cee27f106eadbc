"""Charts make their point: training memory (not the CPU process peak), zero-based throughput
axes, legends outside the data, no stray legend entries, speedup bars coloured by technique
group, Pareto labels that neither overlap nor fall off the figure."""

from itertools import combinations
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation, Text

from gpubench.analysis.results import load_results
from gpubench.report.charts import (
    GROUP_COLORS,
    MIB,
    plot_accumulation,
    plot_loader,
    plot_memory,
    plot_pareto,
    plot_scaling,
    plot_speedup,
    spread_labels,
)

COMMITTED = Path(__file__).resolve().parent / "data" / "cpu-run.json"  # a frozen CPU run


@pytest.fixture(scope="module")
def results():
    return load_results([COMMITTED])


@pytest.fixture(scope="module")
def bert(results):
    # One model with every chart of the committed cpu run (resnet18 sweeps the loader knobs).
    return results[results["model"] == "resnet18"]


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _legend_texts(fig) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for leg in legends for t in leg.get_texts()] + [
        leg.get_title().get_text() for leg in legends]


def _assert_legends_outside(fig):
    renderer = _drawn(fig)
    assert all(ax.get_legend() is None for ax in fig.axes), "a legend sits inside an axes"
    for leg in fig.legends:
        box = leg.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "legend over the data"


@pytest.mark.parametrize("plot", [plot_speedup, plot_memory, plot_pareto, plot_accumulation,
                                  plot_scaling, plot_loader])
def test_legends_outside_and_no_run_entry_for_one_run(bert, plot):
    fig = plot(bert)
    try:
        _assert_legends_outside(fig)
        texts = _legend_texts(fig)
        assert texts, "the chart explains its colours"
        assert not [t for t in texts if t in ("run", "cpu", "benchmark") or t.startswith("run ")]
    finally:
        plt.close(fig)


def test_memory_chart_is_training_memory_not_process_peak(bert):
    fig = plot_memory(bert)
    try:
        (ax,) = fig.axes
        process_peak = bert["peak_memory_bytes"].min() / MIB  # ~800 MiB of runtime
        assert ax.get_xlim()[1] < process_peak / 3
        assert "training memory" in ax.get_xlabel()
        # The process peak is named as such, not drawn.
        assert any("process high-water mark" in t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("plot", [plot_pareto, plot_accumulation, plot_scaling, plot_loader])
def test_throughput_and_memory_axes_start_at_zero(bert, plot):
    fig = plot(bert)
    try:
        for ax in fig.axes:
            assert ax.get_ylim()[0] == 0, ax.get_title(loc="left")
    finally:
        plt.close(fig)


def test_accumulation_memory_follows_the_micro_batch(results):
    """Constant effective batch (smaller micro-batches) never needs more memory than k=1."""
    fig = plot_accumulation(results)
    try:
        memory_axes = [ax for ax in fig.axes
                       if ax.get_title(loc="left").endswith("training memory")]
        assert len(memory_axes) == 3
        for ax in memory_axes:
            blue = ax.get_lines()[0].get_ydata()  # constant effective batch, k = 1, 2, 4
            assert max(blue) == blue[0] and max(blue) < 500  # MiB, not the ~1 GiB process
    finally:
        plt.close(fig)


def test_speedup_bars_coloured_by_technique_group(bert):
    fig = plot_speedup(bert)
    try:
        (ax,) = fig.axes
        bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() > 0]
        colours = {tuple(round(c, 3) for c in b.get_facecolor()[:3]) for b in bars}
        steps = bert[bert["kind"] == "step"]
        assert len(bars) == steps["case_id"].nunique()
        assert len(colours) == steps["group"].nunique() >= 5
        assert {"precision", "accumulation", "optimizer"} <= set(_legend_texts(fig))
        assert set(GROUP_COLORS) >= set(steps["group"])
    finally:
        plt.close(fig)


def test_pareto_labels_neither_overlap_nor_leave_the_figure(results, tmp_path):
    fig = plot_pareto(results)
    try:
        renderer = _drawn(fig)
        labels = [c for ax in fig.axes for c in ax.get_children() if isinstance(c, Annotation)]
        assert len(labels) >= 8
        # The label texts themselves (their thin leader lines may cross).
        boxes = [Text.get_window_extent(t, renderer) for t in labels]
        for a, b in combinations(boxes, 2):
            assert not a.overlaps(b)
        # Saved with a tight bounding box, every label is inside the image.
        tight = fig.get_tightbbox(renderer)
        for box in boxes:
            assert tight.x1 * fig.dpi >= box.x1 - 1 and box.x0 >= -1
        assert "training memory" in fig.axes[0].get_xlabel()
    finally:
        plt.close(fig)


def test_spread_labels_keeps_order_and_gap():
    pos = spread_labels([0.5, 0.5, 0.51, 0.9, 0.95], 0.1)
    assert pos == sorted(pos)
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(pos, pos[1:], strict=False))
    assert 0 <= pos[0] and pos[-1] <= 1
    assert spread_labels([0.2], 0.1) == [0.2]
    many = spread_labels([0.5] * 30, 0.1)  # more than fit: squeezed evenly into [0, 1]
    assert many[0] >= 0 and many[-1] <= 1 + 1e-9
