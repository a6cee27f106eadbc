"""Where a ``gpubench dist`` rank is: torchrun's environment, Slurm's (a task of ``srun``), or
submitit's local executor, mapped to the variables torch's ``env://`` rendezvous reads.

torch reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` only; under ``srun`` they
are derived here from ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``, the
step's node list and tasks per node (the master is the first host of the expanded node list, the
port is derived from the job id unless ``MASTER_PORT`` is set). torchrun's variables take
precedence over Slurm's (a ``srun torchrun`` job: torchrun's agent set them for its ranks).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID")
LOCAL_VARS = ("SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_JOB_ID")

PORT_BASE, PORT_SPAN = 20000, 20000
"""The port derived from a job id: ``PORT_BASE + job_id % PORT_SPAN`` (20000-39999: above the
well-known ports, below Linux's default ephemeral range 32768-60999 for most of it)."""


class AllocationError(ValueError):
    """The job's environment does not describe a consistent allocation (one line)."""


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact host list expanded, in order: ``cn-d[003-004,006]`` is ``cn-d003,
    cn-d004, cn-d006``; hosts are separated by commas outside brackets (``a1,b[1-2]``); a host
    may carry several bracket groups (``r[1-2]n[01-02]``: every combination, the last group
    varying fastest); a range keeps its zero padding (``[08-11]``: 08, 09, 10, 11). A malformed
    list (an unclosed bracket, a reversed range, an empty part) is a ``ValueError`` naming it."""
    text = text.strip()
    if not text:
        raise ValueError("empty node list")
    hosts: list[str] = []
    for part in _split_outside_brackets(text, f"node list {text!r}"):
        if not part:
            raise ValueError(f"node list {text!r}: an empty host name")
        hosts.extend(_expand_host(part, text))
    return hosts


def _split_outside_brackets(text: str, what: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"{what}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{what}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{what}: '[' without ']'")
    parts.append(text[start:])
    return parts


def _expand_host(part: str, text: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", part)
    if m is None:
        return [part]
    head, tail = part[:m.start()], part[m.end():]
    rests = _expand_host(tail, text) if tail else [""]
    return [head + item + rest for item in _expand_range_list(m.group(1), text) for rest in rests]


def _expand_range_list(body: str, text: str) -> list[str]:
    items = []
    for piece in body.split(","):
        piece = piece.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", piece)
        if m is None:
            raise ValueError(f"node list {text!r}: {piece!r} is not a number or a range N-M")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"node list {text!r}: reversed range {piece!r}")
        width = len(lo) if lo.startswith("0") else 0
        items.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return items


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node list expanded: ``2(x3),1`` is ``[2, 2, 2, 1]``."""
    counts = []
    for piece in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", piece)
        if m is None:
            raise ValueError(f"tasks per node {text!r}: {piece!r} is not N or N(xM)")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def derived_port(job_id: str) -> int:
    digits = re.sub(r"\D", "", job_id) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


@dataclass
class JobPlace:
    """This process's place in its job, and where the job came from (for the record)."""

    launcher: str
    """``torchrun``, ``slurm`` (a task of ``srun``) or ``local`` (submitit's local executor)."""
    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None
    nodes: int = 1
    node_list: list[str] = field(default_factory=list)
    tasks_per_node: list[int] = field(default_factory=list)
    gpus_per_node: int | None = None

    def environ(self) -> dict[str, str]:
        """The torchrun variables of this place (what torch's ``env://`` and ``dist`` read)."""
        env = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world),
               "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.local_world)}
        if self.master_addr is not None:
            env["MASTER_ADDR"] = self.master_addr
        if self.master_port is not None:
            env["MASTER_PORT"] = str(self.master_port)
        return env

    def record(self) -> dict:
        """The record's fields naming where it ran (``gpubench.analysis.schema``)."""
        return {"launcher": self.launcher, "job_id": self.job_id, "nodes": self.nodes,
                "node_list": ",".join(self.node_list) or None,
                "tasks_per_node": self.local_world, "gpus_per_node": self.gpus_per_node}


def _int(env, var: str, default: str | None = None) -> int:
    text = env.get(var, default)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise AllocationError(f"{var} must be an integer; got {text!r}") from None


def _gpus_on_node(env) -> int | None:
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        text = env.get(var)
        if text:
            m = re.search(r"(\d+)\s*$", text)  # "4" or "h200:4"
            if m:
                return int(m.group(1))
    return None


