"""Failure drills as an asset: each partition is one scenario against one backend and workload."""


import json
from pathlib import Path

import dagster as dg
from pydantic import Field

from control_plane.settings import settings
from drills import runner
from drills.campaign import partition_keys, split_partition_key
from drills.runner import SCENARIOS, DrillSetup, drill_catalog, run_scenario
from drills.workloads import SIZES
from shared_resources.resources import StorageResource

FAILURE_DRILL = dg.AssetKey(["platform", "failure_drill"])
DRILL_GROUP = "platform_drills"
# One partition per drill that applies (`<scenario>@<backend>-<workload>`): the UI offers no
# scenario on a workload or backend it cannot fault (a straggler of a rollout sweep, say).
DRILL_PARTITIONS = dg.StaticPartitionsDefinition(partition_keys())


class DrillConfig(dg.Config):
    """How big a run the drill faults."""

    size: str = "small"


def drill_root(storage: StorageResource) -> Path:
    """Local working folder of the drills (pool catalogs, fault markers, results)."""
    configured = settings().drill_dir
    if configured:
        return Path(configured)
    store = storage.get()
    if not store.is_local:
        raise dg.Failure(f"the storage root {store.root} is not a local folder: set SINEWGRID_DRILL_DIR to a local folder for the drills' files")
    return Path(store.root.removeprefix("file://")) / "drills"


@dg.asset(key=FAILURE_DRILL, partitions_def=DRILL_PARTITIONS, group_name=DRILL_GROUP, kinds={"python", "slurm", "ray"})
def failure_drill(context: dg.AssetExecutionContext, config: DrillConfig, storage: StorageResource) -> dg.MaterializeResult:
    """A failure drill: a real fault injected into a real run, and how the platform recovered.

    Each partition is a drill, `<scenario>@<backend>-<workload>`: a scenario (preemption with or without notice, a torn checkpoint, the
    loss of a pool, a straggler, an unhealthy node; for a gang: a lost node, one slow rank, a
    node failing qualification) against a target (backend and workload: Cell pretraining, on
    one process or as a gang of 2 nodes, a Robotics rollout sweep, Robotics policy training), one
    partition for each pair that applies. The drill runs the
    workload once uninterrupted, then again with the fault, through the same placement,
    backends, monitor and ledger as every lane step, on small pools of its own.

    Metadata: seconds from the fault to detection, containment, a replacement running and
    the work resumed; the work redone against the bound the checkpoint cadence promises;
    goodput against the Young/Daly optimum; and whether the end state (final checkpoint or
    episode set) is identical to the uninterrupted run's. `sinewgrid drill` runs every
    partition and writes docs/drills.md; Slurm targets need the cluster it starts.
    """
    scenario, target = split_partition_key(context.partition_key)
    backend, workload_name = target.split("-", 1)
    if config.size not in SIZES:
        raise dg.Failure(f"size must be one of {', '.join(SIZES)}, got {config.size!r}")
    if workload_name not in SCENARIOS[scenario].workloads:
        raise dg.Failure(f"{SCENARIOS[scenario].title} does not apply to {workload_name}; it applies to {', '.join(SCENARIOS[scenario].workloads)}")
    gang = SCENARIOS[scenario].gang
    cluster = runner.ACTIVE_CLUSTERS.get(f"{backend}-gang" if gang and backend == "slurm" else backend)
    if backend != "local" and cluster is None:
        raise dg.Failure(
            f"{backend} drills need a cluster to fault: run them with `sinewgrid drill --backend {backend}`, which starts one on this machine "
            "(Slurm: a single-node cluster, and one of 3 nodes in network namespaces for the gang scenarios; Ray: a head and 3 worker nodes)."
        )
    root = drill_root(storage)
    catalog, pools = drill_catalog(root, backend, cluster, gang=gang)
    setup = DrillSetup(storage_root=storage.root, drill_root=root, backend=backend, catalog=catalog, pools=pools, cluster=cluster)
    result = run_scenario(context, setup, scenario, workload_name, config.size)
    out = root / "results" / f"{scenario}--{target}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_json(), indent=2, default=str))
    t = result.timings
    return dg.MaterializeResult(
        metadata={
            "scenario": result.title,
            "fault": result.fault,
            "recovered": result.recovered,
            "identical_end_state": result.identical,
            "detect_seconds": dg.MetadataValue.float(t.detect if t.detect is not None else float("nan")),
            "contain_seconds": dg.MetadataValue.float(t.contain if t.contain is not None else float("nan")),
            "replace_seconds": dg.MetadataValue.float(t.replace if t.replace is not None else float("nan")),
            "resume_seconds": dg.MetadataValue.float(t.resume if t.resume is not None else float("nan")),
            f"{result.unit}_redone": result.work_lost,
            f"{result.unit}_redone_bound": result.loss_bound,
            "goodput": dg.MetadataValue.float(result.goodput),
            "young_daly_optimum_goodput": dg.MetadataValue.float(result.optimum_goodput),
            "what_the_platform_did": result.action,
            "lost_seconds_by_cause": dg.MetadataValue.json(result.ledger_causes),
            "attempts": dg.MetadataValue.md(_attempts_markdown(result.attempts, result.fault_at)),
            "result_json": dg.MetadataValue.path(str(out)),
        }
    )


