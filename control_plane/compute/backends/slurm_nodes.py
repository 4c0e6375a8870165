"""Slurm's node health: `scontrol show node --oneliner` output read into `NodeHealth` records.

A node is unhealthy when its state words (`State=MIXED+DRAIN`) include one that means it takes
no new work or is sick under the work it has (drained, down, failing, not responding). The
Slurm backend (`control_plane.compute.backends.slurm`) asks `partition_problem` whether a
partition has a node that can take work and `job_nodes_problem` whether a running job's nodes
went bad; their texts name the unhealthy nodes with Slurm's `Reason=` and the `scontrol` line
that returns them to service.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Node state words (`scontrol show node`'s `State=IDLE+DRAIN`, sinfo's long names) that
# mean the node takes no new work, or is sick under the work it has.
_UNHEALTHY = {"DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "INVALID_REG", "FUTURE"}
# How many unhealthy nodes a problem text spells out (a big partition has thousands).
_NODES_SHOWN = 8


@dataclass(frozen=True)
class NodeHealth:
    """One node as `scontrol show node` describes it."""

    name: str
    state: str  # Slurm's words, e.g. `MIXED+DRAIN`
    reason: str = ""  # Slurm's `Reason=` (a health check's message), without the `[user@time]` stamp
    reason_by: str = ""  # the `user@time` stamp Slurm adds to the reason

    @property
    def problems(self) -> set[str]:
        """The state words that make this node unfit for work (empty: healthy)."""
        return set(self.state.upper().split("+")) & _UNHEALTHY

    def describe(self) -> str:
        """`sgnode MIXED+DRAIN (NHC: GPU 0 lost; set by root@2026-11-30T11:39:07)`."""
        stamp = f"; set by {self.reason_by}" if self.reason_by else ""
        return f"{self.name} {self.state}" + (f" ({self.reason}{stamp})" if self.reason else "")


def parse_nodes(text: str) -> list[NodeHealth]:
    """`scontrol show node --oneliner` output, one node per line, as `NodeHealth` records
    (each node once, in the order shown)."""
    nodes: dict[str, NodeHealth] = {}
    for line in text.splitlines():
        name = re.match(r"NodeName=(\S+)", line.strip())
        if not name or name.group(1) in nodes:
            continue
        state = re.search(r"(?:^|\s)State=(\S+)", line)
        reason, by = "", ""
        found = re.search(r"(?:^|\s)Reason=(.*)$", line.rstrip())
        if found:
            # `Reason=TEXT [user@time]` comes last; the text may hold spaces and `=` signs.
            stamped = re.match(r"(.*?)\s*\[([^\[\]\s]+@[^\[\]\s]+)\](.*)$", found.group(1))
            reason, by = (stamped.group(1), stamped.group(2)) if stamped else (found.group(1), "")
            reason = "" if reason.strip() in ("", "None", "(null)") else reason.strip()
        nodes[name.group(1)] = NodeHealth(name.group(1), state.group(1) if state else "UNKNOWN", reason, by)
    return list(nodes.values())


def partition_problem(text: str, partition: str, members: str, where: str) -> str | None:
    """None when `scontrol show node --oneliner` output `text` (the partition's nodes, `members`,
    or every node for `ALL`) has a node of `partition` that can take work; else why not,
    prefixed by `where`."""
    nodes = parse_nodes(text)
    if members == "ALL":
        nodes = [n for n in nodes if _in_partition(text, n.name, partition)]
    if any(not node.problems for node in nodes):
        return None
    if not nodes:
        return f"{where}: `scontrol show node {members}` listed no nodes"
    sick = sorted(nodes, key=lambda n: n.name)
    shown_nodes = "; ".join(n.describe() for n in sick[:_NODES_SHOWN])
    if len(sick) > _NODES_SHOWN:
        shown_nodes += f"; and {len(sick) - _NODES_SHOWN} more (`sinfo -R -p {partition}` lists every reason)"
    names = members if members != "ALL" else ",".join(n.name for n in sick)
    return (
        f"{where} has no node that can take work: {shown_nodes}. Once the cause is fixed, an operator "
        f"returns the nodes to service with `scontrol update NodeName={names} State=RESUME`"
    )


def job_nodes_problem(text: str, job_id: str, pool: str) -> str | None:
    """None when every node in `scontrol show node --oneliner` output `text` (a running job's
    nodes) is healthy; else which are drained, down, failing or not responding, and why."""
    sick = [node for node in parse_nodes(text) if node.problems]
    if not sick:
        return None
    names = ",".join(node.name for node in sick)
    return (
        f"Slurm job {job_id} (pool {pool}) runs on {'an unhealthy node' if len(sick) == 1 else 'unhealthy nodes'}: "
        f"{'; '.join(node.describe() for node in sick)}. Once the node is fixed, an operator returns it to "
        f"service with `scontrol update NodeName={names} State=RESUME`"
    )


def _in_partition(text: str, node: str, partition: str) -> bool:
    for line in text.splitlines():
        if line.strip().startswith(f"NodeName={node} "):
            found = re.search(r"(?:^|\s)Partitions=(\S+)", line)
            return bool(found) and partition in found.group(1).split(",")
    return False
