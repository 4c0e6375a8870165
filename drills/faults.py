"""The faults a drill injects, each done for real to a running workload or its pool.

- `signal_workload`: SIGTERM (a preemption notice) or SIGKILL (the node is gone) to the
  workload's own process, found through the platform's in-flight record of the job (a local
  pid, or `scontrol listpids` of the Slurm job);
- `Throttle`: a straggler — the workload is stopped and continued (SIGSTOP/SIGCONT) so it
  runs a fraction of the time, as a node with a failing fan or a noisy neighbour does;
- `CpuQuota`: one slow node of a gang — its rank's CPU capped (a cgroup quota), so it computes
  slowly while its peers wait for it;
- `SlotHolder`: a local pool that stops taking work — every one of its slots is taken;
- unhealthy nodes: a file the pool's health check tests for (local), or the node drained in
  Slurm as a health checker (NHC) does; pool loss on Slurm: the partition set INACTIVE;
- the torn checkpoint uses the checkpoint writer's failpoint (`workload_runtime.checkpoints`).

None fires on a timer. The run is armed with a `hold` failpoint (`workload_runtime.failpoints`):
when the workload has done the fault's unit it says so (a marker file) and waits, and the
`Injector` fires on that marker, so the fault lands at the same unit of a running job however
fast or slow the machine is (and the pool loss waits until its holder is in line for the slot).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from control_plane.compute.inflight import InFlight
from control_plane.compute.cooldowns import slots_dir
from control_plane.catalog.pools import Pool
from workload_runtime.inputs import Failpoint
from workload_runtime.storage import Storage


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
            pids.extend(p for p in cluster.job_pids(handle["job_id"]) if is_python(p))
    return [p for p in pids if psutil.pid_exists(p)]


def is_python(pid: int) -> bool:
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


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller, as mounted here


class CpuQuota:
    """A slow node: its processes get `share` of one CPU (a CFS quota in a cgroup of their own),
    as a node with a failing fan or a noisy neighbour computes slowly. Unlike `Throttle`, a
    process waiting for the network is not held back, only its computing: what tells one slow
    rank of a gang from the peers that wait for it. Needs root and cgroup v1's cpu controller
    (`/sys/fs/cgroup/cpu`); `stop()` lets the processes go and removes the cgroup."""

    PERIOD_US = 50_000

    def __init__(self, pids: list[int], share: float = 0.1):
        if not (CPU_CGROUP / "cgroup.procs").exists():
            raise RuntimeError(f"no cgroup v1 cpu controller at {CPU_CGROUP}: the slow-node fault cannot cap a process's CPU here")
        self.group = CPU_CGROUP / f"sinewgrid-slow-{os.getpid()}-{threading.get_ident()}"
        self.group.mkdir()
        (self.group / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
        (self.group / "cpu.cfs_quota_us").write_text(str(max(1000, int(self.PERIOD_US * share))))
        self.pids = pids
        for pid in pids:
            try:
                (self.group / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        if not self.group.exists():
            return
        for pid in (self.group / "cgroup.procs").read_text().split():
            try:
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
            except (ProcessLookupError, OSError):
                pass
        try:
            self.group.rmdir()
        except OSError:
            pass


class Injector(threading.Thread):
    """Fires a fault on an event it sees: the `marker` a held workload writes when it has done
    the fault's unit (the `hold` failpoint). Then it lets the workload go on (`release`), except
    for a fault the platform itself must end (`release=False`: the workload waits until the
    platform stops it, so it cannot finish before the platform has looked)."""

    def __init__(self, action: Callable[[], None], failpoint: Failpoint, release: bool = True):
        super().__init__(daemon=True, name="drill-injector")
        self.action, self.failpoint, self.release_after = action, failpoint, release
        self.fault_at: float | None = None
        self.held: dict | None = None  # what the workload wrote: step, pid, time, reports
        self.error: BaseException | None = None
        self.cancelled = threading.Event()

    def run(self) -> None:
        marker = Path(self.failpoint.marker)
        try:
            while not self.cancelled.is_set() and not marker.exists():
                time.sleep(0.02)
            if self.cancelled.is_set():
                return
            self.held = json.loads(marker.read_text())
            self.fault_at = time.time()
            self.action()
        except BaseException as exc:  # noqa: BLE001 - reported by the drill
            self.error = exc
        if self.release_after or self.error is not None:
            self.release()

    def release(self) -> None:
        """Let a held workload go on (harmless when none is held)."""
        Path(self.failpoint.release).touch()


class SlotHolder(threading.Thread):
    """Take every slot of a local pool, waiting for the busy ones. `queued()` says when it waits
    on the busy slot's lock: from then on, the lock is granted to it (in the kernel, the moment
    the running step lets go) before the platform, which only tries again after it has booked
    the attempt and chosen a pool, can take it."""

    def __init__(self, pool: Pool):
        super().__init__(daemon=True, name="drill-slots")
        if pool.max_concurrent_steps is None:
            raise ValueError(f"pool {pool.name} has no `max_concurrent_steps`: it has no slots to take")
        self.pool = pool
        self.held = threading.Event()
        self._release = threading.Event()
        self._handles: list = []
        self._waiting_on: Path | None = None

    def run(self) -> None:
        folder = slots_dir() / self.pool.name
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(self.pool.max_concurrent_steps or 0):
            handle = open(folder / f"slot-{index}.lock", "a+")  # noqa: SIM115 - held until release()
            self._waiting_on = folder / f"slot-{index}.lock"
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._handles.append(handle)
        self._waiting_on = None
        self.held.set()
        self._release.wait()
        for handle in self._handles:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    def queued(self) -> bool:
        """Holding every slot, or waiting in the kernel for the busy one's lock."""
        if self.held.is_set():
            return True
        path = self._waiting_on
        return path is not None and lock_waiters(path)

    def release(self) -> None:
        self._release.set()
        self.join(timeout=5)


