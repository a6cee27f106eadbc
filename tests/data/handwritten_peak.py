"""A hand-written training loop of resnet18 at the cpu profile's shape (micro-batch 8, 32 x 32
images, 10 classes, SGD with momentum), measured as gpubench measures a CPU case: the resident
size before the model is built, then the resident high-water mark (VmHWM, reset after the
first step) above it over the next steps. Prints the figure in bytes."""

import ctypes
import gc
from pathlib import Path

import torch
import torchvision

torch.set_num_threads(1)


def status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)
base = status("VmRSS")
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None, num_classes=10).train()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
inputs, targets = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))


def step() -> None:
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()


step()
Path("/proc/self/clear_refs").write_text("5")
for _ in range(5):
    step()
print(status("VmHWM") - base)
