"""A throwaway Slurm cluster of several nodes on this machine, each node in its own network
namespace with its own address on a bridge: what a gang (`srun` across nodes) needs to run
for real here.

    host (slurmctld, munged)   10.213.N.1  ── bridge sgbr-… ──┬── netns: slurmd sgn0  10.213.N.10
                                                             ├── netns: slurmd sgn1  10.213.N.11
                                                             └── …

Each `slurmd` runs inside its node's namespace (`nsenter --net`), so the job steps it starts
(the batch script on the first node, `srun`'s tasks on every node) have that node's address
and talk to each other over the bridge, as on a real cluster; the file system is shared (one
storage root, one Pipes folder). Processes in a namespace see only its `eth0` and loopback:
gloo is told to use `eth0` (`GLOO_SOCKET_IFNAME`, in `env`, which `sbatch` passes on).

One partition, `gang`, holds every node (one CPU each, no GPUs). The network has a shape, as
Slurm sees it: `topology.conf` (TopologyPlugin=topology/tree) puts every `per_switch` nodes under
a leaf switch (`s0: sgn0 sgn1`, `s1: sgn2 sgn3`) and a spine over the leaves, so a tightly coupled
gang's `--switches=1` keeps it under one (`cluster.switches`; the namespaces' bridge is flat: the
switches are Slurm's view, what its scheduling honours). Everything else (munge, the
controller, start, stop, leftovers of a killed run) is `SlurmCluster`'s, but its accounting: no
slurmdbd here (gangs need no accounts; the single-node cluster tests those), so no associations
are enforced and the priority is Slurm's basic one. Needs root and `ip`
(iproute2). Run by hand: `python -m testbed.slurm_multinode`.
"""

from __future__ import annotations

import random
import subprocess
import tempfile
from pathlib import Path

from control_plane.compute.backends.slurm_topology import switch_layout, topology_conf
from testbed import leftovers
from testbed.ports import free_ports
from testbed.slurm_cluster import SlurmCluster, SlurmClusterError
from testbed.slurm_conf import NO_ACCOUNTING, SLURM_CONF

PREFIX = "sinewgrid-slurmmn-"
NODES = 4
PER_SWITCH = 2  # nodes under one leaf switch of topology.conf: the pool's `nodes_per_domain`
# How long Slurm may hold a job for its `--switches` count (default 300 s): longer than any pool's
# pending deadline here, so the platform's deadline, not Slurm, ends the wait.
MAX_SWITCH_WAIT_SECONDS = 86400
PARTITION = "gang"
INTERFACE = "eth0"  # each namespace's end of its veth pair


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise SlurmClusterError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def _our_namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.startswith("sgmn-")]


def sweep_namespaces() -> None:
    """Remove the namespaces and bridges of clusters whose folder is gone (a killed run)."""
    for namespace in _our_namespaces():
        tag = namespace.split("-")[1]
        if not list(Path("/tmp").glob(f"{PREFIX}*{tag}")):
            _ip("netns", "del", namespace, check=False)
    for line in _ip("-o", "link", "show", "type", "bridge").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith("sgbr") and not list(Path("/tmp").glob(f"{PREFIX}*{name.removeprefix('sgbr')}")):
            _ip("link", "del", name, check=False)


