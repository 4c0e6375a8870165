"""A throwaway single-node Slurm 22.05 cluster in a temporary folder, to run drills against.

`SlurmCluster().start()` writes its own `slurm.conf` and `gres.conf`, starts its own
`munged` (own socket), `slurmctld` and `slurmd` (own ports, state, spool and logs) and waits
until the node takes jobs; `stop()` cancels every job, stops the daemons and removes the
folder. Nothing is shared with a system Slurm: point the client commands at it with
`SLURM_CONF=cluster.conf` (`cluster.env`). The test suite starts the same cluster.

Two partitions on the one node stand for two pools: `gpu` (normal) and `spot` (lower
priority tier: `preempt/partition_prio` requeues its jobs when `gpu` needs the node).
The node offers two fake GPUs as GRES (character devices like /dev/null), so jobs that
ask for `--gres=gpu:1` or `--gpus=1` get a real `CUDA_VISIBLE_DEVICES`.

Faults a drill injects through it: `drain_node` (what a health check such as NHC does to a
sick node: running jobs go on, nothing new starts there; `resume_node` undoes it),
`set_partition_state` (DOWN / INACTIVE), `requeue_after_first_checkpoint` (a spot reclaim),
and `job_pids` to signal a job's workload process directly.

Steps may run in OCI containers (`srun --container=BUNDLE`): the cluster's `oci.conf` runs them
with runc, rootless, as the job's user (testbed/oci_bundle.py makes bundles).

It keeps accounts, as a site's cluster does (testbed/slurm_accounting.py): its own MariaDB and
`slurmdbd`, started before the controller; associations are enforced and the priority is
multifactor, fair share and QOS weighted. Every job needs an association: the start registers
the cluster, the default account `sinewgrid` and the users that submit (root; `users`, and
`add_users` later). Team accounts and QOS are the control plane's to add
(control_plane/compute/backends/slurm_accounts.py, docs/queues_slurm.md); `sshare`, `sacctmgr`
and `sacct` work against it with `env`. Accounting adds about 3 s to the start (4 s in all
here) and 1.5 s to the stop (slurmctld hands its last records to slurmdbd).

Needs root and the Debian packages `slurmctld slurmd slurm-client munge runc slurmdbd
mariadb-server` (`make slurm-packages`). Run by hand: `python -m testbed.slurm_cluster` starts one,
prints its SLURM_CONF and stops it on Enter.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from control_plane.settings import child_env
from testbed import leftovers
from testbed.ports import free_ports
from testbed.slurm_accounting import DEFAULT_ACCOUNT, AccountingStartError, ClusterAccounting, missing_commands, submitters
from testbed.slurm_conf import NO_ACCOUNTING, OCI_CONF, SLURM_CONF

PREFIX = "sinewgrid-slurm-"
START_ATTEMPTS = 3  # new ports each time another process took one between choosing and binding
NODE = "sgnode"
GPUS = 2
PARTITIONS = ("gpu", "spot")
# The daemons a cluster needs (`make slurm-packages` installs them).
DAEMONS = ("munged", "slurmctld", "slurmd")
RUNTIME = "runc"  # the OCI runtime oci.conf names
CLUSTER_NAME = "sinewgrid-test"  # slurm.conf's ClusterName, as slurmdbd registers it


class SlurmClusterError(RuntimeError):
    """The cluster did not start, or a command against it failed; the message says which."""


class SlurmCluster:
    """One throwaway Slurm cluster: `start()`, use `env` for the client commands, `stop()`."""

    partitions: tuple[str, ...] = PARTITIONS
    accounting: bool = True  # slurmdbd and its database (testbed/slurm_accounting.py)

    def __init__(self, root: Path | None = None, users: tuple[str, ...] | None = None):
        """`users`: the Unix users registered under the default account at the start (default:
        root, and the images' user where the machine knows it: `slurm_accounting.submitters`)."""
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix=PREFIX))
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.host = socket.gethostname().split(".")[0]
        self.processes: dict[str, subprocess.Popen] = {}
        self.accounts = ClusterAccounting(self.root, self.host, self.munge_socket, submitters() if users is None else users)

    @property
    def env(self) -> dict[str, str]:
        """What the Slurm client commands need to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    # Life cycle ---------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> SlurmCluster:
        missing = [d for d in (*DAEMONS, "sbatch", RUNTIME) if shutil.which(d) is None]
        missing += missing_commands() if self.accounting else []
        if missing:
            raise SlurmClusterError(
                f"cannot start the throwaway Slurm cluster: {', '.join(missing)} not found. "
                "Install the packages (as root): `make -f mk/engines.mk slurm-packages` "
                "(apt-get install slurmctld slurmd slurm-client munge runc slurmdbd mariadb-server)."
            )
        if os.geteuid() != 0:
            raise SlurmClusterError("the throwaway Slurm cluster runs its daemons as root (SlurmUser=root); run the drills or tests as root.")
        leftovers.sweep(PREFIX)  # clusters a killed earlier run left behind
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once(timeout)
                return self
            except SlurmClusterError as error:
                port_taken = "Address already in use" in str(error)
                self._stop_daemons()
                if not port_taken or attempt == START_ATTEMPTS:
                    self.stop()
                    raise
            except BaseException:
                self.stop()
                raise
        return self

    def _start_once(self, timeout: float) -> None:
        self._write_config()
        leftovers.claim(self.root)
        self._start_munged()
        if self.accounting:  # before the controller, so that it finds the associations at once
            try:
                self.accounts.start(self._spawn, self._wait, timeout)
            except AccountingStartError as error:
                raise SlurmClusterError(f"throwaway Slurm cluster in {self.root}: {error}") from None
            self.accounts.register(self.client, CLUSTER_NAME)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(lambda: self._client_ok(["scontrol", "ping"], "UP"), timeout, "slurmctld answering `scontrol ping`")
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(self._node_ready, timeout, f"node {NODE} idle in `sinfo`")

    def stop(self) -> None:
        """Cancel every job, stop the daemons and remove the cluster's folder.

        Each part runs even when the one before it failed (a `scancel` that times out, a
        daemon that will not die): no daemon, job process or folder is left behind."""
        try:
            if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
                for partition in self.partitions:
                    self.client(["scancel", f"--partition={partition}"], check=False)
                # Jobs end once their processes do (SIGKILL after KillWait): leave no slurmstepd behind.
                self._wait(self._all_jobs_done, 30, "jobs to end", raise_on_timeout=False)
        except (OSError, subprocess.SubprocessError, SlurmClusterError):
            pass  # the daemons are stopped below either way
        finally:
            try:
                self._stop_daemons()
            finally:
                # slurmstepd and job processes carry SLURM_CONF=<this folder> in their environment.
                leftovers.stop_processes(leftovers.processes_using(self.root))
                shutil.rmtree(self.root, ignore_errors=True)

    def _stop_daemons(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # Using it -----------------------------------------------------------------------
    def client(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm client command (`scontrol`, `squeue`...) against this cluster."""
        result = subprocess.run(args, env=child_env(self.env), capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise SlurmClusterError(f"`{' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")
        return result

    @contextmanager
    def requeue_after_first_checkpoint(self, storage_root: Path, lineage: str = "counting") -> Iterator[list[str]]:
        """While the block runs, `scontrol requeue` the first Slurm job in flight under
        `storage_root` once a checkpoint of `lineage` exists (what a spot reclaim does).
        Yields the list the requeued job id is appended to."""
        checkpoints = Path(storage_root) / "checkpoints" / lineage
        with self.on_first_job(
            storage_root, lambda: bool(list(checkpoints.glob("step-*/manifest.json"))), lambda job: self.client(["scontrol", "requeue", job["job_id"]])
        ) as requeued:
            yield requeued

    @contextmanager
    def on_first_job(self, storage_root: Path, ready: Callable[[], bool], act: Callable[[dict], object]) -> Iterator[list[str]]:
        """While the block runs, once `ready()` holds and a Slurm job is in flight under
        `storage_root` (the platform's `state/inflight/` records), call `act` with the first one's
        handle (as JSON). Yields the list the job's id is appended to once acted on."""
        from control_plane.compute.inflight import InFlight
        from workload_runtime.storage import Storage

        inflight = InFlight(Storage.at(str(storage_root)))
        acted_on: list[str] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                jobs = [r["handle"] for r in inflight.records() if r["handle"]["backend"] == "slurm"]
                if jobs and ready():
                    act(jobs[0])
                    acted_on.append(jobs[0]["job_id"])
                    return
                stop.wait(0.2)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        try:
            yield acted_on
        finally:
            stop.set()
            thread.join(timeout=10)

    def reset(self) -> str:
        """Back to a healthy cluster: node in service, every partition up, no job queued or
        running (cancelled). Returns what was left running, for a test to complain about."""
        self.resume_node()
        for partition in PARTITIONS:
            self.set_partition_state(partition, "UP")
        left = self.client(["squeue", "-h", "-t", "PD,R,S", "-o", "%i %P %T %r"]).stdout.strip()  # completing jobs are on their way out
        if left:
            for partition in PARTITIONS:
                self.client(["scancel", f"--partition={partition}"], check=False)
        return left

    def add_users(self, *users: str) -> None:
        """Register more Unix users under the default account (their jobs need an association)."""
        if not self.accounting:
            raise SlurmClusterError("this cluster keeps no accounts (`accounting = False`): any user may submit already")
        self.client(["sacctmgr", "-i", "add", "user", ",".join(users), f"DefaultAccount={DEFAULT_ACCOUNT}"], check=False)  # "Nothing new added" for known ones
        shown = self.client(["sacctmgr", "-n", "-P", "show", "user", "format=User", "where", f"name={','.join(users)}"]).stdout.split()
        if missing := sorted(set(users) - set(shown)):
            raise SlurmClusterError(f"`sacctmgr add user` did not register {', '.join(missing)}:\n{self.logs()}")

    def set_partition_state(self, partition: str, state: str) -> None:
        """`UP`, `DOWN` (jobs queue, none start) or `INACTIVE` (submissions are rejected)."""
        self.client(["scontrol", "update", f"PartitionName={partition}", f"State={state}"])

    def drain_node(self, reason: str, node: str = NODE) -> None:
        """Drain `node` with `reason`, as a health check (NHC, Slurm's `HealthCheckProgram`)
        does to a sick node: jobs running there go on, no new job starts there."""
        if not reason.strip():
            raise ValueError("drain_node needs a reason: Slurm refuses to drain a node without one")
        self.client(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])

    def resume_node(self, node: str = NODE, timeout: float = 30.0) -> None:
        """Return `node` to service (`State=RESUME`) and wait until the controller has heard
        from it again (Slurm marks a resumed node NOT_RESPONDING until its next ping).
        A node already in service is left as it is."""
        unfit = {"DRAIN", "DOWN", "FAIL", "NOT_RESPONDING"}
        if not set(self.node_state(node).split("+")) & unfit:
            return
        self.client(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        self._wait(lambda: not set(self.node_state(node).split("+")) & unfit, timeout, f"node {node} back in service after RESUME")

    def node_state(self, node: str = NODE) -> str:
        """The node's state as `scontrol show node` gives it, e.g. `IDLE`, `MIXED+DRAIN`."""
        shown = self.client(["scontrol", "show", "node", "--oneliner", node]).stdout
        for word in shown.split():
            if word.startswith("State="):
                return word.removeprefix("State=")
        raise SlurmClusterError(f"`scontrol show node {node}` gave no State=: {shown.strip()}")

    def job_pids(self, job_id: str) -> list[int]:
        """The processes of a running job on this node (`scontrol listpids`), workload first,
        without slurmstepd; empty when the job has no processes here (pending or ended)."""
        result = self.client(["scontrol", "listpids", str(job_id)], check=False)
        if result.returncode != 0:
            if "does not exist" in result.stderr or "not found" in result.stderr.lower():
                return []
            raise SlurmClusterError(f"`scontrol listpids {job_id}` failed ({result.returncode}): {result.stderr.strip()}")
        pids = []
        for line in result.stdout.splitlines():
            first = line.split()[0] if line.split() else ""
            if not first.isdigit() or int(first) <= 0:
                continue  # the header, or -1 for a step without a process
            try:
                command = Path(f"/proc/{first}/comm").read_text().strip()
            except OSError:
                continue  # ended since
            if command != "slurmstepd":
                pids.append(int(first))
        return pids

    def logs(self) -> str:
        """The daemons' logs, for a drill or test that needs to say why the cluster misbehaved."""
        parts = []
        logs = [self.munge_socket.parent / "munged.log", *(self.accounts.logs() if self.accounting else []), self.root / "log" / "slurmctld.log", self.root / "log" / "slurmd.log"]
        for path in logs:
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"--- {path} (last 40 lines) ---\n" + "\n".join(text.splitlines()[-40:]))
        return "\n".join(parts)

    # Internals ------------------------------------------------------------------------
    def _write_config(self) -> None:
        for sub in ("etc", "state", "spool", "run", "log", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # munged runs as user `munge` and must reach its socket through this folder.
        self.root.chmod(0o755)
        devices = []
        for i in range(GPUS):
            device = self.root / "dev" / f"nvidia{i}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null
            devices.append(str(device))
        ctld_port, slurmd_port, db_port, dbd_port = free_ports(4)  # chosen together: never the same port twice
        accounting = self.accounts.write_config(db_port, dbd_port) if self.accounting else NO_ACCOUNTING
        self.conf.write_text(
            SLURM_CONF.format(
                accounting=accounting,
                host=self.host,
                ctld_port=ctld_port,
                slurmd_port=slurmd_port,
                munge_socket=self.munge_socket,
                root=self.root,
                node=NODE,
                cpus=os.cpu_count() or 1,
                gpus=GPUS,
            )
        )
        runc_root = self.root / "runc"  # each user's runc keeps its containers' state in its own folder here
        runc_root.mkdir(exist_ok=True)
        runc_root.chmod(0o1777)
        (self.conf.parent / "oci.conf").write_text(OCI_CONF.format(runc_root=runc_root))
        (self.conf.parent / "gres.conf").write_text(
            "".join(f"NodeName={NODE} Name=gpu File={d}\n" for d in devices)
        )

    def _start_munged(self) -> None:
        munge = pwd.getpwnam("munge")
        folder = self.munge_socket.parent
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, munge.pw_uid, munge.pw_gid)
        folder.chmod(0o755)
        self.munge_socket.unlink(missing_ok=True)  # from an earlier attempt
        self._spawn(
            "munged",
            [
                "munged", "--foreground", f"--socket={self.munge_socket}",
                f"--pid-file={folder / 'munged.pid'}", f"--seed-file={folder / 'munged.seed'}",
                f"--log-file={folder / 'munged.log'}",
            ],
            user=munge.pw_uid,
            group=munge.pw_gid,
        )
        self._wait(self.munge_socket.exists, 20, f"munged's socket {self.munge_socket}")

    def _spawn(self, name: str, command: list[str], **kwargs) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        self.processes[name] = subprocess.Popen(
            command, env=child_env(self.env), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, **kwargs
        )
        log.close()

    def _client_ok(self, args: list[str], expect: str) -> bool:
        result = self.client(args, check=False)
        return result.returncode == 0 and expect in result.stdout

    def _node_ready(self) -> bool:
        result = self.client(["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"], check=False)
        states = {line.strip().rstrip("*~#") for line in result.stdout.splitlines()}  # one line per partition
        return result.returncode == 0 and bool(states) and states <= {"idle", "mixed", "allocated"}

    def _all_jobs_done(self) -> bool:
        states = self.client(["squeue", "-h", "-t", "all", "-o", "%T"], check=False).stdout.split()
        return all(s in ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE") for s in states)

    def _wait(self, ready, timeout: float, what: str, raise_on_timeout: bool = True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead and raise_on_timeout:
                raise SlurmClusterError(
                    f"throwaway Slurm cluster in {self.root}: {', '.join(dead)} exited while waiting for {what}.\n{self._startup_report()}"
                )
            if ready():
                return
            time.sleep(0.3)
        if raise_on_timeout:
            raise SlurmClusterError(f"throwaway Slurm cluster in {self.root}: no {what} after {timeout:g}s.\n{self._startup_report()}")

    def _startup_report(self) -> str:
        parts = [self.logs()]
        for name in self.processes:
            out = self.root / "log" / f"{name}.out"
            if out.exists():
                parts.append(f"--- {out} ---\n" + out.read_text(errors="replace")[-3000:])
        return "\n".join(parts)


if __name__ == "__main__":
    with SlurmCluster() as cluster:
        print(f"Slurm cluster up: export SLURM_CONF={cluster.conf}")
        print(cluster.client(["sinfo"]).stdout)
        input("Enter stops it. ")
