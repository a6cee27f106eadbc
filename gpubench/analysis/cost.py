"""What a sample costs: a machine's price per hour over its throughput.

``--price-per-hour PRICE`` is the price of the whole machine per hour (``2.5``, or
``2.5/machine``) or of each GPU a case uses (``2.5/gpu``: times the case's world size on CUDA).
A case's cost per million samples is ``price_per_hour / 3600 / samples_per_s * 1e6``; for a
language model (``LANGUAGE_MODELS``: its input is token ids ``[batch, sequence]``) also per
million tokens, over ``samples_per_s * sequence length``. Headers spell out the unit with the
price they assume, and the price is in whatever currency the user gave it.

The same arithmetic serves ``gpubench summary`` and ``compare`` (``with_cost``: a results
frame's step cases) and ``gpubench tune`` (``tune_cost``: the configurations the tune
confirmed, at the global batch over their median step time in the confirmation's rounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

LANGUAGE_MODELS = frozenset({"bert", "gpt2", "llama", "t5", "lstm"})
"""Models whose samples are token sequences: their cost is also per token."""


@dataclass(frozen=True)
class Price:
    per_hour: float
    per_gpu: bool = False

    @classmethod
    def parse(cls, text: str) -> Price:
        """``2.5``, ``2.5/machine`` or ``2.5/gpu``; ``ValueError`` naming the bad value."""
        value, _, unit = str(text).strip().partition("/")
        unit = unit.strip().lower() or "machine"
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if unit not in ("machine", "gpu") or not math.isfinite(number) or number <= 0:
            raise ValueError("expected a positive price per hour, for the whole machine (2.5 "
                             f"or 2.5/machine) or per GPU (2.5/gpu); got {text!r}")
        return cls(number, unit == "gpu")

    def label(self) -> str:
        return f"{self.per_hour:g}/{'GPU' if self.per_gpu else 'machine'}-hour"

    def hourly(self, gpus: int) -> float:
        return self.per_hour * (max(1, gpus) if self.per_gpu else 1)


def tokens_per_sample(model, input_shape) -> float:
    """The sequence length of a language model's input ``[batch, sequence]``, else NaN."""
    if str(model) in LANGUAGE_MODELS and isinstance(input_shape, list | tuple) \
            and len(input_shape) == 2:
        try:
            return float(input_shape[1])
        except (TypeError, ValueError):
            return math.nan
    return math.nan


def cost_per_million(samples_per_s: float, price: Price, gpus: int = 1,
                     tokens: float = math.nan) -> tuple[float, float]:
    """(cost per million samples, per million tokens: NaN without ``tokens`` per sample)."""
    if not samples_per_s or not math.isfinite(samples_per_s) or samples_per_s <= 0:
        return math.nan, math.nan
    per_sample = price.hourly(gpus) / 3600 / samples_per_s
    return per_sample * 1e6, (per_sample / tokens * 1e6 if tokens and tokens > 0
                              else math.nan)


def _gpus(row) -> int:
    if row.get("device") != "cuda":
        return 1
    world = row.get("world_size")
    return int(world) if isinstance(world, int | float) and not pd.isna(world) else 1


def with_cost(df: pd.DataFrame, price: Price) -> pd.DataFrame:
    """``df`` (rows with samples_per_s, model, input_shape, device, world_size) with
    ``cost_per_m_samples`` and ``cost_per_m_tokens``."""
    df = df.copy()
    costs = [cost_per_million(float(r.get("samples_per_s") or math.nan), price, _gpus(r),
                              tokens_per_sample(r.get("model"), r.get("input_shape")))
             for _, r in df.iterrows()]
    df["cost_per_m_samples"] = [c[0] for c in costs]
    df["cost_per_m_tokens"] = [c[1] for c in costs]
    return df


def cost_headers(price: Price) -> tuple[str, str]:
    return (f"cost per 1M samples (at {price.label()})",
            f"cost per 1M tokens (at {price.label()})")


def cost_markdown(df: pd.DataFrame, price: Price) -> str:
    """Per measured step case: throughput and its cost per million samples (and tokens)."""
    from gpubench.util.tables import markdown_table

    steps = df[(df["kind"] == "step") & df["samples_per_s"].notna()]
    steps = with_cost(steps, price)
    samples, tokens = cost_headers(price)
    rows = [{"case": r["case_id"], "device": r["device"], "samples/s": f"{r['samples_per_s']:.1f}",
             samples: f"{r['cost_per_m_samples']:.4g}",
             tokens: "-" if pd.isna(r["cost_per_m_tokens"]) else f"{r['cost_per_m_tokens']:.4g}"}
            for _, r in steps.iterrows()]
    return markdown_table(rows, align=["left", "left", "right", "right", "right"],
                          columns=["case", "device", "samples/s", samples, tokens])


def tune_cost(result, price: Price) -> dict:
    """What the configurations a ``gpubench tune`` confirmed cost (``result``: its
    ``TuneResult`` or the ``result`` of ``tune.json``): per case id (the baseline's included),
    ``samples_per_s`` (the global batch over the median step time of its confirmation rounds)
    and its cost per million samples and tokens (None where unknown: not a language model, a
    figure from a tune that did not record step times). A tune measures one process on one
    device: a per-GPU price counts one GPU. JSON-ready: ``tune.json`` keeps it as it is."""
    fields = result if isinstance(result, dict) else vars(result)
    batch = fields.get("global_batch")
    tokens = tokens_per_sample(fields.get("name") or fields.get("model"),
                               fields.get("input_shape"))
    times = {c["case_id"]: c.get("step_time_s") for c in fields.get("confirmed") or ()
             if c.get("check") == "passed"}
    times[fields["baseline"]] = fields.get("baseline_step_time_s")
    samples_header, tokens_header = cost_headers(price)
    cases = {}
    for case_id, step_s in times.items():
        rate = (batch / step_s if isinstance(step_s, int | float) and step_s > 0
                and isinstance(batch, int | float) else math.nan)
        per_samples, per_tokens = cost_per_million(rate, price, 1, tokens)
        cases[case_id] = {k: (None if not math.isfinite(v) else v) for k, v in (
            ("samples_per_s", rate), ("cost_per_m_samples", per_samples),
            ("cost_per_m_tokens", per_tokens))}
    return {"price": price.label(), "price_per_hour": price.per_hour, "per_gpu": price.per_gpu,
            "samples_header": samples_header,
            "tokens_header": tokens_header if math.isfinite(tokens) else None,
            "cases": cases}
