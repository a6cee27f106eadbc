import os

import pytest
import torch

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
"""How many pytest-xdist workers share the machine (1 without xdist)."""


@pytest.fixture(autouse=True)
def _threads():
    # Two cores: pin threads so that tests (and the workers running them side by side) do not
    # oversubscribe the machine.
    torch.set_num_threads(max(1, min(2, (os.cpu_count() or 2) // WORKERS)))
