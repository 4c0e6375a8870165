"""One rank of a gang: a step that runs as N nodes × R ranks training data-parallel.

Workload side only (imports torch, never Dagster). Each engine starts the ranks the way its
users do and this module reads whichever variables it set:

- `torchrun` (local pools, and under `srun`): `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
  `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`;
- `srun` alone (Slurm): `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`,
  with `MASTER_ADDR`/`MASTER_PORT` exported by the batch script;
- Ray and Kubernetes launchers set the torchrun names.

A workload does not use this module itself: `WorkloadRun` joins the gang when it starts in
one (`WorkloadRun.gang`), and the training loop asks it for its share of each global batch
(`shard`) and wraps its model (`wrap`). Rank 0 is the gang's voice: only it talks to Dagster
Pipes. Every step the ranks agree, in one small collective, on what the step ends with
(checkpoint now? SIGTERM seen by any rank?) and rank 0 learns each rank's busy time: its step
time less the time it spent waiting for its peers inside the gradient all-reduce, which is
what tells the one slow rank from the peers that wait for it.
"""

from __future__ import annotations

import datetime as dt
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workload_runtime.node_env import node_env

# How long a collective waits for a missing peer before it fails. A dead rank's peers fail
# after this long if the launcher has not stopped them first (every launcher here stops the
# whole gang when one rank ends; this is the last line).
COLLECTIVE_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class GangMember:
    """Where this process stands in its gang."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    node: str  # this node's name, as its engine knows it (hostname, Slurm node, Ray node id)

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def leader(self) -> bool:
        return self.rank == 0


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "")
        if value.strip():
            return int(value.split("(")[0].split(",")[0])
    return None


def member_from_env(env: Mapping[str, str] | None = None) -> GangMember | None:
    """This process's place in its gang, or None when it runs alone (one rank in all).

    `srun` tasks count: a Slurm batch step with one task is not a gang."""
    env = node_env().gang if env is None else env
    world = _int(env, "WORLD_SIZE", "SLURM_NTASKS") or 1
    if world <= 1:
        return None
    rank = _int(env, "RANK", "SLURM_PROCID")
    if rank is None:
        raise RuntimeError(f"this process is one of {world} ranks but its rank is not set: set RANK (torchrun does) or run it under srun")
    local_world = _int(env, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE") or 1
    master = env.get("MASTER_ADDR", "")
    port = _int(env, "MASTER_PORT")
    if not master or port is None:
        raise RuntimeError(
            f"rank {rank} of {world}: MASTER_ADDR and MASTER_PORT are not set, so the ranks cannot meet. "
            "The platform's launchers set them; by hand, use `torchrun` or export them before `srun`."
        )
    return GangMember(
        rank=rank,
        world_size=world,
        local_rank=_int(env, "LOCAL_RANK", "SLURM_LOCALID") or 0,
        local_world_size=local_world,
        node_rank=_int(env, "GROUP_RANK", "NODE_RANK", "SLURM_NODEID") or 0,
        master_addr=master,
        master_port=port,
        node=env.get("SINEWGRID_NODE") or env.get("SLURMD_NODENAME") or socket.gethostname(),
    )


@dataclass
class StepAgreement:
    """What every rank of the gang agreed at the end of a step."""

    preempt: bool  # some rank got SIGTERM: all checkpoint this step and exit 75
    checkpoint_due: bool  # rank 0's clock says a time-based checkpoint is due
    busy_seconds: list[float]  # each rank's busy time in this step, by rank


class _AllReduceTimer:
    """The state of `_timed_allreduce`: when this step's first bucket was handed over, and when
    the last came back reduced."""

    def __init__(self) -> None:
        self.began: float | None = None
        self.done: float | None = None

    def take(self) -> float:
        waited = (self.done - self.began) if self.began is not None and self.done is not None else 0.0
        self.began = self.done = None
        return max(0.0, waited)


def _timed_allreduce(timer, bucket):  # no annotations: DDP checks them, and this module's are strings
    """A DDP communication hook: the gradient average, timed from the moment a bucket is ready on
    this rank to the moment it is back reduced (on the slow rank that is the transfer alone; on
    its peers it is mostly waiting for it).

    Each parameter's gradient is reduced on its own rather than the bucket as one buffer: DDP
    regroups its buckets after the first step, and a ring all-reduce adds up each value in an
    order that depends on where it sits in the buffer, so a gang resumed from a checkpoint (fresh
    buckets) would drift from the run it continues in the last bits. Per parameter, the order
    depends only on the tensor's size and the ranks: a resumed gang continues bit for bit."""
    if timer.began is None:
        timer.began = time.monotonic()
    world = dist.get_world_size()
    futures = [dist.all_reduce(gradient.div_(world), async_op=True).get_future() for gradient in bucket.gradients()]

    def finished(_):
        timer.done = time.monotonic()
        return bucket.buffer()

    return torch.futures.collect_all(futures).then(finished)


