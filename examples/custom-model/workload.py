"""A custom workload for gpubench: a small Vision Transformer on shape images it generates.

    gpubench run --model examples/custom-model/workload.py:workload

Everything gpubench needs is in the ``Workload`` returned by ``workload()``: how to build the
model (random weights), a batch of inputs and targets, the loss, the real data path (PNG files
decoded with PIL and augmented) and a split into stages for model and pipeline parallelism.
"""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import Dataset

from gpubench import DataRequest, Workload

SIZES = {  # per gpubench profile: (image side, width, depth, micro-batch)
    "smoke": (32, 32, 2, 8),
    "cpu": (32, 64, 4, 16),
    "gpu-small": (96, 256, 6, 64),
    "gpu-full": (224, 384, 12, 128),
}
CLASSES = ("circle", "square", "triangle")
PATCH = 8


class PatchEmbed(nn.Module):
    def __init__(self, side: int, width: int):
        super().__init__()
        self.proj = nn.Conv2d(3, width, PATCH, stride=PATCH)
        self.pos = nn.Parameter(torch.randn(1, (side // PATCH) ** 2, width) * 0.02)

    def forward(self, images):
        return self.proj(images).flatten(2).transpose(1, 2) + self.pos


class Block(nn.Module):
    def __init__(self, width: int, heads: int = 4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, len(CLASSES))

    def forward(self, x):
        return self.fc(self.norm(x).mean(1))


class TinyViT(nn.Module):
    def __init__(self, side: int, width: int, depth: int):
        super().__init__()
        self.embed = PatchEmbed(side, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = Head(width)

    def forward(self, images):
        return self.head(self.blocks(self.embed(images)))


def stages(model: TinyViT, n: int) -> list[nn.Module]:
    """Embedding + the first blocks, ..., the last blocks + head."""
    units = [model.embed, *model.blocks, model.head]
    if not 2 <= n <= len(units):
        raise ValueError(f"TinyViT splits into 2..{len(units)} stages")
    sizes = [len(units) // n + (i < len(units) % n) for i in range(n)]
    starts = np.cumsum([0, *sizes])
    return [nn.Sequential(*units[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]


def draw(rng: np.random.Generator, side: int) -> tuple[Image.Image, int]:
    """A shape on a noisy background: the label is the shape."""
    label = int(rng.integers(len(CLASSES)))
    image = Image.fromarray(rng.integers(0, 80, (side, side, 3), dtype=np.uint8))
    pen = ImageDraw.Draw(image)
    r = rng.uniform(0.2, 0.4) * side
    cx, cy = rng.uniform(r, side - r, 2)
    colour = tuple(int(c) for c in rng.integers(120, 256, 3))
    if CLASSES[label] == "circle":
        pen.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif CLASSES[label] == "square":
        pen.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
    else:
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    return image, label


class ShapeFiles(Dataset):
    """PNG files on disk, decoded with PIL and augmented (random flip and crop-and-resize).
    ``load`` is the decode (what gpubench's cached cases keep), ``finish`` the augmentation."""

    def __init__(self, request: DataRequest, side: int):
        folder = request.root / f"tinyvit-shapes-{side}px-{request.size}"
        labels_file = folder / "labels.json"
        if not labels_file.exists():  # generate once, then reuse
            folder.mkdir(parents=True, exist_ok=True)
            rng = np.random.default_rng(request.seed)
            labels = {}
            for i in range(request.size):
                image, labels[f"{i:05d}.png"] = draw(rng, 2 * side)
                image.save(folder / f"{i:05d}.png")
            labels_file.write_text(json.dumps(labels))  # written last: the set is complete
        self.folder, self.side = folder, side
        self.labels = json.loads(labels_file.read_text())
        self.names = sorted(self.labels)

    def __len__(self):
        return len(self.names)

    def load(self, index):
        with Image.open(self.folder / self.names[index]) as image:
            pixels = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
        return pixels, self.labels[self.names[index]]

    def finish(self, sample):
        pixels, label = sample
        x = pixels.float().div(255)
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        x = F.interpolate(x[None], size=(self.side, self.side), mode="bilinear")[0]
        return (x - 0.5) / 0.25, torch.tensor(label)

    def __getitem__(self, index):
        return self.finish(self.load(index))


def workload(profile: str = "cpu") -> Workload:
    side, width, depth, batch = SIZES[profile]

    def make_batch(n: int, g: torch.Generator):
        return torch.randn(n, 3, side, side, generator=g), torch.randint(0, 3, (n,), generator=g)

    return Workload(
        name="tinyvit",
        build_model=lambda: TinyViT(side, width, depth),
        make_batch=make_batch,
        micro_batch=batch,
        loss_fn=F.cross_entropy,
        dataset=lambda request: ShapeFiles(request, side),
        dataset_name="shapes-png",
        stages=stages,
    )
