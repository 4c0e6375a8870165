"""Print the benchmark figures and write them to ``benchmarks/results/latest.json``.

Usage (from the repository root)::

    make bench
    .venv/bin/python -m benchmarks.run [--repeats N] [--output PATH] [--only FIGURES]

Each figure is printed next to its baseline, measured in the same run. With ``--only`` (e.g.
``--only 7``) just those figures are measured, and the others already in the JSON file are kept
(its ``measured`` map says which run measured each figure).

This module runs the figures and writes the JSON; the tables it prints are built in
``benchmarks.tables``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks import MIN_REPEAT_SECONDS, REPEATS
from benchmarks.tables import (
    dispatch_table,
    gang_tables,
    ingest_table,
    isaaclab_table,
    machine_table,
    omics_table,
    registry_tables,
    rollouts_table,
    validation_table,
)

RESULTS_FILE = Path(__file__).resolve().parent / "results" / "latest.json"
PACKAGES = ("numpy", "pandas", "pyarrow", "zarr", "anndata", "scanpy", "mujoco", "gymnasium", "av")


def machine_facts() -> dict[str, Any]:
    try:
        usable_cpus: int | None = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable_cpus = None
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus,
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "packages": versions,
    }


FIGURES = {
    "1": "validation", "2": "omics", "3a": "rollouts", "3b": "isaaclab", "4": "ingest", "5": "dispatch",
    "6": "planner", "7": "registry", "8": "gang", "9": "sealing", "10": "gateway", "11": "camera", "12": "instance",
    "13": "images", "13b": "slurm-images", "14": "drops", "15": "queues",
    "16": "topology",
}
"""Figure number -> name; `--only` takes either (and '3' for both 3a and 3b)."""


def _selected(only: list[str] | None) -> set[str]:
    """The figure numbers `--only` names (all of them when not given); ValueError names a wrong one."""
    if not only:
        return set(FIGURES)
    names = {name: number for number, name in FIGURES.items()}
    chosen: set[str] = set()
    for item in (part.strip().lower() for value in only for part in value.split(",")):
        if item == "3":
            chosen |= {"3a", "3b"}
        elif item == "13":
            chosen |= {"13", "13b"}
        elif item in FIGURES:
            chosen.add(item)
        elif item in names:
            chosen.add(names[item])
        elif item:
            known = ", ".join(f"{number} ({name})" for number, name in FIGURES.items())
            raise ValueError(f"--only: no figure {item!r}; the figures are {known}")
    return chosen


def _merge_kept(output: Path, report: dict[str, Any]) -> list[str]:
    """Carry the figures this run did not measure over from the existing ``output``; their keys."""
    try:
        old = json.loads(output.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(old, dict) or not isinstance(old.get("figures"), dict):
        return []
    old_measured = old.get("measured") or {}
    fallback = {"created": old.get("created"), "command": old.get("command"), "repeats": (old.get("method") or {}).get("repeats")}
    kept = [key for key in old["figures"] if key not in report["figures"]]
    new_figures, new_measured = report["figures"], report["measured"]
    order = [*old["figures"], *(key for key in new_figures if key not in old["figures"])]  # the file's order, new ones last
    report["figures"] = {key: new_figures[key] if key in new_figures else old["figures"][key] for key in order}
    report["measured"] = {key: new_measured[key] if key in new_measured else old_measured.get(key, fallback) for key in order}
    for key, value in (old.get("method") or {}).items():
        report["method"].setdefault(key, value)
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"timed repeats per figure (default {REPEATS})")
    parser.add_argument("--output", type=Path, default=RESULTS_FILE, help=f"JSON file to write (default {RESULTS_FILE})")
    parser.add_argument(
        "--only",
        action="append",
        metavar="FIGURES",
        help="measure only these figures, by number or name, comma-separated or repeated (e.g. --only 7, "
        "--only 2,registry; 3 means 3a and 3b). The other figures already in the JSON file are kept.",
    )
    args = parser.parse_args(argv)
    # Library notices that say nothing about the figures (Dagster's preview APIs used inside
    # Pipes, zarr v3's consolidated metadata) would otherwise fill the tables' output.
    from dagster import PreviewWarning

    warnings.filterwarnings("ignore", category=PreviewWarning)
    warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    try:
        chosen = _selected(args.only)
    except ValueError as exc:
        parser.error(str(exc))

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)  # piped or logged: rich would squeeze the tables to 80 columns
    started = time.perf_counter()
    facts = machine_facts()
    console.print(machine_table(facts))

    from benchmarks import (
        camera_ingest, dispatch, drop_events, episode_ingest, gang, gateway, images, instance, isaaclab_overhead, omics_write, planner, queue_fleet,
        registry, rollouts, sealing, slurm_images, topology_fleet, validation,
    )

    figures: dict[str, Any] = {}
    method: dict[str, Any] = {}

    if "1" in chosen:
        with console.status("Measuring plate validation…"):
            validation_results = validation.run(repeats=args.repeats)
        console.print(validation_table(validation_results, args.repeats))
        figures["validation_throughput_wells_per_s"] = [r.to_dict() for r in validation_results]
        method["validation_min_repeat_seconds"] = MIN_REPEAT_SECONDS

    if "2" in chosen:
        with console.status("Measuring omics writes…"):
            omics_results, load_s = omics_write.run(repeats=args.repeats)
        console.print(omics_table(omics_results, args.repeats, load_s))
        figures["omics_write_throughput_mb_per_s"] = {"reference_load_s": load_s, "cases": [r.to_dict() for r in omics_results]}
        method["omics"] = "one write per repeat, each into a fresh temporary folder"

    if "3a" in chosen:
        with console.status("Measuring MuJoCo rollouts…"):
            rollout_results = rollouts.run(repeats=args.repeats)
        console.print(rollouts_table(rollout_results, args.repeats))
        figures["rollout_overhead_mujoco_env_steps_per_s"] = [r.to_dict() for r in rollout_results]
        method["rollouts"] = (
            "one call per repeat (env built, every seed run), each into a fresh temporary folder; "
            "harness, harness + commit and raw alternate"
        )

    if "3b" in chosen:
        with console.status("Measuring Isaac Lab rollouts (child process in .venv-isaaclab, about a minute)…"):
            isaaclab_result = isaaclab_overhead.run(repeats=args.repeats)
        console.print(isaaclab_table(isaaclab_result, args.repeats))
        figures["rollout_overhead_isaaclab_env_steps_per_s"] = isaaclab_result.to_dict()
        method["isaaclab"] = (
            "timed inside the .venv-isaaclab child with the same time_pair, one call per repeat, "
            "after start-up and one warm-up episode"
        )

    if "4" in chosen:
        with console.status("Measuring episode ingest…"):
            ingest_results = episode_ingest.run(repeats=args.repeats)
        console.print(ingest_table(ingest_results, args.repeats))
        figures["episode_ingest_frames_per_s"] = [r.to_dict() for r in ingest_results]
        method["ingest_min_repeat_seconds"] = MIN_REPEAT_SECONDS

    if "5" in chosen:
        with console.status("Measuring dispatch overhead (starts a Slurm cluster and a Ray head, a few minutes)…"):
            dispatch_results = dispatch.run(repeats=args.repeats)
        console.print(dispatch_table(dispatch_results, args.repeats))
        figures["dispatch_overhead_s"] = [r.to_dict() for r in dispatch_results]
        method["dispatch"] = "one empty step per repeat; platform and each baseline alternate"

    if "6" in chosen:
        with console.status("Planning capacity (40 jobs against HiGHS optima, then 10,000 steps × 500 pools, 10–20 minutes)…"):
            planner_cases, planner_timing = planner.run(repeats=min(args.repeats, 3))
        for table in planner.tables(planner_cases, planner_timing):
            console.print(table)
        figures["capacity_plan"] = {
            "cost_vs_optimum": [c.to_dict() for c in planner_cases],
            "planning_time": planner_timing.to_dict(),
        }
        method["planner"] = "cost: 40 seeded jobs, each plan priced with the full cost model against the benchmark's own HiGHS program; time: min(repeats, 3) runs of plan_job; memory: the CLI in a child process"

    if "7" in chosen:
        with console.status("Measuring the data registry (register, re-register, get vs copytree, about 30 s)…"):
            registry_results, registry_setup_s = registry.run(repeats=args.repeats)
        for table in registry_tables(registry_results, args.repeats, registry_setup_s):
            console.print(table)
        figures["data_registry_mb_per_s"] = {"data_setup_s": registry_setup_s, "cases": [r.to_dict() for r in registry_results]}
        method["registry"] = (
            "one call per repeat; register, re-register, md5, get and copytree alternate; each register is a new "
            "version and its DVC remote is emptied after it (outside the timing); destinations fresh temporary folders"
        )

    if "8" in chosen:
        with console.status("Timing gangs (local, and a 4-node Slurm cluster started here; about two minutes)…"):
            gang_results = gang.run(repeats=min(args.repeats, 3))
        for table in gang_tables(gang_results, min(args.repeats, 3)):
            console.print(table)
        figures["gang"] = {"launch_s": [r.to_dict() for r in gang_results["launch"]], "resume_after_node_loss_s": gang_results["resume"]}
        method["gang"] = "launch: min(repeats, 3) gangs each way, alternating, after one warm-up; resume: one node loss per backend"

    if "9" in chosen:
        with console.status("Measuring sealing (checkpoint save and omics write, sealed vs plain, about a minute)…"):
            sealing_results = sealing.run(repeats=args.repeats)
        console.print(sealing.table(sealing_results, args.repeats))
        figures["sealing_cost"] = [r.to_dict() for r in sealing_results]
        method["sealing"] = "one write per repeat, sealed and plain alternating, each into fresh folders (the sealed one with a local key registered)"

    if "10" in chosen:
        with console.status("Measuring the model gateway's overhead per call (stand-in providers on loopback, about a minute)…"):
            gateway_result = gateway.run(repeats=args.repeats)
        console.print(gateway.table(gateway_result, args.repeats))
        figures["gateway_overhead_ms"] = gateway_result.to_dict()
        method["gateway"] = (
            f"{gateway.CALLS} calls per column per repeat, the four columns alternating call by call, distinct payloads; "
            f"p50 and p99 per repeat, median over repeats; a {gateway.SETTLE_S * 1e3:.0f} ms pause after each call, outside the timing"
        )

    if "11" in chosen:
        with console.status("Measuring camera episode ingest (encodes the datasets first, about two minutes)…"):
            camera_results = camera_ingest.run(repeats=args.repeats)
        console.print(camera_ingest.table(camera_results, args.repeats))
        figures["camera_ingest_frames_per_s"] = [r.to_dict() for r in camera_results]
        method["camera_ingest"] = "validate, read decoded, plain PyAV decode and decode + RGB alternate; one call per repeat unless faster than the minimum"

    if "12" in chosen:
        with console.status("Measuring a Dagster instance on SQLite opened and given one run (about ten seconds)…"):
            instance_result = instance.run(repeats=args.repeats)
        console.print(instance.table(instance_result, args.repeats))
        figures["instance_open_and_run_s"] = instance_result.to_dict()
        method["instance"] = "a new SQLite instance in a fresh folder and one materialize per call; shared histories and Alembic's own reading alternate"

    if "13" in chosen:
        with console.status("Measuring a step in the workload image, warm and cold (about five minutes; needs `make images`)…"):
            images_result = images.run(repeats=args.repeats)
        console.print(images.table(images_result, args.repeats))
        figures["image_step_s"] = images_result.to_dict()
        method["images"] = "podman run --rm of the workload image and the bare process alternate, one call per repeat; cold = podman load of its archive, then the step"

    if "13b" in chosen:
        with console.status("Measuring a Slurm step in the workload image (srun --container) against bare, and with its bundle unpacked first (about two minutes)…"):
            slurm_images_result = slurm_images.run(repeats=args.repeats)
        console.print(slurm_images.table(slurm_images_result, args.repeats))
        figures["slurm_image_step_s"] = slurm_images_result.to_dict()
        method["slurm_images"] = "Slurm jobs through the Slurm backend, srun --container of the workload image's bundle and the bare batch job alternate, one job per repeat; cold = podman export into a new bundle, then the step"

    if "14" in chosen:
        with console.status("Measuring a landing sensor's tick, drops as S3 events vs listing 100,000 (about 17 minutes: moto lists 100,000 objects slowly)…"):
            drops_result = drop_events.run(repeats=args.repeats)
        console.print(drop_events.table(drops_result, args.repeats))
        figures["drop_tick_s"] = drops_result.to_dict()
        method["drops"] = "the assay sensor's tick reading 100 events from SQS and list_complete_drops over the zone alternate on moto; 100 new drops written before each tick, untimed"

    if "15" in chosen:
        with console.status("Simulating a week of a 2,240-GPU fleet's queues, three loads × three policies (about half a minute)…"):
            queues_result = queue_fleet.run(repeats=args.repeats)
        for table in queue_fleet.tables(queues_result):
            console.print(table)
        figures["fleet_queues"] = queues_result
        method["queues"] = (
            "one simulated week per load and policy, the same seeded jobs and spot trace for all; jobs placed by plan_placement and "
            "admitted by PoolQueue (control_plane/queues); decision time: median of repeats with 600 jobs in flight"
        )

    if "16" in chosen:
        with console.status("Simulating gangs on eight NVLink racks, topology-aware against blind (ten seeded weeks, a few seconds)…"):
            topology_result = topology_fleet.run()
        for table in topology_fleet.tables(topology_result):
            console.print(table)
        figures["fleet_topology"] = topology_result
        method["topology"] = (
            "seeded weeks of gangs on 8 GB200 NVL72 racks, the same gangs under each placement policy (benchmarks/topology_sim.py), "
            "each gang planned by plan_placement; step times by the all-reduce model (placement/links.py); no timing repeats: "
            "the figures are simulated, the wall time of each simulation is one run"
        )

    total_s = time.perf_counter() - started
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    command = " ".join([Path(sys.executable).name, "-m", "benchmarks.run", *(argv if argv is not None else sys.argv[1:])])
    report = {
        "created": created,
        "command": command,
        "machine": facts,
        "method": {
            "clock": "time.perf_counter",
            "statistic": "median",
            "repeats": args.repeats,
            "warm_up_calls": 1,
            "order": "subject and baseline alternate, repeat by repeat",
            **method,
            "mb": 1_000_000,
        },
        "figures": figures,
        "measured": {key: {"created": created, "command": command, "repeats": args.repeats} for key in figures},
        "total_run_s": total_s,
    }
    kept = _merge_kept(args.output, report) if chosen != set(FIGURES) else []
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(args.output.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(args.output)
    shown = args.output
    try:
        shown = args.output.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    console.print(f"Figures written to {shown}  (whole run {total_s:.0f} s)")
    if kept:
        console.print(f"Kept from the earlier file, not measured now: {', '.join(kept)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