class MultiNodeSlurmCluster(SlurmCluster):
    """`nodes` Slurm nodes named sgn0… in network namespaces of their own, one partition, and
    leaf switches of `per_switch` nodes each in `topology.conf` (`switches`)."""

    partitions = (PARTITION,)
    accounting = False

    def __init__(self, nodes: int = NODES, per_switch: int = PER_SWITCH):
        sweep_namespaces()
        leftovers.sweep(PREFIX)
        tag = f"{random.randrange(16**6):06x}"
        super().__init__(Path(tempfile.mkdtemp(prefix=PREFIX, suffix=tag)))
        self.tag = tag
        self.nodes = [f"sgn{i}" for i in range(nodes)]
        self.per_switch = per_switch
        self.switches = switch_layout(self.nodes, per_switch)  # leaf switch -> its nodes
        self.bridge = f"sgbr{tag}"
        self.subnet = self._free_subnet()
        self.host_address = f"{self.subnet}.1"
        self.addresses = {name: f"{self.subnet}.{10 + i}" for i, name in enumerate(self.nodes)}
        self.namespaces = {name: f"sgmn-{tag}-{i}" for i, name in enumerate(self.nodes)}

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf), "GLOO_SOCKET_IFNAME": INTERFACE}

    @staticmethod
    def _free_subnet() -> str:
        used = _ip("-o", "-4", "addr").stdout
        for _ in range(100):
            subnet = f"10.213.{random.randrange(256)}"
            if f" {subnet}." not in used:
                return subnet
        raise SlurmClusterError("no free 10.213.x.0/24 subnet for the test cluster's bridge")

    # Life cycle ---------------------------------------------------------------------
    def _start_once(self, timeout: float) -> None:
        self._write_config()
        leftovers.claim(self.root)
        self._network_up()
        self._start_munged()
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(lambda: self._client_ok(["scontrol", "ping"], "UP"), timeout, "slurmctld answering `scontrol ping`")
        for node in self.nodes:
            # `nsenter --net`, not `ip netns exec`: that one mounts a fresh /sys, without the cgroup
            # file system slurmd looks for.
            namespace = f"/run/netns/{self.namespaces[node]}"
            self._spawn(f"slurmd-{node}", ["nsenter", f"--net={namespace}", "slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait(self._nodes_ready, timeout, f"nodes {', '.join(self.nodes)} idle in `sinfo`")

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for namespace in self.namespaces.values():
                _ip("netns", "del", namespace, check=False)
            _ip("link", "del", self.bridge, check=False)

    def _network_up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, node in enumerate(self.nodes):
            namespace, veth = self.namespaces[node], f"sgv{self.tag}{i}"
            _ip("netns", "add", namespace)
            _ip("link", "add", veth, "type", "veth", "peer", "name", INTERFACE, "netns", namespace)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{self.addresses[node]}/24", "dev", INTERFACE)
            _ip("-n", namespace, "link", "set", INTERFACE, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")

    # Faults ---------------------------------------------------------------------------
    def node_pids(self, node: str) -> list[int]:
        """Every process running in `node`'s namespace (its slurmd, job steps and ranks)."""
        result = _ip("netns", "pids", self.namespaces[node])
        return [int(p) for p in result.stdout.split()]

    # Internals ------------------------------------------------------------------------
    def _write_config(self) -> None:
        for sub in ("etc", "state", "run", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        ctld_port, slurmd_port = free_ports(2)
        conf = SLURM_CONF.format(
            accounting=NO_ACCOUNTING, host=self.host, ctld_port=ctld_port, slurmd_port=slurmd_port, munge_socket=self.munge_socket, root=self.root,
            node="unused", cpus=1, gpus=0,
        )  # fmt: skip
        keep = []
        for line in conf.splitlines():
            if line.startswith(("NodeName=", "PartitionName=", "GresTypes=", "PreemptType=", "PreemptMode=")):
                continue
            line = line.replace("(127.0.0.1)", f"({self.host_address})")
            if line.startswith("SchedulerParameters="):
                line += f",max_switch_wait={MAX_SWITCH_WAIT_SECONDS}"
            line = line.replace(f"{self.root}/spool", f"{self.root}/spool/%n").replace("slurmd.pid", "slurmd-%n.pid").replace("slurmd.log", "slurmd-%n.log")
            keep.append(line)
        keep.append("# Leaf switches and a spine in topology.conf, beside this file: a gang's --switches counts leaves.")
        keep.append("TopologyPlugin=topology/tree")
        (self.conf.parent / "topology.conf").write_text(topology_conf(self.nodes, self.per_switch))
        keep.append("# One node per network namespace, each with its own address on the bridge.")
        keep += [f"NodeName={n} NodeHostname={n} NodeAddr={self.addresses[n]} CPUs=1 State=UNKNOWN" for n in self.nodes]
        keep.append(f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(keep) + "\n")

    def _nodes_ready(self) -> bool:
        result = self.client(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        states = dict(line.split()[:2] for line in result.stdout.splitlines() if len(line.split()) >= 2)
        return result.returncode == 0 and all(states.get(n, "").rstrip("*~#") in ("idle", "mixed", "allocated") for n in self.nodes)

    def reset(self) -> str:
        left = self.client(["squeue", "-h", "-t", "PD,R,S", "-o", "%i %P %T %r"]).stdout.strip()
        for node in self.nodes:
            self.resume_node(node)
        if left:
            self.client(["scancel", f"--partition={PARTITION}"], check=False)
        return left

    def restore_nodes(self, nodes: list[str]) -> None:
        """Resume drained nodes (after a drill or a test replaced them)."""
        for node in nodes:
            self.resume_node(node)

    def logs(self) -> str:
        parts = [super().logs()]
        for node in self.nodes:
            path = self.root / "log" / f"slurmd-{node}.log"
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"--- {path} (last 20 lines) ---\n" + "\n".join(text.splitlines()[-20:]))
        return "\n".join(parts)


if __name__ == "__main__":
    with MultiNodeSlurmCluster() as cluster:
        print(f"Slurm cluster of {len(cluster.nodes)} nodes up: export SLURM_CONF={cluster.conf} GLOO_SOCKET_IFNAME={INTERFACE}")
        print(cluster.client(["sinfo", "-N"]).stdout)
        print(cluster.client(["scontrol", "show", "topology"]).stdout)
        input("Enter stops it. ")
