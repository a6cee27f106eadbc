"""Paired, interleaved measurements for the advice check.

Two cases measured one after the other see different machine conditions: on a shared 2-core
machine, blocks of steps taken tens of seconds apart differ by 10-20%, more than most of the
effects the claims are about. So each claim's pair (the baseline and the technique) is built
side by side and timed in alternating rounds (A B, B A, A B, ...), and the verdict compares those
rounds. Each pair is one benchmark in the ``claims`` group.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubench.build import Unsupported, unsupported_reason
from gpubench.config import LoaderConfig, RunConfig
from gpubench.measure import InProcess


@dataclass(frozen=True)
class ClaimPair:
    claim: str
    """Key of the claim in ``gpubench.advice`` (amp-bf16, accumulation, adamw, ...)."""
    base: RunConfig
    new: RunConfig

    @property
    def id(self) -> str:
        return f"claim-{self.claim}-{self.new.name}"


def claim_pairs(model: str, profile: str, device: str) -> list[ClaimPair]:
    base = RunConfig(model=model, profile=profile, device=device)
    # Accumulation at constant effective batch: k=4 micro-batches of a quarter of the batch.
    quarter = max(base.workload.min_batch, base.resolved_micro_batch // 4)
    pairs = [
        ClaimPair("amp-bf16", base, base.with_(precision="bf16")),
        ClaimPair("accumulation", base, base.with_(accum_steps=4, micro_batch=quarter)),
        ClaimPair("adamw", base.with_(optimizer="adam"), base.with_(optimizer="adamw")),
    ]
    if device == "cuda":
        pairs += [
            ClaimPair("amp-fp16", base, base.with_(precision="fp16")),
            ClaimPair("empty-cache", base, base.with_(empty_cache=True)),
        ]
    own = base.workload.dataset_names
    if own:
        # Not the loader-workers claim: a side with workers keeps prefetching while the other
        # side runs, which would bias alternating rounds; it is judged from the loader cases.
        files = LoaderConfig(dataset=own[0])
        pairs.append(ClaimPair("cache", base.with_(loader=files),
                               base.with_(loader=LoaderConfig(dataset=own[0], cached=True))))
    return pairs


def measure_pair(benchmark, pair: ClaimPair, rounds: int, warmup_rounds: int) -> dict:
    """Check both sides, then time them in alternating rounds; fill ``benchmark.extra_info``."""
    for cfg in (pair.base, pair.new):
        reason = unsupported_reason(cfg)
        if reason:
            raise Unsupported(reason)
    # The same protocol as every case, in this process: prepare, check, count, then steps.
    sides = [InProcess(pair.base), InProcess(pair.new)]
    try:
        activation, global_batch = [], []
        for side in sides:
            side.call("prepare")
            side.call("check")
            activation.append(side.call("count")[0]["activation_bytes"])
            global_batch.append(side.program.cfg.global_batch)
        times: list[list[float]] = [[], []]
        order = [0]

        def alternate():
            first = order[0]
            order[0] = 1 - first
            for i in (first, 1 - first):
                times[i].append(sides[i].call("step")[0])

        benchmark.pedantic(alternate, rounds=rounds, warmup_rounds=warmup_rounds)
    finally:
        for side in sides:
            side.program.close()
    info = {
        "kind": "claim",
        "claim": pair.claim,
        "case_id": pair.id,
        "model": pair.base.name,
        "workload": pair.base.model,
        "profile": pair.base.profile,
        "device": pair.base.device,
        "case_id_base": pair.base.id,
        "case_id_new": pair.new.id,
        "accum_steps_new": pair.new.accum_steps,
        "global_batch_base": global_batch[0],
        "global_batch_new": global_batch[1],
        "rounds_base_s": times[0][warmup_rounds:],
        "rounds_new_s": times[1][warmup_rounds:],
        "activation_bytes_base": activation[0],
        "activation_bytes_new": activation[1],
        "note": "benchmark time is one step of each side; the sides alternate in order",
    }
    benchmark.extra_info.update(info)
    return info
