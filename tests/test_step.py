"""The training step: accumulation equivalence, precision tolerance, the in-case checks."""


import pytest
import torch

from gpubench.train.build import build
from gpubench.train.checks import LOSS_RTOL, TrainingCheckError, check_case
from gpubench.train.config import RunConfig
from gpubench.train.precision import Precision, unsupported_reason
from gpubench.train.step import train_step

GRAD_RTOL = 1e-4
"""Accumulated vs one big batch: the same sums in a different order (float32)."""


def _grads_after_one_backward(cfg: RunConfig, inputs, targets) -> list[torch.Tensor]:
    case = build(cfg)
    k = cfg.accum_steps
    chunks = zip(inputs.chunk(k), targets.chunk(k), strict=True)
    # A step with lr=0 leaves the weights alone; keep the gradients by not zeroing them.
    for group in case.optimizer.param_groups:
        group["lr"] = 0.0
    train_step(case.model, case.optimizer, iter(chunks), precision=case.precision,
               accum_steps=k, set_to_none=False, after_step=lambda: None)
    return [p.grad.clone() for p in case.model.parameters()]


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_accumulation_equals_one_large_batch(model, monkeypatch):
    # zero_grad after the step would erase the gradients to compare: make it a no-op.
    monkeypatch.setattr(torch.optim.SGD, "zero_grad", lambda self, set_to_none=True: None)
    base = RunConfig(model=model, profile="smoke", micro_batch=8)
    case = build(base)
    inputs, targets = next(case.batches)
    one = _grads_after_one_backward(base, inputs, targets)
    four = _grads_after_one_backward(base.with_(accum_steps=4, micro_batch=2), inputs, targets)
    for a, b in zip(one, four, strict=True):
        torch.testing.assert_close(b, a, rtol=GRAD_RTOL, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_loss_close_to_fp32(precision):
    if unsupported_reason(precision, "cpu"):
        pytest.skip(unsupported_reason(precision, "cpu"))
    result = check_case(build(RunConfig(model="bert", profile="smoke", precision=precision)))
    ref = check_case(build(RunConfig(model="bert", profile="smoke")))
    # Same weights and batch: the first loss within the stated tolerance, and both train.
    assert ref.first_loss == pytest.approx(ref.reference_loss, rel=LOSS_RTOL["fp32"])
    assert result.first_loss == pytest.approx(ref.first_loss, rel=LOSS_RTOL[precision])
    assert result.losses[-1] < result.losses[0]


def test_check_catches_a_technique_that_does_not_train():
    case = build(RunConfig(model="bert", profile="smoke"))
    for group in case.optimizer.param_groups:
        group["lr"] = 0.0  # a broken optimizer: nothing changes
    with pytest.raises(TrainingCheckError, match="update differs|did not fall"):
        check_case(case)


def test_check_catches_numerical_divergence_from_fp32():
    case = build(RunConfig(model="bert", profile="smoke"))
    case.reference_model = _Perturbed(case.reference_model)
    # The scaled reference loss scales the reference gradient too: caught at the gradient.
    with pytest.raises(TrainingCheckError, match="FP32 reference|gradient differs"):
        check_case(case)


class _Perturbed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, y):
        return self.inner(x, y) * 0.99


def test_precision_policy_off_forms_are_no_ops():
    p = Precision("fp32", "cpu")
    assert not p.scaler.is_enabled()
    with p.autocast():
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == torch.float32
    assert RunConfig(model="bert", precision="tf32").inert_techniques
    assert not RunConfig(model="bert", precision="tf32", device="cuda").inert_techniques
    with Precision("bf16", "cpu").autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_fixed_batches_are_the_next_micro_batches():
    case = build(RunConfig(model="resnet18", profile="smoke", accum_steps=2, micro_batch=2))
    fixed = case.fixed_batches()
    assert len(fixed) == 2 and fixed[0][0].shape == (2, 3, 32, 32)
    assert not torch.equal(fixed[0][0], fixed[1][0])


def test_device_resident_cases_build_only_the_samples_they_use():
    """One optimizer step of micro-batches is made on the device and reused, with no loader
    behind it (four steps' worth was 2.5 GB of host memory for ResNet-50 accum4 at batch 256;
    the chunks it is made of: ``tests/test_diagnostics.py``); a loader case still gets several
    steps to iterate."""
    from gpubench.train.config import LoaderConfig

    case = build(RunConfig(model="resnet18", profile="smoke", accum_steps=2, micro_batch=2))
    assert case.loader is None
    batches = case.fixed_batches()
    assert len(batches) == 2 and batches[0][0].shape[0] == 2
    assert not torch.equal(batches[0][0], batches[1][0])
    case.close()
    loader = build(RunConfig(model="resnet18", profile="smoke", micro_batch=2,
                             loader=LoaderConfig(dataset="synthetic")))
    assert len(loader.loader.dataset) == 2 * 4
    loader.close()
