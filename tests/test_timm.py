"""timm models as workloads (``timm:NAME?key=value``): random weights, timm's own activation
checkpointing, bad names and keys on one line, and a case that trains."""

from __future__ import annotations

import pytest

pytest.importorskip("timm", reason="timm is an optional dependency: pip install -e '.[timm]'")

from gpubench.train.build import build  # noqa: E402
from gpubench.train.checks import check_case  # noqa: E402
from gpubench.train.config import RunConfig  # noqa: E402
from gpubench.workloads.api import WorkloadError  # noqa: E402
from gpubench.workloads.registry import checked  # noqa: E402


def test_a_timm_spec_is_a_workload_with_its_overrides():
    w = checked("timm:resnet18?micro_batch=4&image_size=48&num_classes=5", "cpu")
    assert (w.name, w.micro_batch) == ("resnet18", 4)
    inputs, targets = w.sample_batch(4)
    assert list(inputs.shape) == [4, 3, 48, 48] and int(targets.max()) < 5
    vit = checked("timm:vit_tiny_patch16_224?image_size=32", "smoke")
    assert vit.facts.uses_sdpa  # its attention cases apply


@pytest.mark.parametrize("spec, says", [
    ("timm:resnet_18", "timm has no model 'resnet_18' (e.g. "),
    ("timm:resnet18?depth_sise=3", "timm:resnet18?depth_sise=3"),
])
def test_a_bad_timm_spec_is_one_line(spec, says):
    with pytest.raises(WorkloadError) as err:
        checked(spec, "smoke")
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("changes", [{}, {"checkpointing": True}])
def test_a_timm_case_trains_with_timms_own_checkpointing(changes, monkeypatch):
    import timm.models.resnet

    calls = []
    real = timm.models.resnet.ResNet.set_grad_checkpointing
    monkeypatch.setattr(timm.models.resnet.ResNet, "set_grad_checkpointing",
                        lambda self, enable=True: (calls.append(enable), real(self, enable)))
    cfg = RunConfig(model="timm:resnet18?image_size=32", profile="smoke", **changes)
    with build(cfg) as case:
        check_case(case)
    assert calls == ([True] if changes else [])
