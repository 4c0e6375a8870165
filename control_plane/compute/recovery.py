"""Recovery policies: what happens after an attempt ends.

After every attempt the compute resource asks the policy of the pool it ran on (the step's
`recovery`, else the pool's, else `failover`) for a `Decision`: retry on the same pool, move
to the next pool of the placement plan, or give up; and whether the pool cools down (busy:
avoided for its `cooldown_seconds` while another pool can run the step) or is drained (bad:
out of placement for its `drain_seconds`, or until `sinewgrid pools undrain`). The shape
follows SkyPilot's managed-job recovery strategies (`sky/jobs/recovery_strategy.py`):
small classes chosen by name.

| ending | `failover` (default) | `stay` |
|---|---|---|
| succeeded | done | done |
| failed (the workload's own error) | give up | give up |
| refused (no capacity, nothing ran) | cool down, never this pool again for the step, move | same |
| failed qualification | drain, move (a gang's node with a spare: drain that node only, retry here) | same |
| preempted: straggler or unhealthy node | drain, move | same |
| preempted: notice, lost node, reclaimed | cool down, move (the next free pool, this one if all cool) | retry here, no cool-down |
| preempted: quota or moved (admission gave its GPUs to another step, or moved it to committed capacity of its plan; control_plane/queues) | move, no cool-down: the first pool admission allows; not counted against `max_preemptions` | same |
| a gang's node lost, slow or sick, and the pool has a spare | drain that node only, retry here without it | same |
| more preemptions than `max_preemptions` | give up | give up |

Adding a policy: a subclass with a `name`, registered in `POLICIES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from control_plane.compute.causes import ADMISSION_CAUSES, Cause


class Action(StrEnum):
    done = "done"  # the step succeeded
    retry = "retry"  # run the next attempt on the same pool
    move = "move"  # run the next attempt on the first pool of the plan that can take it
    give_up = "give up"  # fail the step


class Ending(StrEnum):
    """How one try on a pool ended: an attempt's outcome, or the pool failing qualification."""

    succeeded = "succeeded"
    preempted = "preempted"
    refused = "refused"
    failed = "failed"
    disqualified = "disqualified"


@dataclass(frozen=True)
class Outcome:
    """What the policy is told about the try that just ended."""

    ending: Ending
    cause: str = ""  # a `Cause` ("" on success)
    problem: str = ""  # in words: the qualification problem, or the monitor's flag
    preemptions: int = 0  # preemptions of the step so far, this one included
    max_preemptions: int = 0
    flags: list[dict[str, Any]] = field(default_factory=list)
    node: str = ""  # the node at fault, when the backend or the monitor named one (a gang's)
    spare_nodes: int = 0  # nodes of the pool the gang could use instead (not in it, not excluded)


@dataclass(frozen=True)
class Decision:
    action: Action
    cool_down: str | None = None  # why the pool is avoided for its `cooldown_seconds`
    drain: str | None = None  # why the pool is taken out of placement for its `drain_seconds`
    exclude: bool = False  # never try this pool again for this step
    replace_node: str | None = None  # drain this node only; the next attempt runs on the pool without it


# Endings that say a node is bad, not the pool: a gang replaces that node with a spare.
REPLACEABLE = frozenset({Cause.lost_node, Cause.straggler, Cause.unhealthy_node})


class RecoveryPolicy:
    """`failover`: on a preemption, resume from the checkpoint on the next pool that is free of
    cool-down (the preempted pool cools down); a bad pool is drained; a full pool is skipped."""

    name: ClassVar[str] = "failover"

    def decide(self, outcome: Outcome) -> Decision:
        if outcome.ending is Ending.succeeded:
            return Decision(Action.done)
        if outcome.ending is Ending.failed:
            return Decision(Action.give_up)
        if outcome.ending is Ending.disqualified:
            if outcome.node and outcome.spare_nodes > 0:
                return Decision(Action.retry, replace_node=outcome.node)  # a gang's node failed its checks: start without it
            return Decision(Action.move, drain=outcome.problem)
        if outcome.ending is Ending.refused:
            return Decision(Action.move, cool_down="refused: no capacity", exclude=True)
        return self.after_preemption(outcome)

    def after_preemption(self, outcome: Outcome) -> Decision:
        if outcome.node and outcome.spare_nodes > 0 and outcome.cause in REPLACEABLE:
            decision = Decision(Action.retry, replace_node=outcome.node)
        elif outcome.cause in ADMISSION_CAUSES:
            decision = Decision(Action.move)  # the pool is fine: admission says where it resumes, no cool-down
        elif Cause(outcome.cause).pool_at_fault:
            detail = next((f["detail"] for f in outcome.flags if f["cause"] == outcome.cause), outcome.problem)
            decision = Decision(Action.move, drain=f"{outcome.cause}: {detail}")
        else:
            decision = self.after_notice(outcome)
        if outcome.preemptions > outcome.max_preemptions:
            return Decision(Action.give_up, cool_down=decision.cool_down, drain=decision.drain)
        return decision

    def after_notice(self, outcome: Outcome) -> Decision:
        """A preemption that says nothing against the pool (a notice, a lost node, a reclaim)."""
        return Decision(Action.move, cool_down="preempted")


class StayPolicy(RecoveryPolicy):
    """`stay`: resume on the same pool after a preemption (capacity that comes back, such as a
    reserved block between maintenance windows); still moves off a pool that is bad or full."""

    name: ClassVar[str] = "stay"

    def after_notice(self, outcome: Outcome) -> Decision:
        return Decision(Action.retry)


POLICIES: dict[str, type[RecoveryPolicy]] = {policy.name: policy for policy in (RecoveryPolicy, StayPolicy)}
DEFAULT_POLICY = RecoveryPolicy.name


class UnknownPolicyError(ValueError):
    pass


def policy_named(name: str | None, where: str = "") -> RecoveryPolicy:
    """The policy called `name` (None: the default), or an error naming where it was asked for."""
    chosen = name or DEFAULT_POLICY
    if chosen not in POLICIES:
        raise UnknownPolicyError(
            f"{where + ': ' if where else ''}unknown recovery policy `{chosen}`; known: {', '.join(POLICIES)} "
            "(control_plane/compute/recovery.py)"
        )
    return POLICIES[chosen]()
