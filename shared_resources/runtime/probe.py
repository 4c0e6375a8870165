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

from shared_resources.runtime.inputs import WorkloadInputs
from shared_resources.runtime.messages import Qualified


def _check_imports(modules: list[str]) -> str:
    versions = []
    for name in modules:
        module = importlib.import_module(name)
        versions.append(f"{name} {getattr(module, '__version__', '?')}")
    return f"Python {platform.python_version()}" + (f", {', '.join(versions)}" if versions else "")


def _check_storage(root: str, pool: str) -> str:
    from shared_resources.runtime.storage import fs_for, read_bytes, write_bytes_atomic

    uri = posixpath.join(root.rstrip("/"), "state", "probes", pool, f"{uuid.uuid4().hex}.txt")
    payload = f"probe {time.time()}".encode()
    began = time.monotonic()
    write_bytes_atomic(uri, payload)
    if read_bytes(uri) != payload:
        raise RuntimeError(f"read back something else than was written at {uri}")
    fs, path = fs_for(uri)
    fs.rm(path)  # the probe's own object
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


def main() -> int:
    with open_dagster_pipes() as pipes:
        inputs = WorkloadInputs.from_extras(pipes.extras)
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
                problem = f"{name} check failed on {platform.node()}: {exc}"
                pipes.log.error(problem)
                print(problem, file=sys.stderr)
                return 1
        pipes.report_custom_message(Qualified(checks=results, node=platform.node(), at=round(time.time(), 4)).payload())
    return 0


if __name__ == "__main__":
    sys.exit(main())
