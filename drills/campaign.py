"""`sinewgrid drill`: run the drill matrix as Dagster runs, then publish the report.

Every scenario × backend × workload that applies is one partition of `platform/failure_drill`,
materialized on the same Dagster instance the UI shows; the preemption trace is
`platform/preemption_trace`. A Slurm backend gets a throwaway single-node cluster
(`testbed.slurm_cluster`) for the length of the campaign, and the gang scenarios a 3-node one
(`testbed.slurm_multinode`); a Ray backend gets a head and 3 worker nodes (`testbed.ray_head`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from contextlib import contextmanager, nullcontext
from pathlib import Path

import dagster as dg

from drills import runner
from drills.model import DrillResult, Timings, TraceResult, TraceRun
from drills.report import write_report
from drills.runner import BACKENDS, SCENARIOS
from drills.workloads import WORKLOADS
from control_plane.settings import child_env
from control_plane.signals import sigterm_kept


def matrix(backends: list[str], scenarios: list[str], workloads: list[str]) -> list[tuple[str, str, str]]:
    """(scenario, backend, workload) for every combination that applies, in report order."""
    for name, known in (("backend", BACKENDS), ("scenario", list(SCENARIOS)), ("workload", WORKLOADS)):
        chosen = {"backend": backends, "scenario": scenarios, "workload": workloads}[name]
        unknown = [c for c in chosen if c not in known]
        if unknown:
            raise ValueError(f"unknown {name} {', '.join(unknown)}; choose from {', '.join(known)}")
    return [(s, b, w) for s in scenarios for b in backends for w in workloads if w in SCENARIOS[s].workloads and b in SCENARIOS[s].backends]


def partition_key(scenario: str, backend: str, workload: str) -> str:
    """The `platform/failure_drill` partition of one drill: `<scenario>@<backend>-<workload>`."""
    return f"{scenario}@{backend}-{workload}"


def split_partition_key(key: str) -> tuple[str, str]:
    """`<scenario>@<target>` -> (scenario, target)."""
    scenario, sep, target = key.partition("@")
    if not (sep and scenario and target):
        raise ValueError(f"drill partition {key!r} is not <scenario>@<backend>-<workload>")
    return scenario, target


def partition_keys() -> list[str]:
    """A partition per drill that applies (scenario × backend × workload), none for one that does not."""
    return [partition_key(*drill) for drill in matrix(list(BACKENDS), list(SCENARIOS), list(WORKLOADS))]


@contextmanager
def registered(key: str, cluster: object) -> Iterator[None]:
    """`cluster` is the one the drill asset faults for `key` while the context lasts."""
    runner.ACTIVE_CLUSTERS[key] = cluster
    try:
        yield
    finally:
        runner.ACTIVE_CLUSTERS.pop(key, None)


@contextmanager
def slurm_cluster() -> Iterator[object]:
    """A single-node Slurm cluster for the campaign, registered for the drill asset."""
    from testbed.slurm_cluster import SlurmCluster

    missing = [d for d in ("munged", "slurmctld", "slurmd") if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        raise RuntimeError(f"Slurm drills need {', '.join(missing)}: install them with `make slurm-packages` (Debian packages slurmctld slurmd munge)")
    with SlurmCluster() as cluster, registered("slurm", cluster):
        yield cluster


@contextmanager
def gang_slurm_cluster() -> Iterator[object]:
    """A Slurm cluster of 3 nodes, each in a network namespace of its own, for the gang scenarios."""
    from testbed.slurm_multinode import MultiNodeSlurmCluster

    with MultiNodeSlurmCluster(nodes=3) as cluster, registered("slurm-gang", cluster):
        yield cluster


@contextmanager
def ray_cluster() -> Iterator[object]:
    """A Ray cluster on this machine: a head and 3 worker nodes, for the gang scenarios."""
    from testbed.ray_head import start_ray_nodes

    cluster = start_ray_nodes(workers=3)
    try:
        with registered("ray", cluster):
            yield cluster
    finally:
        cluster.stop()


def cluster_for(backend: str, gang: bool):
    """The engine a backend's drills need, started for them (nothing for local)."""
    if backend == "slurm":
        return gang_slurm_cluster() if gang else slurm_cluster()
    if backend == "ray":
        return ray_cluster()
    return nullcontext()


