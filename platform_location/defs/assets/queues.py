"""The GPU queues: who holds each pool's GPUs against their quotas, and what waits for them."""

import base64
import datetime as dt

import dagster as dg

from control_plane.catalog.quotas import QuotaCatalogError, load_quotas
from control_plane.queues.chart import queues_png
from control_plane.queues.view import PoolView, queue_view
from platform_location.defs.assets.ledger_reports import REPORT_GROUP
from shared_resources.compute import ComputeResource
from shared_resources.resources import StorageResource
from workload_runtime.storage import write_bytes_atomic

GPU_QUEUES = dg.AssetKey(["platform", "gpu_queues"])


def queues_markdown(views: list[PoolView]) -> str:
    lines = ["| pool | GPUs | free | team | nominal | in use | borrowed |", "|---|---:|---:|---|---:|---:|---:|"]
    for v in views:
        rows = v.teams or [None]
        for i, row in enumerate(rows):
            head = [f"`{v.pool}`" + ("" if v.queued else " (not queued)"), str(v.gpus), str(v.free)] if i == 0 else ["", "", ""]
            cells = [row.team, str(row.nominal), str(row.used), str(row.borrowed)] if row else ["—", "", "", ""]
            lines.append("| " + " | ".join(head + cells) + " |")
    waiting = [(v.pool, w) for v in views for w in v.waiting]
    if waiting:
        lines += ["", "**Waiting**, in the order the GPUs go to them:", "", "| pool | step | team | GPUs | class | waiting | why |", "|---|---|---|---:|---|---:|---|"]
        lines += [f"| `{p}` | {w.step} | {w.team} | {w.gpus} | {w.priority} | {w.waited_seconds / 60:.0f} min | {w.reason} |" for p, w in waiting]
    else:
        lines += ["", "Nothing waits for admission."]
    return "\n".join(lines)


@dg.asset(key=GPU_QUEUES, group_name=REPORT_GROUP, kinds={"python", "png"})
def gpu_queues(context: dg.AssetExecutionContext, storage: StorageResource, compute: ComputeResource) -> dg.MaterializeResult:
    """Each capacity pool's queue right now: its GPUs held by each team against the team's
    nominal quota (and what it borrows from its cohort), and the GPU steps waiting for it, with
    why they wait (`sinewgrid queue` shows the same).

    Teams, quotas and priority classes come from the quotas file (SINEWGRID_QUOTAS,
    docs/queues.md). A pool the file does not name is not queued: its steps start as its engine
    lets them. The chart is also saved under `reports/queues/` in the storage root.
    """
    try:
        quotas = load_quotas()
    except QuotaCatalogError as exc:
        raise dg.Failure(description=str(exc)) from exc
    store = storage.get()
    views = queue_view(store, compute.pools(), quotas)
    png = queues_png(views)
    uri = store.uri("reports", "queues", "gpu_queues.png")
    write_bytes_atomic(uri, png)
    waiting = sum(len(v.waiting) for v in views)
    context.log.info(f"{len(views)} pools, {sum(1 for v in views if v.queued)} queued; {waiting} step(s) waiting")
    return dg.MaterializeResult(metadata={
        "queues": dg.MetadataValue.md(queues_markdown(views)),
        "chart": dg.MetadataValue.md(f"![GPUs by pool](data:image/png;base64,{base64.b64encode(png).decode()})"),
        "gpus_in_use": dg.MetadataValue.int(sum(r.used for v in views for r in v.teams)),
        "gpus_borrowed": dg.MetadataValue.int(sum(r.borrowed for v in views for r in v.teams)),
        "steps_waiting": dg.MetadataValue.int(waiting),
        "quotas_file": dg.MetadataValue.path(quotas.file),
        "as_of": dg.MetadataValue.timestamp(dt.datetime.now(dt.UTC)),
    })  # fmt: skip
