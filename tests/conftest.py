import pytest
import torch


@pytest.fixture(autouse=True)
def _threads():
    # Two cores: pin threads so tests do not oversubscribe the machine.
    torch.set_num_threads(2)
