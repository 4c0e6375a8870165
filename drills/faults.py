"""The faults a drill injects, each done for real to a running workload or its pool.

- `signal_workload`: SIGTERM (a preemption notice) or SIGKILL (the node is gone) to the
  workload's own process, found through the platform's in-flight record of the job (a local
  pid, or `scontrol listpids` of the Slurm job);
- `Throttle`: a straggler — the workload is stopped and continued (SIGSTOP/SIGCONT) so it
  runs a fraction of the time, as a node with a failing fan or a noisy neighbour does;
- `SlotHolder`: a local pool that stops taking work — every one of its slots is taken;
- unhealthy nodes: a file the pool's health check tests for (local), or the node drained in
  Slurm as a health checker (NHC) does; pool loss on Slurm: the partition set INACTIVE;
- the torn checkpoint uses the checkpoint writer's failpoint (`shared_resources.runtime.checkpoints`).
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from pathlib import Path

import psutil

from shared_resources.compute.inflight import InFlight
from shared_resources.compute.cooldowns import slots_dir
from shared_resources.catalog.pools import Pool
from shared_resources.runtime.storage import Storage


def workload_pids(storage: Storage, step: str, cluster=None) -> list[int]:
    """The processes of `step`'s running attempt (not its qualification probe)."""
    pids: list[int] = []
    for record in InFlight(storage).records():
        if record["owner"]["step"] != step:
            continue
        handle = record["handle"]
        if handle["backend"] == "local":
            pids.append(int(handle["job_id"]))
        elif handle["backend"] == "slurm" and cluster is not None:
            pids.extend(p for p in cluster.job_pids(handle["job_id"]) if _is_python(p))
    return [p for p in pids if psutil.pid_exists(p)]


def _is_python(pid: int) -> bool:
    try:
        return "python" in " ".join(psutil.Process(pid).cmdline()[:1])
    except psutil.Error:
        return False


def signal_workload(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


class Throttle(threading.Thread):
    """Keep processes running `share` of every `period` seconds until they exit or `stop()`."""

    def __init__(self, pids: list[int], share: float = 0.2, period: float = 0.1):
        super().__init__(daemon=True, name="drill-throttle")
        self.pids, self.share, self.period = pids, share, period
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set() and any(psutil.pid_exists(p) for p in self.pids):
            signal_workload(self.pids, signal.SIGCONT)
            time.sleep(self.period * self.share)
            if self._halt.is_set():
                break
            signal_workload(self.pids, signal.SIGSTOP)
            time.sleep(self.period * (1 - self.share))
        signal_workload(self.pids, signal.SIGCONT)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        signal_workload(self.pids, signal.SIGCONT)


class SlotHolder(threading.Thread):
    """Take every slot of a local pool, waiting for the busy ones (a blocking `flock` is granted
    the moment the running step lets go, before the platform can try again)."""

    def __init__(self, pool: Pool):
        super().__init__(daemon=True, name="drill-slots")
        if pool.max_concurrent_steps is None:
            raise ValueError(f"pool {pool.name} has no `max_concurrent_steps`: it has no slots to take")
        self.pool = pool
        self.held = threading.Event()
        self._release = threading.Event()
        self._handles: list = []

    def run(self) -> None:
        folder = slots_dir() / self.pool.name
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(self.pool.max_concurrent_steps or 0):
            handle = open(folder / f"slot-{index}.lock", "a+")  # noqa: SIM115 - held until release()
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._handles.append(handle)
        self.held.set()
        self._release.wait()
        for handle in self._handles:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    def release(self) -> None:
        self._release.set()
        self.join(timeout=5)


def unhealthy_marker(drill_root: Path, pool: str) -> Path:
    """The file a drill pool's health check tests for: present means the node is unhealthy."""
    return drill_root / "faults" / f"{pool}.unhealthy"


def health_check_for(drill_root: Path, pool: str) -> list[str]:
    return ["test", "!", "-e", str(unhealthy_marker(drill_root, pool))]
