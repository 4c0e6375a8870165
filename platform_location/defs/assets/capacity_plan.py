"""The lanes' calendar as a capacity plan: where each recurring step will run, and what it costs."""

import base64
import datetime as dt
import io
import json
from pathlib import Path

import dagster as dg

from control_plane.placement.job_files import JobFileError, plan_calendar
from control_plane.placement.planner import InfeasiblePlanError
from control_plane.catalog.pools import PoolCatalogError
from shared_resources.resources import StorageResource
from workload_runtime.storage import write_bytes_atomic
from control_plane.settings import REPO_ROOT

CAPACITY_PLAN = dg.AssetKey(["platform", "capacity_plan"])
PLAN_GROUP = "platform_capacity"


class CapacityPlanConfig(dg.Config):
    """Which calendars to plan, against which catalogs (paths relative to the repository)."""

    job_files: list[str] = ["deploy/jobs/cell.yaml", "deploy/jobs/robotics.yaml"]
    pools: list[str] = ["deploy/pools"]


def _path(value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else REPO_ROOT / path


def _job(row: dict) -> str:
    return row["step"].split("/", 1)[0]


def _calendar_png(plan) -> bytes:
    """One row per pool, one bar per step run, coloured by job: the calendar at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    rows = plan.rows()
    pools = sorted({row["pool"] for row in rows})
    jobs = list(dict.fromkeys(_job(row) for row in rows))
    colours = dict(zip(jobs, plt.get_cmap("tab10").colors))
    height = 0.8 / len(jobs)
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.55 * len(pools)))
    for row in rows:
        start, end = (dt.datetime.strptime(row[k], "%Y-%m-%d %H:%M UTC") for k in ("start", "end"))
        y = pools.index(row["pool"]) - 0.4 + height * (jobs.index(_job(row)) + 0.5)
        ax.barh(y, mdates.date2num(end) - mdates.date2num(start), left=mdates.date2num(start), height=height * 0.9, color=colours[_job(row)])
    ax.set_yticks(range(len(pools)), pools)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%b %d"))
    ax.set_title("Capacity plan: step runs per pool (both lanes planned together, sharing quotas)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[j]) for j in jobs]
    ax.legend(handles, jobs, loc="upper right", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def _spares(row: dict) -> str:
    """A gang's standby spare nodes, where the pool holds some: their part of the cost."""
    return f" (spares ${row['spare_usd']:,.2f})" if row.get("spare_usd") else ""


def _steps_markdown(rows: list[dict]) -> str:
    lines = [
        "| step | pool | mode | start | GPUs | GPU-h | egress | cost | checkpoint every | failover |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        every = f"{row['checkpoint_interval_seconds'] / 60:.0f} min" if row["checkpoint_interval_seconds"] else "—"
        lines.append(
            f"| {row['step'].split('/', 1)[1]} | `{row['pool']}` | {row['purchasing']} | {row['start']} | {row['gpus']} | "
            f"{row['gpu_hours']:,.1f} | ${row['egress_usd']:,.2f} | ${row['cost_usd']:,.2f}{_spares(row)} | {every} | "
            f"{', '.join(row['failover'][:3]) or '—'} |"
        )
    return "\n".join(lines)


@dg.asset(key=CAPACITY_PLAN, group_name=PLAN_GROUP, kinds={"yaml", "png"})
def capacity_plan(context: dg.AssetExecutionContext, config: CapacityPlanConfig, storage: StorageResource) -> dg.MaterializeResult:
    """Where the lanes' recurring GPU work will run next, and what it will cost.

    Each lane describes its calendar as a job file (`deploy/jobs/`): the Cell lane's steady
    pretraining and its fine-tune bursts after each assay round; the Robotics lane's nightly
    rollout sweeps and policy training. The planner places every run of every step on the
    pool catalogs (`deploy/pools/`, illustrative prices) at the lowest expected cost within
    quotas, deadlines, tenant limits and budgets: commitments already paid first, spot only for
    steps that checkpoint (with the expected rework priced in), compute moved to the data
    unless egress is cheaper.

    Both calendars are planned together, so they share the pools' quotas and commitments.
    Shows per job the table of runs (pool, purchasing mode, cost, Young/Daly checkpoint
    interval, failover order), the totals, and a calendar plot per pool. The whole plan with
    every pool's verdict is written to `reports/capacity/plan.json`; `sinewgrid plan
    deploy/jobs/cell.yaml --pools deploy/pools` prints the same plan with its evidence.
    """
    try:
        plan = plan_calendar([_path(f) for f in config.job_files], [_path(p) for p in config.pools])
    except (JobFileError, PoolCatalogError, InfeasiblePlanError) as exc:
        raise dg.Failure(description=f"cannot plan the calendar {', '.join(config.job_files)}: {exc}") from exc
    store = storage.get()
    plan_uri = store.uri("reports", "capacity", "plan.json")
    write_bytes_atomic(plan_uri, json.dumps(plan.to_dict(), indent=2, default=str).encode())
    png = _calendar_png(plan)
    png_uri = store.uri("reports", "capacity", "calendar.png")
    write_bytes_atomic(png_uri, png)
    rows = plan.rows()
    by_job = {job: [r for r in rows if _job(r) == job] for job in dict.fromkeys(_job(r) for r in rows)}
    totals = plan.totals()
    context.log.info(f"{len(by_job)} calendars, {totals['steps']} step runs, ${totals['cost_usd']:,.2f}")
    summary = ["| job | step runs | GPU-h | egress | cost |", "|---|---|---|---|---|"] + [
        f"| {job} | {len(r)} | {sum(x['gpu_hours'] for x in r):,.1f} | ${sum(x['egress_usd'] for x in r):,.2f} | "
        f"${sum(x['cost_usd'] for x in r):,.2f} |"
        for job, r in by_job.items()
    ]
    return dg.MaterializeResult(
        metadata={
            "cost_usd": dg.MetadataValue.float(round(totals["cost_usd"], 2)),
            "gpu_hours": dg.MetadataValue.float(round(totals["gpu_hours"], 1)),
            "committed_gpu_hours_used": dg.MetadataValue.float(round(totals["committed_gpu_hours_used"], 1)),
            "spare_nodes_usd": dg.MetadataValue.float(round(totals.get("spare_usd", 0.0), 2)),
            "prices": "illustrative list prices, not quotes" if totals["prices_illustrative"] else "from the catalogs' sources",
            "summary": dg.MetadataValue.md("\n".join(summary)),
            **{f"plan_{job}": dg.MetadataValue.md(_steps_markdown(r)) for job, r in by_job.items()},
            "calendar": dg.MetadataValue.md(f"![calendar](data:image/png;base64,{base64.b64encode(png).decode()})"),
            "calendar_png": dg.MetadataValue.path(png_uri),
            "plan_json": dg.MetadataValue.path(plan_uri),
        }
    )
