"""The S4 memory claim ("DDP keeps each GPU's optimizer state apart") on synthetic records: DDP's
per-rank state equals one device's (replicated), FSDP's is half at 2 ranks (sharded)."""

from __future__ import annotations

import pandas as pd

from gpubench.analysis.advice import advise

CLAIM = "DDP keeps each GPU's optimizer state apart, reducing memory"
MIB = 2**20


def _row(case_id, *, state_mib, parallel="single", world_size=1, **extra):
    rounds = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    row = {
        "run": "r", "kind": "step", "model": "bert", "profile": "cpu", "device": "cpu",
        "case_id": case_id, "is_baseline": case_id == "bert-fp32", "step_time_s": 1.0,
        "rounds_s": rounds, "global_batch": 8 * world_size, "micro_batch": 8,
        "samples_per_s": 8.0, "parallel": parallel, "world_size": world_size,
        "precision": "fp32", "accum_steps": 1, "dataset": "device-resident", "group": "parallel",
        "peak_memory_bytes": 1000.0 * MIB, "activation_bytes": 50 * MIB,
        "param_bytes": state_mib * MIB, "grad_bytes": state_mib * MIB,
        "optimizer_state_bytes": state_mib * MIB, "num_workers": 0, "cached": False,
        "optimizer": "sgd", "optimizer_impl": "default", "zero_grad_set_to_none": True,
        "empty_cache": False, "checkpointing": False, "channels_last": False, "compile": False,
        "pin_memory": False, "non_blocking": False, "ddp_no_sync": False,
        "fsdp_mixed_precision": False,
    }
    row.update(extra)
    return row


def _sharding(rows):
    return next(v for v in advise(pd.DataFrame(rows)) if v.claim == CLAIM)


def test_ddp_replicates_the_optimizer_state_and_fsdp_shards_it():
    rows = [
        _row("bert-fp32", state_mib=40),
        _row("bert-fp32-ddp2", state_mib=40, parallel="ddp", world_size=2),
        # Listed first, FSDP's mixed-precision case must not be taken for the fp32 fsdp2 one.
        _row("bert-fp32-fsdp2-mp", state_mib=30, parallel="fsdp", world_size=2,
             fsdp_mixed_precision=True),
        _row("bert-fp32-fsdp2", state_mib=20, parallel="fsdp", world_size=2),
    ]
    verdict = _sharding(rows)
    assert verdict.verdict == "does not hold"
    assert "DDP x1.00" in verdict.measured and "FSDP x0.50" in verdict.measured
    assert "replicates" in verdict.why
    assert "FSDP shards it: x0.50 per rank at 2 ranks" in verdict.why
    assert "parameters + gradients x0.50" in verdict.why


def test_without_fsdp_the_verdict_stands_and_without_ddp_it_is_inconclusive():
    base = _row("bert-fp32", state_mib=40)
    ddp = _row("bert-fp32-ddp2", state_mib=40, parallel="ddp", world_size=2)
    verdict = _sharding([base, ddp])
    assert verdict.verdict == "does not hold" and "not measured" in verdict.why
    assert _sharding([base]).verdict == "inconclusive"
    # A DDP whose per-rank state really fell would make the claim hold (it never does).
    assert _sharding([base, {**ddp, "optimizer_state_bytes": 20 * MIB}]).verdict == "holds"
