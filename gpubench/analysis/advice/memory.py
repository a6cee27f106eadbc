"""The advice's judges of memory: empty_cache, the OOM frontier, offloading, no_grad and del
(the ``gpubench memory`` report's verdicts, ``memory_verdicts``)."""

from __future__ import annotations

import pandas as pd

from gpubench.analysis.advice.cases import Verdict, _Cases, _missing
from gpubench.analysis.advice.parallel import _bytes
from gpubench.analysis.speed import (
    judge_memory,
)
from gpubench.suite.claims import CLAIMS
from gpubench.util.verdicts import MIN_EFFECT, Kind, combine_parts


def check_empty_cache(c: _Cases) -> list[Verdict]:
    """S0, S4: ``empty_cache()`` after every step against the baseline on CUDA: it helps if it
    is faster, or lowers the peak reserve without costing speed."""
    spec = CLAIMS["empty-cache"]
    claim = spec.text
    base, row = c.find(), c.claim_case(spec.key)
    if base is None or row is None:
        return [_missing(c.model, claim, "speedup.png", "the emptycache case")]
    speed, basis = c.speed(spec.key, base, row)
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, speed.describe(), Kind.NOT_TESTABLE,
                        "needs CUDA: the CPU allocator has no cache to empty", "speedup.png")]
    reserved = row["peak_reserved_bytes"] / base["peak_reserved_bytes"]
    # It helps if it is faster, or if it lowers the peak reserve without costing speed.
    speed_verdict = speed.decide()
    lowers_reserve = reserved <= spec.parts["reserved"][1] and speed.ratio >= 1 - MIN_EFFECT
    verdict = Kind.HOLDS if speed_verdict == Kind.HOLDS or lowers_reserve else (
        Kind.INCONCLUSIVE if speed_verdict == Kind.INCONCLUSIVE else Kind.DOES_NOT_HOLD)
    return [Verdict(c.model, claim, f"{speed.describe()}, peak reserved x{reserved:.2f}",
                    verdict, "it releases cached blocks the next step must allocate again; "
                    "it lowers the reserve only between steps", "memory.png")]


def _frontier_entry(report: dict, technique: str) -> dict | None:
    """One technique's frontier in a ``gpubench memory`` report (by name; older reports, which
    lack the names, by the configuration's id)."""
    ids = {"fp32": f"{report.get('model')}-fp32",
           "emptycache": f"{report.get('model')}-fp32-emptycache"}
    for entry in report.get("frontier") or []:
        if entry.get("technique") == technique or (
                entry.get("technique") is None and entry.get("cfg_id") == ids.get(technique)):
            return entry
    return None


def check_empty_cache_oom(c: _Cases) -> list[Verdict]:
    """S0, S4: the largest micro-batch that fits with and without ``empty_cache()`` after every
    step (the OOM frontier of ``gpubench memory``)."""
    spec = CLAIMS["empty-cache-oom"]
    claim = spec.text
    report = c.memory or {}
    device = report.get("device", c.device)
    plain, emptied = _frontier_entry(report, "fp32"), _frontier_entry(report, "emptycache")
    measured = "-" if plain is None or emptied is None else (
        f"largest micro-batch that fits: {plain['max_batch']} without, {emptied['max_batch']} "
        "with empty_cache() after every step")
    if device not in spec.devices:
        return [Verdict(c.model, claim, measured, Kind.NOT_TESTABLE,
                        "needs CUDA: the CPU allocator keeps no cache to empty (on the CPU the "
                        "frontier runs against a --budget)", "memory.json")]
    if plain is None or emptied is None:
        return [_missing(c.model, claim, "memory.json", "the fp32 and emptycache OOM frontiers: "
                         "gpubench memory --techniques fp32,emptycache, and its memory.json")]
    why = ("when an allocation fails, PyTorch's caching allocator itself frees its unused "
           "cached blocks and retries (allocation retries) before raising out of memory, so "
           "emptying the cache by hand cannot make a larger batch fit in the same process; it "
           "returns memory to other processes on the GPU, at the cost of new cudaMalloc calls")
    if plain.get("capped") or emptied.get("capped"):
        return [Verdict(c.model, claim, measured, Kind.INCONCLUSIVE,
                        "the search reached its limit (--max-batch) without running out of "
                        "memory; " + why, "memory.json")]
    low = spec.parts["max_batch"][0]
    ratio = (emptied["max_batch"] / plain["max_batch"] if plain["max_batch"]
             else float("inf") if emptied["max_batch"] else 1.0)
    verdict = (Kind.HOLDS if ratio >= low else Kind.SMALLER if ratio > 1
               else Kind.DOES_NOT_HOLD)
    return [Verdict(c.model, claim, measured + f" (x{ratio:.2f})", verdict, why, "memory.json")]


