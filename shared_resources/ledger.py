"""Ledger v1: one record per step attempt — where it ran, how long, how much was useful, what it cost.

Each attempt is one small JSON object under `ledger/attempts/` (safe to write from many
processes and on object stores); `read_ledger` gathers them into a DataFrame.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
from dataclasses import asdict, dataclass

import pandas as pd

from shared_resources.pools import Pool
from shared_resources.storage import fs_for, write_json_atomic


@dataclass(frozen=True)
class AttemptRecord:
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
    started_at: str
    ended_at: str
    wall_seconds: float
    productive_seconds: float
    outcome: str  # succeeded | preempted | refused | failed | orphaned
    exit_code: int | None
    price_per_gpu_hour: float

    @property
    def gpu_hours(self) -> float:
        return self.wall_seconds * max(self.gpus, 1) / 3600.0

    @property
    def cost_usd(self) -> float:
        return self.gpu_hours * self.price_per_gpu_hour

    @property
    def goodput(self) -> float:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def lost_seconds(self) -> float:
        """Time the pool was held without making work safe (start-up, redone or unsaved steps)."""
        return max(self.wall_seconds - self.productive_seconds, 0.0)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "gpu_hours": self.gpu_hours,
            "cost_usd": self.cost_usd,
            "goodput": self.goodput,
            "lost_seconds": self.lost_seconds,
        }

    @classmethod
    def for_attempt(
        cls,
        *,
        run_id: str,
        step: str,
        asset: str,
        partition: str | None,
        attempt: int,
        pool: Pool,
        gpus: int,
        started: dt.datetime,
        ended: dt.datetime,
        productive_seconds: float,
        outcome: str,
        exit_code: int | None,
    ) -> AttemptRecord:
        wall = max((ended - started).total_seconds(), 0.0)
        return cls(
            run_id=run_id,
            step=step,
            asset=asset,
            partition=partition,
            attempt=attempt,
            pool=pool.name,
            provider=pool.provider,
            region=pool.region,
            backend=pool.backend.value,
            purchasing=pool.purchasing.value,
            gpus=gpus,
            started_at=started.isoformat(),
            ended_at=ended.isoformat(),
            wall_seconds=round(wall, 3),
            productive_seconds=round(min(productive_seconds, wall), 3),
            outcome=outcome,
            exit_code=exit_code,
            price_per_gpu_hour=pool.price_per_gpu_hour,
        )


def record_attempt(ledger_uri: str, record: AttemptRecord) -> str:
    name = f"{record.started_at.replace(':', '').replace('+', 'Z')}-{record.run_id[:8]}-{record.step}-{record.attempt}.json"
    uri = posixpath.join(ledger_uri, name)
    write_json_atomic(uri, record.to_dict())
    return uri


def read_ledger(ledger_uri: str) -> pd.DataFrame:
    """Every attempt recorded under `ledger_uri`, oldest first."""
    fs, path = fs_for(ledger_uri)
    columns = list(AttemptRecord.__dataclass_fields__) + ["gpu_hours", "cost_usd", "goodput", "lost_seconds"]
    if not fs.exists(path):
        return pd.DataFrame(columns=columns)
    rows = [json.loads(fs.cat_file(p)) for p in sorted(fs.glob(posixpath.join(path, "*.json")))]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("started_at", kind="stable").reset_index(drop=True)


def ledger_markdown(records: list[AttemptRecord]) -> str:
    lines = [
        "| attempt | pool | backend | purchasing | outcome | wall s | productive s | lost s | GPU-h | cost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r.attempt} | `{r.pool}` | {r.backend} | {r.purchasing} | {r.outcome} | {r.wall_seconds:.1f} | "
            f"{r.productive_seconds:.1f} | {r.lost_seconds:.1f} | {r.gpu_hours:.4f} | ${r.cost_usd:.4f} |"
        )
    return "\n".join(lines)