class Gang:
    """This rank's membership: the process group, and the per-step agreement."""

    def __init__(self, member: GangMember):
        self.member = member
        self.device = torch.device("cpu")
        self._timer = _AllReduceTimer()
        self._step_began = time.monotonic()
        self._collective_seconds = 0.0  # this step's time in the workload's own collectives (`all_sum`)
        self.nodes_by_rank: list[str] = [member.node]
        self.checkpoint_group: Any = None

    @classmethod
    def join(cls, member: GangMember, timeout_seconds: float = COLLECTIVE_TIMEOUT_SECONDS) -> Gang:
        """Meet the other ranks (NCCL where this rank has a GPU, gloo otherwise)."""
        gang = cls(member)
        if torch.cuda.is_available():
            gang.device = torch.device("cuda", member.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(gang.device)
        dist.init_process_group(
            backend="nccl" if gang.device.type == "cuda" else "gloo",
            init_method=f"tcp://{member.master_addr}:{member.master_port}",
            rank=member.rank,
            world_size=member.world_size,
            timeout=dt.timedelta(seconds=timeout_seconds),
        )
        # Checkpoints are written in the background on a gloo group of their own (`sharded.py`).
        gang.checkpoint_group = dist.new_group(backend="gloo")
        names: list[str | None] = [None] * member.world_size
        dist.all_gather_object(names, member.node)
        gang.nodes_by_rank = [str(n) for n in names]
        gang._step_began = time.monotonic()
        return gang

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    @property
    def rank(self) -> int:
        return self.member.rank

    @property
    def world_size(self) -> int:
        return self.member.world_size

    @property
    def leader(self) -> bool:
        return self.member.leader

    def shard(self, items: torch.Tensor) -> torch.Tensor:
        """This rank's part of a global batch: contiguous, as even as the size allows."""
        return torch.tensor_split(items, self.world_size)[self.rank]

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model, data-parallel across the gang (DDP), its gradient all-reduce timed."""
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda" else None)
        ddp.register_comm_hook(self._timer, _timed_allreduce)
        return ddp

    def all_sum(self, value: float) -> float:
        """The sum of `value` over the ranks."""
        began = time.monotonic()
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        self._collective_seconds += time.monotonic() - began  # mostly waiting for peers: not work
        return float(tensor.item())

    def agree(self, *, preempt: bool, checkpoint_due: bool, idle_seconds: float = 0.0) -> StepAgreement:
        """End a step together: every rank's flags and busy time, gathered on every rank.
        `idle_seconds`: time in this step that was not work (a drill's held failpoint)."""
        now = time.monotonic()
        busy = max(0.0, now - self._step_began - self._timer.take() - self._collective_seconds - idle_seconds)
        self._collective_seconds = 0.0
        mine = torch.tensor([float(preempt), float(checkpoint_due), busy], dtype=torch.float64, device=self.device)
        gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        self._step_began = time.monotonic()
        return StepAgreement(
            preempt=any(g[0].item() > 0 for g in gathered),
            checkpoint_due=gathered[0][1].item() > 0,  # rank 0's clock decides time-based checkpoints
            busy_seconds=[round(float(g[2].item()), 6) for g in gathered],
        )

    def restart_step_clock(self) -> None:
        """Start timing the next step now (after a checkpoint or a held failpoint)."""
        self._step_began = time.monotonic()
        self._collective_seconds = 0.0
        self._timer.take()
