"""Figure 5: dispatch overhead per backend — a step sent through the platform against the
engine's own bare submission of an empty job, in the same run, on engines started here.

For each backend:

- **platform**: `dg.materialize` of one asset whose body is `compute.run(...)` with the counting
  workload told to do zero steps — so the time is submit → workload running (interpreter, Pipes
  session, torch import) → final checkpoint → result back through Pipes → materialization.
  A fresh checkpoint lineage per repeat, so no repeat reuses an earlier result.
- **bare**: the engine's own way of running an empty job and waiting for it —
  local: `python -c pass` as a subprocess; Slurm: `sbatch --wait --wrap 'exec python -c pass'`;
  Ray: `ray job submit --address … -- python -c pass` (waits and tails the logs).
- **overhead** = platform − bare: what the platform adds on top of what the engine costs anyway.
- **cold start** (local only): the same step with `SINEWGRID_WARM_START=0`, so the workload's
  interpreter starts from nothing instead of being forked from the backend's warm forkserver.
- **qualification**: the same step with the pool's qualification pass forgotten, so the probe
  job (runtime, storage, GPUs, health check) runs before it — the cost of a pool's first step
  in each `qualify_ttl_seconds`; the steady-state platform figure excludes it.

The Slurm cluster and Ray head are the tests' own (`testbed/`), started here and stopped
after. A backend whose engine cannot start here is reported as skipped, with the reason.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class DispatchResult:
    """Seconds per empty step through the platform, and per empty job through each baseline."""

    backend: str
    platform_s: list[float] = field(default_factory=list)
    baselines: dict[str, list[float]] = field(default_factory=dict)  # label -> seconds each repeat; first = bare engine
    skipped: str | None = None

    @property
    def platform(self) -> float:
        return statistics.median(self.platform_s)

    def baseline(self, label: str | None = None) -> float:
        return statistics.median(self.baselines[label or next(iter(self.baselines))])

    @property
    def overhead(self) -> float:
        """Platform minus the engine's own bare submission of an empty job."""
        return self.platform - self.baseline()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "skipped": self.skipped}
        if not self.skipped:
            out.update(
                statistic="median",
                platform_s=self.platform,
                platform_each_s=self.platform_s,
                baselines={label: {"median_s": statistics.median(t), "each_s": t} for label, t in self.baselines.items()},
                overhead_vs_bare_s=self.overhead,
            )
        return out