def check_offload(c: _Cases) -> list[Verdict]:
    """The largest micro-batch that fits with activation offloading against without (the OOM
    frontier of ``gpubench memory --techniques fp32,offload``), and the step time it costs
    (the offload case against the baseline: at least 0.8 of its speed counts as modest)."""
    spec = CLAIMS["offload"]
    claim = spec.text
    base, row = c.find(), c.claim_case(spec.key)
    report = c.memory or {}
    plain, offloaded = _frontier_entry(report, "fp32"), _frontier_entry(report, "offload")
    measured = []
    speed = None
    if base is not None and row is not None:
        speed, basis = c.speed(spec.key, base, row)
        measured.append(speed.describe())
    if plain is not None and offloaded is not None:
        measured.append(f"largest micro-batch {plain['max_batch']} -> {offloaded['max_batch']}")
    text = ", ".join(measured) or "-"
    if c.device not in spec.devices:
        return [Verdict(c.model, claim, text, Kind.NOT_TESTABLE,
                        "needs CUDA: on the CPU the activations already live in host memory, "
                        "so offloading only adds the copies", "memory.json")]
    if speed is None or plain is None or offloaded is None:
        return [_missing(c.model, claim, "memory.json", "the offload case and the fp32 and "
                         "offload OOM frontiers (gpubench memory --techniques fp32,offload)")]
    low = spec.parts["time"][0]
    parts = {"time": Kind.HOLDS if speed.low >= low else
             Kind.DOES_NOT_HOLD if speed.high < low else Kind.INCONCLUSIVE}
    if plain.get("capped") or offloaded.get("capped"):
        parts["max_batch"] = Kind.INCONCLUSIVE
    else:
        ratio = (offloaded["max_batch"] / plain["max_batch"] if plain["max_batch"]
                 else float("inf") if offloaded["max_batch"] else 1.0)
        fit = spec.parts["max_batch"][0]
        parts["max_batch"] = (Kind.HOLDS if ratio >= fit else Kind.SMALLER if ratio > 1
                              else Kind.DOES_NOT_HOLD)
    why = (f"{basis}; time {parts['time']} (claimed at least x{low:g} of the baseline's speed), "
           f"larger batch {parts['max_batch']}; the saved tensors cross PCIe twice per step, "
           "which the copies' overlap with compute decides")
    return [Verdict(c.model, claim, text, combine_parts(parts), why, "memory.json")]


def _hygiene_ratio(new: dict, base: dict) -> tuple[float, str]:
    """``new`` over ``base`` (``gpubench.diagnostics.hygiene`` figures): the CUDA allocator's peaks
    where measured, else the exact bytes held (saved activations at their peak + kept tensors)."""
    if new.get("peak_bytes") is not None and base.get("peak_bytes"):
        return new["peak_bytes"] / base["peak_bytes"], "CUDA allocator peak"
    held = base.get("held_bytes")
    return (new["held_bytes"] / held if held else float("nan"),
            "exact bytes held: saved activations + kept tensors")


def _hygiene(c: _Cases) -> dict | None:
    return (c.memory or {}).get("hygiene")


