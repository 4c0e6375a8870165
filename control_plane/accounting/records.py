"""What the ledger books: one `AttemptRecord` per step attempt, and how its time is split.

An attempt's record says where it ran, how long, how much of it was useful and what it
cost. `split_time` cuts its allocated time into productive, checkpoint-writing and lost time
by reason (`LOST_REASONS`); `OUTCOMES` are the ways an attempt can end. `ledger_markdown`
renders a step's attempts as a table for an asset's metadata. The database that stores the
records is `control_plane.accounting.ledger`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from control_plane.catalog.pools import Pool

OUTCOMES = ("succeeded", "preempted", "refused", "failed", "orphaned")
# Why time that was paid for made no saved progress. Each is a column `lost_<reason>_seconds`.
LOST_REASONS = ("preemption", "failure", "queueing", "rework")
# Where an attempt's unexplained time goes, by how the attempt ended (see `split_time`).
_REST_REASON = {"succeeded": "rework", "preempted": "preemption", "refused": "queueing", "failed": "failure", "orphaned": "failure"}


@dataclass(frozen=True)
class TimeSplit:
    """An attempt's allocated time, cut into parts that add back up to it."""

    productive: float
    checkpoint: float
    lost: dict[str, float]


def split_time(
    outcome: str,
    allocated: float,
    productive: float,
    *,
    checkpoint: float = 0.0,
    queue: float = 0.0,
    rework: float | None = None,
) -> TimeSplit:
    """Cut `allocated` seconds into productive, checkpoint-writing and lost time by reason.

    Productive time is work saved in a checkpoint; `queue` is the time the job waited for
    capacity; `rework` (when the workload reports it) is time spent redoing steps a
    previous attempt had done but not saved. Whatever is left is charged to how the attempt
    ended: a preemption or a failure lost it; a refused attempt only ever waited (queueing);
    a successful one spent it starting up, restoring and redoing work (rework).
    Each part is clipped so the parts never exceed the allocation.
    """
    if outcome not in _REST_REASON:
        raise ValueError(f"unknown attempt outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
    left = max(float(allocated), 0.0)

    def take(seconds: float | None) -> float:
        nonlocal left
        part = min(max(float(seconds or 0.0), 0.0), left)
        left -= part
        return part

    productive_s = take(productive)
    lost = dict.fromkeys(LOST_REASONS, 0.0)
    lost["queueing"] = take(queue)
    checkpoint_s = take(checkpoint)
    lost["rework"] = take(rework)
    lost[_REST_REASON[outcome]] += left
    return TimeSplit(productive=productive_s, checkpoint=checkpoint_s, lost={k: round(v, 3) for k, v in lost.items()})


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of one step on one pool, as booked in the ledger."""

    run_id: str
    step: str
    asset: str
    partition: str | None
    attempt: int
    pool: str
    provider: str
    region: str
    backend: str
    purchasing: str
    gpus: int
    started_at: str  # ISO 8601, UTC
    ended_at: str
    allocated_seconds: float  # submit to end: the time the step held (or waited for) its pool
    productive_seconds: float  # work saved in a checkpoint during this attempt
    outcome: str  # succeeded | preempted | refused | failed | orphaned
    exit_code: int | None
    price_per_gpu_hour: float
    project: str = ""
    lane: str = ""  # the lane the step belongs to: cell, robotics, ...
    checkpoint_seconds: float = 0.0  # time spent writing checkpoints
    queue_seconds: float = 0.0  # time the job waited for capacity (the engine's pending time)
    lost_preemption_seconds: float = 0.0
    lost_failure_seconds: float = 0.0
    lost_queueing_seconds: float = 0.0
    lost_rework_seconds: float = 0.0
    # Tokens bought from a model provider (the model gateway books one row per item it was asked,
    # answered or not, and one per evaluation; `backend` "model-gateway", no GPUs, no allocated
    # time): input, output, what they cost.
    tokens_in: int | None = None
    tokens_out: int | None = None
    token_cost_usd: float | None = None
    task_id: str = ""  # the unit of work this attempt serves; several attempts may serve one task
    completed_task: bool = False  # this attempt completed its task
    # Why it ended, when not plainly: notice (SIGTERM, checkpointed), lost-node (killed without
    # notice), reclaimed (the engine took it back), straggler, unhealthy-node, refused, failed,
    # orphaned; "" on success. Lost time by cause: `Ledger.frame().groupby("cause")`.
    cause: str = ""
    ranks: int = 1  # processes of a gang (nodes × ranks per node): all of them lose the same time
    node: str = ""  # the node at fault, when known (a gang's lost, slow or sick node, replaced by a spare)
    # Bytes of datasets and checkpoints the attempt read: found in the node cache, read from the store.
    cache_bytes: int = 0
    store_bytes: int = 0
    tenant: str = ""  # whose work it was (tenants catalog: lab-a, ...); the lane's name for the platform's own steps
    model: str = ""  # the model that answered (model gateway rows), e.g. `standin-openai/swift-1`
    tokens_cached: int = 0  # input tokens the provider served from its prompt cache (billed at the cached price)
    cache_hits: int = 0  # calls answered from the gateway's response cache (no tokens bought)

    @property
    def wall_seconds(self) -> float:
        """The v1 name of `allocated_seconds`."""
        return self.allocated_seconds

    @property
    def gpu_hours(self) -> float:
        return self.allocated_seconds * max(self.gpus, 1) / 3600.0

    @property
    def gpu_cost_usd(self) -> float:
        return self.gpu_hours * self.price_per_gpu_hour

    @property
    def cost_usd(self) -> float:
        """GPU cost plus the cost of tokens bought from model providers (if any)."""
        return self.gpu_cost_usd + (self.token_cost_usd or 0.0)

    @property
    def goodput(self) -> float:
        return self.productive_seconds / self.allocated_seconds if self.allocated_seconds > 0 else 0.0

    @property
    def lost_seconds(self) -> float:
        """Time the pool was held without making work safe, for any reason (checkpoint writing excluded)."""
        return self.lost_preemption_seconds + self.lost_failure_seconds + self.lost_queueing_seconds + self.lost_rework_seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "wall_seconds": self.wall_seconds,
            "gpu_hours": self.gpu_hours,
            "gpu_cost_usd": self.gpu_cost_usd,
            "cost_usd": self.cost_usd,
            "goodput": self.goodput,
            "lost_seconds": self.lost_seconds,
        }

    @classmethod
    def build(
        cls,
        *,
        run_id: str,
        step: str,
        asset: str,
        partition: str | None,
        attempt: int,
        pool: str,
        provider: str,
        region: str,
        backend: str,
        purchasing: str,
        price_per_gpu_hour: float,
        gpus: int,
        started: dt.datetime,
        ended: dt.datetime,
        productive_seconds: float,
        outcome: str,
        exit_code: int | None = None,
        checkpoint_seconds: float = 0.0,
        queue_seconds: float = 0.0,
        rework_seconds: float | None = None,
        lane: str | None = None,
        project: str | None = None,
        task_id: str | None = None,
        completed_task: bool | None = None,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        token_cost_usd: float | None = None,
        cause: str | None = None,
        ranks: int = 1,
        node: str = "",
        cache_bytes: int = 0,
        store_bytes: int = 0,
        tenant: str | None = None,
    ) -> AttemptRecord:
        """A record from plain values; the time split and the defaults are worked out here.

        `lane` defaults to the first part of the asset key (`cell/foundation_model` → `cell`),
        `tenant` and `project` to the lane, `task_id` to run, step and partition, and `completed_task` to
        whether the attempt succeeded.
        """
        if started.tzinfo is None or ended.tzinfo is None:
            raise ValueError(f"{step} attempt {attempt}: started/ended must be timezone-aware (use dt.UTC)")
        allocated = max((ended - started).total_seconds(), 0.0)
        split = split_time(
            outcome, allocated, productive_seconds, checkpoint=checkpoint_seconds, queue=queue_seconds, rework=rework_seconds
        )
        lane = lane or asset.split("/", 1)[0]
        return cls(
            run_id=run_id,
            step=step,
            asset=asset,
            partition=partition,
            attempt=attempt,
            pool=pool,
            provider=provider,
            region=region,
            backend=backend,
            purchasing=purchasing,
            gpus=gpus,
            started_at=started.astimezone(dt.UTC).isoformat(),
            ended_at=ended.astimezone(dt.UTC).isoformat(),
            allocated_seconds=round(allocated, 3),
            productive_seconds=round(split.productive, 3),
            outcome=outcome,
            exit_code=exit_code,
            price_per_gpu_hour=price_per_gpu_hour,
            project=project or lane,
            lane=lane,
            checkpoint_seconds=round(split.checkpoint, 3),
            queue_seconds=round(min(max(queue_seconds, 0.0), allocated), 3),
            **{f"lost_{reason}_seconds": seconds for reason, seconds in split.lost.items()},
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            token_cost_usd=token_cost_usd,
            task_id=task_id or f"{run_id}:{step}:{partition or ''}",
            completed_task=(outcome == "succeeded") if completed_task is None else completed_task,
            cause=cause if cause is not None else ("" if outcome == "succeeded" else outcome),
            ranks=ranks,
            node=node,
            cache_bytes=cache_bytes,
            store_bytes=store_bytes,
            tenant=tenant or lane,
        )

    @classmethod
    def for_attempt(cls, *, pool: Pool, **values: Any) -> AttemptRecord:
        """A record for an attempt on `pool` (its provider, region, backend, purchasing and price).

        Takes every keyword of `build` except the pool's own fields.
        """
        return cls.build(
            pool=pool.name,
            provider=pool.provider,
            region=pool.region,
            backend=pool.backend,
            purchasing=pool.purchasing.value,
            price_per_gpu_hour=pool.price_per_gpu_hour,
            **values,
        )


def ledger_markdown(records: list[AttemptRecord]) -> str:
    """The attempts of one step as a markdown table, for an asset's metadata."""
    lines = [
        "| attempt | pool | backend | purchasing | outcome | allocated s | productive s | checkpoint s | lost s (why) | read MB (node cache / store) | GPU-h | cost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        why = ", ".join(f"{reason} {getattr(r, f'lost_{reason}_seconds'):.1f}" for reason in LOST_REASONS if getattr(r, f"lost_{reason}_seconds") > 0)
        lines.append(
            f"| {r.attempt} | `{r.pool}` | {r.backend} | {r.purchasing} | {r.outcome} | {r.allocated_seconds:.1f} | "
            f"{r.productive_seconds:.1f} | {r.checkpoint_seconds:.1f} | {r.lost_seconds:.1f}{f' ({why})' if why else ''} | "
            f"{r.cache_bytes / 1e6:.1f} / {r.store_bytes / 1e6:.1f} | {r.gpu_hours:.4f} | ${r.cost_usd:.4f} |"
        )
    return "\n".join(lines)
