"""The built-in workloads, defined with the public ``Workload`` API like a user's: torchvision
ResNets, a transformers BERT (sequence classification), GPT-2 and Llama (causal LMs),
per-profile sizes, random weights, dropout off; plus the ``torchvision:NAME`` and
``transformers:TYPE`` families.
Nothing is downloaded.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gpubench.workloads.api import (
    Checkpointed,
    DataRequest,
    Workload,
    WorkloadError,
    parse_overrides,
)
from gpubench.workloads.profiles import profile as profile_of


@dataclass(frozen=True, kw_only=True)
class ModelSize:
    """How big one built-in model is in one profile."""

    micro_batch: int
    """Default samples per micro-batch."""
    image_size: int = 0
    """Image side in pixels (image models)."""
    num_classes: int = 10
    seq_len: int = 0
    """Tokens per sample (token models)."""
    vocab_size: int = 1000
    hidden: int = 0
    layers: int = 0
    heads: int = 0


_TINY_TEXT = dict(seq_len=16, vocab_size=256, hidden=32, layers=1, heads=2)
_CPU_TEXT = dict(seq_len=64, vocab_size=1000, hidden=128, layers=2, heads=4)

MODEL_SIZES: dict[tuple[str, str], ModelSize] = {
    ("resnet18", "smoke"): ModelSize(micro_batch=8, image_size=32),
    ("resnet50", "smoke"): ModelSize(micro_batch=4, image_size=32),
    ("bert", "smoke"): ModelSize(micro_batch=4, **_TINY_TEXT),
    ("gpt2", "smoke"): ModelSize(micro_batch=4, **_TINY_TEXT),
    ("resnet18", "cpu"): ModelSize(micro_batch=8, image_size=32),
    ("resnet50", "cpu"): ModelSize(micro_batch=4, image_size=32),
    ("bert", "cpu"): ModelSize(micro_batch=8, **_CPU_TEXT),
    ("gpt2", "cpu"): ModelSize(micro_batch=8, **_CPU_TEXT),
    # gpu-small and gpu-full: the shapes the names promise (ResNets at 224 px, BERT-base at
    # sequence 128, GPT-2 124M at sequence 1024), batches sized for one large GPU (an H200's
    # 141 GB holds every fp32 case); the profiles differ in their case lists.
    **{(model, profile): size for profile in ("gpu-small", "gpu-full") for model, size in {
        "resnet18": ModelSize(micro_batch=256, image_size=224, num_classes=1000),
        "resnet50": ModelSize(micro_batch=256, image_size=224, num_classes=1000),
        "bert": ModelSize(micro_batch=128, seq_len=128, vocab_size=30522, hidden=768,
                          layers=12, heads=12),
        "gpt2": ModelSize(micro_batch=16, seq_len=1024, vocab_size=50257, hidden=768,
                          layers=12, heads=12),
    }.items()},
}

LLAMA_SIZES = {
    "smoke": ModelSize(micro_batch=4, seq_len=16, vocab_size=256, hidden=32, layers=1, heads=2),
    "cpu": ModelSize(micro_batch=8, seq_len=64, vocab_size=1024, hidden=128, layers=2, heads=4),
    **{profile: ModelSize(micro_batch=8, seq_len=1024, vocab_size=32000, hidden=2048, layers=4,
                          heads=16) for profile in ("gpu-small", "gpu-full")},
}
"""Sizes of the built-in ``llama``: every linear's dimensions (hidden, 4 x hidden, heads x
head size, vocabulary) multiples of 16 at every profile; on the GPU profiles a Llama-3-1B-wide
model of 4 layers (about 0.4 B parameters; 8 x 1,024 tokens a step), whose attention, MLP and
output projections all pass torchao's float8 filters (its auto filter skips the small ones)."""

GENERIC_IMAGE = {"smoke": (4, 32), "cpu": (8, 32), "gpu-small": (64, 224), "gpu-full": (128, 224)}
"""(micro-batch, image side) of ``torchvision:NAME`` workloads per profile."""

