"""The loader and memory claims on synthetic records: DataParallel vs DDP, pinning and prefetch
apart, empty_cache against running out of memory (the OOM frontier), no_grad and del (the hygiene
measurements of ``gpubench memory``)."""

from __future__ import annotations

import pandas as pd
import pytest
from test_advice import _row  # the tests folder is on sys.path (pytest's rootdir-less import)

from gpubench.analysis.advice import advise, memory_verdicts
from gpubench.suite.claims import CLAIMS

DP_DDP = CLAIMS["dp-vs-ddp"].text
PIN = CLAIMS["pin-memory"].text
PREFETCH = CLAIMS["prefetch"].text
OOM = CLAIMS["empty-cache-oom"].text
NO_GRAD = CLAIMS["no-grad"].text
DEL = CLAIMS["del"].text


def _verdicts(rows, memory=None):
    return {v.claim: v for v in advise(pd.DataFrame(rows), memory)}


def _cuda(case_id, median, **extra):
    return _row(case_id, median, device="cuda", **extra)


# -- DataParallel vs DDP ---------------------------------------------------------------------


def _parallel_rows(dp_median, dp_peaks, *, dp_micro=16):
    return [
        _cuda("bert-fp32", 0.5),
        _cuda("bert-fp32-ddp2", 1.0, parallel="ddp", world_size=2, global_batch=16,
              micro_batch=8, peak_memory_bytes=1000.0, device_peak_memory_bytes=[1000, 1000]),
        _cuda(f"bert-fp32-mb{dp_micro}-dp2", dp_median, parallel="dp", world_size=2,
              global_batch=dp_micro, micro_batch=dp_micro,
              peak_memory_bytes=float(max(dp_peaks)), device_peak_memory_bytes=dp_peaks),
    ]


def test_ddp_beats_dataparallel_at_the_same_global_batch():
    v = _verdicts(_parallel_rows(1.6, [1500, 900]))[DP_DDP]
    # Per sample 1.6x faster, busiest GPU x0.67, GPUs' peaks 1.67x apart under DataParallel.
    assert v.verdict == "holds", v
    assert "x1.67 (DP), x1.00 (DDP)" in v.measured and "global batch 16" in v.why


def test_dataparallel_as_fast_and_balanced_does_not_lose():
    v = _verdicts(_parallel_rows(1.0, [1000, 1000]))[DP_DDP]
    assert v.verdict == "does not hold", v


def test_dataparallel_at_the_baseline_micro_batch_is_compared_per_sample_only():
    rows = _parallel_rows(0.8, [900, 500], dp_micro=8)
    v = _verdicts(rows)[DP_DDP]
    # DDP is 0.8/0.5 = 1.6x faster per sample (16 vs 8 samples a step); memory not judged.
    assert v.verdict == "holds" and "not judged" in v.why, v


def test_dataparallel_is_not_testable_on_the_cpu():
    assert _verdicts([_row("bert-fp32", 1.0)])[DP_DDP].verdict == "not testable here"


# -- pinning and prefetch, each against pageable memory at the same workers -------------------


def _loader_rows(device, *, pin, pin_nb, prefetch):
    data = dict(dataset="tokens-mmap", num_workers=2, group="loader")
    own = dict(workload_datasets=["tokens-mmap"])
    return [
        _row("bert-fp32", 0.5, device=device, **own),
        # Neither a persistent nor a doubled-batch case is the pageable base, though listed first.
        _row("bert-fp32-tokens-mmap-w2-persist", 0.5, device=device, persistent_workers=True,
             **data, **own),
        _row("bert-fp32-mb16-tokens-mmap-w2", 1.0, global_batch=16, device=device, **data, **own),
        _row("bert-fp32-tokens-mmap-w2", 1.0, device=device, **data, **own),
        _row("bert-fp32-tokens-mmap-w2-pin", pin, device=device, pin_memory=True, **data, **own),
        _row("bert-fp32-tokens-mmap-w2-pin-nb", pin_nb, device=device, pin_memory=True,
             non_blocking=True, **data, **own),
        _row("bert-fp32-tokens-mmap-w2-pf4", prefetch, device=device, prefetch_factor=4,
             **data, **own),
    ]


def test_pinning_and_prefetch_are_separate_verdicts():
    verdicts = _verdicts(_loader_rows("cuda", pin=1.0, pin_nb=0.7, prefetch=1.0))
    pin = verdicts[PIN]
    assert pin.verdict == "partly holds (non_blocking)", pin
    assert "pin_memory + non_blocking: 1.4" in pin.measured and "at 2 workers" in pin.why
    assert verdicts[PREFETCH].verdict == "does not hold", verdicts[PREFETCH]
    faster = _verdicts(_loader_rows("cuda", pin=1.0, pin_nb=1.0, prefetch=0.7))[PREFETCH]
    assert faster.verdict == "holds" and "prefetch_factor 4" in faster.why


def test_pinning_is_not_testable_without_an_accelerator_but_prefetch_is():
    verdicts = _verdicts(_loader_rows("cpu", pin=0.7, pin_nb=0.7, prefetch=0.7))
    assert verdicts[PIN].verdict == "not testable here"
    assert "no accelerator" in verdicts[PIN].why
    assert verdicts[PREFETCH].verdict == "holds"


def test_loader_knobs_do_not_apply_without_a_dataset():
    verdicts = _verdicts([_row("bert-fp32", 1.0, workload_datasets=[])])
    assert verdicts[PIN].verdict == verdicts[PREFETCH].verdict == "not applicable"


