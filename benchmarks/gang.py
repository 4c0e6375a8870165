"""Figure 8: gangs. How long a gang takes to start and finish through the platform against the
same ranks started by hand, and how long a gang takes to resume after it lost a node.

- **launch**: a gang of the smallest gang workload (`testbed/gang_workload.py`: the ranks meet,
  agree once, rank 0 writes a final checkpoint) as one step through the platform
  (`dg.materialize` of `compute.run`) against the same ranks started the way the engine's users
  start them: on a local pool two `torchrun` agents (`--nnodes 2`, static rendezvous); on the
  4-node Slurm test cluster (`testbed/slurm_multinode.py`, one network namespace per node)
  `srun` from the submit host across the nodes (it allocates them, runs a task on each and
  returns when they end; `sbatch --wait` would add its own polling, up to 10 s). Median of `repeats`, after one
  warm-up each, interleaved.
- **resume after a node loss**: the pretraining as a gang (local: 2 nodes × 2 ranks; Slurm:
  2 nodes × 1 rank) held at step 30, one node's ranks killed with SIGKILL; from the kill to the
  relaunched gang reporting its first step back (`Resumed`), split into detect (the kill to the
  platform seeing the attempt end), relaunch (to the new gang running) and resume (to the
  workload having loaded its sharded checkpoint and started again). One run each.

On Ray (a head and a second raylet on this machine, each on its own loopback address) the
platform's gang is a Ray job running `workload_runtime/ray_gang.py`; by hand, a Ray job whose driver
creates the placement group itself and runs each rank as a task in its bundle
(`RAY_BY_HAND` below), polled through the Jobs API every 0.1 s. The resume after a node loss
on Ray runs on a head and 3 worker nodes: the whole Ray node of rank 1 is killed, and the gang
comes back on the two left.

(No `from __future__ import annotations`: Dagster reads the asset's annotations.)
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from benchmarks.dispatch import DispatchResult
from shared_resources.compute import ComputeResource

REPO_ROOT = Path(__file__).resolve().parent.parent
GANG = "testbed.gang_workload"


def _pool(backend: str, settings: dict[str, Any], nodes: int) -> dict[str, Any]:
    return {
        "provider": "local", "region": "local", "backend": backend, "backend_settings": settings, "purchasing": "on_demand",
        "accelerator": "local", "gpus_per_node": 1, "nodes": nodes, "price_per_gpu_hour": 1.0, "qualify": False,
    }  # fmt: skip


def _step_asset(spec, timelines: list):
    @dg.asset(name="gang_step")
    def gang_step(context: dg.AssetExecutionContext, compute: ComputeResource) -> dg.MaterializeResult:
        step = compute.run(context, spec, lineage=f"gang-{time.perf_counter_ns()}")
        timelines.append(step.timeline)
        return dg.MaterializeResult(metadata=step.metadata())

    return gang_step


def _materialize(home: Path, catalog: Path, spec, timelines: list | None = None) -> None:
    result = dg.materialize(
        [_step_asset(spec, timelines if timelines is not None else [])],
        resources={"compute": ComputeResource(storage_root=str(home), pools_file=str(catalog))},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=True,
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
    )
    assert result.success


def _timed(fn: Callable[[], Any]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def _extras(folder: Path) -> Path:
    extras = folder / f"extras-{time.perf_counter_ns()}.json"
    extras.write_text(json.dumps({"config": {}, "checkpoint_uri": str(folder / f"by-hand-{time.perf_counter_ns()}")}))
    return extras


def _torchrun_by_hand(folder: Path, nodes: int) -> Callable[[], None]:
    from control_plane.compute.backends.gang import free_port

    def call() -> None:
        extras, port = _extras(folder), free_port()
        agents = [
            subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node-rank={i}", "--nproc-per-node=1",
                 "--master-addr=127.0.0.1", f"--master-port={port}", "-m", GANG, "--extras", str(extras)],
                cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            for i in range(nodes)
        ]  # fmt: skip
        codes = [a.wait(timeout=300) for a in agents]
        assert codes == [0] * nodes, codes

    return call


def _srun_by_hand(folder: Path, cluster, nodes: int) -> Callable[[], None]:
    """`srun` from the submit host, as a user runs a gang by hand: it allocates the nodes, starts
    a task on each, and returns when they end; each task finds rank 0's node itself."""
    rendezvous = (
        'export MASTER_ADDR=$(scontrol show node -o "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)" '
        '| tr " " "\\n" | sed -n "s/^NodeAddr=//p"); export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)); '
    )

    def call() -> None:
        command = f"{rendezvous}exec {sys.executable} -m {GANG} --extras {_extras(folder)}"
        subprocess.run(
            ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", f"--chdir={REPO_ROOT}", "bash", "-c", command],
            check=True, capture_output=True, env={**os.environ, **cluster.env}, timeout=300,
        )  # fmt: skip

    return call