CATALOG = """
pools:
  bench:
    provider: local
    region: local
    backend: {backend}
    backend_settings: {settings}
    purchasing: on_demand
    accelerator: local
    gpus_per_node: {gpus}
    price_per_gpu_hour: 1.0
"""


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _measure(
    backend: str, settings: dict[str, Any], baselines: dict[str, Callable[[], Any]], repeats: int, gpus: int = 1
) -> DispatchResult:
    import json

    from control_plane.compute.health import Qualifications
    from testbed.counting_step import counting_spec, materialize_counting
    from workload_runtime.storage import Storage

    result = DispatchResult(backend, baselines={label: [] for label in baselines})
    with tempfile.TemporaryDirectory(prefix=f"bench-dispatch-{backend}-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        pools = Path(tmp) / "pools.yaml"
        pools.write_text(CATALOG.format(backend=backend, settings=json.dumps(settings), gpus=gpus))
        spec = counting_spec(name="bench.empty", gpus=gpus, config={"steps": 0})

        def platform(i: int) -> None:
            materialize_counting(home, pools, spec, lineage=f"dispatch-{i}", log_level="ERROR")

        def unqualified(i: int = 0) -> None:
            # The pool's qualification pass forgotten: the probe job runs before the step.
            Qualifications(Storage.at(str(home))).forget("bench")
            materialize_counting(home, pools, spec, lineage=f"dispatch-cold-{time.perf_counter_ns()}", log_level="ERROR")

        def cold(i: int = 0) -> None:
            # The local backend's warm start turned off: the workload's interpreter starts from nothing.
            os.environ["SINEWGRID_WARM_START"] = "0"
            try:
                materialize_counting(home, pools, spec, lineage=f"dispatch-cold-start-{time.perf_counter_ns()}", log_level="ERROR")
            finally:
                del os.environ["SINEWGRID_WARM_START"]

        extra = {COLD: cold} if backend == "local" else {}
        baselines = {**baselines, **extra, QUALIFYING: unqualified}
        result.baselines.update({label: [] for label in (*extra, QUALIFYING)})
        platform(-1)  # warm-up: first imports, first Ray worker, Slurm's first job
        for fn in baselines.values():
            fn()
        for i in range(repeats):  # interleaved, so drift hits every column the same way
            result.platform_s.append(_timed(lambda: platform(i)))
            for label, fn in baselines.items():
                result.baselines[label].append(_timed(fn))
    return result


def _command(args: list[str], env: dict[str, str] | None = None) -> Callable[[], None]:
    def call() -> None:
        subprocess.run(args, check=True, capture_output=True, env={**os.environ, **(env or {})}, cwd=REPO_ROOT, timeout=300)

    return call


def _workload_alone(tmp: Path) -> Callable[[], None]:
    """The same empty workload run by hand (no Dagster, no engine): its own start-up cost."""
    import json

    def call() -> None:
        extras = tmp / "extras.json"
        lineage = tmp / f"alone-{time.perf_counter_ns()}"
        extras.write_text(json.dumps({"config": {"steps": 0}, "checkpoint_uri": str(lineage), "checkpoint_every_steps": 5}))
        _command([sys.executable, "-m", "testbed.counting_workload", "--extras", str(extras)])()

    return call


def _ray_api(address: str) -> Callable[[], None]:
    """An empty Ray job through the Jobs API from this process, polled every 0.1 s (no CLI start-up)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)

    def call() -> None:
        job = client.submit_job(entrypoint=f"{sys.executable} -c pass", entrypoint_resources={"pool_bench": 1})
        while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
            time.sleep(0.1)

    return call


BARE = "bare engine, empty job"
COLD = "the same step started cold (SINEWGRID_WARM_START=0: no forkserver)"
# Not a baseline but the platform's own first step on a pool in each qualification TTL: the
# probe job runs first. Platform minus it (negative) is what qualification costs that step.
QUALIFYING = "the same step on a pool not qualified yet (its probe job runs first)"


def run(repeats: int = 3) -> list[DispatchResult]:
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as tmp:
        results = [
            _measure(
                "local",
                {},
                {
                    f"{BARE} (`python -c pass`)": _command([sys.executable, "-c", "pass"]),
                    "the same workload run by hand, no Dagster": _workload_alone(Path(tmp)),
                },
                repeats,
            )
        ]

    try:
        from testbed.slurm_cluster import SlurmCluster

        cluster = SlurmCluster().start()
    except Exception as exc:  # noqa: BLE001 - reported as skipped, with the reason
        results.append(DispatchResult("slurm", skipped=f"no Slurm cluster here: {str(exc).splitlines()[0]}"))
    else:
        try:
            sbatch = ["sbatch", "--wait", "--partition=gpu", "--gres=gpu:1", "--output=/dev/null", f"--wrap=exec {sys.executable} -c pass"]
            results.append(
                _measure("slurm", {"partition": "gpu", "env": cluster.env}, {f"{BARE} (`sbatch --wait`)": _command(sbatch, cluster.env)}, repeats)
            )
        finally:
            cluster.stop()

    try:
        from testbed.ray_head import start_ray_head

        head = start_ray_head({"pool_bench": 4})
    except Exception as exc:  # noqa: BLE001
        results.append(DispatchResult("ray", skipped=f"no Ray head here: {str(exc).splitlines()[0]}"))
    else:
        try:
            ray_cli = str(Path(sys.executable).with_name("ray"))
            submit = [ray_cli, "job", "submit", f"--address={head.address}", '--entrypoint-resources={"pool_bench": 1}', "--", sys.executable, "-c", "pass"]
            results.append(
                _measure(
                    "ray",
                    {"address": head.address, "resources": {"pool_bench": 1}, "gpu_resource": None},
                    {
                        f"{BARE} (`ray job submit`)": _command(submit, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}),
                        "Jobs API from this process, polled every 0.1 s": _ray_api(head.address),
                    },
                    repeats,
                    gpus=0,
                )
            )
        finally:
            head.stop()
    return results
