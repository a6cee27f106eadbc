from dataclasses import fields

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpubench.train.config import LoaderConfig, RunConfig


@pytest.mark.parametrize(
    ("changes", "bad", "valid"),
    [
        ({"precision": "fp4"}, "'fp4'", "fp32, tf32, fp16, bf16, fp8, fp8-rowwise"),
            ({"fp8_layers": "all"}, "'all'", "fp8, fp8-rowwise"),
        ({"model": "vgg"}, "'vgg'", "resnet18, resnet50, bert, gpt2, llama, FILE.py:FACTORY"),
        ({"optimizer": "lamb"}, "'lamb'", "sgd, adam, adamw"),
        ({"optimizer_impl": "triton"}, "'triton'", "default, foreach, fused"),
        ({"profile": "huge"}, "'huge'", "smoke, cpu, gpu-small, gpu-full"),
        ({"device": "tpu"}, "'tpu'", "cpu, cuda"),
        ({"accum_steps": 0}, "0", "positive integer"),
        ({"micro_batch": -2}, "-2", "positive integer"),
        ({"world_size": 2}, "2", "world_size 1"),
        ({"model": "bert", "channels_last": True}, "'bert'", "one 4-D tensor"),
    ],
)
def test_invalid_config_names_bad_value_and_valid_ones(changes, bad, valid):
    kwargs = {"model": "resnet18", **changes}
    with pytest.raises(ValueError) as err:
        RunConfig(**kwargs)
    assert bad in str(err.value)
    assert valid in str(err.value)


def test_invalid_loader_config():
    with pytest.raises(ValueError, match="num_workers > 0"):
        LoaderConfig(dataset="synthetic", prefetch_factor=2)
    with pytest.raises(ValueError, match="-1"):
        LoaderConfig(num_workers=-1)


def test_id_lists_only_what_differs_from_baseline():
    base = RunConfig(model="resnet18")
    assert base.id == "resnet18-fp32"
    assert base.is_baseline
    cfg = base.with_(precision="bf16", accum_steps=4)
    assert cfg.id == "resnet18-bf16-accum4"
    assert not cfg.is_baseline
    full = base.with_(
        optimizer="adamw", optimizer_impl="fused", checkpointing=True, channels_last=True,
        zero_grad_set_to_none=False, empty_cache=True, compile=True, micro_batch=2,
        loader=LoaderConfig(dataset="synthetic", num_workers=2, pin_memory=True,
                            non_blocking=True),
    )
    assert full.id == (
        "resnet18-fp32-mb2-adamw_fused-zerofill-emptycache-ckpt-cl-compile-synthetic-w2-pin-nb"
    )
    # The default feeds device-resident batches; loader settings need a dataset read through
    # the loader, and the error names the setting.
    assert base.loader.dataset == "device-resident"
    with pytest.raises(ValueError, match="num_workers=2"):
        LoaderConfig(num_workers=2)


def test_flatten_has_the_documented_names():
    flat = RunConfig(model="bert").flatten()
    for name in ("model", "profile", "device", "precision", "accum_steps", "micro_batch",
                 "optimizer", "parallel", "world_size", "num_workers", "pin_memory"):
        assert name in flat


def test_config_round_trips_through_a_record():
    from gpubench.train.config import config_from_record

    cfg = RunConfig(model="bert", precision="bf16", accum_steps=2, micro_batch=4,
                    loader=LoaderConfig(dataset="tokens-mmap", num_workers=2))
    record = {**cfg.flatten(), "case_id": cfg.id}
    assert config_from_record(record) == cfg
    default_batch = RunConfig(model="resnet18", precision="bf16")
    record = {**default_batch.flatten(), "micro_batch": 8, "case_id": default_batch.id}
    assert config_from_record(record) == default_batch


@pytest.mark.parametrize("model", [[], [1], {}, {"a": 1}, None, 5, b"bert", ""])
def test_model_that_is_not_a_spec_string_is_a_value_error(model):
    """An unhashable model (a list, a dict) raised TypeError from the workload cache (fault
    campaign: generated configurations)."""
    with pytest.raises(ValueError, match="model must be a workload spec"):
        RunConfig(model=model)


# -- property: construction raises only ValueError; what it accepts has the declared types ------

ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
    st.text(max_size=6), st.sampled_from(["bert", "resnet18", "smoke", "cpu", "fp32", "bf16",
                                          "sgd", "adamw", "fused", "ddp", "pipeline", "1f1b",
                                          "synthetic", "tokens-mmap"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                         max_size=1),
    st.binary(max_size=2),
)


def _declared(value, declared: str) -> bool:
    return {"bool": type(value) is bool, "int": type(value) is int,
            "str": type(value) is str,
            "int | None": value is None or type(value) is int,
            "LoaderConfig": type(value) is LoaderConfig}[declared]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_field_values_raise_only_value_error(data):
    cls = data.draw(st.sampled_from([RunConfig, LoaderConfig]))
    names = [f.name for f in fields(cls) if f.name != "loader"]
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    kwargs = {name: data.draw(ANY_VALUE) for name in chosen}
    if cls is RunConfig:
        kwargs.setdefault("model", "bert")
        kwargs.setdefault("profile", "smoke")
    try:
        cfg = cls(**kwargs)
    except ValueError:
        return
    for f in fields(cls):
        assert _declared(getattr(cfg, f.name), f.type), (f.name, getattr(cfg, f.name))