# -- empty_cache and the OOM frontier ---------------------------------------------------------


def _report(device="cuda", plain=512, emptied=512, capped=False, hygiene=None):
    def entry(technique, cfg_id, batch):
        return {"technique": technique, "cfg_id": cfg_id, "max_batch": batch, "tries": [],
                "capped": capped}
    return {"model": "bert", "device": device, "hygiene": hygiene,
            "frontier": [entry("fp32", "bert-fp32", plain),
                         entry("emptycache", "bert-fp32-emptycache", emptied)]}


@pytest.mark.parametrize(("emptied", "capped", "expected"), [
    (512, False, "does not hold"), (600, False, "holds"), (520, False, "smaller than claimed"),
    (512, True, "inconclusive")])
def test_empty_cache_against_the_oom_frontier(emptied, capped, expected):
    rows = [_cuda("bert-fp32", 1.0)]
    v = _verdicts(rows, [_report(emptied=emptied, capped=capped)])[OOM]
    assert v.verdict == expected, v
    assert f"{emptied} with empty_cache()" in v.measured


def test_empty_cache_frontier_not_measured_or_not_testable():
    assert _verdicts([_cuda("bert-fp32", 1.0)])[OOM].verdict == "inconclusive"
    assert "not measured" in _verdicts([_cuda("bert-fp32", 1.0)])[OOM].why
    assert _verdicts([_row("bert-fp32", 1.0)])[OOM].verdict == "not testable here"
    (oom,) = [v for v in memory_verdicts(_report(device="cpu")) if v.claim == OOM]
    assert oom.verdict == "not testable here"
    # A report of an older gpubench, without technique names: found by configuration id.
    old = _report(emptied=600)
    for entry in old["frontier"]:
        del entry["technique"]
    (oom,) = [v for v in memory_verdicts(old) if v.claim == OOM]
    assert oom.verdict == "holds"


# -- no_grad and del: the hygiene measurements ------------------------------------------------


def _m(saved, held, kept=4, peak=None):
    return {"name": "-", "saved_bytes": saved, "held_saved_bytes": held, "kept_bytes": kept,
            "peak_bytes": peak, "held_bytes": held + kept}


MIB = 2**20
HYGIENE = {
    "micro_batch": 8, "device": "cpu",
    "evaluation": {"grad": _m(10 * MIB, 10 * MIB), "no_grad": _m(0, 0),
                   "inference_mode": _m(0, 0)},
    "kept_graph": {"kept": _m(20 * MIB, 20 * MIB), "deleted": _m(20 * MIB, 10 * MIB, kept=0)},
    "kept_outputs": {"kept": _m(20 * MIB, 10 * MIB, kept=MIB // 10),
                     "deleted": _m(20 * MIB, 10 * MIB, kept=0)},
}


def test_no_grad_and_del_verdicts_from_the_hygiene_measurements():
    verdicts = _verdicts([_row("bert-fp32", 1.0)], [_report(device="cpu", hygiene=HYGIENE)])
    assert verdicts[NO_GRAD].verdict == "holds", verdicts[NO_GRAD]
    assert "10.00 MiB for backward with autograd on, 0 B under no_grad" in \
        verdicts[NO_GRAD].measured
    # The kept loss holds its graph (x0.50 after del); after backward, outputs of 0.1 MiB next
    # to 10 MiB of activations: x0.99, no effect.
    assert verdicts[DEL].verdict == "partly holds (graph)", verdicts[DEL]
    assert "holds 10.00 MiB of saved activations: x0.50 after del" in verdicts[DEL].measured


def test_hygiene_verdicts_use_the_cuda_peak_where_measured():
    cuda = {**HYGIENE, "device": "cuda",
            "evaluation": {"grad": _m(10 * MIB, 10 * MIB, peak=30 * MIB),
                           "no_grad": _m(0, 0, peak=29 * MIB),
                           "inference_mode": _m(0, 0, peak=5 * MIB)}}
    (no_grad,) = [v for v in memory_verdicts(_report(hygiene=cuda)) if v.claim == NO_GRAD]
    assert no_grad.verdict == "partly holds (inference_mode)" and "CUDA allocator peak" in \
        no_grad.measured


def test_hygiene_not_measured_is_inconclusive():
    verdicts = _verdicts([_row("bert-fp32", 1.0)])
    assert verdicts[NO_GRAD].verdict == verdicts[DEL].verdict == "inconclusive"
    assert "gpubench memory" in verdicts[DEL].why


# -- the claims' configurations are cases of the profiles --------------------------------------


def test_claim_sides_are_measured_cases():
    from gpubench.suite.cases import profile_cases
    from gpubench.train.config import RunConfig

    cpu = {c.id for c in profile_cases("cpu", "cpu", ("resnet18",))}
    base = RunConfig(model="resnet18", profile="cpu")
    for key in ("pin-memory", "prefetch"):
        for side in ("base", "new"):
            assert CLAIMS[key].config(side, base).id in cpu, (key, side)
    gpu = {c.id for c in profile_cases("gpu-small", "cuda", ("resnet50",))}
    base = RunConfig(model="resnet50", profile="gpu-small", device="cuda")
    for side in ("base", "new"):
        assert CLAIMS["dp-vs-ddp"].config(side, base).id in gpu, side
    dp = CLAIMS["dp-vs-ddp"].config("base", base)
    ddp = CLAIMS["dp-vs-ddp"].config("new", base)
    assert dp.global_batch == ddp.global_batch  # the same global batch, and samples per GPU
