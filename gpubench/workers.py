"""Worker processes for multi-process cases: one per rank, driven by commands over pipes.

The parent hosts the rendezvous store on a port the OS picks (``TCPStore`` on port 0), so two
suites started at once never collide. A rank that raises reports its traceback and the whole
group fails at once; a rank that does not answer within the timeout fails the group too. Either
way, and on normal exit, no worker process outlives the group.
"""

from __future__ import annotations

import datetime
import multiprocessing.connection as mpc
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a command may take on every rank before the group is declared hung."""

START_TIMEOUT_S = 180.0
"""Seconds for workers to start (import torch, build the model, join the process group)."""


class WorkerError(RuntimeError):
    """A rank failed; the message carries its traceback."""


class WorkerTimeout(WorkerError):
    """A rank did not answer in time."""


def _worker_main(rank: int, world_size: int, port: int, backend: str,
                 factory: Callable[..., Any], args: tuple, conn, timeout_s: float) -> None:
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        handler = factory(rank, world_size, *args)
        conn.send(("ok", None))
        while True:
            command, payload = conn.recv()
            if command == "stop":
                break
            conn.send(("ok", getattr(handler, command)(*payload)))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        try:
            conn.send(("error", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass
        os._exit(1)  # skip teardown that could block on peers that are gone


class WorkerGroup:
    """``world_size`` processes, each running ``factory(rank, world_size, *args)``, the object
    whose methods ``call`` invokes on every rank."""

    def __init__(self, world_size: int, factory: Callable[..., Any], args: tuple = (), *,
                 backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S,
                 start_timeout_s: float = START_TIMEOUT_S):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer; got {world_size!r}")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=timeout_s))
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        try:
            for rank in range(world_size):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker_main,
                    args=(rank, world_size, self.store.port, backend, factory, args, child,
                          timeout_s),
                    name=f"gpubench-rank{rank}",
                )
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            self._collect("start", start_timeout_s)
        except BaseException:
            self.close()
            raise

    def call(self, command: str, *payload: Any, timeout_s: float | None = None) -> list[Any]:
        """Run ``command`` on every rank; return the results in rank order."""
        for conn in self.conns:
            conn.send((command, payload))
        return self._collect(command, self.timeout_s if timeout_s is None else timeout_s)

    def _collect(self, command: str, timeout_s: float) -> list[Any]:
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        pending = dict(enumerate(self.conns))
        while pending:
            remaining = deadline - time.monotonic()
            ready = mpc.wait(list(pending.values()), timeout=max(0.0, remaining))
            if not ready:
                self.close(graceful=False)
                raise WorkerTimeout(
                    f"rank(s) {', '.join(map(str, sorted(pending)))} did not finish "
                    f"{command!r} within {timeout_s:g} s (hung?); all workers stopped"
                )
            for rank, conn in list(pending.items()):
                if conn not in ready:
                    continue
                try:
                    status, value = conn.recv()
                except EOFError:
                    code = self.procs[rank].exitcode
                    self.close(graceful=False)
                    raise WorkerError(
                        f"rank {rank} exited (code {code}) during {command!r} without a report"
                    ) from None
                if status == "error":
                    self.close(graceful=False)
                    raise WorkerError(f"rank {rank} failed during {command!r}:\n{value}")
                results[rank] = value
                del pending[rank]
        return [results[r] for r in range(self.world_size)]

    def close(self, graceful: bool = True) -> None:
        """Stop every worker: ask politely (``graceful``), then terminate, then kill."""
        for conn, proc in zip(self.conns, self.procs, strict=False):
            if graceful and proc.is_alive():
                try:
                    conn.send(("stop", ()))
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + (5 if graceful else 0)
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]
