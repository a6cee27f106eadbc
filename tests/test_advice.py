"""Verdict logic on synthetic results: holds, does not hold, inconclusive, not testable here."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpubench.analysis.advice import advise
from gpubench.analysis.recommend import recommend
from gpubench.analysis.speed import compare_speed

RNG = np.random.default_rng(0)


def _row(case_id, median, *, rounds=20, noise=0.01, global_batch=8, **extra):
    data = list(median * np.exp(RNG.normal(0, noise, rounds)))
    row = {
        "run": "r", "model": "bert", "profile": "cpu", "device": "cpu", "case_id": case_id,
        "is_baseline": case_id == "bert-fp32", "step_time_s": float(np.median(data)),
        "rounds_s": data, "global_batch": global_batch, "micro_batch": global_batch,
        "samples_per_s": global_batch / float(np.median(data)), "parallel": "single",
        "world_size": 1, "precision": "fp32", "accum_steps": 1, "dataset": "device-resident",
        "group": "precision", "peak_memory_bytes": 1000.0, "activation_bytes": 500,
        "param_bytes": 0, "grad_bytes": 100, "optimizer_state_bytes": 100, "num_workers": 0,
        "cached": False, "optimizer": "sgd", "optimizer_impl": "default",
        "zero_grad_set_to_none": True, "empty_cache": False, "checkpointing": False,
        "channels_last": False, "compile": False, "pin_memory": False, "non_blocking": False,
        "ddp_no_sync": False, "matmul_peak_tflops": {"fp32": 1.0, "bf16": 0.5, "fp16": 0.01},
    }
    row.update(extra)
    return row


def _verdicts(rows):
    return {(v.claim, v.verdict) for v in advise(pd.DataFrame(rows))}


def test_compare_speed_decisions():
    base = pd.Series(_row("bert-fp32", 1.0))
    faster = pd.Series(_row("bert-x", 0.7))
    slower = pd.Series(_row("bert-y", 1.3))
    same = pd.Series(_row("bert-z", 1.0, noise=0.005))
    noisy = pd.Series({**_row("bert-w", 0.9), "rounds_s": [0.5, 1.4, 0.9, 0.7, 1.2]})
    assert compare_speed(base, faster).decide() == "holds"
    assert compare_speed(base, slower).decide() == "does not hold"
    assert compare_speed(base, same).decide() == "does not hold"  # equivalent: no effect
    assert compare_speed(base, noisy).decide() == "inconclusive"


def test_amp_claim_holds_or_not_with_a_reason():
    rows = [_row("bert-fp32", 1.0),
            _row("bert-bf16", 0.6, precision="bf16", activation_bytes=250),
            _row("bert-fp16", 20.0, precision="fp16")]
    verdicts = {v.claim: v for v in advise(pd.DataFrame(rows))}
    bf16 = verdicts["AMP cuts training time ~30% and memory ~50% (bf16)"]
    fp16 = verdicts["AMP cuts training time ~30% and memory ~50% (fp16)"]
    # 1.67x the speed reaches the claimed 1.25-1.67x; memory x0.64 falls short of ~50%.
    assert bf16.verdict == "partly holds (time)" and "memory x0.64" in bf16.measured
    assert fp16.verdict == "does not hold" and "no fast fp16 matrix units" in fp16.why


def test_each_verdict_kind_on_synthetic_rounds():
    base = _row("bert-fp32", 1.0)
    half = dict(activation_bytes=100, grad_bytes=50, optimizer_state_bytes=50)
    cases = {
        "holds": _row("bert-bf16", 0.65, precision="bf16", **half),
        "smaller than claimed": _row("bert-bf16", 0.9, precision="bf16", activation_bytes=450),
        "partly holds (memory)": _row("bert-bf16", 1.0, precision="bf16", **half),
        "does not hold": _row("bert-bf16", 1.3, precision="bf16"),
        # Too few, too spread rounds, and memory not measured: nothing to conclude.
        "inconclusive": {**_row("bert-bf16", 0.9, precision="bf16", activation_bytes=None),
                         "rounds_s": [0.5, 1.4, 0.9, 0.7, 1.2]},
    }
    for expected, row in cases.items():
        verdicts = {v.claim: v.verdict for v in advise(pd.DataFrame([base, row]))}
        assert verdicts["AMP cuts training time ~30% and memory ~50% (bf16)"] == expected


def test_claims_about_data_do_not_apply_to_a_workload_without_data():
    rows = [_row("bert-fp32", 1.0, workload_datasets=[])]
    verdicts = dict(_verdicts(rows))
    assert verdicts["caching decoded samples removes the loading cost"] == "not applicable"
    assert verdicts["more DataLoader workers and pinned, asynchronous copies speed training "
                    "~30%"] == "not applicable"


def test_recommendation_keeps_the_effective_batch_and_optimizer():
    rows = [_row("bert-fp32", 1.0),
            _row("bert-fp32-accum4", 1.5, accum_steps=4, global_batch=32, group="accumulation"),
            _row("bert-fp32-adam", 0.7, optimizer="adam", group="optimizer"),
            _row("bert-fp32-ckpt", 0.8, checkpointing=True, group="memory")]
    (rec,) = recommend(pd.DataFrame(rows))
    # accum4 (4x the effective batch) and adam are faster but change the recipe.
    assert rec.case_id == "bert-fp32-ckpt"
    assert "changes the training recipe" in rec.note and "bert-fp32-accum4" in rec.note
    chosen = next(r for r in rows if r["case_id"] == rec.case_id)
    assert chosen["global_batch"] == rows[0]["global_batch"]


def test_hardware_claims_are_not_guessed_on_the_cpu():
    rows = [_row("bert-fp32", 1.0), _row("bert-fp32-emptycache", 1.0, empty_cache=True),
            _row("bert-fp32-ddp2", 1.5, parallel="ddp", world_size=2, global_batch=16,
                 micro_batch=8, single_case_id="bert-fp32")]
    verdicts = dict(_verdicts(rows))
    assert verdicts["DDP cuts training time to ~1/N"] == "not testable here"
    assert verdicts["torch.cuda.empty_cache() after every step helps"] == "not testable here"


def test_missing_cases_are_inconclusive_not_errors():
    verdicts = dict(_verdicts([_row("bert-fp32", 1.0)]))
    assert verdicts["caching decoded samples removes the loading cost"] == "inconclusive"
    assert verdicts["AdamW is faster than Adam"] == "inconclusive"


def test_accumulation_and_no_sync_claims():
    rows = [
        _row("bert-fp32", 1.0),
        _row("bert-fp32-accum4-mb2", 1.6, accum_steps=4, micro_batch=2, group="accumulation",
             activation_bytes=125),
        _row("bert-fp32-accum2-ddp2", 2.0, parallel="ddp", world_size=2, accum_steps=2,
             global_batch=32, micro_batch=8),
        _row("bert-fp32-accum2-ddp2-nosync", 1.5, parallel="ddp", world_size=2, accum_steps=2,
             global_batch=32, micro_batch=8, ddp_no_sync=True),
    ]
    verdicts = dict(_verdicts(rows))
    assert verdicts["gradient accumulation keeps the effective batch at lower memory"] == "holds"
    assert verdicts["no_sync during accumulation saves communication"] == "holds"


def test_recommendation_needs_a_significant_win_and_respects_the_budget():
    rows = [_row("bert-fp32", 1.0),
            _row("bert-bf16", 0.8, precision="bf16", peak_memory_bytes=3000),
            _row("bert-fp32-ckpt", 0.99)]
    (rec,) = recommend(pd.DataFrame(rows))
    assert rec.case_id == "bert-bf16" and rec.speedup > 1.2
    (within,) = recommend(pd.DataFrame(rows), budget_bytes=2000)
    assert within.case_id == "bert-fp32"  # nothing else within the budget beats the baseline


def test_interleaved_pair_takes_precedence_over_separate_cases():
    # Separately measured, bf16 looks 40% faster (machine drift between the two cases)...
    rows = [_row("bert-fp32", 1.0), _row("bert-bf16", 0.6, precision="bf16")]
    # ...but in alternating rounds the two are the same speed.
    same = list(1.0 + 0.005 * RNG.standard_normal(20))
    rows.append({"run": "r", "model": "bert", "kind": "claim", "claim": "amp-bf16",
                 "case_id": "claim-amp-bf16-bert", "rounds_base_s": same,
                 "rounds_new_s": list(np.array(same) * 1.001), "global_batch_base": 8,
                 "global_batch_new": 8, "step_time_s": None})
    verdicts = {v.claim: v for v in advise(pd.DataFrame(rows))}
    bf16 = verdicts["AMP cuts training time ~30% and memory ~50% (bf16)"]
    assert bf16.verdict == "does not hold" and "interleaved rounds" in bf16.why


def test_recommendation_ignores_techniques_that_do_nothing_on_this_device():
    # On the CPU empty_cache is a no-op: a faster measurement of it can only be noise.
    rows = [_row("bert-fp32", 1.0), _row("bert-fp32-emptycache", 0.7, empty_cache=True)]
    (rec,) = recommend(pd.DataFrame(rows))
    assert rec.case_id == "bert-fp32"
    # Nor can FP8 emulated without FP8 units (its casts run in higher precision).
    rows = [_row("bert-fp32", 1.0), _row("bert-fp8", 0.7, precision="fp8", fp8_emulated=True)]
    (rec,) = recommend(pd.DataFrame(rows))
    assert rec.case_id == "bert-fp32"


def test_a_compiled_recommendation_says_when_compiling_pays_off():
    rows = [_row("bert-fp32", 1.0), _row("bert-fp32-compile", 0.7, compile=True,
                                         compile_time_s=12.5, break_even_steps=41.7,
                                         break_even_against="bert-fp32")]
    (rec,) = recommend(pd.DataFrame(rows))
    assert rec.case_id == "bert-fp32-compile"
    assert "compiling took 12.5 s, won back after 42 steps" in rec.note


def test_claims_are_one_list_read_by_the_verdicts_and_the_pairs():
    from gpubench.suite.claims import CLAIMS, claim_pairs

    pairs = claim_pairs("resnet18", "cpu", "cpu")
    assert {p.claim for p in pairs} == {k for k, c in CLAIMS.items() if c.interleaved}
    for pair in pairs:  # each side is the claim's configuration, found by its fields
        claim = CLAIMS[pair.claim]
        assert pair.base == claim.config("base", pair.base.baseline)
        assert pair.new == claim.config("new", pair.base.baseline)
    judged = [v.claim for v in advise(pd.DataFrame([_row("bert-fp32", 1.0)]))]
    for claim in CLAIMS.values():  # a verdict's claim is the text, perhaps with a note after it
        assert any(j == claim.text or j.startswith(claim.text + " (") for j in judged), claim.key


def test_a_claim_is_not_decided_by_one_part_while_another_is_inconclusive():
    """"2.32x speed (95% CI 1.10-24.15, p=0.25)" with memory smaller than claimed read
    "smaller than claimed": the time part could not be decided, so neither can the claim."""
    from gpubench.util.verdicts import combine_parts

    assert combine_parts({"time": "inconclusive", "memory": "smaller than claimed"}) \
        == "inconclusive"
    assert combine_parts({"time": "does not hold", "memory": "inconclusive"}) == "does not hold"
    assert combine_parts({"time": "holds", "memory": "inconclusive"}) == "partly holds (time)"
    assert combine_parts({"time": "smaller than claimed", "memory": "smaller than claimed"}) \
        == "smaller than claimed"


def test_the_baseline_row_reads_one_with_its_noise_floor_beside_it():
    """The fp32 row read 0.98x in the summary, 1.00x in the answer: it reads 1.00x, as
    everywhere, and its interval column names its paired ratio against its own copy (the
    run's noise floor)."""
    from gpubench.report.summary import summary_frame

    base = _row("bert-fp32", 0.01, mfu=0.1, speedup_paired=0.985, speedup_paired_low=0.98,
                speedup_paired_high=0.99)
    frame = summary_frame(pd.DataFrame([base]))
    row = frame.iloc[0]
    assert row["speedup"] == 1.0 and row["speedup_ci"] == "baseline (noise 0.98-0.99)"
    assert row["baseline_samples_per_s"] == row["samples_per_s"]
