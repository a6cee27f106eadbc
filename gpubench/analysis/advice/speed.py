"""The advice's judges of compute: precision (AMP, FP8), accumulation, optimizers, compilation,
CUDA graphs, attention kernels, the recipe's stack, and convergence parity."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpubench.analysis.advice.cases import (
    Verdict,
    _Cases,
    _flag,
    _memory,
    _missing,
    _not_applicable,
    _range,
)
from gpubench.analysis.results import compile_cost_words
from gpubench.analysis.speed import (
    SpeedComparison,
    compare_speed,
    judge_memory,
)
from gpubench.suite.claims import CLAIMS
from gpubench.train.config import FP8_PRECISIONS
from gpubench.util.verdicts import Kind, combine_parts


def check_amp(c: _Cases) -> list[Verdict]:
    """S0: each AMP precision (fp16 with GradScaler, bf16) against the FP32 baseline: its
    paired speedup and its training memory, each part judged against its claimed range."""
    base = c.find()
    out = []
    for precision in ("fp16", "bf16"):
        claim = CLAIMS[f"amp-{precision}"]
        amp = c.claim_case(claim.key)
        if base is None or amp is None:
            out.append(_missing(c.model, f"{claim.text} ({precision})", "speedup.png",
                                f"{c.model}-fp32 and {c.model}-{precision}"))
            continue
        speed, basis = c.speed(claim.key, base, amp)
        memory = _memory(amp) / _memory(base)
        parts = {"time": speed.judge(claim.parts["time"]),
                 "memory": judge_memory(memory, claim.parts["memory"])}
        why = (f"{basis}; time {parts['time']} (claimed {_range(claim.parts['time'])}), "
               f"memory {parts['memory']} (claimed {_range(claim.parts['memory'], True)})")
        if c.peaks and c.peaks.get(precision) and c.peaks.get("fp32"):
            fast, slow = c.peaks[precision], c.peaks["fp32"]
            why += (f"; measured matmul peak {precision} {fast:.3g} vs fp32 {slow:.3g} TFLOP/s")
            if fast < slow:
                why += f": this device has no fast {precision} matrix units"
        out.append(Verdict(c.model, f"{claim.text} ({precision})",
                           f"{speed.describe()}, memory x{memory:.2f}", combine_parts(parts),
                           why, "speedup.png"))
    return out


def check_accumulation(c: _Cases) -> list[Verdict]:
    """S0, S1, S4: k = 4 micro-batches at the baseline's effective batch against the baseline:
    training memory judged against the claimed range, with the speed it costs."""
    claim = CLAIMS["accumulation"]
    base = c.find()
    k = claim.new["accum_steps"]
    # The claim's case: k micro-batches at the baseline's effective batch (its micro-batch is
    # the baseline's / k, found by the global batch so that a workload's minimum batch holds),
    # the baseline's configuration in every other field.
    row = None if base is None else c.first(
        c.like(base, vary=("accum_steps", "micro_batch"))
        & c.is_("accum_steps", k) & c.is_("global_batch", base["global_batch"]))
    if row is None:
        return [_missing(c.model, claim.text, "accumulation.png",
                         f"accumulation k={k} at constant batch")]
    memory = _memory(row) / _memory(base)
    speed, basis = c.speed(claim.key, base, row)
    return [_accumulation_verdict(c, claim.text, k, memory, speed, basis)]


def _accumulation_verdict(c: _Cases, claim: str, k: int, memory: float,
                          speed: SpeedComparison, basis: str) -> Verdict:
    verdict = judge_memory(memory, CLAIMS["accumulation"].parts["memory"])
    return Verdict(c.model, claim, f"k={k}: memory x{memory:.2f}, {speed.describe()}", verdict,
                   f"{basis}; smaller micro-batches keep fewer activations (gradients and "
                   f"optimizer state stay); the price is {k} sequential micro-steps",
                   "accumulation.png")


def check_adamw(c: _Cases) -> list[Verdict]:
    """S1: AdamW against Adam in each optimizer implementation (default: their interleaved
    pair), same update but for the weight decay."""
    spec = CLAIMS["adamw"]
    claim = spec.text
    out = []
    for impl in ("default", "foreach", "fused"):
        adam = c.find(**spec.base, optimizer_impl=impl)
        adamw = c.find(**spec.new, optimizer_impl=impl)
        if adam is None or adamw is None:
            continue
        speed, basis = c.speed(spec.key, adam, adamw) if impl == "default" else (
            compare_speed(adam, adamw), "separate cases")
        out.append(Verdict(c.model, f"{claim} ({impl})",
                           speed.describe(), speed.decide(),
                           f"{basis}; both run the same update; AdamW only applies weight "
                           "decay to the weights directly instead of through the gradient",
                           "speedup.png"))
    return out or [_missing(c.model, claim, "speedup.png", "adam and adamw cases")]


def check_compile(c: _Cases) -> list[Verdict]:
    """The compiled fp32 case against the baseline (``--slow`` runs it), with what compiling
    cost and the steps after which it pays off (``compile_time_s``, ``break_even_steps``)."""
    spec = CLAIMS["compile"]
    base, row = c.find(), c.claim_case(spec.key)
    if base is None or row is None:
        return [_missing(c.model, spec.text, "speedup.png",
                         "the compile case (gpubench run --slow, or gpubench case --compile)")]
    speed, basis = c.speed(spec.key, base, row)
    why = basis
    if pd.notna(row.get("compile_time_s")):
        why += "; " + compile_cost_words(row)
    return [Verdict(c.model, spec.text, speed.describe(), speed.judge(spec.parts["time"]), why,
                    "speedup.png")]


def check_cuda_graphs(c: _Cases) -> list[Verdict]:
    """torch.compile's reduce-overhead mode (CUDA graphs) against its default mode at the
    baseline's batch (separate cases): the launch overhead the graphs remove shows on steps
    whose kernels are short."""
    spec = CLAIMS["cuda-graphs"]
    base, row = c.claim_case(spec.key, "base"), c.claim_case(spec.key)
    if c.device not in spec.devices:
        return [Verdict(c.model, spec.text, "-", Kind.NOT_TESTABLE,
                        "needs CUDA: CUDA graphs record and replay a GPU's kernel launches",
                        "speedup.png")]
    if base is None or row is None:
        return [_missing(c.model, spec.text, "speedup.png",
                         "the compile and compile-reduce-overhead cases (gpubench run --slow)")]
    speed = compare_speed(base, row)
    why = (f"separate cases; default-mode compiled step {base['step_time_s'] * 1e3:.2f} ms: the "
           "shorter the step's kernels, the larger the launch overhead the graph removes")
    return [Verdict(c.model, spec.text, speed.describe(), speed.judge(spec.parts["time"]), why,
                    "speedup.png")]


def check_flash_attention(c: _Cases) -> list[Verdict]:
    """The FlashAttention kernel against the math kernel (the unfused attention eager code
    computes) at fp32, separate cases: speed per sample, and training memory (the score
    matrices the math kernel saves for backward, which flash recomputes)."""
    spec = CLAIMS["flash-attention"]
    math_row, flash = c.claim_case(spec.key, "base"), c.claim_case(spec.key)
    if math_row is None or flash is None:
        known = [bool(v) for v in c.col("uses_sdpa").dropna()]
        if known and not any(known):
            return [_not_applicable(c, spec.text, "the model calls no "
                                    "scaled_dot_product_attention", "speedup.png")]
        return [_missing(c.model, spec.text, "speedup.png",
                         "the sdpa_math and sdpa_flash cases (the attention group)"),
                *_eager_attention(c)]
    speed = compare_speed(math_row, flash)
    memory = _memory(flash) / _memory(math_row)
    parts = {"time": speed.judge(spec.parts["time"]),
             "memory": judge_memory(memory, spec.parts["memory"])}
    saved = (f"; saved activations {math_row['activation_bytes'] / 2**20:,.1f} -> "
             f"{flash['activation_bytes'] / 2**20:,.1f} MiB per micro-batch"
             if pd.notna(math_row.get("activation_bytes"))
             and pd.notna(flash.get("activation_bytes")) else "")
    why = (f"separate cases; time {parts['time']}, memory {parts['memory']} (claimed "
           f"{_range(spec.parts['memory'], True)}){saved}; the gap grows with the sequence "
           "length (the math kernel's scores are seq x seq per head)")
    return [Verdict(c.model, spec.text, f"{speed.describe()}, memory x{memory:.2f}",
                    combine_parts(parts), why, "speedup.png"), *_eager_attention(c)]


def _eager_attention(c: _Cases) -> list[Verdict]:
    """A transformers model's ``sdpa`` attention against its ``eager`` one (separate cases;
    the sdpa side is the baseline where that is the model's default), where measured."""
    spec = CLAIMS["flash-attention"]
    eager = c.find(attn_implementation="eager")
    if eager is None:
        return []
    sdpa = c.find(attn_implementation="sdpa")
    base = c.find()
    if sdpa is None and base is not None and base.get("hf_attention") == "sdpa":
        sdpa = base
    if sdpa is None:
        return [_missing(c.model, f"{spec.text} (transformers: sdpa vs eager)", "speedup.png",
                         "the attn_sdpa case")]
    if sdpa is base:  # the eager case's rounds are paired with the baseline's
        speed, basis = c.speed(spec.key, base, eager)
        speed = speed.inverted()
    else:
        speed, basis = compare_speed(eager, sdpa), "separate cases"
    memory = _memory(sdpa) / _memory(eager)
    parts = {"time": speed.judge(spec.parts["time"]),
             "memory": judge_memory(memory, spec.parts["memory"])}
    why = (f"{basis}; time {parts['time']}, memory {parts['memory']}: transformers' "
           "sdpa attention calls scaled_dot_product_attention (a fused kernel where one "
           "runs), its eager attention materialises the scores and runs softmax and dropout "
           "as ops of their own")
    return [Verdict(c.model, f"{spec.text} (transformers: sdpa vs eager)",
                    f"{speed.describe()}, memory x{memory:.2f}", combine_parts(parts), why,
                    "speedup.png")]


