"""``gpubench dist``: DDP/FSDP/pipeline cases as a rank of a torchrun job or a task of a Slurm
``srun``, on one machine or several.

    torchrun --nproc-per-node 2 -m gpubench dist --model resnet18 --out results/ddp2.json
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-endpoint HOST:29500 \\
        -m gpubench dist --model bert --device cuda --profile gpu-full --out ddp16.json
    srun --nodes 2 --ntasks-per-node 8 --gpus-per-node 8 gpubench dist --model bert \\
        --device cuda --parallel ddp fsdp --out ddp-fsdp16.json

Every rank builds its shard of each case; rounds end when the slowest rank has finished; rank 0
writes the records as pytest-benchmark JSON after each case (load, chart and compare it like any
other result). Several cases (``--parallel ddp fsdp pipeline``, ``--group parallel``) run one
after another in the same process group: the rendezvous is paid once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from gpubench.cli.options import add_target_arguments, resolve_target
from gpubench.train.config import (
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    SCHEDULES,
    RunConfig,
)
from gpubench.util.argtypes import non_negative_int, positive, positive_int

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")

DEFAULT_TIMEOUT_S = 300.0
"""``--timeout``'s default, that of ``gpubench run`` (``gpubench.launchers.workers``, not imported
here: the command line's --help stays fast)."""

STUCK_GRACE_S = 5.0
"""Seconds (at most ``--timeout`` again) past ``--timeout`` before a rank stuck joining (in C
code, where torch's own timeout does not reach: a store that never answers) is ended with the
reason."""


def add_dist_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p, model=True)
    p.add_argument("--parallel", default=["ddp"], nargs="+", choices=("ddp", "fsdp", "pipeline"),
                   help="one case per mode given, one after another in the same job "
                   "(default: ddp)")
    p.add_argument("--group", choices=("parallel",), default=None,
                   help="instead: the parallel group's multi-process cases at this job's world "
                   "size (DDP with accumulation, no_sync and bf16, FSDP, pipeline), from the "
                   "FP32 baseline of --model, --profile and --device")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--accum-steps", type=positive_int, default=1)
    p.add_argument("--micro-batch", type=positive_int, default=None)
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    p.add_argument("--optimizer-impl", default="default", choices=OPTIMIZER_IMPLS)
    p.add_argument("--no-sync", action="store_true", help="DDP: no_sync while accumulating")
    p.add_argument("--fsdp-mixed-precision", action="store_true",
                   help="FSDP: its MixedPrecisionPolicy (bf16 compute, fp32 reduction)")
    p.add_argument("--chunks", type=positive_int, default=1,
                   help="pipeline micro-batches per batch")
    p.add_argument("--schedule", default="gpipe", choices=SCHEDULES)
    p.add_argument("--rounds", type=positive_int, default=10)
    p.add_argument("--warmup", type=non_negative_int, default=2)
    p.add_argument("--timeout", type=positive, default=DEFAULT_TIMEOUT_S,
                   help="seconds a rank waits for the others: to join the rendezvous "
                   "(MASTER_ADDR:MASTER_PORT) and the process group, and in each command's "
                   f"collectives (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--out", required=True, help="pytest-benchmark JSON written by rank 0 (after "
                   "each case: an interrupted job keeps the cases it finished)")