# What a Ray user writes by hand to run the same ranks: a placement group of one bundle per node,
# a task per rank in its bundle, each running the workload with its rank.
RAY_BY_HAND = """
import os, subprocess, sys, ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(address="auto", log_to_driver=False)
nodes, command = int(sys.argv[1]), sys.argv[2:]
pg = placement_group([{"CPU": 1}] * nodes, strategy="STRICT_SPREAD")
ray.get(pg.ready())
@ray.remote(num_cpus=1)
def where():
    return ray.util.get_node_ip_address()
@ray.remote(num_cpus=1)
def rank(i, addr):
    env = {**os.environ, "RANK": str(i), "WORLD_SIZE": str(nodes), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "GROUP_RANK": str(i), "MASTER_ADDR": addr, "MASTER_PORT": "29611"}
    return subprocess.run(command, env=env).returncode
on = lambda i: PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
addr = ray.get(where.options(scheduling_strategy=on(0)).remote())
codes = ray.get([rank.options(scheduling_strategy=on(i)).remote(i, addr) for i in range(nodes)])
sys.exit(max(codes))
"""


def _ray_by_hand(folder: Path, head, nodes: int) -> Callable[[], None]:
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(head.address)
    script = folder / "ray_by_hand.py"
    script.write_text(RAY_BY_HAND)

    def call() -> None:
        entrypoint = f"cd {REPO_ROOT} && {sys.executable} {script} {nodes} {sys.executable} -m {GANG} --extras {_extras(folder)}"
        job = client.submit_job(entrypoint=entrypoint, entrypoint_resources={"pool_bench": 1})
        while (status := client.get_job_status(job)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
            time.sleep(0.1)
        assert status is JobStatus.SUCCEEDED, client.get_job_logs(job)[-2000:]

    return call


def _launch(name: str, home: Path, catalog: Path, spec, by_hand: dict[str, Callable[[], None]], repeats: int) -> DispatchResult:
    result = DispatchResult(name, baselines={label: [] for label in by_hand})
    platform = lambda: _materialize(home, catalog, spec)
    platform()
    for fn in by_hand.values():
        fn()
    for _ in range(repeats):
        result.platform_s.append(_timed(platform))
        for label, fn in by_hand.items():
            result.baselines[label].append(_timed(fn))
    return result


def _resume_after_node_loss(name: str, home: Path, catalog: Path, spec, kill: Callable[[Path], None], dataset_uri: str) -> dict[str, Any]:
    """One gang of the pretraining, one node killed when it holds at step 30: the seconds from
    the kill to the relaunched gang's first step back, and their split."""
    from drills.faults import Injector
    from workload_runtime.inputs import Failpoint

    marker = home.parent / f"held-{name}.json"
    failpoint = Failpoint(kind="hold", at_step=30, marker=str(marker))
    injector = Injector(lambda: kill(home), failpoint, release=False)
    injector.start()
    timelines: list = []
    try:
        _materialize(home, catalog, spec.model_copy(update={"failpoint": failpoint}), timelines)
    finally:
        injector.cancelled.set()
    lost, resumed = timelines[-1][0], timelines[-1][1]
    fault = injector.fault_at or 0.0
    return {
        "backend": name,
        "kill_to_first_step_s": resumed["resumed_at"] - fault,
        "detect_s": lost["ended_at"] - fault,
        "relaunch_s": resumed["running_at"] - lost["ended_at"],
        "resume_s": resumed["resumed_at"] - resumed["running_at"],
        "resumed_step": resumed["resumed_step"],
        "cause": str(lost.get("cause", "")),
    }


def run(repeats: int = 3) -> dict[str, Any]:
    import pandas as pd

    from cell_lane.omics import join_labels, load_reference_expression, publish_dataset
    from control_plane.catalog.step_spec import StepSpec
    from control_plane.compute.backends.gang import kill_node

    launches: list[DispatchResult] = []
    resumes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-gang-") as tmp:
        folder = Path(tmp)
        dataset_uri, _ = publish_dataset(join_labels(load_reference_expression(), pd.DataFrame()), str(folder / "omics"))
        probe = StepSpec(name="bench.gang", entry_point=GANG, tenant="bench", gpus=0, nodes=2, ranks_per_node=1, imports=["numpy"])
        pretrain = StepSpec(
            name="bench.pretrain", entry_point="cell_lane.workloads.pretrain", tenant="bench", gpus=0, nodes=2, ranks_per_node=2,
            checkpoint_every_steps=20, config={"dataset_uri": dataset_uri, "steps": 60, "seed": 3},
        )  # fmt: skip

        catalog = folder / "local.yaml"
        catalog.write_text(yaml.safe_dump({"pools": {"bench": _pool("local", {}, nodes=3)}}))
        os.environ.setdefault("SINEWGRID_SLOTS_DIR", str(folder / "slots"))
        launches.append(_launch("local (2 nodes × 1 rank)", folder / "home-local", catalog, probe, {"two `torchrun` agents by hand": _torchrun_by_hand(folder, 2)}, repeats))

        def kill_local(home: Path) -> None:
            from control_plane.compute.inflight import InFlight
            from workload_runtime.storage import Storage

            (record,) = InFlight(Storage.at(str(home))).records()
            kill_node(record["handle"]["info"]["nodes"][1][0])

        resumes.append(_resume_after_node_loss("local (2 × 2)", folder / "home-local-resume", catalog, pretrain, kill_local, dataset_uri))

        try:
            from testbed.slurm_multinode import PARTITION, MultiNodeSlurmCluster

            cluster = MultiNodeSlurmCluster(nodes=4).start()
        except Exception as exc:  # noqa: BLE001 - reported as skipped, with the reason
            launches.append(DispatchResult("slurm", skipped=f"no multi-node Slurm cluster here: {str(exc).splitlines()[0]}"))
        else:
            try:
                slurm_catalog = folder / "slurm.yaml"
                pool = _pool("slurm", {"partition": PARTITION, "env": cluster.env, "time_limit": "00:10:00"}, nodes=4)
                slurm_catalog.write_text(yaml.safe_dump({"pools": {"bench": pool}}))
                launches.append(
                    _launch("slurm (2 nodes × 1 rank, 4-node cluster)", folder / "home-slurm", slurm_catalog, probe, {"`srun` across the nodes by hand": _srun_by_hand(folder, cluster, 2)}, repeats)
                )

                def kill_slurm(home: Path) -> None:
                    for node in ("sgn1",):
                        for pid in cluster.node_pids(node):
                            if Path(f"/proc/{pid}/comm").read_text().strip().startswith("python"):
                                os.kill(pid, signal.SIGKILL)

                slurm_pretrain = pretrain.model_copy(update={"ranks_per_node": 1})
                resumes.append(_resume_after_node_loss("slurm (2 × 1)", folder / "home-slurm-resume", slurm_catalog, slurm_pretrain, kill_slurm, dataset_uri))
            finally:
                cluster.stop()
        try:
            from testbed.ray_head import add_worker_node, start_ray_head

            head = start_ray_head({"pool_bench": 1}, num_cpus=2, ip="127.0.0.2")
        except Exception as exc:  # noqa: BLE001 - reported as skipped, with the reason
            launches.append(DispatchResult("ray", skipped=f"no Ray cluster here: {str(exc).splitlines()[0]}"))
        else:
            try:
                add_worker_node(head, num_cpus=2)
                ray_catalog = folder / "ray.yaml"
                settings = {"address": head.address, "resources": {"pool_bench": 1}, "gpu_resource": None}
                ray_catalog.write_text(yaml.safe_dump({"pools": {"bench": _pool("ray", settings, nodes=2)}}))
                launches.append(
                    _launch("ray (2 nodes × 1 rank, 2-node cluster)", folder / "home-ray", ray_catalog, probe, {"a placement group and a task per rank, by hand": _ray_by_hand(folder, head, 2)}, repeats)
                )
            finally:
                head.stop()
        try:
            from testbed.ray_head import start_ray_nodes

            ray_nodes = start_ray_nodes(workers=3)
        except Exception:  # noqa: BLE001 - the launch row already says why Ray is missing
            ray_nodes = None
        if ray_nodes is not None:
            try:
                ray3_catalog = folder / "ray3.yaml"
                settings = {"address": ray_nodes.address, "resources": ray_nodes.entry_resources, "gpu_resource": None}
                ray3_catalog.write_text(yaml.safe_dump({"pools": {"bench": _pool("ray", settings, nodes=3)}}))

                def kill_ray(home: Path) -> None:  # the whole Ray node of rank 1
                    from drills.faults import rank_process

                    _, node = rank_process(1, "cell_lane.workloads.pretrain")
                    ray_nodes.kill_node(node)

                ray_pretrain = pretrain.model_copy(update={"ranks_per_node": 1})
                resumes.append(_resume_after_node_loss("ray (2 × 1, 3 worker nodes)", folder / "home-ray-resume", ray3_catalog, ray_pretrain, kill_ray, dataset_uri))
            finally:
                ray_nodes.stop()
    return {"launch": launches, "resume": resumes}


if __name__ == "__main__":
    out = run(repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    for r in out["launch"]:
        print(r.to_dict())
    for r in out["resume"]:
        print(r)