def check_fp8(c: _Cases) -> list[Verdict]:
    """Each FP8 recipe (per-tensor and per-row scales) against bf16 autocast, separate cases of
    the precision group: speed per sample where the float8 matmuls ran on FP8 units; *not
    testable* where they were emulated (the training check still ran the recipe)."""
    spec = CLAIMS["fp8"]
    out = []
    for precision in FP8_PRECISIONS:
        text = f"{spec.text} ({precision})"
        bf16 = c.claim_case(spec.key, "base")
        row = c.claim_case(spec.key, precision=precision)
        if bf16 is None or row is None:
            out.append(_missing(c.model, text, "speedup.png",
                                f"the bf16 and {precision} cases of the precision group; an fp8 "
                                "case is skipped where none of the model's linears can convert"))
            continue
        converted = row.get("fp8_converted")
        layers = (f"{len(converted)} linears converted ({row.get('fp8_layers')} filter)"
                  if isinstance(converted, list) else "converted linears not recorded")
        speed = compare_speed(bf16, row)
        if _flag(row.get("fp8_emulated")) or c.device not in spec.devices:
            out.append(Verdict(c.model, text, speed.describe(), Kind.NOT_TESTABLE,
                               "needs FP8 matmul units (CUDA compute capability 8.9+: Ada, "
                               "Hopper, Blackwell); here the float8 casts and matmuls were "
                               f"emulated, so the speed is not FP8's; {layers}, training "
                               "check passed", "speedup.png"))
            continue
        why = (f"separate cases; {layers}: FP8 pays off on large matmuls only (torchao's "
               "filter keeps the linears its H100 measurements found faster), and each cast "
               "and scale costs memory traffic")
        out.append(Verdict(c.model, text, speed.describe(), speed.judge(spec.parts["time"]),
                           why, "speedup.png"))
    return out