def _attempts_markdown(attempts: list[dict], fault_at: float) -> str:
    def since(value) -> str:
        return f"{value - fault_at:+.2f}" if isinstance(value, int | float) else "—"

    lines = ["| attempt | pool | outcome | cause | running (s from fault) | resumed at step | ended | flags |", "|---|---|---|---|---|---|---|---|"]
    for a in attempts:
        lines.append(
            f"| {a['attempt']} | `{a['pool']}` | {a['outcome']} | {a['cause'] or '—'} | {since(a['running_at'])} | "
            f"{a['resumed_step'] if a['resumed_step'] is not None else '—'} | {since(a['ended_at'])} | {a['flags'] or '—'} |"
        )
    return "\n".join(lines)


PREEMPTION_TRACE = dg.AssetKey(["platform", "preemption_trace"])


class TraceConfig(dg.Config):
    """Which interruption rate to replay, and how."""

    rate: str = Field("10-15%", description='A Spot Instance Advisor band ("<5%", "5-10%", "10-15%", "15-20%", ">20%") or interruptions per hour.')
    seed: int = Field(1, description="Seed of the Poisson draw: the same seed replays the same interruption times.")
    size: str = Field("small", description="Drill size: small (2400 training steps per run) or full (9000).")
    steps: int | None = Field(None, description="Training steps in each run, instead of the size's; fewer is quicker, with process start-up a larger share of each run.")
    expected_faults: float = Field(3.0, description="Interruptions an uninterrupted run would meet: the replayed rate is time-compressed to this.")


@dg.asset(key=PREEMPTION_TRACE, group_name=DRILL_GROUP, kinds={"python"})
def preemption_trace(context: dg.AssetExecutionContext, config: TraceConfig, storage: StorageResource) -> dg.MaterializeResult:
    """Checkpoint cadences under a replayed preemption trace: none, fixed, and Young/Daly.

    Interruption times are drawn from a Poisson process at the configured rate (a published
    spot interruption band, time-compressed so a short run sees `expected_faults` of them)
    and replayed as SIGKILLs (no notice) against the same Cell pretraining run three times:
    checkpointing only at the end, on the lane's fixed cadence, and on the Young/Daly interval
    the placement works out from the pool's interruption rate and the step's checkpoint cost.

    Metadata: per cadence, the interval, interruptions, wall time, measured goodput beside
    Daly's prediction, checkpoints written, work lost, and whether the final checkpoint is
    identical to an uninterrupted run's.
    """
    from drills.replay import run_trace

    root = drill_root(storage)
    setup = DrillSetup(storage_root=storage.root, drill_root=root, backend="local")
    result = run_trace(context, setup, config.rate, seed=config.seed, size=config.size, steps=config.steps, expected_faults=config.expected_faults)
    out = root / "results" / f"trace-seed{config.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_json(), indent=2, default=str))
    lines = ["| cadence | interval s | interruptions | wall s | goodput | Daly predicts | checkpoints | work lost s | identical |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result.runs:
        lines.append(
            f"| {r.cadence} | {r.interval_seconds if r.interval_seconds is not None else 'end only'} | {len(r.faults_at)} | {r.wall_seconds:.2f} | "
            f"{r.goodput:.1%} | {r.predicted_goodput:.1%} | {r.checkpoints} | {r.work_lost_seconds:.2f} | {'✓' if r.identical else '✗'} |"
        )
    return dg.MaterializeResult(
        metadata={
            "rate": result.band,
            "replayed_rate_per_hour": dg.MetadataValue.float(result.rate_per_hour),
            "checkpoint_seconds": dg.MetadataValue.float(result.checkpoint_seconds),
            "work_seconds": dg.MetadataValue.float(result.work_seconds),
            "cadences": dg.MetadataValue.md("\n".join(lines)),
            **{f"goodput_{r.cadence.replace('-', '_')}": dg.MetadataValue.float(r.goodput) for r in result.runs},
            "result_json": dg.MetadataValue.path(str(out)),
        }
    )