GENERIC_TEXT = {
    "smoke": dict(micro_batch=4, seq_len=16, hidden_size=32, num_hidden_layers=1,
                  num_attention_heads=2, vocab_size=256),
    "cpu": dict(micro_batch=8, seq_len=64, hidden_size=128, num_hidden_layers=2,
                num_attention_heads=4, vocab_size=1000),
    "gpu-small": dict(micro_batch=16, seq_len=256, hidden_size=512, num_hidden_layers=4,
                      num_attention_heads=8),
    "gpu-full": dict(micro_batch=16, seq_len=512),
}
"""Sizes of ``transformers:TYPE`` workloads per profile (overrides win); gpu-full keeps the
config's own model size."""


def model_size(model: str, profile: str) -> ModelSize:
    return MODEL_SIZES[(model, profile)]


# -- data --------------------------------------------------------------------------------------


def stored_image_size(image_size: int) -> int:
    """Side of the encoded images: larger than the model's input, as photos are, so that
    decoding and RandomResizedCrop cost what they cost in real training."""
    return min(384, max(64, 8 * image_size))


def image_files(fmt: str, image_size: int, num_classes: int, profile: str
                ) -> Callable[[DataRequest], torch.utils.data.Dataset]:
    def dataset(request: DataRequest):
        from gpubench.workloads.datasets import ImageFolderDataset, ensure_image_folder

        count = max(profile_of(profile).dataset_size, request.size)
        folder = ensure_image_folder(request.root, fmt, count, stored_image_size(image_size),
                                     num_classes)
        return ImageFolderDataset(folder, image_size)

    return dataset


def token_file(seq_len: int, vocab_size: int, causal_lm: bool, profile: str
               ) -> Callable[[DataRequest], torch.utils.data.Dataset]:
    def dataset(request: DataRequest):
        from gpubench.workloads.datasets import TokenFileDataset, ensure_token_file

        count = max(profile_of(profile).dataset_size, request.size)
        folder = ensure_token_file(request.root, count, seq_len, vocab_size)
        return TokenFileDataset(folder, causal_lm=causal_lm)

    return dataset


def image_batch(image_size: int, num_classes: int):
    def make_batch(n: int, g: torch.Generator):
        inputs = torch.randn((n, 3, image_size, image_size), generator=g)
        return inputs, torch.randint(0, num_classes, (n,), generator=g)

    return make_batch


def token_batch(seq_len: int, vocab_size: int, num_classes: int, causal_lm: bool):
    def make_batch(n: int, g: torch.Generator):
        inputs = torch.randint(0, vocab_size, (n, seq_len), generator=g)
        if causal_lm:
            return inputs, inputs
        return inputs, torch.randint(0, num_classes, (n,), generator=g)

    return make_batch


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy (the targets are the input ids), in float32 as transformers
    computes it."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets[:, 1:].flatten())


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets)


# -- splitting into stages ----------------------------------------------------------------------


def split_evenly(first: nn.Module, blocks: list[nn.Module], last: nn.Module,
                 n: int) -> list[nn.Module]:
    """``n`` stages of consecutive modules, as equal in count as possible: the embeddings
    (``first``), the blocks, and the head (``last``) each count as one."""
    units = [first, *blocks, last]
    if not 2 <= n <= len(units):
        raise ValueError(f"cannot split {len(blocks)} blocks plus embeddings and head into {n} "
                         f"stages (2..{len(units)})")
    sizes = [len(units) // n + (1 if i < len(units) % n else 0) for i in range(n)]
    stages, start = [], 0
    for size in sizes:
        stages.append(nn.Sequential(*units[start:start + size]))
        start += size
    return stages


def resnet_stages(net: nn.Module, n: int) -> list[nn.Module]:
    """Split a torchvision ResNet into ``n`` (2..4) sequential stages at residual group edges."""
    if not 2 <= n <= 4:
        raise ValueError(f"a ResNet splits into 2..4 stages; got {n}")
    groups = [
        nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1),
        net.layer2,
        net.layer3,
        nn.Sequential(net.layer4, net.avgpool, nn.Flatten(1), net.fc),
    ]
    # Earlier groups run at higher resolution and cost more: merge from the front.
    cuts = {2: [2, 2], 3: [2, 1, 1], 4: [1, 1, 1, 1]}[n]
    stages, start = [], 0
    for size in cuts:
        stages.append(nn.Sequential(*groups[start:start + size]))
        start += size
    return stages


