"""The models: torchvision ResNets and transformers encoders/decoders, built with random weights.

Every model is wrapped in a ``TrainModule`` whose ``forward(inputs, targets)`` returns the loss,
so the training step, DDP and activation checkpointing treat all families alike.
Sizes come per profile from ``MODEL_SIZES``; nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True, kw_only=True)
class ModelSize:
    """How big one model is in one profile."""

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
    ("resnet18", "gpu-small"): ModelSize(micro_batch=64, image_size=224, num_classes=1000),
    ("resnet50", "gpu-small"): ModelSize(micro_batch=64, image_size=128, num_classes=1000),
    ("bert", "gpu-small"): ModelSize(
        micro_batch=32, seq_len=128, vocab_size=30522, hidden=512, layers=4, heads=8
    ),
    ("gpt2", "gpu-small"): ModelSize(
        micro_batch=16, seq_len=256, vocab_size=50257, hidden=512, layers=4, heads=8
    ),
    ("resnet18", "gpu-full"): ModelSize(micro_batch=256, image_size=224, num_classes=1000),
    ("resnet50", "gpu-full"): ModelSize(micro_batch=128, image_size=224, num_classes=1000),
    # BERT-base and GPT-2 small (124M) shapes.
    ("bert", "gpu-full"): ModelSize(
        micro_batch=64, seq_len=128, vocab_size=30522, hidden=768, layers=12, heads=12
    ),
    ("gpt2", "gpu-full"): ModelSize(
        micro_batch=16, seq_len=512, vocab_size=50257, hidden=768, layers=12, heads=12
    ),
}


def model_size(model: str, profile: str) -> ModelSize:
    return MODEL_SIZES[(model, profile)]


class TrainModule(nn.Module):
    """A network plus its loss: ``forward(inputs, targets) -> scalar loss``."""

    def __init__(self, net: nn.Module, kind: str):
        super().__init__()
        self.net = net
        self.kind = kind

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        match self.kind:
            case "image":
                return F.cross_entropy(self.net(inputs), targets)
            case "classify":
                return self.net(input_ids=inputs, labels=targets).loss
            case "causal-lm":
                return self.net(input_ids=inputs, labels=targets).loss
        raise AssertionError(self.kind)


class _Checkpointed(nn.Module):
    """Recompute a block's activations in backward instead of storing them."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # use_reentrant=False: the supported mode, works with inputs that need no grad.
        return checkpoint(self.block, x, use_reentrant=False)


def _resnet(model: str, size: ModelSize, checkpointing: bool) -> nn.Module:
    import torchvision

    net = getattr(torchvision.models, model)(weights=None, num_classes=size.num_classes)
    if checkpointing:
        for name in ("layer1", "layer2", "layer3", "layer4"):
            layer = getattr(net, name)
            setattr(net, name, nn.Sequential(*(_Checkpointed(b) for b in layer)))
    return net


def _bert(size: ModelSize) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=size.vocab_size,
        hidden_size=size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        intermediate_size=4 * size.hidden,
        max_position_embeddings=max(512, size.seq_len),
        num_labels=size.num_classes,
        # No dropout: techniques are checked for numerical equivalence with the FP32 baseline.
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def _gpt2(size: ModelSize) -> nn.Module:
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
        loss_type="ForCausalLM",
    )
    return GPT2LMHeadModel(config)


def build_model(model: str, profile: str, *, checkpointing: bool = False) -> TrainModule:
    """A freshly initialised model (seed the RNG first for identical weights across cases)."""
    size = model_size(model, profile)
    match model:
        case "resnet18" | "resnet50":
            return TrainModule(_resnet(model, size, checkpointing), "image")
        case "bert":
            net, kind = _bert(size), "classify"
        case "gpt2":
            net, kind = _gpt2(size), "causal-lm"
        case _:
            raise ValueError(f"unknown model {model!r}")
    if checkpointing:
        kwargs = {"use_reentrant": False}
        # transformers 5 renamed the switch; older releases only have the first name.
        if hasattr(net, "activation_checkpointing_enable"):
            net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return TrainModule(net, kind)


def input_shape(model: str, profile: str, micro_batch: int) -> list[int]:
    """Shape of one micro-batch of inputs."""
    size = model_size(model, profile)
    if size.image_size:
        return [micro_batch, 3, size.image_size, size.image_size]
    return [micro_batch, size.seq_len]