def check_no_grad(c: _Cases) -> list[Verdict]:
    """S4: an evaluation pass with autograd on, under ``no_grad`` and ``inference_mode``
    (``gpubench.diagnostics.hygiene.evaluation``, exact on any device)."""
    spec = CLAIMS["no-grad"]
    claim = spec.text
    h = _hygiene(c)
    if h is None:
        return [_missing(c.model, claim, "memory.json",
                         "the hygiene measurements of gpubench memory, in its memory.json")]
    ev = h["evaluation"]
    grad = ev["grad"]
    parts, ratios = {}, []
    for mode in ("no_grad", "inference_mode"):
        ratio, basis = _hygiene_ratio(ev[mode], grad)
        parts[mode] = judge_memory(ratio, spec.parts[mode])
        ratios.append(f"{mode} x{ratio:.2f}")
    measured = (f"evaluation of {h['micro_batch']} samples saves "
                f"{_bytes(grad['saved_bytes'])} for backward with autograd on, "
                f"{_bytes(ev['no_grad']['saved_bytes'])} under no_grad, "
                f"{_bytes(ev['inference_mode']['saved_bytes'])} under inference_mode; "
                f"{basis}: {', '.join(ratios)}")
    why = ("autograd saves what backward needs only while grad mode is on; under no_grad and "
           "inference_mode nothing is saved and each activation is freed once the next layer "
           "has used it; model.eval() alone switches dropout and BatchNorm, not autograd")
    return [Verdict(c.model, claim, measured, combine_parts(parts), why, "memory.json")]


def check_del(c: _Cases) -> list[Verdict]:
    """S0: ``del`` of what the training loop keeps: a loss kept with its graph, and the previous
    step's outputs after ``backward()`` (``gpubench.diagnostics.hygiene``)."""
    spec = CLAIMS["del"]
    claim = spec.text
    h = _hygiene(c)
    if h is None:
        return [_missing(c.model, claim, "memory.json",
                         "the hygiene measurements of gpubench memory, in its memory.json")]
    graph, outputs = h["kept_graph"], h["kept_outputs"]
    r_graph, basis = _hygiene_ratio(graph["deleted"], graph["kept"])
    r_outputs, _ = _hygiene_ratio(outputs["deleted"], outputs["kept"])
    parts = {"graph": judge_memory(r_graph, spec.parts["graph"]),
             "outputs": judge_memory(r_outputs, spec.parts["outputs"])}
    held = graph["kept"]["held_saved_bytes"] - graph["deleted"]["held_saved_bytes"]
    measured = (f"a loss kept with its graph ({_bytes(graph['kept']['kept_bytes'])}) holds "
                f"{_bytes(held)} of saved activations: x{r_graph:.2f} after del; the previous "
                f"step's outputs kept after backward ({_bytes(outputs['kept']['kept_bytes'])}): "
                f"x{r_outputs:.2f} after del ({basis})")
    why = ("del drops a name, and the memory goes when nothing else refers to the tensor: a "
           "tensor computed with autograd on and never backpropagated keeps its whole graph "
           "(del, .item() or .detach() frees it); after backward() the graph is already freed, "
           "so deleting the outputs frees only their own storage, until the next forward "
           "would have rebound the names")
    return [Verdict(c.model, claim, measured, combine_parts(parts), why, "memory.json")]


MEMORY_CHECKS = (check_empty_cache_oom, check_no_grad, check_del)
"""The verdicts read from a ``gpubench memory`` report (``memory.json``)."""


def memory_verdicts(report: dict) -> list[Verdict]:
    """The ``MEMORY_CHECKS`` verdicts of one ``gpubench memory`` report alone."""
    c = _Cases(pd.DataFrame({"model": [], "step_time_s": []}), report["model"], memory=report)
    c.device = report.get("device", c.device)
    return [v for check in MEMORY_CHECKS for v in check(c)]