def lock_waiters(path: Path) -> bool:
    """Whether a process waits for a lock on `path`: Linux lists it in `/proc/locks` as a `->`
    line ending its `MAJOR:MINOR:INODE` field with the file's inode (the inode alone: an overlay
    file system may name another device). Where /proc/locks cannot be read, True: the waiter
    this is asked about is at most a few instructions from blocking."""
    inode = f":{os.stat(path).st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return True
    return any("->" in fields and any(f.endswith(inode) for f in fields) for fields in (line.split() for line in lines))


def unhealthy_marker(drill_root: Path, pool: str) -> Path:
    """The file a drill pool's health check tests for: present means the node is unhealthy."""
    return drill_root / "faults" / f"{pool}.unhealthy"


def rank1_sickens(drill_root: Path, pool: str) -> Path:
    """The trigger of the node-unqualified fault: the next health check that runs for rank 1 of
    a gang on `pool` marks its own node unhealthy (`<node>.unhealthy`), for good."""
    return drill_root / "faults" / f"{pool}.sicken-rank1"


# Runs on the node (the qualification probe runs it with each rank's environment) and, on local
# pools, in the orchestrator while a step runs (no node there: only the pool's marker counts).
_HEALTH_CHECK = """faults="$1"; pool="$2"
node="${SINEWGRID_NODE:-${SLURMD_NODENAME:-}}"; rank="${RANK:-${SLURM_PROCID:-}}"
if [ -e "$faults/$pool.unhealthy" ]; then echo "drill: pool $pool is unhealthy"; exit 1; fi
if [ -n "$node" ] && [ "$rank" = 1 ] && mv "$faults/$pool.sicken-rank1" "$faults/$node.unhealthy" 2>/dev/null; then :; fi
if [ -n "$node" ] && [ -e "$faults/$node.unhealthy" ]; then echo "drill: node $node is unhealthy"; exit 1; fi
exit 0"""


def health_check_for(drill_root: Path, pool: str) -> list[str]:
    """A drill pool's health check (like NHC): fails for the pool, or for one node of it."""
    return ["sh", "-c", _HEALTH_CHECK, "drill-health-check", str(drill_root / "faults"), pool]


def sick_nodes(drill_root: Path, pools: list[str]) -> list[str]:
    """The nodes a node-unqualified fault marked unhealthy (not the pools' own markers)."""
    return [p.name.removesuffix(".unhealthy") for p in (drill_root / "faults").glob("*.unhealthy") if p.name.removesuffix(".unhealthy") not in pools]


def rank_process(rank: int, entry_point: str, peer: int) -> tuple[psutil.Process, str]:
    """The process of one rank of the gang that `peer` (the pid of one of its ranks: the one the
    hold failpoint stopped) belongs to, and its node's name where the process says it.

    A local node's ranks are forked by its torchrun agent under this process (the local backend's
    forkserver): their command line and environment read as the agent's, and each names itself
    `rank<N>` (workload_runtime/run_module.py). The node is its agent, the rank's parent. A
    cluster's ranks (srun's, Ray's, torchrun's in a pod) run `entry_point` with their rank and
    their gang's meeting point (`MASTER_ADDR`, `MASTER_PORT`) in the environment: the rank is
    looked for in `peer`'s gang only, never in another gang that runs on this machine meanwhile.
    """
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.name() == f"rank{rank}":
                return process, ""
    try:
        gang = _meeting_point(psutil.Process(peer).environ())
    except psutil.Error as exc:
        raise RuntimeError(f"the held rank (pid {peer}) ended before its gang's rank {rank} was found") from exc
    if gang is None:
        raise RuntimeError(f"the held rank (pid {peer}) has no MASTER_ADDR and MASTER_PORT in its environment: it is not a rank of a gang")
    for process in psutil.process_iter(["cmdline"]):
        try:
            if entry_point not in " ".join(process.info["cmdline"] or []):
                continue
            env = process.environ()
        except psutil.Error:
            continue
        if _meeting_point(env) == gang and env.get("RANK", env.get("SLURM_PROCID")) == str(rank):
            return process, env.get("SINEWGRID_NODE") or env.get("SLURMD_NODENAME") or ""
    raise RuntimeError(f"found no process of rank {rank} running {entry_point} in the gang meeting at {gang[0]}:{gang[1]}")


def _meeting_point(env: dict[str, str]) -> tuple[str, str] | None:
    """Where a gang's ranks meet (rank 0's address and port): the same for every rank of one
    gang, and different for two gangs running at once."""
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return env["MASTER_ADDR"], env["MASTER_PORT"]
    return None
