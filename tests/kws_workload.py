"""A workload of a family gpubench does not ship, defined only through the public API: a small
1-D convolutional keyword-spotting model on waveforms, with its own on-disk dataset (``.npy``
files it generates, read and augmented by its own Dataset) and its own split into stages."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from gpubench import DataRequest, Workload

SAMPLES, CLASSES = 256, 5


def conv_block(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv1d(cin, cout, 5, padding=2), nn.BatchNorm1d(cout), nn.ReLU(),
                         nn.MaxPool1d(2))


class KeywordNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(conv_block(1, 8), conv_block(8, 16), conv_block(16, 16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool1d(1), nn.Flatten(1), nn.Linear(16, CLASSES))

    def forward(self, wave):
        return self.head(self.blocks(wave))


def stages(model: KeywordNet, n: int) -> list[nn.Module]:
    units = [*model.blocks, model.head]
    if not 2 <= n <= len(units):
        raise ValueError(f"KeywordNet splits into 2..{len(units)} stages")
    sizes = [len(units) // n + (i < len(units) % n) for i in range(n)]
    out, start = [], 0
    for size in sizes:
        out.append(nn.Sequential(*units[start:start + size]))
        start += size
    return out


class WaveFiles(Dataset):
    """One ``.npy`` waveform per sample, generated once; reading adds random gain (augmentation)."""

    def __init__(self, request: DataRequest):
        self.folder = request.root / f"kws-{request.size}"
        done = self.folder / "labels.npy"
        if not done.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            rng = np.random.default_rng(request.seed)
            labels = rng.integers(0, CLASSES, request.size)
            for i, label in enumerate(labels):
                t = np.linspace(0, 1, SAMPLES, dtype=np.float32)
                wave = np.sin(2 * np.pi * (label + 1) * 4 * t) + rng.normal(0, 0.3, SAMPLES)
                np.save(self.folder / f"{i:05d}.npy", wave.astype(np.float32)[None])
            np.save(done, labels)
        self.labels = np.load(done)

    def __len__(self):
        return len(self.labels)

    def load(self, index):
        return np.load(self.folder / f"{index:05d}.npy"), int(self.labels[index])

    def finish(self, sample):
        wave, label = sample
        return torch.from_numpy(wave) * (0.8 + 0.4 * torch.rand(())), torch.tensor(label)

    def __getitem__(self, index):
        return self.finish(self.load(index))


def make_batch(n: int, g: torch.Generator):
    return torch.randn(n, 1, SAMPLES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def workload(profile: str = "smoke") -> Workload:
    return Workload(
        name="kws",
        build_model=KeywordNet,
        make_batch=make_batch,
        micro_batch=8,
        loss_fn=F.cross_entropy,
        dataset=WaveFiles,
        dataset_name="waves",
        stages=stages,
    )


class DictInputNet(nn.Module):
    """Takes a dict of inputs (ids and a mask) and computes its own loss."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.fc = nn.Linear(16, 3)

    def forward(self, inputs, targets):
        mask = inputs["mask"].unsqueeze(-1).float()
        pooled = (self.embed(inputs["ids"]) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return F.cross_entropy(self.fc(pooled), targets)


def dict_workload() -> Workload:
    def batch(n, g):
        ids = torch.randint(0, 50, (n, 12), generator=g)
        return {"ids": ids, "mask": torch.ones(n, 12, dtype=torch.long)}, torch.randint(
            0, 3, (n,), generator=g)

    return Workload(name="dictnet", build_model=DictInputNet, make_batch=batch, micro_batch=4)


def not_a_workload():
    return 42


def scalar_free():
    return Workload(name="vector-loss", build_model=lambda: nn.Linear(4, 2),
                    make_batch=lambda n, g: (torch.randn(n, 4, generator=g), None),
                    micro_batch=2, loss_fn=lambda out, _: out.sum(0))