def recipe_ingredients(c: _Cases, stack: pd.Series) -> dict[str, pd.Series | None]:
    """The single-technique cases a recipe stack is made of, each measured in its own group:
    its precision, its accumulation (k at the same micro-batch), its loader (the same dataset,
    workers and pinning), its DDP (2 ranks, no accumulation); None where not measured. An
    ingredient the stack does not use (fp32, device-resident batches) is left out."""
    micro = int(stack["micro_batch"])
    out: dict[str, pd.Series | None] = {}
    if stack["precision"] != "fp32":
        out["precision"] = c.find(precision=stack["precision"])
    if int(stack["accum_steps"]) > 1:
        out["accumulation"] = c.find(accum_steps=int(stack["accum_steps"]), micro_batch=micro)
    if stack.get("dataset") not in (None, "device-resident"):
        out["loader"] = c.find(**{k: stack[k] for k in ("dataset", "num_workers", "pin_memory",
                                                         "non_blocking")})
    if stack["parallel"] == "ddp":
        out["ddp"] = c.find(parallel="ddp", world_size=int(stack["world_size"]))
    return out


def interaction(c: _Cases, stack: pd.Series) -> tuple[float, dict[str, float]]:
    """The stack's speedup over the product of its ingredients' speedups (each against the FP32
    baseline, per sample): 1 when the techniques' gains multiply, below 1 when they overlap or
    get in each other's way, above 1 when they help each other; and each ingredient's speedup.
    NaN when an ingredient was not measured."""
    speeds = {name: (float(row["speedup"]) if row is not None else float("nan"))
              for name, row in recipe_ingredients(c, stack).items()}
    product = float(np.prod(list(speeds.values()))) if speeds else 1.0
    return float(stack["speedup"]) / product, speeds


