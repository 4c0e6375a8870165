"""Small builders shared by tests: plates and drops as a lab would send them, a sensor tick, and a
workload run as a plain process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

import dagster as dg
import numpy as np
import pandas as pd
import psutil

from cell_lane.plate_layout import GENES_PER_PLATE, plate_layout
from control_plane.catalog.step_spec import TRAINING_IMPORTS
from control_plane.compute.backends.warm_start import Process, start_process
from control_plane.intake.landing import tenant_drop_key, write_drop
from control_plane.settings import REPO_ROOT, child_env
from shared_resources.resources import StorageResource
from workload_runtime.envelope import PREFIX
from workload_runtime.storage import Storage

GENES = ["CD3E", "CD14", "LYZ", "MS4A1", "NKG7", "GNLY", "FCGR3A", "CST3", "PPBP", "IL7R"]


def good_plate(barcode: str = "P001", genes: list[str] | None = None, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    table = plate_layout(genes or GENES, barcode)
    kind = table["sample_type"]
    table.loc[kind == "neg_ctrl", "readout"] = rng.normal(1000, 30, (kind == "neg_ctrl").sum()).round(2)
    table.loc[kind == "pos_ctrl", "readout"] = rng.normal(250, 20, (kind == "pos_ctrl").sum()).round(2)
    table.loc[kind == "sample", "readout"] = rng.normal(700, 80, (kind == "sample").sum()).round(2)
    return table


def drop_plate(storage: Storage, drop_id: str, table: pd.DataFrame | None = None, **fields) -> str:
    table = good_plate() if table is None else table
    return write_drop(
        storage,
        "assays",
        drop_id,
        {"plates/plate.csv": table.to_csv(index=False).encode()},
        assay=fields.pop("assay", "viability"),
        instrument=fields.pop("instrument", "reader-1"),
        project=fields.pop("project", "test"),
        **fields,
    )


SEALED = PREFIX  # how every object sealed with a tenant's key starts (an ESDK message, suite 0x0478)
LAB = "lab-a"  # the tenant (a Cell lab of the packaged tenants catalog) that ingest tests use
LAB_DROPS = "lab_assay_drops"  # cell_lane.defs.partitions.lab_drops: a partition per lab\'s drop


def lab_storage(root: str, tenant: str = LAB) -> Storage:
    """A Cell lab's own storage root under `root`, its key held in this process (made on first use)."""
    return StorageResource(root=root).for_tenant(tenant)


def lab_drop(drop_id: str, tenant: str = LAB) -> str:
    """The ingest partition of one lab's drop: `<lab>/<drop_id>`."""
    return tenant_drop_key(tenant, drop_id)


def add_lab_drops(instance, drop_ids: list[str], tenant: str = LAB) -> None:
    """Add the ingest partitions of a lab's drops, as the landing sensor does when they arrive."""
    instance.add_dynamic_partitions(LAB_DROPS, [lab_drop(d, tenant) for d in drop_ids])


def ingest_drop(instance, resources, drop_id: str, tenant: str = LAB, assets: list | None = None) -> dg.ExecuteInProcessResult:
    """Materialize a lab's drop (raw copy and validation) as the ingest job would."""
    from cell_lane.defs.assets.ingest import raw_assay, validated_assay

    add_lab_drops(instance, [drop_id], tenant)
    return dg.materialize(
        assets or [raw_assay, validated_assay], instance=instance, resources=resources, partition_key=lab_drop(drop_id, tenant), raise_on_error=False
    )


__all__ = ["GENES", "GENES_PER_PLATE", "LAB", "LAB_DROPS", "SEALED", "add_lab_drops", "drop_plate", "good_plate", "ingest_drop", "lab_drop", "lab_storage"]


def sensor_ingest(sensor, assets: list, defs, instance, resources, root: str, cursor: str | None) -> tuple[list[str], dict[str, bool], str | None]:
    """One tick of a landing sensor, then a materialization of `assets` for each partition it asked for.

    Returns the requested partitions (in request order), each run's success, and the new cursor.
    """
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(), cursor=cursor, definitions=defs, resources={"storage": StorageResource(root=root)}
    ) as context:
        tick = sensor.evaluate_tick(context)
    for request in tick.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    requested = [r.partition_key for r in tick.run_requests or []]
    outcomes = {
        key: dg.materialize(assets, instance=instance, resources=resources, partition_key=key, raise_on_error=False).success
        for key in requested
    }
    return requested, outcomes, tick.cursor