def torchrun_env() -> tuple[int, int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) from torchrun's environment; a value
    that is not an integer or out of range is a one-line ``ValueError`` naming the variable
    (before the process group, which would wait for a rank that never comes)."""
    def read(var: str, default: str | None = None) -> int:
        text = os.environ.get(var, default)
        try:
            return int(text)
        except (TypeError, ValueError):
            raise ValueError(f"{var} must be an integer; got {text!r}") from None

    world = read("WORLD_SIZE")
    if world < 1:
        raise ValueError(f"WORLD_SIZE must be >= 1; got {os.environ['WORLD_SIZE']!r}")
    rank = read("RANK")
    if not 0 <= rank < world:
        raise ValueError(f"RANK must be in 0..{world - 1} (WORLD_SIZE {world}); "
                         f"got {os.environ['RANK']!r}")
    local_world = read("LOCAL_WORLD_SIZE", str(world))
    if not 1 <= local_world <= world:
        raise ValueError(f"LOCAL_WORLD_SIZE must be in 1..{world} (WORLD_SIZE {world}); "
                         f"got {os.environ['LOCAL_WORLD_SIZE']!r}")
    local_rank = read("LOCAL_RANK")
    if not 0 <= local_rank < local_world:
        raise ValueError(f"LOCAL_RANK must be in 0..{local_world - 1} (LOCAL_WORLD_SIZE "
                         f"{local_world}); got {os.environ['LOCAL_RANK']!r}")
    return rank, world, local_rank, local_world


def dist_main(args: argparse.Namespace) -> int:
    import torch  # heavy imports here: the command line's --help stays fast
    import torch.distributed as dist

    from gpubench.launchers.distributed import LocalRanks, backend_for
    from gpubench.launchers.slurm import AllocationError, interconnect_facts, job_place
    from gpubench.measure.machine import machine_info
    from gpubench.measure.protocol import CaseProgram
    from gpubench.measure.runner import run_case
    from gpubench.measure.standalone import StandaloneBenchmark, write_benchmark_json
    from gpubench.train.build import unsupported_reason
    from gpubench.util.progress import with_progress

    try:
        place = job_place()
    except AllocationError as err:
        print(f"gpubench dist: {err}", file=sys.stderr)
        return 2
    if place is None:
        missing = [v for v in TORCHRUN_ENV if v not in os.environ]
        print(f"gpubench dist: run under torchrun or srun (missing {', '.join(missing)}), e.g.\n"
              "  torchrun --nproc-per-node 2 -m gpubench dist --model resnet18 --out ddp.json\n"
              "  srun --ntasks 2 gpubench dist --model resnet18 --out ddp.json", file=sys.stderr)
        return 2
    os.environ.update(place.environ())  # torch's env:// reads these
    rank, world, local_rank, local_world = torchrun_env()
    from gpubench.util.paths import check_output

    check_output("--out", args.out, is_file=True)  # rank 0 writes it, after every case
    device, profile = resolve_target(args.device, args.profile)
    # Every argument is checked before the process group: a bad one is one line and exit 2 on
    # each rank, not a hang at the rendezvous or a traceback per rank.
    try:
        cfgs = dist_cases(args, profile, device, world)
        reasons = [unsupported_reason(cfg, check_devices=False) for cfg in cfgs]
        # The device count is per node here (a job spans machines): each rank needs its GPU.
        reason = next((r for r in reasons if r), None)
        if reason is None and device == "cuda" and local_world > torch.cuda.device_count():
            reason = (f"{local_world} ranks on this node need {local_world} CUDA devices; "
                      f"it has {torch.cuda.device_count()}")
    except ValueError as err:
        reason = str(err)
    if reason:
        print(f"gpubench dist: {' '.join(reason.split())}", file=sys.stderr)
        return 2
    try:
        join_process_group(backend_for(device), rank, world, args.timeout,
                           local_rank if device == "cuda" else None)
    except RendezvousError as err:
        print(f"gpubench dist: {err}", file=sys.stderr)
        return 1
    where = {**place.record(), **interconnect_facts(device)}
    machine = machine_info(device) if rank == 0 else None
    commit = commit_info() if rank == 0 else None
    done: list = []
    try:
        for cfg in cfgs:
            program = CaseProgram(rank, world, cfg, local_rank, local_world)
            try:
                bench = StandaloneBenchmark(f"{place.launcher}[{cfg.id}]",
                                            f"{cfg.name}-{profile}-{device}")
                bench.extra_info["group"] = "parallel"
                bench.extra_info.update(where)
                shown = with_progress(bench, cfg.id) if rank == 0 else bench  # stderr a tty
                run_case(shown, cfg, rounds=args.rounds, warmup_rounds=args.warmup,
                         group=LocalRanks(program))
            finally:
                program.close()
            done.append(bench)
            if rank == 0:
                write_benchmark_json(args.out, done, machine, commit)
                print(f"gpubench dist: {cfg.id}: median step "
                      f"{bench.extra_info['step_time_s']:.4f} s, "
                      f"{bench.extra_info['samples_per_s']:.1f} samples/s; wrote {args.out}",
                      flush=True)
    finally:
        dist.destroy_process_group()
    return 0


def dist_cases(args: argparse.Namespace, profile: str, device: str, world: int) -> list:
    """The cases of one ``gpubench dist`` job, validated (``ValueError`` names a bad one)."""
    if args.group == "parallel":
        from gpubench.suite.cases import baseline, parallel_cases

        cases = [c for c in parallel_cases(baseline(args.model, profile, device))
                 if c.multiprocess and c.world_size == world]
        if not cases:
            raise ValueError(f"the parallel group has no multi-process case at world size "
                             f"{world} on {device}")
        return cases
    return [RunConfig(
        model=args.model, profile=profile, device=device, precision=args.precision,
        accum_steps=args.accum_steps, micro_batch=args.micro_batch,
        optimizer=args.optimizer, optimizer_impl=args.optimizer_impl,
        parallel=mode, world_size=world, ddp_no_sync=args.no_sync,
        chunks=args.chunks, schedule=args.schedule,
        fsdp_mixed_precision=args.fsdp_mixed_precision,
    ) for mode in dict.fromkeys(args.parallel)]


def commit_info() -> dict:
    """The record's ``commit_info``, as pytest-benchmark writes it for ``gpubench run`` (the
    git commit of the current folder, its branch and whether it has changes)."""
    from pytest_benchmark.utils import get_commit_info

    try:
        return get_commit_info()
    except Exception as err:  # noqa: BLE001 - pytest-benchmark records the error the same way
        return {"error": f"{type(err).__name__}: {err}"}


class RendezvousError(RuntimeError):
    """A rank could not join its job; the message is one line naming the address."""


def _rendezvous_address() -> str:
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def _probe(timeout_s: float) -> str:
    """Why the rendezvous address did not answer, as far as a plain connection tells."""
    import socket

    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    try:
        with socket.create_connection((host, int(port)), timeout=min(2.0, timeout_s)):
            return ("something there accepted the connection but never answered as the job's "
                    "store (another service on MASTER_PORT?)")
    except (OSError, ValueError) as err:
        why = getattr(err, "strerror", None) or str(err)
        return (f"nothing listens there ({why}): is rank 0 running, and are MASTER_ADDR and "
                "MASTER_PORT (torchrun's --rdzv-endpoint / --master-port) right?")


@contextlib.contextmanager
def _held_stderr():
    """What this process writes to stderr meanwhile is held back (c10d logs every connection
    retry with a C++ stack): written out after all if the block succeeds, dropped if it fails
    (its failure is reported in one line instead). ``GPUBENCH_DEBUG=1`` shows it as it comes."""
    if os.environ.get("GPUBENCH_DEBUG"):
        yield
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
            held.seek(0)  # reached only when the block succeeded
            text = held.read()
            if text:
                os.write(2, text)
    finally:
        os.close(saved)


def join_process_group(backend: str, rank: int, world: int, timeout_s: float,
                       cuda_rank: int | None = None) -> None:
    """``init_process_group`` of a torchrun rank, with every wait bounded by ``timeout_s``:
    the rendezvous (torch's ``env://``: a ``TCPStore`` at MASTER_ADDR:MASTER_PORT, hosted by
    rank 0 or torchrun's agent) first, then the process group on it, whose collectives get the
    same timeout. Any failure is a one-line ``RendezvousError`` naming the address. torch's
    store timeout bounds the connection attempts (nobody listening), not a reply that never
    comes (a port owned by another service: the store's validation waits on its socket in C
    code, out of reach of any exception): past ``timeout_s`` plus ``STUCK_GRACE_S`` this
    process is ended with the reason (exit status 1). ``cuda_rank``: this rank's GPU, set
    first (NCCL binds its communicator to it, and nothing of this rank lands on GPU 0).
    torch's C++ log lines are held back meanwhile (``_held_stderr``)."""
    import datetime

    import torch
    import torch.distributed as dist

    from gpubench.util.watchdog import exit_after

    timeout = datetime.timedelta(seconds=timeout_s)
    where = _rendezvous_address()
    give_up_s = timeout_s + min(STUCK_GRACE_S, timeout_s)

    def stuck(stage: str) -> str:
        return (f"gpubench dist: rank {rank} could not {stage} at {where} within "
                f"{timeout_s:g} s: {_probe(timeout_s)}")

    with exit_after(give_up_s, lambda: stuck("join the rendezvous"), code=1), _held_stderr():
        try:
            store, rank, world = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        except (RuntimeError, ValueError, OSError) as err:  # DistNetworkError, DistStoreError
            last = (str(err).strip().splitlines() or [type(err).__name__])[-1]
            if "timed out" in last.lower() or "timeout" in last.lower():
                raise RendezvousError(stuck("join the rendezvous")[len("gpubench dist: "):]
                                      ) from None
            raise RendezvousError(f"rank {rank} could not join the rendezvous at {where}: "
                                  f"{last}") from None
    store.set_timeout(timeout)
    kwargs = {}
    if cuda_rank is not None:
        torch.cuda.set_device(cuda_rank)
        kwargs["device_id"] = torch.device("cuda", cuda_rank)
    with exit_after(give_up_s, lambda: stuck("form the process group with the other ranks"),
                    code=1), _held_stderr():
        try:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                    timeout=timeout, **kwargs)
        except (RuntimeError, ValueError, OSError) as err:
            last = (str(err).strip().splitlines() or [type(err).__name__])[-1]
            raise RendezvousError(f"rank {rank} joined the rendezvous at {where} but the "
                                  f"process group did not form within {timeout_s:g} s: "
                                  f"{last}") from None