def check_recipe(c: _Cases) -> list[Verdict]:
    """S1 section 6: the stacked recipe against its best single ingredient (part ``single``),
    and the stack over DDP against the stack on one device (part ``ddp``, GPUs only), with the
    interaction ratio (``interaction``) of each stack."""
    spec = CLAIMS["recipe"]
    claim = spec.text
    stacks = c.where(c.is_("group", "recipe"))
    single = next((r for r in stacks if r["parallel"] == "single"), None)
    ddp = next((r for r in stacks if r["parallel"] == "ddp"), None)
    if single is None:
        return [_missing(c.model, claim, "speedup.png", "the recipe group's cases")]
    ingredients = {k: v for k, v in recipe_ingredients(c, single).items() if v is not None}
    figures, parts = [], {}
    ratio, speeds = interaction(c, single)
    figures.append(f"{single['case_id']}: x{float(single['speedup']):.2f} vs the product of "
                   + " x ".join(f"{k} x{v:.2f}" for k, v in speeds.items())
                   + f", interaction x{ratio:.2f}")
    if ingredients:
        best_name, best = max(ingredients.items(), key=lambda kv: float(kv[1]["speedup"]))
        speed = compare_speed(best, single)
        parts["single"] = speed.judge(spec.parts["single"])
        figures.append(f"against its best ingredient ({best_name}): {speed.describe()}")
    else:
        parts["single"] = Kind.INCONCLUSIVE
    why = ("separate cases, per sample against the FP32 baseline; interaction = the stack's "
           "speedup over the product of its ingredients' (1: they multiply; below 1: they "
           "overlap, e.g. workers matter less once the step is slower per batch, or compete "
           "for the same cores)")
    if ddp is not None:
        ratio_ddp, _ = interaction(c, ddp)
        if c.device == "cuda":
            speed = compare_speed(single, ddp)
            parts["ddp"] = speed.judge(spec.parts["ddp"])
            figures.append(f"over DDP: {speed.describe()} against the stack on one GPU, "
                           f"interaction x{ratio_ddp:.2f}")
        else:
            figures.append(f"over DDP x{float(ddp['speedup']):.2f} (interaction "
                           f"x{ratio_ddp:.2f}: on the CPU the ranks share the cores)")
            why += "; the DDP stack is not judged on the CPU (its ranks share the same cores)"
    elif c.device == "cuda":
        parts["ddp"] = Kind.INCONCLUSIVE
    base = c.find()
    if base is not None and int(single["global_batch"]) != int(base["global_batch"]):
        why += (f"; the stack trains on {int(single['global_batch'])} samples per step, the "
                f"baseline on {int(base['global_batch'])}: accumulation at the same "
                "micro-batch changes the training recipe (S1: 'simulate a larger batch')")
    return [Verdict(c.model, claim, "; ".join(figures), combine_parts(parts), why,
                    "speedup.png")]


def check_parity(c: _Cases) -> list[Verdict]:
    """Training accuracy under AMP, DDP and accumulation: the loss curves of ``gpubench parity``
    (``parity.json``), each technique's final loss against FP32's from the same initial
    weights and data (``gpubench.analysis.parity``)."""
    from gpubench.analysis.parity import CLAIM, describe, verdict_parts

    report = c.parity
    parts = verdict_parts(report) if report is not None else {}
    if not parts:
        spec = next((w for w in c.col("workload") if isinstance(w, str)), c.model)
        return [_missing(c.model, CLAIM, "parity.md",
                         f"the loss curves of gpubench parity --model {spec}, its parity.json")]
    measured, why = describe(report)
    # parity.md: the table, beside its chart(s) (parity.png, or parity-<model>.png)
    return [Verdict(c.model, CLAIM, measured, combine_parts(parts), why, "parity.md")]
