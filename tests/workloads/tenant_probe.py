"""A workload for the tenancy tests: it tries what its config names with the access it was
handed (its tenant's credentials and key, nothing else), reports what the store and the key
answered, and saves its weights as its tenant's final checkpoint.

Config: `weights` (floats), and lists of URIs to `list`, `read`, `overwrite`, `open_checkpoint`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.storage import fs_for, read_bytes, write_bytes_atomic
from workload_runtime.workload import WorkloadRun


def _try(action: Callable[[], Any]) -> str:
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - the answer is what this probe reports
        return f"refused: {type(exc).__name__}: {exc}"[:400]
    return "ok"


def _open_checkpoint(uri: str) -> None:
    if CheckpointStore(uri, framework="numpy").latest_valid() is None:
        raise FileNotFoundError(f"no valid checkpoint under {uri}")


def main() -> None:
    with WorkloadRun(framework="numpy") as run:
        cfg = run.config
        probes: dict[str, str] = {}
        for uri in cfg.get("list", []):
            probes[f"list {uri}"] = _try(lambda u=uri: fs_for(u)[0].ls(fs_for(u)[1], refresh=True))
        for uri in cfg.get("read", []):
            probes[f"read {uri}"] = _try(lambda u=uri: read_bytes(u))
        for uri in cfg.get("overwrite", []):
            probes[f"overwrite {uri}"] = _try(lambda u=uri: write_bytes_atomic(u, b"overwritten by another tenant's workload"))
        for uri in cfg.get("open_checkpoint", []):
            probes[f"open_checkpoint {uri}"] = _try(lambda u=uri: _open_checkpoint(u))
        resumed = run.resume(final_ends_run=False)  # the tenant's own checkpoint (final after one run): needs its key
        weights = np.asarray(cfg.get("weights", [0.0]), dtype=np.float32)
        run.finish(1, {"model": {"w": weights}}, metadata={
            "probes": json.dumps(probes), "resumed": resumed is not None,
            "aws_key_seen": os.environ.get("AWS_ACCESS_KEY_ID", ""),
        })


if __name__ == "__main__":
    main()