# --- workloads started as plain processes ------------------------------------------------------

class WorkloadProcess:
    """A workload module run as `python -m MODULE --extras FILE`, its output in a file beside the
    extras (a pipe nobody reads would fill and block it). Started as a local pool starts it,
    forked from the warm interpreter with `imports` loaded (`warm_start.py`); `cold=True` starts
    a fresh interpreter, as a person running it by hand does."""

    def __init__(self, module: str, extras: Path, label: str, *, imports: Sequence[str] = TRAINING_IMPORTS, cold: bool = False):
        self.log = extras.with_name(f"{extras.stem}-{label}.log")
        command = [sys.executable, "-m", module, "--extras", str(extras)]
        with self.log.open("ab") as out:
            if cold:
                self.process: Process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=out)
            else:
                self.process = start_process(command, env=child_env(), cwd=str(REPO_ROOT), output=out, imports=imports)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def wait(self, timeout: float = 600) -> int:
        return self.process.wait(timeout=timeout)

    def wait_until_held(self, marker: Path, timeout: float = 300) -> None:
        """Until the workload's `hold` failpoint has published `marker` (it is waiting there)."""
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert self.process.poll() is None, f"the workload ended ({self.process.returncode}) before it was held:\n{self.tail()}"
            assert time.monotonic() < deadline, f"not held within {timeout:g}s:\n{self.tail()}"
            time.sleep(0.01)


# --- preemptions fired on an event: a workload held at its step ------------------------------

class Preemptor:
    """Arms the `hold` failpoint in every attempt the compute resource launches in a test, and
    preempts (SIGTERM) each attempt once it is held there: the fault fires on an event the test
    can see (the marker the held workload publishes), whatever the machine's speed.

    `times` preemptions in all: after each, once the stopped attempt is gone, the marker is
    removed so that the next attempt (resumed from the checkpoint the SIGTERM wrote) holds again
    after its first step. Use as a context manager around the run."""

    def __init__(self, monkeypatch, marker: Path, *, at_step: int, times: int = 1, timeout: float = 300):
        from control_plane.compute import attempts
        from workload_runtime.inputs import Failpoint

        self.marker, self.times, self.timeout = marker, times, timeout
        self.preempted: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._preempt, daemon=True, name="test-preemptor")
        failpoint = Failpoint(kind="hold", at_step=at_step, marker=str(marker))
        launch_inputs = attempts.workload_inputs

        def armed(*args, **kwargs):
            return launch_inputs(*args, **kwargs).model_copy(update={"failpoint": failpoint})

        monkeypatch.setattr(attempts, "workload_inputs", armed)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _preempt(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._stop.is_set() and len(self.preempted) < self.times and time.monotonic() < deadline:
            if not self.marker.exists():
                time.sleep(0.02)
                continue
            pid = int(json.loads(self.marker.read_text())["pid"])
            os.kill(pid, signal.SIGTERM)  # the capacity is taken back
            self.preempted.append(pid)
            while _alive(pid) and not self._stop.is_set():
                time.sleep(0.02)
            if len(self.preempted) < self.times:
                self.marker.unlink()  # arm it again for the next attempt


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped, is not running)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def committed_episodes(folder: Path) -> dict[int, tuple]:
    """A rollout shard's committed episodes: seed -> (trial record, states, actions, camera videos),
    compared bit for bit by the resume tests (tests/test_rollout_resume*.py)."""
    from robotics_lane.episodes.shards import read_episode_file

    out = {}
    for trial in sorted((folder / "trials").glob("seed-*.json")):
        record = json.loads(trial.read_text())
        episode = read_episode_file(record["episode_file"], ["balance the pole"])
        out[record["seed"]] = (
            {k: v for k, v in record.items() if k != "episode_file"},
            episode.observation_state.tobytes(),
            episode.action.tobytes(),
            {video.name.split(".", 1)[1]: video.read_bytes() for video in sorted(Path(record["episode_file"]).parent.glob(f"episode-{record['seed']:06d}.*.mp4"))},
        )
    return out


def wait_for(what: str, ready: Callable[[], object], timeout: float = 60.0) -> object:
    """Poll until `ready()` is truthy and return its value; fail naming `what` (a bound on a
    wait, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