class Logits(nn.Module):
    """A transformers model called with ``input_ids``, returning its logits."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids).logits


class _BertEmbed(nn.Module):
    def __init__(self, embeddings: nn.Module):
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids):
        return self.embeddings(input_ids=input_ids)


class _BertHead(nn.Module):
    def __init__(self, pooler: nn.Module, classifier: nn.Module):
        super().__init__()
        self.pooler, self.classifier = pooler, classifier

    def forward(self, hidden):
        return self.classifier(self.pooler(hidden))


def bert_stages(model: Logits, n: int) -> list[nn.Module]:
    """Embeddings + the first blocks, ..., the last blocks + pooler and classifier."""
    bert = model.net.bert
    head = _BertHead(bert.pooler, model.net.classifier)
    return split_evenly(_BertEmbed(bert.embeddings), list(bert.encoder.layer), head, n)


class _GPT2Embed(nn.Module):
    def __init__(self, wte: nn.Module, wpe: nn.Module, drop: nn.Module):
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.drop(self.wte(input_ids) + self.wpe(positions))


class _GPT2Head(nn.Module):
    def __init__(self, ln_f: nn.Module, lm_head: nn.Linear):
        super().__init__()
        self.ln_f = ln_f
        # A stage cannot share a parameter with another device or process: the split model
        # gets its own copy of the LM head (tied to the embedding in the unsplit model).
        self.lm_head = nn.Linear(lm_head.in_features, lm_head.out_features, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(lm_head.weight)

    def forward(self, hidden):
        return self.lm_head(self.ln_f(hidden))


def gpt2_stages(model: Logits, n: int) -> list[nn.Module]:
    """Embeddings + the first blocks, ..., the last blocks + final norm and LM head (untied)."""
    t = model.net.transformer
    return split_evenly(_GPT2Embed(t.wte, t.wpe, t.drop), list(t.h),
                        _GPT2Head(t.ln_f, model.net.lm_head), n)


# -- the built-in models ----------------------------------------------------------------------


def _resnet_checkpointing(net: nn.Module) -> None:
    for name in ("layer1", "layer2", "layer3", "layer4"):
        layer = getattr(net, name)
        setattr(net, name, nn.Sequential(*(Checkpointed(b) for b in layer)))


def _hf_checkpointing(model: nn.Module) -> None:
    net = model.net if isinstance(model, Logits) else model
    kwargs = {"use_reentrant": False}
    # transformers 5 renamed the switch; older releases only have the first name.
    if hasattr(net, "activation_checkpointing_enable"):
        net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def resnet(name: str, profile: str) -> Workload:
    size = model_size(name, profile)

    def build_model():
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=size.num_classes)

    return Workload(
        name=name,
        build_model=build_model,
        make_batch=image_batch(size.image_size, size.num_classes),
        micro_batch=size.micro_batch,
        loss_fn=classification_loss,
        dataset=image_files("images-jpeg", size.image_size, size.num_classes, profile),
        dataset_name="images-jpeg",
        extra_datasets={
            "images-png": image_files("images-png", size.image_size, size.num_classes, profile)
        },
        stages=resnet_stages,
        checkpointing=_resnet_checkpointing,
        imports=("torchvision.models",),
    )


def bert(profile: str) -> Workload:
    size = model_size("bert", profile)

    def build_model():
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            vocab_size=size.vocab_size,
            hidden_size=size.hidden,
            num_hidden_layers=size.layers,
            num_attention_heads=size.heads,
            intermediate_size=4 * size.hidden,
            max_position_embeddings=max(512, size.seq_len),
            num_labels=size.num_classes,
            # No dropout: techniques are checked for numerical equivalence with FP32.
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return Logits(BertForSequenceClassification(config))

    return Workload(
        name="bert",
        build_model=build_model,
        make_batch=token_batch(size.seq_len, size.vocab_size, size.num_classes, False),
        micro_batch=size.micro_batch,
        loss_fn=classification_loss,
        dataset=token_file(size.seq_len, size.vocab_size, False, profile),
        dataset_name="tokens-mmap",
        stages=bert_stages,
        checkpointing=_hf_checkpointing,
        imports=("transformers.models.bert.modeling_bert",),
    )


def gpt2(profile: str) -> Workload:
    size = model_size("gpt2", profile)

    def build_model():
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=size.vocab_size,
            n_embd=size.hidden,
            n_layer=size.layers,
            n_head=size.heads,
            n_positions=max(1024, size.seq_len),
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=size.vocab_size - 1,
            eos_token_id=size.vocab_size - 1,
        )
        return Logits(GPT2LMHeadModel(config))

    return Workload(
        name="gpt2",
        build_model=build_model,
        make_batch=token_batch(size.seq_len, size.vocab_size, size.num_classes, True),
        micro_batch=size.micro_batch,
        loss_fn=causal_lm_loss,
        dataset=token_file(size.seq_len, size.vocab_size, True, profile),
        dataset_name="tokens-mmap",
        stages=gpt2_stages,
        checkpointing=_hf_checkpointing,
        imports=("transformers.models.gpt2.modeling_gpt2",),
    )


def llama(profile: str) -> Workload:
    """transformers' Llama (a causal LM, random weights) sized by ``LLAMA_SIZES``: the FP8
    workload, whose linears torchao converts where GPT-2's ``Conv1D`` layers and the
    classifier heads of the other built-ins (10 classes) are not ``nn.Linear`` multiples of
    16. A ``transformers:llama`` spec with those sizes, under its own name."""
    size = LLAMA_SIZES[profile]
    fields = {"hidden_size": size.hidden, "intermediate_size": 4 * size.hidden,
              "num_hidden_layers": size.layers, "num_attention_heads": size.heads,
              "num_key_value_heads": size.heads, "head_dim": size.hidden // size.heads,
              "vocab_size": size.vocab_size, "seq_len": size.seq_len,
              "micro_batch": size.micro_batch}
    return transformers_workload(
        "transformers:llama?" + "&".join(f"{k}={v}" for k, v in fields.items()), profile)


BUILTIN: dict[str, Callable[[str], Workload]] = {
    "resnet18": lambda profile: resnet("resnet18", profile),
    "resnet50": lambda profile: resnet("resnet50", profile),
    "bert": bert,
    "gpt2": gpt2,
    "llama": llama,
}


# -- families: torchvision:NAME and transformers:TYPE -------------------------------------------


def _split_spec(spec: str, prefix: str) -> tuple[str, dict]:
    body = spec.removeprefix(prefix)
    name, _, query = body.partition("?")
    if not name:
        raise WorkloadError(f"workload {spec!r}: expected {prefix}NAME")
    return name, parse_overrides(spec, query)


def _pop_int(spec: str, overrides: dict, key: str, default: int) -> int:
    value = overrides.pop(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise WorkloadError(f"workload {spec!r}: {key} must be a positive integer; got {value!r}")
    return value


def _image_overrides(spec: str, overrides: dict, profile: str) -> tuple[int, int, int]:
    """(micro_batch, image_size, num_classes) of an image-model spec: its overrides (taken out
    of ``overrides``), else the profile's generic image shape and 10 classes."""
    batch, side = GENERIC_IMAGE[profile]
    return (_pop_int(spec, overrides, "micro_batch", batch),
            _pop_int(spec, overrides, "image_size", side),
            _pop_int(spec, overrides, "num_classes", 10))


