"""What a drill can do: its scenarios, the backends they run on, and the small pools they run on.

`SCENARIOS` is the drill matrix's first axis (`sinewgrid drill --scenario`); `drill_catalog`
writes the pool catalog of one drill: two or three small pools, the first of which the fault
hits. A gang scenario's first pool has one node more than the gang: its spare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from drills import faults

BACKENDS = ("local", "slurm", "ray")


GANG_BACKENDS = ("local", "slurm", "ray")
GANG_NODES = 2  # the gang drills' size: 2 nodes × 1 rank (workload `pretrain-gang`)
GANG_ENTRY_POINT = "cell_lane.workloads.pretrain"


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    fault: str  # what is injected, in words
    notice: bool  # the workload gets to checkpoint before it goes
    workloads: tuple[str, ...]  # the workloads it makes sense for
    on_straggler: str = "report"
    gang: bool = False  # faults one node of a gang (workload `pretrain-gang`, pools with spare nodes)
    backends: tuple[str, ...] = ("local", "slurm")


SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in (
        Scenario("preempt-notice", "Preemption with notice", "SIGTERM to the workload mid-run (a spot reclaim notice)", True, ("pretrain", "rollouts", "policy")),
        Scenario("preempt-no-notice", "Preemption without notice", "SIGKILL of the workload mid-step (the node is gone)", False, ("pretrain", "rollouts", "policy")),
        Scenario("torn-checkpoint", "Torn checkpoint", "the workload dies (SIGKILL) while writing a checkpoint: tensors written, manifest not", False, ("pretrain", "policy")),
        Scenario("pool-loss", "Pool loss mid-run", "the pool stops taking work (local: every slot taken; Slurm: partition INACTIVE) and its running job is killed", False, ("pretrain", "rollouts", "policy")),
        Scenario("straggler", "Straggler", "the workload's node slows to a twentieth of its speed (SIGSTOP/SIGCONT duty cycle)", True, ("pretrain", "policy"), on_straggler="replace"),
        Scenario("unhealthy-node", "Unhealthy node", "the node fails its health check mid-run (local: the pool's health check fails; Slurm: the node is drained, as NHC does)", True, ("pretrain", "rollouts", "policy")),
        Scenario(
            "node-loss", "Node loss in a gang", "one node of a 2-node gang dies mid-step with its rank (local: its torchrun agent and rank; Slurm: every process of the job on it; Ray: the whole Ray node)",
            False, ("pretrain-gang",), gang=True, backends=GANG_BACKENDS,
        ),
        Scenario(
            "slow-rank", "One slow rank",
            "one rank's node computes at a fiftieth of its speed (a cgroup CPU quota); its peer waits for it in every all-reduce. "
            "Stopped, the slow rank may not reach its checkpoint within the engine's grace period, so the bound is one interval",
            False, ("pretrain-gang",), on_straggler="replace", gang=True, backends=GANG_BACKENDS,
        ),
        Scenario(
            "node-unqualified", "A node fails qualification", "the health check of the node that would host rank 1 fails just before the gang starts (the pool's qualification is due)",
            True, ("pretrain-gang",), gang=True, backends=GANG_BACKENDS,
        ),
    )
}


@dataclass
class DrillSetup:
    """Where a drill runs: its root, its pool catalog and (for Slurm) the cluster."""

    storage_root: str
    drill_root: Path
    backend: str
    catalog: Path | None = None  # None: the drill writes its own (the preemption trace does)
    pools: list[str] = field(default_factory=list)  # placement order: the first pool, its peer, (the fallback)
    cluster: Any = None


def drill_catalog(drill_root: Path, backend: str, cluster=None, gang: bool = False) -> tuple[Path, list[str]]:
    """Small pools for the drill, ranked by price: the pool the fault hits first, then its peer.

    Cool-downs are 0 so that after a plain preemption the step resumes on the same pool
    (as a spot pool that gets capacity back does); a pool that goes bad is drained instead.
    A gang drill's first pool has one node more than the gang (its spare); the second is a
    local pool the gang moves to only when the first has no spare left.
    """
    def local(name: str, price: float, nodes: int = 1) -> dict[str, Any]:
        return {
            "provider": "drill", "region": "local", "backend": "local", "purchasing": "spot" if price < 2 else "on_demand",
            "accelerator": "local", "gpus_per_node": 1, "nodes": nodes, "price_per_gpu_hour": price, "max_concurrent_steps": 1,
            "cooldown_seconds": 0, "drain_seconds": 600, "health_check_interval_seconds": 0.5,
            "health_check": faults.health_check_for(drill_root, name),
        }

    def engine(name: str, kind: str, settings: dict[str, Any], nodes: int) -> dict[str, Any]:
        return {
            "provider": "drill", "region": "local", "backend": kind, "backend_settings": settings, "purchasing": "reserved",
            "accelerator": "local", "gpus_per_node": 1, "nodes": nodes, "price_per_gpu_hour": 1.0, "cooldown_seconds": 0,
            "drain_seconds": 600, "health_check_interval_seconds": 0.5, "health_check": faults.health_check_for(drill_root, name),
        }

    if backend not in BACKENDS:
        raise ValueError(f"unknown drill backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend != "local" and cluster is None:
        raise ValueError(f"a {backend} drill needs a cluster: `sinewgrid drill --backend {backend}` starts one")
    if gang:
        spare = GANG_NODES + 1
        if backend == "local":
            pools = {"drill-gang-a": local("drill-gang-a", 1.0, spare)}
        elif backend == "slurm":
            settings = {"partition": cluster.partitions[0], "env": cluster.env, "time_limit": "00:20:00"}
            pools = {"drill-gang-slurm": engine("drill-gang-slurm", "slurm", settings, len(cluster.nodes))}
        else:
            settings = {"address": cluster.address, "resources": dict(cluster.entry_resources), "gpu_resource": None}
            pools = {"drill-gang-ray": engine("drill-gang-ray", "ray", settings, len(cluster.workers))}
        pools["drill-gang-b"] = local("drill-gang-b", 3.0, GANG_NODES)  # where the gang goes when the first pool has no spare
    elif backend == "local":
        pools = {"drill-local-a": local("drill-local-a", 1.0), "drill-local-b": local("drill-local-b", 2.0)}
    elif backend == "slurm":
        pools = {}
        for partition, price in (("spot", 1.0), ("gpu", 2.0)):
            pools[f"drill-slurm-{partition}"] = {
                "provider": "drill", "region": "local", "backend": "slurm",
                "backend_settings": {"partition": partition, "env": cluster.env, "time_limit": "00:20:00"},
                "purchasing": "spot" if partition == "spot" else "on_demand", "accelerator": "local", "gpus_per_node": 2,
                "price_per_gpu_hour": price, "cooldown_seconds": 0, "drain_seconds": 600, "health_check_interval_seconds": 0.5,
            }
        pools["drill-local-b"] = local("drill-local-b", 3.0)  # where a step goes when the whole cluster is out
    else:
        raise ValueError("Ray drills are the gang scenarios (node-loss, slow-rank, node-unqualified)")
    path = drill_root / f"pools-{backend}{'-gang' if gang else ''}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"pools": pools}, sort_keys=False))
    return path, list(pools)
