"""Pool health: qualification before a step lands, drains when a pool goes bad.

- **Qualification.** Before an attempt is submitted to a pool, the backend says whether the
  pool can take work (Slurm: its partition is up and has a node that is not drained), and a
  probe job (`workload_runtime.probe`, run on the pool like any step, in the step's runtime)
  checks that the runtime starts and imports the modules the step needs (`StepSpec.imports`:
  torch and safetensors for training), the storage root is reachable from the node, the GPUs
  answer where the pool has GPUs, and the pool's own `health_check` command passes. A pass is
  remembered for the pool's `qualify_ttl_seconds` under `state/health/qualified/`, per set of
  modules imported: a step that needs other modules qualifies the pool for those.
- **Drains.** A pool that fails qualification, whose node fails its health check during a
  step, or that ran a straggler whose policy is `replace`, is drained: no step is placed on
  it for its `drain_seconds`, or until `sinewgrid pools undrain POOL`. Drains live under
  `state/health/drained/`, so every orchestrator process sees them.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from typing import Any

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from workload_runtime.storage import Storage, exists, fs_for, glob_uris, read_json, write_json_atomic

PROBE_ENTRY_POINT = "workload_runtime.probe"


@dataclass(frozen=True)
class Drain:
    pool: str
    since: float
    until: float
    reason: str

    @property
    def remaining_seconds(self) -> float:
        return max(0.0, self.until - time.time())


class Drains:
    """Pools taken out of placement until an operator (or time) puts them back."""

    def __init__(self, storage: Storage):
        self.storage = storage

    def _uri(self, pool: str) -> str:
        return self.storage.uri("state", "health", "drained", f"{pool}.json")

    def drain(self, pool: Pool, reason: str) -> Drain:
        now = time.time()
        drain = Drain(pool.name, now, now + pool.drain_seconds, reason)
        write_json_atomic(self._uri(pool.name), {"pool": pool.name, "since": now, "until": drain.until, "reason": reason})
        Qualifications(self.storage).forget(pool.name)
        return drain

    def active(self, pool: str) -> Drain | None:
        uri = self._uri(pool)
        if not exists(uri):
            return None
        doc = read_json(uri)
        drain = Drain(pool, float(doc["since"]), float(doc["until"]), str(doc["reason"]))
        return drain if drain.remaining_seconds > 0 else None

    def undrain(self, pool: str) -> bool:
        """Put a pool back in service. False when it was not drained."""
        fs, path = fs_for(self._uri(pool))
        if not fs.exists(path):
            return False
        fs.rm_file(path)
        return True

    def all(self) -> list[Drain]:
        pools = (read_json(uri)["pool"] for uri in glob_uris(self.storage.uri("state", "health", "drained", "*.json")))
        return [drain for pool in pools if (drain := self.active(pool)) is not None]


class Qualifications:
    """Recent qualification passes, one per pool, runtime and set of modules imported: steps
    that need different modules on one pool each keep their own pass."""

    def __init__(self, storage: Storage):
        self.storage = storage

    def _uri(self, pool: str, runtime: str, imports: list[str]) -> str:
        modules = "+".join(sorted(set(imports))) or "none"
        return self.storage.uri("state", "health", "qualified", f"{pool}--{runtime}--{modules}.json")

    def fresh(self, pool: Pool, runtime: str, imports: list[str]) -> dict[str, Any] | None:
        """The pool's pass in `runtime` for these modules, if it is recent."""
        uri = self._uri(pool.name, runtime, imports)
        if not exists(uri):
            return None
        doc = read_json(uri)
        return doc if time.time() - float(doc["at"]) < pool.qualify_ttl_seconds else None

    def record(self, pool: Pool, runtime: str, imports: list[str], checks: dict[str, Any]) -> None:
        doc = {"pool": pool.name, "runtime": runtime, "imports": sorted(set(imports)), "at": time.time(), "checks": checks}
        write_json_atomic(self._uri(pool.name, runtime, imports), doc)

    def forget(self, pool: str) -> None:
        for uri in glob_uris(self.storage.uri("state", "health", "qualified", f"{pool}--*.json")):
            fs, path = fs_for(uri)
            fs.rm_file(path)


def run_health_check(pool: Pool, timeout_seconds: float = 60.0) -> str | None:
    """Run the pool's `health_check` command here; None when it passes (or there is none),
    else the problem in words with the command's own output."""
    if not pool.health_check:
        return None
    command = " ".join(pool.health_check)
    try:
        result = subprocess.run(pool.health_check, capture_output=True, text=True, timeout=timeout_seconds)
    except FileNotFoundError:
        return f"health check `{command}` of pool {pool.name} cannot start: {pool.health_check[0]} not found (fix `health_check` in the pool catalog)"
    except subprocess.TimeoutExpired:
        return f"health check `{command}` of pool {pool.name} did not answer within {timeout_seconds:g}s"
    if result.returncode != 0:
        said = " ".join((result.stdout + result.stderr).split())[-300:]
        return f"health check `{command}` failed with exit {result.returncode}{': ' + said if said else ''}"
    return None


def probe_spec(spec: StepSpec, pool: Pool) -> StepSpec:
    """The probe that qualifies `pool` for `spec`: same runtime and GPUs, a moment's work.

    A gang's probe is itself a gang of one rank per node, on the nodes the gang would get
    (without those it no longer uses): each node checks itself, so a sick node is named and
    replaced before the gang starts, not found by a gang that cannot train."""
    return StepSpec(
        name=f"{spec.name}.qualify",
        entry_point=PROBE_ENTRY_POINT,
        tenant=spec.tenant,
        runtime=spec.runtime,
        gpus=spec.gpus,
        nodes=spec.nodes if spec.gang else 1,
        exclude_nodes=list(spec.exclude_nodes) if spec.gang else [],
        checkpoints=False,
        expected_hours=0.01,
        max_preemptions=0,
        config={
            "pool": pool.name,
            "gpus": (spec.gpus // (spec.nodes if spec.gang else 1)) if pool.accelerator not in ("local", "cpu") else 0,
            "imports": list(spec.imports),
            "health_check": list(pool.health_check),
        },
    )
