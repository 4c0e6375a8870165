"""`sinewgrid`: drive the loop from a terminal against the same instance the UI shows.

This module holds the app and the loop's own commands (seed, tick, summary, drill, demo, the
lab stand-in, pool health); the data registry, checkpoint/run and cost commands live in
`sinewgrid.cli_data`, `sinewgrid.cli_models` and `sinewgrid.cli_costs`, registered here.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sinewgrid.cli_costs import plan, report
from sinewgrid.cli_data import data_app, lineage
from sinewgrid.cli_models import checkpoints_app, runs_app
from sinewgrid.cli_pools import pools_list
from sinewgrid.cli_summary import tag as _tag
from sinewgrid.cli_tenants import key_revoked_drill, tenants_app
from sinewgrid.cli_queue import queue_app
from control_plane.settings import quiet_dagster, settings, storage_root
from sinewgrid.instance import ensure_instance_home, get_instance

app = typer.Typer(help="Sinewgrid: the control plane for ML work on rented GPUs.", no_args_is_help=True, add_completion=False, pretty_exceptions_show_locals=False)
lab_app = typer.Typer(help="The lab stand-in (LabStandIn) used by the demo.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
app.add_typer(data_app, name="data")
app.add_typer(tenants_app, name="tenants")
app.add_typer(queue_app, name="queue")
app.add_typer(checkpoints_app, name="checkpoints", help="Checkpoints by model, run, step and dataset; retention.")
app.add_typer(runs_app, name="runs", help="Training runs: metrics, loss curves, and comparing two runs.")
app.command("lineage")(lineage)
console = Console(width=None if sys.stdout.isatty() else 150)


def _quiet() -> None:
    """Dagster logs every event; the command line shows its own progress and a table instead.

    Set SINEWGRID_LOG_LEVEL (e.g. INFO) to see the runs' own logs as well.
    """
    warnings.filterwarnings("ignore")
    quiet_dagster()
    if not settings().log_level:
        logging.disable(logging.CRITICAL)


def _storage():
    from workload_runtime.storage import Storage

    return Storage.at(storage_root())


def _labs() -> list:
    """One lab stand-in per Cell tenant (tenants catalog), each on its own root, each with its own seed."""
    from cell_lane.standins.lab import LabStandIn
    from control_plane.catalog.tenants import load_tenants

    root = _storage().root
    return [LabStandIn.of_tenant(root, t.name, seed=7 + i) for i, t in enumerate(load_tenants().of_lane("cell"))]


def _cell_tenant_storages() -> dict:
    """Each Cell tenant's storage, its key held in this process (to open its sealed predictions)."""
    from control_plane.catalog.tenants import load_tenants
    from shared_resources.resources import StorageResource

    resource = StorageResource(root=_storage().root)
    return {t.name: resource.for_tenant(t.name) for t in load_tenants().of_lane("cell")}


@app.command("init-instance")
def init_instance() -> None:
    """Create the Dagster instance folder (DAGSTER_HOME) with its dagster.yaml."""
    home = ensure_instance_home()
    console.print(f"Dagster instance: [bold]{home}[/]   storage root: [bold]{_storage().root}[/]")


@app.command()
def seed(
    plates: int = typer.Option(2, help="How many good first-round plates to drop."),
    bad: bool = typer.Option(True, help="Also drop one deliberately bad export, to see quarantine at work."),
) -> None:
    """Put sample lab drops (first-round plates) into each Cell lab's landing zone."""
    with console.status("writing sample drops…"):
        labs = _labs()
        dropped = {lab.tenant: lab.seed_drops(plates=plates, include_bad=bad) for lab in labs}
    for lab in labs:
        for drop in dropped[lab.tenant]:
            console.print(f"  {_tag(lab.tenant)} dropped [cyan]{lab.storage.landing('assays', drop)}[/]")


