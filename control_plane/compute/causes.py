"""Why an attempt ended, as the ledger books it and the recovery policies read it."""

from __future__ import annotations

from enum import StrEnum


class Cause(StrEnum):
    none = ""  # it succeeded
    notice = "notice"  # SIGTERM, checkpointed, exit 75 (a preemption notice, a time limit, a cancelled run)
    lost_node = "lost-node"  # killed without notice (spot reclaim, node failure, the OOM killer)
    reclaimed = "reclaimed"  # the engine took the capacity back (requeue, a stopped Ray job)
    straggler = "straggler"  # the attempt monitor stopped it: its steps slowed down
    unhealthy_node = "unhealthy-node"  # the attempt monitor stopped it, or qualification failed: a sick node
    quota = "quota"  # admission took the GPUs back (a team reclaiming its lent quota, or its own higher priority): checkpointed on notice
    moved = "moved"  # admission moved it to committed capacity of its plan that came free: checkpointed on notice
    refused = "refused"  # the pool had no capacity for it; nothing ran
    failed = "failed"  # the workload itself failed

    @property
    def pool_at_fault(self) -> bool:
        """A cause that says the pool is bad (drain it), not merely busy (cool it down)."""
        return self in (Cause.straggler, Cause.unhealthy_node)


# Preemptions admission made (control_plane/queues): they move a step, they say nothing against a
# pool, and they do not count against the step's `max_preemptions`.
ADMISSION_CAUSES = frozenset({Cause.quota, Cause.moved})
