"""A gang on a local pool: one `torchrun` per node, all its ranks or none.

A step with `nodes: N` and `ranks_per_node: R` (`StepSpec.world_size` > 1) trains data-parallel
as N × R processes. On a local pool each node is one `torchrun` agent on this machine
(`--nnodes N --node-rank i --nproc-per-node R`, static rendezvous on loopback), started warm like
the local backend's workloads (`warm_start.py`), named
`<pool>-node<i>` (`SINEWGRID_NODE`): the pool's `nodes` are the names there are, and a node the
platform replaced (`StepSpec.exclude_nodes`) is skipped, so the gang runs on a spare. `GangProcess` holds the agents as one process for the Pipes
client and the attempt monitor: signals go to every node, and when one node ends badly the gang
is over: the others get SIGTERM, then SIGKILL after `PEER_GRACE_SECONDS` (their ranks fail on
their first collective with the lost peer anyway). A node's ranks go with it, as on a real node:
`torchrun` starts each rank in a session of its own, so `GangProcess` keeps track of each node's
ranks and kills those of a node that ended (`kill_node` kills a node and its ranks at once).

Its exit code is the first node's that ended badly (a node killed by a signal reads as that
signal, a lost node; `torchrun` itself exits 1 whatever its ranks' codes), 0 when all succeeded.

A local node's agent forks its ranks (`--start-method=fork --run-path workload_runtime/run_module.py`,
torch elastic's own way to run ranks in the agent's interpreter) instead of starting a new Python
per rank: the agent starts warm with the step's libraries, so a rank skips their import (~3 CPU-s
for torch, torch._dynamo and anndata, for every rank of every attempt). A cluster's node (a
Kubernetes pod) starts its ranks as `python -u -m ENTRY`, as torchrun does by default.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import psutil

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.warm_start import Process, start_process
from workload_runtime import run_module

PEER_GRACE_SECONDS = 10.0
# A node's agent starts warm, as the local backend's workloads do (`warm_start.py`): importing
# torchrun's module is ~2 CPU-s of each agent's start, paid again by every attempt of every node.
AGENT_IMPORTS = ("torch.distributed.run", "torch.distributed.checkpoint")  # a gang saves sharded checkpoints (DCP)
MONITOR_SECONDS = "0.2"  # how often torchrun looks at its ranks


def node_name(pool: str, node_rank: int) -> str:
    return f"{pool}-node{node_rank}"


def torchrun_command(
    interpreter: str, spec: StepSpec, node_rank: int | str, port: int, master_addr: str = "127.0.0.1", *, fork_ranks: bool = False
) -> list[str]:
    """The command that starts one node of `spec`'s gang: `torchrun` for its ranks. `node_rank`
    may be a reference the launcher expands (Kubernetes: `$(JOB_COMPLETION_INDEX)`). With
    `fork_ranks`, the agent forks its ranks rather than starting a new interpreter for each."""
    entry = ["--start-method=fork", "--run-path", run_module.__file__, spec.entry_point] if fork_ranks else ["-m", spec.entry_point]
    return [
        interpreter, "-m", "torch.distributed.run",
        f"--nnodes={spec.nodes}", f"--node-rank={node_rank}", f"--nproc-per-node={spec.ranks_per_node or 1}",
        f"--master-addr={master_addr}", f"--master-port={port}",
        "--max-restarts=0", f"--monitor-interval={MONITOR_SECONDS}",
        *entry,
    ]  # fmt: skip


def kill_node(pid: int) -> list[int]:
    """SIGKILL a local node: its agent and every process under it (its ranks). Returns the pids."""
    try:
        agent = psutil.Process(pid)
        tree = [agent, *agent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for process in tree:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in tree]


def free_port() -> int:
    """A free TCP port on loopback for the gang's rendezvous (rank 0 listens on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_nodes(pool: Pool, spec: StepSpec) -> list[str]:
    """The nodes of a local pool the gang runs on: the first `spec.nodes` the step may use
    (fewer when the pool has too few left: the backend refuses the step then)."""
    names = [node_name(pool.name, i) for i in range(max(pool.nodes, spec.nodes))]
    return [n for n in names if n not in spec.exclude_nodes][: spec.nodes]