def _print_ticks(ticks, all_rows: bool = False) -> bool:
    ok = True
    table = Table(title="tick", show_lines=False)
    for column in ("sensor / schedule", "new partitions", "runs", "result"):
        table.add_column(column)
    for tick in ticks:
        runs = "\n".join(
            escape(f"{r.job}{f'[{r.partition}]' if r.partition else ''}")
            + f" {'[green]ok[/]' if r.success else '[red]failed[/]'} {r.seconds:.1f}s"
            + "".join(f"\n  [yellow]quarantined → {escape(q)}[/]" for q in r.quarantined)
            + (f"\n  [red]{escape(r.failure)}[/]" if r.failure and not r.quarantined else "")
            for r in tick.runs
        )
        ok &= all(r.success or r.quarantined for r in tick.runs)
        events = getattr(tick, "asset_events", [])
        result = (f"reported on {', '.join(events)}" if events else "") or tick.skipped or (
            f"{len(tick.already_run)} already run" if tick.already_run else ""
        )
        if not tick.runs and not tick.new_partitions and not tick.already_run and not events and not all_rows:
            continue  # keep the table to what happened; `sinewgrid tick` shows every row
        table.add_row(f"{tick.location}/{tick.sensor}", ", ".join(tick.new_partitions), runs, result)
    console.print(table)
    return ok


def _tick() -> list:
    from sinewgrid.ticker import tick_all

    instance = get_instance()
    with console.status("evaluating sensors…") as status:
        ticks = tick_all(
            instance,
            on_run=lambda job, part: status.update(f"running {job}{f' [{part}]' if part else ''}…"),
            log_level=settings().log_level or "CRITICAL",
        )
    return ticks


@app.command()
def tick() -> None:
    """Evaluate every sensor once and run what it requests, in this process."""
    _quiet()
    _print_ticks(_tick(), all_rows=True)


@lab_app.command("answer")
def lab_answer() -> None:
    """Let each lab's stand-in run every worklist in its outbox; results land as new drops."""
    for lab in _labs():
        with console.status(f"the stand-in of {lab.tenant} is running plates…"):
            drops = lab.answer_outbox()
        console.print(f"  {_tag(lab.tenant)} new drops: {', '.join(drops) or 'none (no unanswered worklists)'}")


@app.command()
def summary() -> None:
    """Print what ran where, how long it took, what it cost and how the model's error moved."""
    _quiet()
    _print_summary()


app.command("report")(report)
app.command("plan")(plan)


def _print_summary(truth=None, robotics_rows: bool = True) -> None:
    from sinewgrid.cli_summary import print_summary

    print_summary(console, _storage(), get_instance(), _cell_tenant_storages(), truth=truth, robotics_rows=robotics_rows)