def environment() -> str:
    """The machine the figures were measured on, in one line."""
    try:
        # `--version` needs a configuration to read; any cluster's will do (SLURM_CONF or the campaign's).
        cluster = runner.ACTIVE_CLUSTERS.get("slurm") or runner.ACTIVE_CLUSTERS.get("slurm-gang")
        env = child_env(cluster.env if cluster is not None else {})
        slurm = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=10, env=env).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        slurm = ""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU only)"
    return f"{platform.node()}: {os.cpu_count()} cores, {gpu}, Python {platform.python_version()}, torch {torch.__version__}, {slurm or 'Slurm not running'}"


@dataclass(frozen=True)
class DrillAssets:
    """The platform location's drill assets and the folder they keep their files in. The caller
    passes them in: drills/ imports no code location."""

    failure_drill: dg.AssetsDefinition
    preemption_trace: dg.AssetsDefinition
    root: Path


def run_campaign(
    *,
    assets: DrillAssets,
    instance: dg.DagsterInstance,
    storage_root: str,
    backends: list[str],
    scenarios: list[str],
    workloads: list[str],
    size: str,
    trace_rate: str | None,
    trace_seeds: list[int],
    out_dir: Path,
    docs_path: Path | None,
    command: str,
    say: Callable[[str], None] = print,
) -> tuple[list[DrillResult], list[TraceResult], dict]:
    from shared_resources.resources import platform_resources

    plan = matrix(backends, scenarios, workloads)
    resources = platform_resources(root=storage_root)
    failure_drill, preemption_trace, root = assets.failure_drill, assets.preemption_trace, assets.root
    results: list[DrillResult] = []
    traces: list[TraceResult] = []
    machine = environment()
    for backend, gang in ((b, g) for b in backends for g in (False, True)):
        todo = [(s, w) for s, b, w in plan if b == backend and SCENARIOS[s].gang == gang]
        if not todo:
            continue
        with cluster_for(backend, gang):
            if backend == "slurm":
                machine = environment()  # with the cluster up, Slurm can say its version
            for scenario, name in todo:
                key = partition_key(scenario, backend, name)
                say(f"{SCENARIOS[scenario].title} · {backend} · {name} …")
                with sigterm_kept():
                    outcome = dg.materialize(
                        [failure_drill], partition_key=key, instance=instance, resources=resources, raise_on_error=False,
                        run_config={"ops": {"platform__failure_drill": {"config": {"size": size}}}},
                    )
                path = root / "results" / f"{scenario}--{backend}-{name}.json"
                if not outcome.success or not path.exists():
                    errors = [e.step_failure_data.error.message.strip().splitlines()[-1] for e in outcome.all_events if e.is_step_failure and e.step_failure_data.error]
                    say(f"  failed (run {outcome.run_id}): {errors[-1] if errors else 'see the run in the UI'}")
                    continue
                result = load_result(path)
                results.append(result)
                t = result.timings
                say(
                    f"  detect {_s(t.detect)} · contain {_s(t.contain)} · replace {_s(t.replace)} · resume {_s(t.resume)} · "
                    f"{result.unit} redone {result.work_lost}/{result.loss_bound} · identical {'yes' if result.identical else 'NO'}"
                    + ("" if result.reacted else " · THE PLATFORM NEVER REACTED")
                )
    for seed in trace_seeds if trace_rate else []:
        say(f"Preemption trace at {trace_rate}, seed {seed} · local · pretrain (three cadences) …")
        with sigterm_kept():
            outcome = dg.materialize(
                [preemption_trace], instance=instance, resources=resources, raise_on_error=False,
                run_config={"ops": {"platform__preemption_trace": {"config": {"rate": trace_rate, "seed": seed, "size": size}}}},
            )
        path = root / "results" / f"trace-seed{seed}.json"
        if not outcome.success or not path.exists():
            say(f"  failed (run {outcome.run_id}); see the run in the UI")
            continue
        trace = load_trace(path)
        traces.append(trace)
        for r in trace.runs:
            say(f"  {r.cadence}: goodput {r.goodput:.1%} (Daly predicts {r.predicted_goodput:.1%}), {len(r.faults_at)} interruptions, identical {'yes' if r.identical else 'NO'}")
    written = write_report(results, traces, out_dir, docs_path, command=command, environment=machine)
    return results, traces, written


def load_trace(path: Path) -> TraceResult:
    data = json.loads(path.read_text())
    return TraceResult(**{**data, "runs": [TraceRun(**r) for r in data["runs"]]})


def load_result(path: Path) -> DrillResult:
    data = json.loads(path.read_text())
    for derived in ("within_bound", "reacted", "passed"):
        data.pop(derived, None)
    data["timings"] = Timings(**data["timings"])
    return DrillResult(**data)


def _s(value: float | None) -> str:
    return f"{value:.2f}s" if value is not None else "—"
