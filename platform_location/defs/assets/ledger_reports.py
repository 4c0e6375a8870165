"""Cost and goodput of every GPU step of every lane, and the tokens model tasks bought, read from the ledger."""


import base64
import datetime as dt

import dagster as dg

from control_plane.accounting import reports
from control_plane.accounting.ledger import Ledger, LedgerConfigError
from shared_resources.resources import StorageResource
from workload_runtime.storage import write_bytes_atomic

LEDGER_SUMMARY = dg.AssetKey(["platform", "ledger_summary"])
REPORT_GROUP = "platform_costs"
# The per-run table lists the costliest runs only; `sinewgrid report --by run` lists them all.
RUNS_SHOWN = 20


def _image(title: str, png: bytes) -> str:
    return f"![{title}](data:image/png;base64,{base64.b64encode(png).decode()})"


@dg.asset(key=LEDGER_SUMMARY, group_name=REPORT_GROUP, kinds={"sql", "png"})
def ledger_summary(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """What the GPU work and the model tokens of both lanes cost, and how much of the GPU time was useful.

    Read from the attempt ledger, which books every attempt of every GPU step: where it ran
    (pool, provider, purchasing mode), how long it held its GPUs, how much of that time
    ended in a saved checkpoint (productive) and why the rest was lost (preemption, failure,
    queueing, rework). Goodput is productive ÷ allocated GPU time: 100% means every GPU-hour
    paid for became saved progress. Cost per completed task counts everything spent, failed
    and preempted attempts included, over the steps that finished. Model tasks (the model
    gateway) book tokens and no GPU time: every table shows tokens in, out and from the
    provider's cache, the gateway's cache hits, and token cost beside GPU-hours and GPU cost.

    Shows the totals, tables per lane, tenant (each lab of the Cell lane), provider, project, model, task (a GPU step or a model task) and run, and two plots: the cost
    breakdown and goodput per day. The plots are also saved under `reports/ledger/` in the
    storage root.
    """
    store = storage.get()
    try:
        frame = Ledger.for_storage(store).frame()
    except LedgerConfigError as exc:
        raise dg.Failure(description=str(exc)) from exc
    totals = reports.totals(frame)
    cost_png = reports.cost_breakdown_png(frame)
    goodput_png = reports.goodput_over_time_png(frame)
    cost_uri = store.uri("reports", "ledger", "cost_breakdown.png")
    goodput_uri = store.uri("reports", "ledger", "goodput_over_time.png")
    write_bytes_atomic(cost_uri, cost_png)
    write_bytes_atomic(goodput_uri, goodput_png)
    context.log.info(f"{totals['attempts']} attempts, ${totals['cost_usd']:.2f}; plots in {store.uri('reports', 'ledger')}")

    tables = {by: reports.summary_markdown(reports.summary(frame, by)) for by in ("lane", "tenant", "provider", "project", "model", "task")}
    runs = reports.summary(frame, "run").head(RUNS_SHOWN)
    return dg.MaterializeResult(
        metadata={
            "attempts": totals["attempts"],
            "cost_usd": dg.MetadataValue.float(round(totals["cost_usd"], 4)),
            "gpu_cost_usd": dg.MetadataValue.float(round(totals["gpu_cost_usd"], 4)),
            "token_cost_usd": dg.MetadataValue.float(round(totals["token_cost_usd"], 4)),
            **{name: dg.MetadataValue.int(totals[name]) for name in reports.TOKEN_COLUMNS},
            "gpu_hours": dg.MetadataValue.float(round(totals["gpu_hours"], 4)),
            "goodput": dg.MetadataValue.float(round(totals["goodput"], 4)) if totals["attempts"] else dg.MetadataValue.text("no attempts yet"),
            "completed_tasks": totals["completed_tasks"],
            "cost_per_completed_task_usd": dg.MetadataValue.float(round(totals["cost_per_completed_task"], 4))
            if totals["completed_tasks"]
            else dg.MetadataValue.text("no completed tasks yet"),
            **{f"lost_{reason}_gpu_hours": dg.MetadataValue.float(round(totals[f"lost_{reason}_gpu_hours"], 4)) for reason in ("preemption", "failure", "queueing", "rework")},
            "by_lane": dg.MetadataValue.md(tables["lane"]),
            "by_tenant": dg.MetadataValue.md(tables["tenant"]),
            "by_provider": dg.MetadataValue.md(tables["provider"]),
            "by_project": dg.MetadataValue.md(tables["project"]),
            "by_model": dg.MetadataValue.md(tables["model"]),
            "by_task": dg.MetadataValue.md(tables["task"]),
            f"costliest_{RUNS_SHOWN}_runs": dg.MetadataValue.md(reports.summary_markdown(runs)),
            "cost_breakdown": dg.MetadataValue.md(_image("cost breakdown", cost_png)),
            "goodput_over_time": dg.MetadataValue.md(_image("goodput over time", goodput_png)),
            "cost_breakdown_png": dg.MetadataValue.path(cost_uri),
            "goodput_over_time_png": dg.MetadataValue.path(goodput_uri),
            "as_of": dg.MetadataValue.timestamp(dt.datetime.now(dt.UTC)),
        }
    )