@app.command()
def drill(
    backend: list[str] = typer.Option(
        ["local", "slurm", "ray"], "--backend", "-b",
        help="Where to drill: local, slurm (a single-node cluster is started for it, and a 3-node one for the gang scenarios), ray (a head and 3 worker nodes; gang scenarios only). Repeat for several.",
    ),
    scenario: list[str] = typer.Option(
        [], "--scenario", "-s",
        help="preempt-notice, preempt-no-notice, torn-checkpoint, pool-loss, straggler, unhealthy-node; for a gang: node-loss, slow-rank, node-unqualified; "
        "key-revoked (a tenant's key is disabled: its next run is refused, the other tenant runs on; local only) (default: all but key-revoked).",
    ),
    workload: list[str] = typer.Option([], "--workload", "-w", help="pretrain (Cell), rollouts, policy (Robotics), pretrain-gang (Cell, 2 nodes) (default: all)."),
    size: str = typer.Option("small", help="small (seconds per run) or full (the figures in docs/drills.md)."),
    trace: str = typer.Option("10-15%", help="Preemption-trace rate: a spot band (<5%, 5-10%, 10-15%, 15-20%, >20%) or interruptions per hour; 'none' to skip."),
    trace_seed: list[int] = typer.Option([1, 2, 3], "--trace-seed", help="Seeds of the preemption traces: one trace per seed, each replayed under the three cadences."),
    out: Path = typer.Option(None, help="Where the report goes (default: reports/drills/ under the storage root)."),
    docs: Path = typer.Option(None, help="Also write the report here (e.g. docs/drills.md) with its plots beside it."),
) -> None:
    """Inject real faults into real runs and publish how the platform recovered.

    Each scenario runs an uninterrupted baseline and a faulted run of a lane workload through the real compute resource, as Dagster runs on this instance (the UI shows them under platform/failure_drill). It measures the time to detect, contain, replace and resume, the work redone against the checkpoint cadence's bound, goodput against the Young/Daly optimum, and whether the end state matches the uninterrupted run.
    """
    from drills.campaign import DrillAssets, run_campaign
    from drills.runner import SCENARIOS
    from drills.workloads import SIZES, WORKLOADS
    from platform_location.defs.assets.drills import drill_root, failure_drill, preemption_trace
    from shared_resources.resources import StorageResource

    _quiet()
    if size not in SIZES:
        raise typer.BadParameter(f"use {' or '.join(SIZES)}", param_hint="--size")
    storage = _storage()
    ensure_instance_home()
    out = out or Path(storage.root.removeprefix("file://")) / "reports" / "drills"
    command = "sinewgrid drill " + " ".join(sys.argv[2:])
    if "key-revoked" in scenario:
        key_revoked_drill(storage.root, out)
        scenario = [s for s in scenario if s != "key-revoked"]
        if not scenario:
            return
    with get_instance() as instance:
        try:
            assets = DrillAssets(failure_drill, preemption_trace, drill_root(StorageResource(root=storage.root)))
            results, traces, written = run_campaign(
                assets=assets, instance=instance, storage_root=storage.root, backends=backend, scenarios=scenario or list(SCENARIOS),
                workloads=workload or list(WORKLOADS), size=size, trace_rate=None if trace == "none" else trace, trace_seeds=trace_seed,
                out_dir=out, docs_path=docs, command=command, say=lambda line: console.print(escape(line)),
            )
        except (ValueError, RuntimeError) as exc:
            console.print(f"[red]{escape(str(exc))}[/]")
            raise typer.Exit(2) from None
    console.print(f"\nreport: [bold]{written['markdown']}[/]" + (f" and [bold]{written['docs']}[/]" if written.get("docs") else ""))
    bad = [r for r in results if not r.passed]
    bad += [r for t in traces for r in t.runs if not (r.finished and r.identical)]
    if bad:
        console.print(f"[red]{len(bad)} drill(s) did not pass (the platform did not react, or did not recover to an identical end state within the bound); see the report.[/]")
        raise typer.Exit(1)


pools_app = typer.Typer(help="The catalog's pools by accelerator and shape; drained pools and how to put them back.", no_args_is_help=True)
app.add_typer(pools_app, name="pools")
pools_app.command("list")(pools_list)


@pools_app.command("drained")
def pools_drained() -> None:
    """List the pools taken out of placement (failed qualification, unhealthy node, straggler)."""
    from control_plane.compute.health import Drains

    drains = Drains(_storage()).all()
    if not drains:
        console.print("no pool is drained")
        return
    table = Table(title="Drained pools")
    for column in ("pool", "since", "left", "why"):
        table.add_column(column)
    for d in drains:
        table.add_row(escape(d.pool), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.since)), f"{d.remaining_seconds:.0f}s", escape(d.reason))
    console.print(table)


@pools_app.command("undrain")
def pools_undrain(pool: str = typer.Argument(..., help="The pool to put back in service.")) -> None:
    """Put a drained pool back in service (it is qualified again before its next step)."""
    from control_plane.compute.health import Drains

    if Drains(_storage()).undrain(pool):
        console.print(f"{escape(pool)} is back in service; it will be qualified again before its next step")
    else:
        console.print(f"{escape(pool)} was not drained")