def job_place(env=None) -> JobPlace | None:
    """Where this process is: torchrun's variables first (they win over Slurm's), else
    submitit's local executor's (its own), else a Slurm task's; None outside any of them. An
    inconsistent allocation is an ``AllocationError`` (one line naming the variable)."""
    env = os.environ if env is None else env
    slurm = all(v in env for v in SLURM_VARS)
    if all(v in env for v in TORCHRUN_VARS):
        place = JobPlace("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
                         _int(env, "LOCAL_RANK"),
                         _int(env, "LOCAL_WORLD_SIZE", env.get("WORLD_SIZE")))
        # torchrun's agents: one per node (its GROUP_WORLD_SIZE), their ranks LOCAL_WORLD_SIZE.
        per_node = max(1, place.local_world)  # a bad value is named by the command, not divided by
        place.nodes = _int(env, "GROUP_WORLD_SIZE", str(max(1, place.world // per_node)))
        if slurm:  # srun torchrun: the job's facts are Slurm's
            place.job_id = env["SLURM_JOB_ID"]
            _slurm_facts(place, env)
        elif "SUBMITIT_LOCAL_JOB_ID" in env:
            place.job_id = env["SUBMITIT_LOCAL_JOB_ID"]
        place.gpus_per_node = _gpus_on_node(env)
        return place
    if all(v in env for v in LOCAL_VARS):
        world = _int(env, "SUBMITIT_LOCAL_NTASKS")
        rank = _int(env, "SUBMITIT_LOCAL_GLOBALID")
        job_id = env["SUBMITIT_LOCAL_JOB_ID"]
        place = JobPlace("local", rank, world, _int(env, "SUBMITIT_LOCAL_LOCALID", str(rank)),
                         world, env.get("MASTER_ADDR", "127.0.0.1"),
                         _int(env, "MASTER_PORT", str(derived_port(job_id))), job_id, 1,
                         [os.uname().nodename], [world], None)
        _check_ranks(place)
        return place
    if slurm:
        return _slurm_place(env)
    return None


def _slurm_facts(place: JobPlace, env) -> None:
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise AllocationError("SLURM_JOB_NODELIST is not set")
    try:
        place.node_list = expand_hostlist(nodelist)
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        place.tasks_per_node = (expand_tasks_per_node(per_node) if per_node
                                else [place.local_world])
    except ValueError as err:
        raise AllocationError(str(err)) from None
    place.nodes = len(place.node_list)


def _slurm_place(env) -> JobPlace:
    step = "SLURM_STEP_NUM_TASKS" in env
    world = _int(env, "SLURM_STEP_NUM_TASKS" if step else "SLURM_NTASKS")
    node = _int(env, "SLURM_NODEID")
    place = JobPlace("slurm", _int(env, "SLURM_PROCID"), world, _int(env, "SLURM_LOCALID"), 0,
                     job_id=env["SLURM_JOB_ID"])
    _slurm_facts(place, env)
    counts = place.tasks_per_node
    if len(counts) != place.nodes:
        raise AllocationError(f"the node list names {place.nodes} nodes "
                              f"({','.join(place.node_list)}) but tasks per node lists "
                              f"{len(counts)} ({counts})")
    if sum(counts) != world:
        raise AllocationError(f"SLURM_NTASKS is {world} but the tasks per node add up to "
                              f"{sum(counts)} ({counts})")
    if not 0 <= node < place.nodes:
        raise AllocationError(f"SLURM_NODEID must be in 0..{place.nodes - 1}; got {node}")
    place.local_world = counts[node]
    place.gpus_per_node = _gpus_on_node(env)
    if place.gpus_per_node is not None and place.local_world > place.gpus_per_node:
        raise AllocationError(f"{place.local_world} tasks on node {place.node_list[node]} but "
                              f"{place.gpus_per_node} GPUs (one task per GPU: srun "
                              "--ntasks-per-node equal to --gpus-per-node)")
    place.master_addr = env.get("MASTER_ADDR") or place.node_list[0]
    place.master_port = _int(env, "MASTER_PORT", str(derived_port(place.job_id)))
    _check_ranks(place)
    return place


def _check_ranks(place: JobPlace) -> None:
    if place.world < 1:
        raise AllocationError(f"the job has {place.world} tasks")
    if not 0 <= place.rank < place.world:
        raise AllocationError(f"task rank {place.rank} is not in 0..{place.world - 1}")
    if not 0 <= place.local_rank < place.local_world:
        raise AllocationError(f"local rank {place.local_rank} is not in "
                              f"0..{place.local_world - 1} ({place.local_world} tasks here)")


def interconnect_facts(device: str) -> dict:
    """What this process can read about the network between ranks: the NCCL version (CUDA),
    the InfiniBand devices (``/sys/class/infiniband``), and the NCCL and Gloo variables that
    choose the network (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ...) where set."""
    facts: dict = {"nccl_version": None, "ib_devices": sorted(_listdir("/sys/class/infiniband"))}
    if device == "cuda":
        import torch

        try:
            v = torch.cuda.nccl.version()
            facts["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except (RuntimeError, AttributeError):
            pass
    net = {k: v for k, v in os.environ.items()
           if k in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_NET", "NCCL_IB_DISABLE",
                    "NCCL_P2P_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "GLOO_SOCKET_IFNAME")}
    facts["net_env"] = ",".join(f"{k}={v}" for k, v in sorted(net.items())) or None
    return facts


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