def torchvision_workload(spec: str, profile: str) -> Workload:
    """Any torchvision classification model by name, random weights. Overrides after ``?``:
    ``image_size``, ``micro_batch``, ``num_classes`` and the builder's own keyword arguments."""
    import torchvision

    name, overrides = _split_spec(spec, "torchvision:")
    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise WorkloadError(f"workload {spec!r}: torchvision has no classification model "
                            f"{name!r} (e.g. {', '.join(available[:6])}, ...)")
    micro_batch, side, classes = _image_overrides(spec, overrides, profile)
    builder = torchvision.models.get_model_builder(name)
    kwargs = {"weights": None, "num_classes": classes, **overrides}
    accepts = inspect.signature(builder).parameters
    # Models with positional embeddings (ViT) are built for the input size they will see.
    if "image_size" in accepts or name.startswith("vit"):
        kwargs.setdefault("image_size", side)
    if name.startswith("inception") or name.startswith("googlenet"):
        kwargs.setdefault("aux_logits", False)
        kwargs.setdefault("init_weights", True)

    def build_model():
        try:
            return builder(**kwargs)
        except TypeError as err:
            raise WorkloadError(f"workload {spec!r}: {err}") from None

    return Workload(
        name=name,
        build_model=build_model,
        make_batch=image_batch(side, classes),
        micro_batch=micro_batch,
        loss_fn=classification_loss,
        imports=("torchvision.models",),
    )