@app.command()
def demo(
    rounds: int = typer.Option(2, min=1, help="Rounds to run after the first drops (lab plates, robot-cell results)."),
    lane: str = typer.Option("all", help="Which loop to drive: cell, robotics or all."),
) -> None:
    """Seed sample drops, tick through the rounds of both loops, then print the summary."""
    _quiet()
    if lane not in ("cell", "robotics", "all"):
        raise typer.BadParameter("use --lane cell, robotics or all")
    storage = _storage()
    cell, robotics = lane in ("cell", "all"), lane in ("robotics", "all")
    started = time.monotonic()
    console.rule("[bold]Sinewgrid demo: " + {"cell": "the Cell loop", "robotics": "the Robotics loop", "all": "the Cell and Robotics loops"}[lane] + " on this machine")
    console.print(f"storage root {storage.root}")
    if cell:
        labs = _labs()  # one stand-in per Cell lab, each on its own root: the labs' loops run side by side
    if robotics:
        from robotics_lane.standins.robot_cell import RobotCellStandIn
        from robotics_lane.standins.teleop_operator import TeleopOperatorStandIn

        operator, robot_cell = TeleopOperatorStandIn(storage), RobotCellStandIn(storage)

    console.print("\n[bold]Round 1[/]: first data arrives")
    if cell:
        for lab in labs:
            console.print(f"  {_tag(lab.tenant)} lab plates (one a bad export): {', '.join(lab.seed_drops())}")
    if robotics:
        with console.status("the teleop stand-in is recording sessions…"):
            console.print(f"  teleop sessions (one with a recorder glitch): {', '.join(operator.record_sessions())}")
    ok = _print_ticks(_tick())
    for round_number in range(2, rounds + 2):
        console.print(f"\n[bold]Round {round_number}[/]: answers come back")
        if cell:
            for lab in labs:
                with console.status(f"the stand-in of {lab.tenant} is running plates…"):
                    console.print(f"  {_tag(lab.tenant)} lab results for the proposed plate: {', '.join(lab.answer_outbox()) or 'none'}")
        if robotics:
            with console.status("the robot-cell stand-in is running trials…"):
                console.print(f"  robot-cell results: {', '.join(robot_cell.answer_requests()) or 'none'}")
        ok &= _print_ticks(_tick())
        if robotics:
            with console.status("the teleop stand-in is relabelling failed trials…"):
                relabelled = operator.answer_relabel_requests()
            if relabelled:
                console.print(f"  corrective demonstrations for failed real-robot trials: {', '.join(relabelled)}")
                ok &= _print_ticks(_tick())
    console.rule("[bold]Summary")
    _print_summary(truth=labs[0].truth if cell and labs else None, robotics_rows=robotics)
    _print_traceability(storage)
    console.print(f"demo finished in {time.monotonic() - started:.0f}s")
    if not ok:
        console.print("[red]Some runs failed for reasons other than a bad drop; rerun with SINEWGRID_LOG_LEVEL=INFO to see their logs.[/]")
        raise typer.Exit(1)


def _print_traceability(storage) -> None:
    """Where to look next: the newest results' lineage (each lab's under its own root), the dataset versions, the runs."""
    from data_layer.lineage import LineageStore

    console.print("\n[bold]Every result can be traced[/] to its data and code:")
    roots = [("", storage.root, "robotics/real_robot_evaluation/")]
    roots += [(tenant, store.root, "cell/next_plate_proposal/") for tenant, store in _cell_tenant_storages().items()]
    for tenant, root, prefix in roots:
        lineage = LineageStore(root)
        records = sorted((lineage.get(i) for i in lineage.ids() if i.startswith(prefix)), key=lambda r: r.created_at)
        if records:
            where = f" --tenant {escape(tenant)}" if tenant else ""
            console.print(f"  {_tag(tenant) + ' ' if tenant else ''}sinewgrid lineage{where} {escape(records[-1].id)}", soft_wrap=True)  # one line, to copy
    console.print("  sinewgrid data list [--tenant lab-a]   the registered dataset versions (DVC), each retrievable with `sinewgrid data get`")
    console.print("  sinewgrid runs list [--root LAB ROOT]  the training runs, their figures and loss curves; `sinewgrid runs compare A B`")
    console.print("  sinewgrid tenants list                 each lab's root, key and data agreement")


if __name__ == "__main__":
    app()
