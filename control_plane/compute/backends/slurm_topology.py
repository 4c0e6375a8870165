"""A gang's fast domain on Slurm: the job's `--switches`, and the `topology.conf` that gives it meaning.

A Slurm cluster knows its network through `topology.conf` (`TopologyPlugin=topology/tree` in
`slurm.conf`): leaf switches, each with the nodes cabled to it, and switches above them. A pool's
fast domain (`nodes_per_domain`) is one leaf switch there. Slurm's tree plugin already prefers to
pack a job under few switches, but only as a preference: when no single switch has enough free
nodes, it starts a gang across switches rather than wait. A tightly coupled step would then run, at
the slower links' speed, a placement the planner refused (`StepSpec.tightly_coupled`). So its job
asks for at most as many leaf switches as the plan allows (`--switches=COUNT@WAIT`): one when the
gang fits one domain; with `span_domains`, the fewest whole domains that hold it.

WAIT is how long Slurm may hold the job for that switch count before it gives up and starts it on
more switches. The platform itself cancels a job still pending at the pool's
`pending_deadline_seconds` and moves the step to the next pool; so WAIT is that deadline plus a
margin (`SWITCH_WAIT_MARGIN_SECONDS`): Slurm never relaxes the count while the platform still
waits. Slurm caps WAIT at the cluster's `SchedulerParameters=max_switch_wait=SECONDS` (default
300 s): a site must set it at least as long, or a gang may still be split after that cap.
"""

from __future__ import annotations

import math

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec

# Slurm holds the switch count this long past the pool's pending deadline, when the platform has
# cancelled the job already (its poll and `scancel` take a second or two; a minute is ample).
SWITCH_WAIT_MARGIN_SECONDS = 60


def slurm_duration(seconds: float) -> str:
    """Seconds in a form Slurm's time options read: `10:00` (minutes:seconds), `1:30:00`
    (hours:minutes:seconds), `2-00:00:00` (days-hours:minutes:seconds)."""
    total = max(math.ceil(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def switches_needed(pool: Pool, spec: StepSpec) -> int | None:
    """The most leaf switches `spec`'s job may span on `pool`; None: no limit to ask for (a step
    that is not a tightly coupled gang of several nodes, or a pool with no fast domain declared)."""
    if not (spec.gang and spec.tightly_coupled and spec.nodes > 1) or pool.domain_nodes is None:
        return None
    # One domain when the gang fits one; else (the planner allows it only with `span_domains`)
    # the fewest whole domains that hold it.
    return 1 if spec.nodes <= pool.domain_nodes else math.ceil(spec.nodes / pool.domain_nodes)


def switches_option(pool: Pool, spec: StepSpec) -> str | None:
    """`--switches=1@11:00` for a tightly coupled gang that fits one domain of a pool with a
    600 s pending deadline; None where the step asks for no switch count (module docstring)."""
    count = switches_needed(pool, spec)
    if count is None:
        return None
    return f"--switches={count}@{slurm_duration(pool.pending_deadline_seconds + SWITCH_WAIT_MARGIN_SECONDS)}"


def switch_layout(nodes: list[str], per_switch: int, prefix: str = "s") -> dict[str, list[str]]:
    """Leaf switches of `per_switch` nodes each, in the nodes' order: `{"s0": [n0, n1], "s1": [n2, n3]}`."""
    if per_switch < 1:
        raise ValueError(f"per_switch must be at least 1, not {per_switch}")
    return {f"{prefix}{i}": nodes[start : start + per_switch] for i, start in enumerate(range(0, len(nodes), per_switch))}


def topology_conf(nodes: list[str], per_switch: int, spine: str = "spine") -> str:
    """A `topology.conf` for the tree plugin: a leaf switch per `per_switch` nodes (a pool's
    `nodes_per_domain`) and, above several, one spine switch over them all."""
    leaves = switch_layout(nodes, per_switch)
    lines = [
        "# Slurm's network topology (TopologyPlugin=topology/tree): one leaf switch per fast domain of",
        f"# {per_switch} node{'s' if per_switch != 1 else ''}; a tightly coupled gang asks for one with --switches.",
    ]
    lines += [f"SwitchName={name} Nodes={','.join(members)}" for name, members in leaves.items()]
    if len(leaves) > 1:
        lines.append(f"SwitchName={spine} Switches={','.join(leaves)}")
    return "\n".join(lines) + "\n"