def timm_workload(spec: str, profile: str) -> Workload:
    """Any timm model by name (``timm.create_model(name, pretrained=False)``: random weights,
    nothing downloaded). Overrides after ``?``: ``image_size``, ``micro_batch``,
    ``num_classes`` and ``create_model``'s own keyword arguments (``drop_path_rate=0.1``).
    Activation checkpointing is timm's own (``set_grad_checkpointing``) where the model has
    it. timm is an optional dependency: ``pip install -e ".[timm]"``."""
    try:
        import timm
    except ImportError:
        raise WorkloadError(f"workload {spec!r}: timm is not installed (pip install -e "
                            "\".[timm]\", or pip install timm)") from None
    name, overrides = _split_spec(spec, "timm:")
    if not timm.is_model(name):
        near = timm.list_models(f"*{name.split('.')[0][:6]}*")[:6] or timm.list_models()[:6]
        raise WorkloadError(f"workload {spec!r}: timm has no model {name!r} (e.g. "
                            f"{', '.join(near)}, ...)")
    micro_batch, side, classes = _image_overrides(spec, overrides, profile)
    kwargs = {"pretrained": False, "num_classes": classes, **overrides}
    # Models with positional embeddings (ViT, Swin) are built for the input size they will see.
    if "img_size" not in kwargs and not name.startswith(("resnet", "efficientnet", "convnext",
                                                         "mobilenet", "regnet")):
        kwargs["img_size"] = side

    def build_model():
        try:
            return timm.create_model(name, **kwargs)
        except TypeError as err:
            if "img_size" in str(err) and "img_size" not in overrides:
                return timm.create_model(name, **{k: v for k, v in kwargs.items()
                                                  if k != "img_size"})
            raise WorkloadError(f"workload {spec!r}: {err}") from None

    def checkpointing(model: nn.Module) -> None:
        if hasattr(model, "set_grad_checkpointing"):
            try:
                model.set_grad_checkpointing(True)
                return
            except (AssertionError, NotImplementedError):
                pass  # a model without timm's own: the generic blocks
        from gpubench.workloads.api import checkpoint_blocks

        checkpoint_blocks(model)

    return Workload(
        name=name.replace("/", "-"),
        build_model=build_model,
        make_batch=image_batch(side, classes),
        micro_batch=micro_batch,
        loss_fn=classification_loss,
        checkpointing=checkpointing,
    )


def _hf_config(spec: str, source: str, overrides: dict):
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # default token ids outside a shrunk vocabulary: fixed below
    try:
        return _hf_config_quiet(spec, source, overrides, AutoConfig)
    finally:
        hf_logging.set_verbosity(verbosity)


