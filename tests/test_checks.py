"""The training check catches wrong gradients, not only a loss that fails to fall."""

from __future__ import annotations

import pytest
import torch

from gpubench.train.build import build
from gpubench.train.checks import TrainingCheckError, check_case
from gpubench.train.config import RunConfig
from gpubench.train.parallel import Single


class Broken(Single):
    """A step whose accumulation is wrong in one of the ways real training loops get it wrong."""

    def __init__(self, how: str, optimizer):
        self.how, self.optimizer = how, optimizer

    def forward_backward(self, model, inputs, targets, precision, accum_steps):
        if self.how == "last-micro-batch-only":
            self.optimizer.zero_grad(set_to_none=True)  # drops the earlier micro-batches
        with precision.autocast():
            loss = model(inputs, targets)
        scale = {"not-divided": 1, "divided-twice": accum_steps ** 2,
                 "last-micro-batch-only": accum_steps, "zeroed-loss": float("inf")}[self.how]
        scaled = loss * 0 if self.how == "zeroed-loss" else loss / scale
        precision.backward(scaled)
        return loss.detach() / accum_steps


def _case(**changes):
    return build(RunConfig(model="bert", profile="smoke", accum_steps=4, micro_batch=2,
                           **changes))


@pytest.mark.parametrize("how", ["not-divided", "divided-twice", "last-micro-batch-only",
                                 "zeroed-loss"])
def test_broken_accumulation_fails_the_check(how):
    case = _case()
    case.strategy = Broken(how, case.optimizer)
    with pytest.raises(TrainingCheckError, match="differs from plain FP32 training"):
        check_case(case)
    case.close()


def test_optimizer_that_does_not_step_fails_the_check():
    case = _case()
    for group in case.optimizer.param_groups:
        group["lr"] = 0.0  # steps, but moves nothing
    with pytest.raises(TrainingCheckError, match="update differs"):
        check_case(case)
    case.close()


def test_optimizer_never_called_fails_the_check():
    case = _case()
    case.optimizer.step = lambda *args, **kwargs: None  # the hooks never fire
    with pytest.raises(TrainingCheckError, match="never stepped"):
        check_case(case)
    case.close()


@pytest.mark.parametrize("changes", [
    {}, {"checkpointing": True}, {"optimizer": "adamw", "optimizer_impl": "fused"},
    {"optimizer": "adam", "optimizer_impl": "foreach"}, {"zero_grad_set_to_none": False},
])
def test_correct_techniques_pass_with_matching_gradients(changes):
    case = _case(**changes)
    result = check_case(case)
    assert result.grad_cosine > 0.9999 and result.grad_norm_ratio == pytest.approx(1, abs=1e-3)
    assert result.update_cosine > 0.9999
    case.close()


def test_gradient_check_covers_model_parallel_and_channels_last():
    for cfg in (RunConfig(model="resnet18", profile="smoke", parallel="model", world_size=2),
                RunConfig(model="resnet18", profile="smoke", channels_last=True)):
        case = build(cfg)
        result = check_case(case)
        assert result.grad_cosine > 0.9999, cfg.id
        case.close()


def test_reference_gradient_is_the_global_batch_gradient():
    """k micro-batches of B/k give the gradient of the whole batch of B (BERT has no BatchNorm)."""
    case = _case()
    fixed = case.fixed_batches()
    from gpubench.train.checks import _Reference

    ref = _Reference(case, fixed)
    whole = build(RunConfig(model="bert", profile="smoke", micro_batch=8))
    inputs = torch.cat([x for x, _ in fixed])
    targets = torch.cat([y for _, y in fixed])
    loss = whole.model(inputs, targets)
    grads = torch.autograd.grad(loss, [p for p in whole.model.parameters()], allow_unused=True)
    names = {id(p): n for n, p in case.model.named_parameters()}
    wanted = dict(zip([n for n, _ in whole.model.named_parameters()], grads, strict=True))
    for p, g in zip(ref.params, ref.grads, strict=True):
        w = wanted[names[id(p)]]
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w,
                                   rtol=1e-4, atol=1e-6)
    case.close()
    whole.close()


def test_the_reference_of_a_tf32_case_is_ieee_fp32(monkeypatch):
    """The check runs inside the case's math mode (TF32 for a tf32 case); its FP32 reference
    must not: a tf32 case compared with TF32 would never exercise the tf32 tolerances."""
    import gpubench.train.checks as checks

    seen = []
    plain = checks._micro_objective

    def recording(*args, **kwargs):
        seen.append((torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32))
        return plain(*args, **kwargs)

    monkeypatch.setattr(checks, "_micro_objective", recording)
    checks.REFERENCE_GRADIENTS.clear()  # computed here, not taken from an earlier test's
    case = build(RunConfig(model="bert", profile="smoke", precision="tf32"))
    with case.precision.math_mode():
        assert torch.get_float32_matmul_precision() == "high"
        check_case(case)
        assert torch.get_float32_matmul_precision() == "high"  # the case's mode, restored
    case.close()
    assert seen and all(mode == ("highest", False) for mode in seen), seen


def test_the_reference_gradient_holds_one_micro_batch_graph_at_a_time(monkeypatch):
    """The FP32 reference of an accumulation case backpropagates each micro-batch before the
    next one's forward: its peak holds one micro-batch's activations, not k."""
    import gpubench.train.checks as checks

    events = []
    plain_micro, plain_grad = checks._micro_objective, torch.autograd.grad

    def micro(*args, **kwargs):
        events.append("forward")
        return plain_micro(*args, **kwargs)

    def grad(*args, **kwargs):
        events.append("backward")
        return plain_grad(*args, **kwargs)

    monkeypatch.setattr(checks, "_micro_objective", micro)
    monkeypatch.setattr(checks.torch.autograd, "grad", grad)
    checks.REFERENCE_GRADIENTS.clear()  # computed here, not taken from an earlier test's
    case = _case()  # accum_steps=4
    checks._Reference(case, case.fixed_batches())
    case.close()
    assert events == ["forward", "backward"] * 4
