"""FLOPs that are counted whole or not claimed: the fused recurrent layers (LSTM, GRU) have
formulas, so a held-out LSTM language model's record and summary agree on its FLOPs and MFU; a
step whose count misses heavy work (an op without a formula) records no FLOP rate at all, never a
silently low one, and the summary says why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from gpubench.analysis.results import load_results
from gpubench.measure.flops import (
    _cudnn_rnn_backward_flop,
    _cudnn_rnn_flop,
    count_flops_detailed,
)
from gpubench.measure.machine import machine_info
from gpubench.measure.runner import run_case
from gpubench.measure.standalone import StandaloneBenchmark
from gpubench.report.summary import summary_frame
from gpubench.train.config import RunConfig

DATA = Path(__file__).resolve().parent / "data"


def _unfused(module: nn.Module, x: torch.Tensor, backward: bool) -> int:
    """The FLOPs torch itself counts for the same layer run unfused (oneDNN off: the cells
    decompose into ``aten.addmm``/``aten.mm``)."""
    def step():
        out, _ = module(x)
        if backward:
            out.sum().backward()
    with torch.backends.mkldnn.flags(enabled=False):
        return count_flops_detailed(step).total


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("kw", [{}, {"batch_first": True}, {"bidirectional": True}])
def test_a_fused_recurrent_layer_counts_what_its_unfused_cells_count(cls, kw):
    torch.manual_seed(0)
    layer = cls(12, 20, num_layers=2, **kw)
    x = torch.randn(4, 7, 12) if kw.get("batch_first") else torch.randn(7, 4, 12)

    def forward():
        with torch.no_grad():
            layer(x)

    counted = count_flops_detailed(forward)
    assert counted.uncounted_ops == []
    assert counted.total == _unfused(layer, x, backward=False) > 0

    def train():
        out, _ = layer(x)
        out.sum().backward()

    whole = count_flops_detailed(train)
    assert whole.uncounted_ops == []
    # The backward: the data and weight gradients, twice the forward, less the first layer's
    # input gradient where nothing needs it (the fused LSTM kernel takes it anyway).
    assert 2.5 * counted.total <= whole.total <= 3 * counted.total
    assert 1.0 <= whole.total / _unfused(layer, x, backward=True) < 1.15


def test_the_cudnn_formula_counts_every_layer_and_direction():
    """``aten._cudnn_rnn`` runs all layers at once; its formula (checked here on shapes, the way
    ``FlopCounterMode`` hands them over) agrees with the unfused count of the same LSTM."""
    torch.manual_seed(0)
    lstm = nn.LSTM(12, 20, num_layers=2, bidirectional=True)
    x = torch.randn(7, 4, 12)
    weights = [p.shape for p in lstm._flat_weights]
    forward = _cudnn_rnn_flop(x.shape, weights, 4)
    with torch.no_grad():
        assert forward == _unfused(lstm, x, backward=False)
    mask = [True, False, False, True]
    assert _cudnn_rnn_backward_flop(x.shape, weights, 4, *[None] * 19, mask) == 2 * forward
    assert _cudnn_rnn_backward_flop(x.shape, weights, 4, *[None] * 19,
                                    [False, False, False, True]) == forward


def _record(spec: str, tmp_path: Path) -> tuple[dict, Path]:
    cfg = RunConfig(model=spec, profile="smoke", device="cpu")
    bench = StandaloneBenchmark(f"case[{cfg.id}]", f"{cfg.name}-smoke-cpu")
    run_case(bench, cfg, rounds=3, warmup_rounds=0)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"benchmarks": [bench.as_json()],
                                "machine_info": {"node": "n", "gpubench": machine_info("cpu")},
                                "datetime": "2026-01-01T00:00:00", "version": "5"}))
    return bench.extra_info, path


@pytest.mark.slow
def test_an_lstm_language_models_record_and_summary_agree_on_its_flops(tmp_path):
    """Embedding, a 2-layer ``nn.LSTM``, a linear head: its record counted the head alone
    (the LSTM's kernel had no formula) and still held an MFU. Now the count is whole, by the
    hand count of the workload, and the summary shows the record's MFU."""
    import sys

    sys.path.insert(0, str(DATA))
    try:
        from lstm_lm_workload import model_flops_per_step
    finally:
        sys.path.remove(str(DATA))
    info, path = _record(f"{DATA / 'lstm_lm_workload.py'}:workload", tmp_path)
    assert info["uncounted_ops"] == []
    assert info["flops_per_step"] == model_flops_per_step(info["global_batch"])
    assert info["mfu"] == pytest.approx(info["flops_per_step"] / info["step_time_s"]
                                        / (info["peak_tflops"] * 1e12))
    row = summary_frame(load_results([path])).iloc[0]
    assert row["mfu"] == pytest.approx(info["mfu"])  # the same figure, not "n/a"
    # The machine fingerprint travels with the run's file.
    assert load_results([path])["fingerprint"].iloc[0]["device"] == "cpu"


def fft_workload():
    from gpubench import Workload

    class Spectral(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc(torch.fft.rfft(x).abs()[..., :32])

    return Workload(name="spectral", build_model=Spectral,
                    make_batch=lambda n, g: (torch.randn(n, 64, generator=g),
                                             torch.randint(0, 4, (n,), generator=g)),
                    micro_batch=4, loss_fn=nn.functional.cross_entropy)


@pytest.mark.slow
def test_a_count_that_misses_heavy_work_records_no_flop_rate(tmp_path):
    """An FFT has no FLOP formula: the count is the linear's alone, so the record's
    ``tflops``, ``mfu`` and ``hfu`` are null (not a silently low figure), the file still reads,
    and the summary names the ops."""
    info, path = _record(f"{Path(__file__).resolve()}:fft_workload", tmp_path)
    missed = info["uncounted_ops"]
    assert any("fft" in op for op in missed), missed
    assert info["tflops"] is info["mfu"] is info["hfu"] is info["hardware_tflops"] is None
    assert info["flops_per_step"] > 0  # what was counted stays, beside the names of what was not
    df = load_results([path])
    assert df["mfu"].isna().all()
    assert summary_frame(df).iloc[0]["mfu"] == f"n/a ({', '.join(missed)} not counted)"