def _hf_config_quiet(spec: str, source: str, overrides: dict, AutoConfig):  # noqa: N803

    if source.endswith(".json") or "/" in source:
        path = Path(source).expanduser()
        if not path.is_file():
            raise WorkloadError(f"workload {spec!r}: config file {source} does not exist")
        try:
            data = json.loads(path.read_text())
            model_type = data.pop("model_type")
        except (ValueError, KeyError, OSError) as err:
            raise WorkloadError(f"workload {spec!r}: {source} is not a transformers config "
                                f"with a model_type ({err})") from None
        return AutoConfig.for_model(model_type, **{**data, **overrides})
    try:
        return AutoConfig.for_model(source, **overrides)
    except ValueError:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        raise WorkloadError(f"workload {spec!r}: transformers has no model type {source!r} "
                            f"(e.g. {', '.join(list(CONFIG_MAPPING)[:8])}, ...)") from None


def _check_override_keys(spec: str, overrides: dict, config) -> None:
    """A spec's override that names no field of the model type's config (``hidden_sise``) is
    a one-line error naming the nearest field and the valid keys: transformers would keep it
    as a stray attribute and build the default size."""
    import difflib

    known = set(type(config)().to_dict()) | set(getattr(type(config), "attribute_map", {}))
    unknown = [k for k in overrides if k not in known]
    if not unknown:
        return
    valid = sorted(k for k in known | {"micro_batch", "seq_len"} if not k.startswith("_"))
    near = difflib.get_close_matches(unknown[0], valid, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise WorkloadError(f"workload {spec!r}: {config.model_type} has no config field "
                        f"{unknown[0]!r}{hint}; valid keys: {', '.join(valid)}")


def transformers_workload(spec: str, profile: str) -> Workload:
    """A transformers model from a model type or a local ``config.json``, random weights.

    The class is ``AutoModelForCausalLM`` when the config can be one (targets: the input ids,
    next-token loss), else ``AutoModelForSequenceClassification`` (targets: class labels).
    Overrides after ``?`` set config fields (``hidden_size=256``) or the workload's
    ``seq_len`` and ``micro_batch``; on the smoke, cpu and gpu-small profiles a model type is
    shrunk to that profile's size unless overridden. Dropout fields are set to 0.
    """
    name, overrides = _split_spec(spec, "transformers:")
    sizes = dict(GENERIC_TEXT[profile])
    micro_batch = _pop_int(spec, overrides, "micro_batch", sizes.pop("micro_batch"))
    seq_len = _pop_int(spec, overrides, "seq_len", sizes.pop("seq_len"))
    from_file = name.endswith(".json") or "/" in name
    fields = {} if from_file else dict(sizes)
    if "hidden_size" in fields:
        fields["intermediate_size"] = 4 * fields["hidden_size"]
        fields["num_key_value_heads"] = fields["num_attention_heads"]
        fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    fields.update(overrides)
    config = _hf_config(spec, name, fields)
    _check_override_keys(spec, overrides, config)
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or key.endswith("_pdrop")):
            setattr(config, key, 0.0)
    vocab = config.vocab_size
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    causal = type(config) in AutoModelForCausalLM._model_mapping
    if not causal and type(config) not in AutoModelForSequenceClassification._model_mapping:
        raise WorkloadError(f"workload {spec!r}: {config.model_type} is neither a causal LM "
                            "nor a sequence classifier in transformers")
    if causal and getattr(config, "is_decoder", True) is False:
        config.is_decoder = True  # encoder models used as causal LMs (BERT) need the switch
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        token = getattr(config, key, None)
        if isinstance(token, int) and token >= vocab:
            setattr(config, key, vocab - 1)
    if not causal:
        config.num_labels = 10
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0

    def build_model():
        cls = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
        return Logits(cls.from_config(config))

    # The model type's modeling module as transformers names most (bert, llama, gpt2); the few
    # whose classes live elsewhere (data2vec-text) name a module that does not import, which
    # the fork server skips: their ranks import their model themselves. Asking the auto
    # mapping for the class would import the model here, at every resolve.
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(config.model_type)
    return Workload(
        name=config.model_type,
        build_model=build_model,
        make_batch=token_batch(seq_len, vocab, 10, causal),
        micro_batch=micro_batch,
        loss_fn=causal_lm_loss if causal else classification_loss,
        checkpointing=_hf_checkpointing,
        imports=(f"transformers.models.{module}.modeling_{module}",),
    )
