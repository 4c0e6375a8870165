"""The qualification probe: run on a pool before a step lands there (see `health.py`).

Checks, on the node and in the step's runtime: the runtime starts and imports what the
workloads need; the storage root is reachable (an object is written, read back and
removed under `state/probes/`); the GPUs answer (a small matrix product on each) when the
pool has GPUs; the pool's `health_check` command passes. Reports each check through Pipes
and exits 1 with the first problem, in words.
"""

from __future__ import annotations

import importlib
import platform
import posixpath
import subprocess
import sys
import time
import uuid
from typing import Any

from dagster_pipes import open_dagster_pipes

from workload_runtime.inputs import WorkloadInputs
from workload_runtime.messages import Qualified
from workload_runtime.node_env import node_env


def _check_imports(modules: list[str]) -> str:
    versions = []
    for name in modules:
        module = importlib.import_module(name)
        versions.append(f"{name} {getattr(module, '__version__', '?')}")
    return f"Python {platform.python_version()}" + (f", {', '.join(versions)}" if versions else "")


def _check_storage(root: str, pool: str) -> str:
    from workload_runtime.storage import fs_for, read_bytes, write_bytes_atomic

    uri = posixpath.join(root.rstrip("/"), "state", "probes", pool, f"{uuid.uuid4().hex}.txt")
    payload = f"probe {time.time()}".encode()
    began = time.monotonic()
    write_bytes_atomic(uri, payload)
    if read_bytes(uri) != payload:
        raise RuntimeError(f"read back something else than was written at {uri}")
    fs, path = fs_for(uri)
    fs.rm_file(path)  # the probe's own object
    return f"{root} round trip {1000 * (time.monotonic() - began):.0f} ms"


def _check_gpus(expected: int) -> str:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"the pool sells {expected} GPU(s) per step but CUDA sees none (driver, CUDA_VISIBLE_DEVICES?)")
    count = torch.cuda.device_count()
    if count < expected:
        raise RuntimeError(f"CUDA sees {count} GPU(s), the step needs {expected}")
    names = []
    for index in range(expected):
        device = torch.device("cuda", index)
        a = torch.ones(256, 256, device=device)
        if float((a @ a).sum()) != 256.0 * 256 * 256:
            raise RuntimeError(f"GPU {index} computed a wrong matrix product")
        names.append(torch.cuda.get_device_name(index))
    return ", ".join(names)


def _check_command(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        said = " ".join((result.stdout + result.stderr).split())[-300:]
        raise RuntimeError(f"`{' '.join(command)}` exited {result.returncode}{': ' + said if said else ''}")
    return "passed"


def run_checks(inputs: WorkloadInputs, node: str) -> tuple[dict[str, str], str | None]:
    """This node's checks in order: what each found, and the first problem in words (or None)."""
    config: dict[str, Any] = dict(inputs.config)
    pool = str(config.get("pool") or inputs.pool or "?")
    checks = [("runtime", lambda: _check_imports(list(config.get("imports", []))))]
    if inputs.storage_root:
        checks.append(("storage", lambda: _check_storage(str(inputs.storage_root), pool)))
    if int(config.get("gpus", 0)) > 0:
        checks.append(("gpus", lambda: _check_gpus(int(config["gpus"]))))
    if config.get("health_check"):
        checks.append(("health_check", lambda: _check_command(list(config["health_check"]))))
    results: dict[str, str] = {}
    for name, check in checks:
        try:
            results[name] = check()
        except Exception as exc:  # noqa: BLE001 - every problem is the answer
            return results, f"{name} check failed on {node}: {exc}"
    return results, None


def main() -> int:
    if node_env().in_gang:
        from workload_runtime.gang import member_from_env

        member = member_from_env()
        if member is not None:
            return gang_main(member)
    with open_dagster_pipes() as pipes:
        inputs = WorkloadInputs.from_extras(pipes.extras)
        results, problem = run_checks(inputs, platform.node())
        if problem:
            pipes.log.error(problem)
            print(problem, file=sys.stderr)
            return 1
        pipes.report_custom_message(Qualified(checks=results, node=platform.node(), at=round(time.time(), 4)).payload())
    return 0


def gang_main(member) -> int:
    """A gang's probe: one rank per node checks its own node, rank 0 reports them all, so the
    platform learns which node failed and can start the gang without it (on a spare)."""
    if not member.leader:
        inputs = WorkloadInputs.from_pipes_env()
        if inputs is None:
            raise SystemExit("the qualification probe runs under Dagster Pipes: the platform starts it")
        _gather(member, inputs)
        return 0
    with open_dagster_pipes() as pipes:
        answers = _gather(member, WorkloadInputs.from_extras(pipes.extras))
        failed = {node: problem for node, _, problem in answers if problem}
        for problem in failed.values():
            pipes.log.error(problem)
            print(problem, file=sys.stderr)
        checks = {f"{name} ({node})": found for node, results, _ in answers for name, found in results.items()}
        pipes.report_custom_message(Qualified(checks=checks, node=member.node, failed_nodes=failed, at=round(time.time(), 4)).payload())
    return 1 if failed else 0


def _gather(member, inputs: WorkloadInputs) -> list[tuple[str, dict[str, str], str | None]]:
    """Check this rank's node, then every rank's answer: (node, what each check found, problem)."""
    from torch import distributed as dist

    from workload_runtime.gang import Gang

    results, problem = run_checks(inputs, member.node)
    gang = Gang.join(member)
    answers: list = [None] * gang.world_size
    dist.all_gather_object(answers, (member.node, results, problem))
    gang.leave()
    return answers


if __name__ == "__main__":
    sys.exit(main())
