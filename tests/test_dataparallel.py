"""DataParallel's replica threads: FLOPs and saved activations counted, autocast dtype kept.

``nn.DataParallel`` runs each replica's forward in a ``threading.Thread`` (``parallel_apply``).
``FlopCounterMode``, ``saved_tensors_hooks`` and autocast are thread-local, so a counter entered
in the calling thread does not see the replica forwards, and the replica threads lose the
autocast dtype. These tests show both on the CPU with real threads (the DataParallel cases
themselves need CUDA devices), and that gpubench's fixes hold.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from gpubench.measure.flops import count_flops_detailed
from gpubench.measure.memory import SavedActivations
from gpubench.measure.protocol import CaseProgram
from gpubench.train.config import RunConfig
from gpubench.train.parallel import ReplicaUnderAutocast, autocast_state


def _in_thread(fn, *args):
    """``fn(*args)`` in a new thread, as ``parallel_apply`` runs a replica."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn(*args)))
    thread.start()
    thread.join()
    return out["value"]


def test_counters_do_not_see_a_forward_in_another_thread():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    x = torch.randn(16, 32)
    with SavedActivations(net) as here:
        same_thread = count_flops_detailed(lambda: net(x)).total
    with SavedActivations(net) as there:
        other_thread = count_flops_detailed(lambda: _in_thread(net, x)).total
    assert same_thread == 2 * 16 * (32 * 64 + 64 * 8)
    assert other_thread == 0  # the problem: the thread's forward is invisible
    assert here.per_micro_batch_bytes > 0 and there.per_micro_batch_bytes == 0


def _threaded_dataparallel(program: CaseProgram) -> None:
    """Make the case's DataParallel run its replica forward in a thread, as it does with
    several GPUs (on the CPU, without devices, ``nn.DataParallel`` calls the module directly)."""
    dp = program.case.model.dp
    dp.forward = lambda *args: _in_thread(dp.module, *args)


def test_dataparallel_is_counted_like_the_single_device_step():
    dp_cfg = RunConfig(model="resnet18", profile="smoke", device="cpu", parallel="dp",
                       world_size=2)
    single_cfg = RunConfig(model="resnet18", profile="smoke", device="cpu",
                           micro_batch=dp_cfg.resolved_micro_batch)
    single = CaseProgram(0, 1, single_cfg)
    dp = CaseProgram(0, 1, dp_cfg)
    try:
        _threaded_dataparallel(dp)
        expected = single.count()
        # The problem: counted through the wrapper, the replica thread's forward is missed
        # (the backward, about 2/3 of the FLOPs, runs in autograd's threads, which inherit the
        # counter), and so are all its saved activations.
        with SavedActivations(dp.case.model) as saved:
            naive = count_flops_detailed(dp.case.step).total
        assert naive < 0.7 * expected["flops"]
        assert saved.per_micro_batch_bytes < 0.1 * expected["activation_bytes"]
        # The fix: CaseProgram.count counts the unwrapped model in this thread.
        counted = dp.count()
        assert counted["flops"] == expected["flops"] > 0
        assert counted["activation_bytes"] == expected["activation_bytes"] > 0
        dp.step()  # the case still trains through its threaded wrapper afterwards
    finally:
        single.close()
        dp.close()


def test_replica_threads_keep_the_callers_autocast_dtype():
    # CPU autocast defaults to bfloat16 (CUDA's to float16): run the caller in float16, the
    # dtype that is not the default, so that a thread falling back to the default shows.
    a, b = torch.ones(4, 4), torch.ones(4, 4)

    def replica(x, y):
        return (x @ y).dtype

    def like_parallel_apply(fn, *args):
        # What torch's parallel_apply does in each replica thread: it re-enters autocast with
        # the caller's enabled flag only.
        with torch.amp.autocast("cpu", enabled=True):
            return fn(*args)

    with torch.autocast("cpu", dtype=torch.float16):
        assert replica(a, b) == torch.float16
        state = autocast_state("cpu")
        assert state[:2] == (True, torch.float16)
        assert _in_thread(like_parallel_apply, replica, a, b) == torch.bfloat16  # the problem
        fixed = ReplicaUnderAutocast(replica, "cpu", state)
        assert _in_thread(like_parallel_apply, fixed, a, b) == torch.float16
    off = ReplicaUnderAutocast(replica, "cpu", autocast_state("cpu"))  # fp32 cases: untouched
    assert _in_thread(off, a, b) == torch.float32