def gang_starter(interpreter: str, pool: Pool, spec: StepSpec) -> Callable[..., GangProcess]:
    """What the local backend's Pipes client calls instead of starting one process."""
    port = free_port()
    names = local_nodes(pool, spec)
    commands = [torchrun_command(interpreter, spec, i, port, fork_ranks=True) for i in range(spec.nodes)]

    def start(command: Sequence[str], *, cwd: str, env: Mapping[str, str], output: IO[bytes] | None, **_: Any) -> GangProcess:
        return GangProcess.start(commands, names, env=env, cwd=cwd, output=output, imports=[*AGENT_IMPORTS, *spec.imports])

    return start


class GangProcess:
    """The node agents of one gang, as one `Popen`-like process."""

    def __init__(self, nodes: list[Process], names: list[str]):
        self.nodes, self.names = nodes, names
        self.returncode: int | None = None
        self.failed_node: str | None = None  # the node whose ending ended the gang
        self._stopping_since: float | None = None
        self._ranks: list[list[psutil.Process]] = [[] for _ in nodes]  # each node's rank processes, as last seen
        self._ranks_seen_at = 0.0

    @classmethod
    def start(
        cls,
        commands: Sequence[Sequence[str]],
        names: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        output: IO[bytes] | None,
        imports: Sequence[str] = AGENT_IMPORTS,
    ) -> GangProcess:
        """Start each node's agent warm, with `imports` (torchrun's and what its ranks need) imported ahead."""
        nodes = []
        for command, name in zip(commands, names, strict=True):
            node_env = {**env, "SINEWGRID_NODE": name, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
            nodes.append(start_process(list(command), cwd=cwd, env=node_env, output=output, imports=imports))
        return cls(nodes, list(names))

    @property
    def pid(self) -> int:
        return self.nodes[0].pid

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self.nodes]

    def _look_at_ranks(self) -> None:
        """Note each live node's ranks (about once a second): a node that dies takes these with it."""
        if time.monotonic() - self._ranks_seen_at < 1.0:
            return
        self._ranks_seen_at = time.monotonic()
        for i, node in enumerate(self.nodes):
            if node.poll() is None:
                try:
                    self._ranks[i] = psutil.Process(node.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    pass

    def _bury(self, codes: list[int | None]) -> None:
        """Kill the ranks left behind by nodes that ended (a lost agent does not take them)."""
        for i, code in enumerate(codes):
            if code is not None and self._ranks[i]:
                for rank in self._ranks[i]:
                    try:
                        rank.kill()
                    except psutil.NoSuchProcess:
                        pass
                self._ranks[i] = []

    def poll(self) -> int | None:
        self._look_at_ranks()
        codes = [node.poll() for node in self.nodes]
        self._bury(codes)
        if self.failed_node is None:
            ended_badly = [(code >= 0, i) for i, code in enumerate(codes) if code not in (None, 0)]
            if ended_badly:  # a node killed by a signal is the cause; its peers' failures follow from it
                self.failed_node = self.names[min(ended_badly)[1]]
                self._stop_peers()
        if self._stopping_since is not None and time.monotonic() - self._stopping_since > PEER_GRACE_SECONDS:
            self._kill_all()
        if any(code is None for code in codes):
            return None
        failed = self.names.index(self.failed_node) if self.failed_node else None
        self.returncode = 0 if failed is None else codes[failed]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.names, timeout or 0)
            time.sleep(0.05)
        return code

    def _stop_peers(self) -> None:
        self._stopping_since = time.monotonic()
        self.send_signal(signal.SIGTERM)

    def _kill_all(self) -> None:
        for node in self.nodes:
            if node.poll() is None:
                kill_node(node.pid)

    def send_signal(self, signum: int) -> None:
        """To every node's agent, which passes it on to its ranks (SIGTERM: they checkpoint)."""
        for node in self.nodes:
            if node.poll() is None:
                node.send_signal(signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to every node and its ranks."""
        self._kill_all()
