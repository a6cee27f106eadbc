"""The timed rounds' protocol: blocks of each side in ABBA order with each block's first step
untimed, the stopping rule (target width, time cap, most rounds, least rounds) and the warm-up
that stops once the step is steady. Fake steps (functions returning their seconds), no model."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from gpubench.measure.protocol import (
    BLOCK_STEPS,
    MIN_ROUNDS,
    StoppingRule,
    block_order,
    is_steady,
    relative_half_width,
    run_rounds,
    warm_up,
)


class Side:
    """A fake step: records its calls in a shared log and returns the next of ``times``."""

    def __init__(self, name: str, log: list, times):
        self.name, self.log, self.times = name, log, iter(times)

    def __call__(self) -> float:
        self.log.append(self.name)
        return next(self.times)


class Switching(Side):
    """A fake step that reads ``slow`` right after the other side's step (or first of all): a
    switch's cost, which the block's untimed first step must absorb."""

    def __init__(self, name: str, log: list, fast: float, slow: float):
        super().__init__(name, log, itertools.repeat(fast))
        self.slow = slow

    def __call__(self) -> float:
        switched = not self.log or self.log[-1] != self.name
        fast = super().__call__()
        return self.slow if switched else fast


def test_blocks_run_in_abba_order_and_only_a_switchs_first_step_is_not_timed():
    log: list[str] = []
    case = Switching("case", log, 0.1, 1.0)
    base = Switching("base", log, 0.2, 2.0)
    out = run_rounds(case, StoppingRule(0.0, 12, 12), base, block_steps=4)
    assert block_order(6) == ["base", "case", "case", "base", "base", "case"]
    runs = [(side, len(list(steps))) for side, steps in itertools.groupby(log)]
    # ABBA blocks of 3 timed steps; a block after the other side's starts with an untimed
    # step, one after its own side's runs on: B C CC BB CC B
    assert runs == [("base", 4), ("case", 7), ("base", 7), ("case", 7), ("base", 4)]
    assert out.case_s == [0.1] * 12 and out.base_s == [0.2] * 12  # no switch was timed
    assert out.discarded == 5 and out.stop_reason == "rounds"
    assert len(log) == 24 + 5  # 8 untimed steps of 32 before; 5 of 29 now


def test_the_rounds_stop_at_the_target_width_but_not_before_the_least_rounds():
    log: list[str] = []
    steady = StoppingRule(0.05, MIN_ROUNDS, 100)
    out = run_rounds(Side("case", log, itertools.repeat(0.1)), steady,
                     Side("base", log, itertools.repeat(0.2)), block_steps=3)
    # a zero-width interval from the first pair of blocks, yet at least MIN_ROUNDS rounds
    assert out.stop_reason == "width" and out.width == 0.0
    assert MIN_ROUNDS <= len(out.case_s) < MIN_ROUNDS + 2 * 2
    assert len(out.case_s) == len(out.base_s)


def test_noisy_rounds_run_to_the_cap_on_rounds_or_on_time():
    noise = itertools.cycle([0.1, 0.3, 0.15, 0.25, 0.12])
    out = run_rounds(Side("case", [], noise), StoppingRule(0.001, 6, 20),
                     Side("base", [], itertools.repeat(0.2)), block_steps=3)
    assert out.stop_reason == "rounds" and len(out.case_s) == 20
    assert out.width > 0.001
    timed = run_rounds(Side("case", [], noise), StoppingRule(0.001, 6, 1000, max_time_s=3.0),
                       Side("base", [], itertools.repeat(0.2)), block_steps=3)
    assert timed.stop_reason == "time"
    assert 3.0 <= sum(timed.case_s) < 3.0 + 2 * 0.3 * 2


def test_a_slow_case_keeps_the_least_rounds_past_its_time_cap():
    out = run_rounds(Side("case", [], itertools.repeat(10.0)),
                     StoppingRule(0.001, 6, 100, max_time_s=1.0),
                     Side("base", [], itertools.cycle([9.0, 11.0, 10.0])), block_steps=2)
    assert len(out.case_s) == 6 and out.stop_reason == "time"


def test_unpaired_rounds_stop_on_the_median_steps_interval():
    out = run_rounds(Side("case", [], itertools.repeat(0.1)), StoppingRule(0.01, 6, 50))
    assert out.base_s == [] and out.stop_reason == "width" and 6 <= len(out.case_s) <= 8


def test_the_stopping_rule_without_a_target_is_the_fixed_budget():
    fixed = StoppingRule.for_case(12, 0.015, 3.0, 0.6, target_width=0.0)
    assert fixed.min_rounds == fixed.max_rounds == 40  # budget_rounds: 40 x 15 ms = 0.6 s
    assert fixed.stop_reason(39, 0.0, 0.0) is None
    assert fixed.stop_reason(40, math.inf, 0.0) == "rounds"
    adaptive = StoppingRule.for_case(12, 0.015, 3.0, 0.6, target_width=0.02)
    assert (adaptive.min_rounds, adaptive.max_rounds, adaptive.max_time_s) == (6, 48, 3.0)
    assert adaptive.stop_reason(5, 0.0, 0.0) is None  # never below the least
    assert adaptive.stop_reason(6, 0.019, 0.1) == "width"
    assert adaptive.stop_reason(6, 0.03, 3.1) == "time"
    assert StoppingRule.for_case(3, 1.0, 2.0, 0.0, 0.02).min_rounds == 3  # fewer asked


def test_relative_half_width():
    assert relative_half_width(0.98, 1.02, 1.0) == pytest.approx(0.02)
    assert relative_half_width(math.nan, 1.0, 1.0) == math.inf


def test_warm_up_stops_once_two_steps_agree_and_at_its_most():
    slow_start = iter([1.0, 0.5, 0.21, 0.2, 0.2])
    assert warm_up(lambda: next(slow_start), most=10) == [1.0, 0.5, 0.21, 0.2]
    assert is_steady([0.21, 0.2]) and not is_steady([0.5, 0.21]) and not is_steady([0.2])
    never = itertools.cycle([0.1, 0.5])
    assert len(warm_up(lambda: next(never), most=5)) == 5
    assert len(warm_up(lambda: 0.1, most=0)) == 1  # at least one
    # After a peak reset the first step is slow; the next, at the check's last step's speed,
    # shows the case is back (without the check's step it takes a third).
    after_reset = [0.3, 0.2, 0.2, 0.2]
    assert warm_up(iter(after_reset).__next__, most=10) == [0.3, 0.2, 0.2]
    assert warm_up(iter(after_reset).__next__, most=10, settled=0.21) == [0.3, 0.2]
    assert warm_up(iter([0.2, 0.5]).__next__, most=10, settled=0.205) == [0.2]
    assert warm_up(iter([0.5, 0.3, 0.31]).__next__, most=10, settled=0.2) == [0.5, 0.3, 0.31]
    assert BLOCK_STEPS >= 3  # at least two timed steps per block


def test_the_fp32_reference_is_computed_once_per_model_weights_and_batches():
    from gpubench.train.build import build
    from gpubench.train.checks import REFERENCE_GRADIENTS, _fp32_gradient, check_case
    from gpubench.train.config import RunConfig

    REFERENCE_GRADIENTS.clear()
    base = RunConfig(model="resnet18", profile="smoke")
    with build(base) as case:
        first = check_case(case)
    misses, hits = REFERENCE_GRADIENTS.misses, REFERENCE_GRADIENTS.hits
    with build(base.with_(optimizer="adam")) as case:  # same model, weights and batches
        again = check_case(case)
    assert (REFERENCE_GRADIENTS.misses, REFERENCE_GRADIENTS.hits) == (misses, hits + 1)
    assert again.reference_loss == first.reference_loss
    with build(base.with_(micro_batch=4)) as case:  # another shape: another reference
        check_case(case)
    assert REFERENCE_GRADIENTS.misses == misses + 1
    with build(base) as case:  # the cached gradient is the one computed afresh
        trained = [p for g in case.optimizer.param_groups for p in g["params"]]
        fixed = case.fixed_batches()
        _, ref_params = case.strategy.pair_parameters(case.reference_model, trained)
        entry = REFERENCE_GRADIENTS.lookup(case, fixed, ref_params)
        loss, grads = entry.loss, entry.grads
        want_loss, want = _fp32_gradient(case, fixed, ref_params)
    assert loss == want_loss and grads
    assert all(torch.equal(a, b) for a, b in zip(grads, want, strict=True))


def test_each_optimizers_reference_update_is_made_once_and_equals_a_fresh_one(monkeypatch):
    """The check's reference update (the default optimizer's first step from the FP32
    gradient) is kept with the cached gradient, one per optimizer name: a second case with
    the same optimizer takes it, another optimizer makes its own, and what is taken equals
    the update made afresh."""
    import gpubench.train.build as build_module
    from gpubench.train.build import build
    from gpubench.train.checks import REFERENCE_GRADIENTS, _Reference
    from gpubench.train.config import RunConfig

    made = []
    plain = build_module.build_optimizer

    def counting(name, impl, params):
        made.append(name)
        return plain(name, impl, params)

    def reference_update(cfg):
        with build(cfg) as case, monkeypatch.context() as patch:
            patch.setattr(build_module, "build_optimizer", counting)
            return _Reference(case, case.fixed_batches()).updates

    REFERENCE_GRADIENTS.clear()
    base = RunConfig(model="bert", profile="smoke")
    fresh = reference_update(base)
    assert made == ["sgd"]
    taken = reference_update(base.with_(optimizer_impl="foreach"))  # same optimizer: taken
    assert made == ["sgd"]
    assert all(torch.equal(a, b) for a, b in zip(taken, fresh, strict=True))
    adamw = reference_update(base.with_(optimizer="adamw"))  # another optimizer: its own
    assert made == ["sgd", "adamw"]
    assert not all(torch.equal(a, b) for a, b in zip(adamw, fresh, strict=True))
    REFERENCE_GRADIENTS.clear()
    again = reference_update(base.with_(optimizer="adamw"))  # made afresh: the same update
    assert made == ["sgd", "adamw", "adamw"]
    assert all(torch.equal(a, b) for a, b in zip(adamw, again, strict=True))
    REFERENCE_GRADIENTS.clear()  # no entry of this test's for a later one to find
