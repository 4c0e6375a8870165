"""The `compute` resource: run a step on the pool placement picks, resume it when preempted.

Assets decide what runs; this resource decides where, launches the workload through
Dagster Pipes on the pool's backend, relaunches it from its checkpoint when the capacity
is taken away, records every attempt in the ledger, and returns metadata for the asset.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from shared_resources.backends import AttemptOutcome, backend_for
from shared_resources.capacity import Cooldowns
from shared_resources.ledger import AttemptRecord, ledger_markdown, record_attempt
from shared_resources.placement import PlacementPlan, plan_placement
from shared_resources.pools import Pool, load_pools
from shared_resources.step_spec import StepSpec
from shared_resources.storage import Storage


@dataclass
class StepRun:
    """What happened to one step: where it ran, every attempt, and the workload's result."""

    spec: StepSpec
    plan: PlacementPlan
    pool: Pool
    checkpoint_uri: str
    attempts: list[AttemptRecord] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    logs: list[str | None] = field(default_factory=list)

    @property
    def preemptions(self) -> int:
        return sum(1 for a in self.attempts if a.outcome == AttemptOutcome.preempted)

    @property
    def wall_seconds(self) -> float:
        return sum(a.wall_seconds for a in self.attempts)

    @property
    def productive_seconds(self) -> float:
        return sum(a.productive_seconds for a in self.attempts)

    @property
    def gpu_hours(self) -> float:
        return sum(a.gpu_hours for a in self.attempts)

    @property
    def cost_usd(self) -> float:
        return sum(a.cost_usd for a in self.attempts)

    @property
    def goodput(self) -> float:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds else 0.0

    def metadata(self) -> dict[str, Any]:
        """Materialization metadata: the workload's result plus placement, cost and goodput."""
        return {
            **self.result,
            "pool": self.pool.name,
            "provider": self.pool.provider,
            "purchasing": self.pool.purchasing.value,
            "backend": self.pool.backend.value,
            "attempts": len(self.attempts),
            "pools_tried": ", ".join(dict.fromkeys(a.pool for a in self.attempts)),
            "preemptions": self.preemptions,
            "wall_seconds": dg.MetadataValue.float(round(self.wall_seconds, 2)),
            "productive_seconds": dg.MetadataValue.float(round(self.productive_seconds, 2)),
            "lost_seconds": dg.MetadataValue.float(round(self.wall_seconds - self.productive_seconds, 2)),
            "goodput": dg.MetadataValue.float(round(self.goodput, 4)),
            "gpu_hours": dg.MetadataValue.float(round(self.gpu_hours, 5)),
            "cost_usd": dg.MetadataValue.float(round(self.cost_usd, 5)),
            "checkpoints": dg.MetadataValue.path(self.checkpoint_uri),
            "placement": dg.MetadataValue.md(self.plan.evidence_markdown()),
            "ledger": dg.MetadataValue.md(ledger_markdown(self.attempts)),
            **({"workload_log": dg.MetadataValue.path(self.logs[-1])} if self.logs and self.logs[-1] else {}),
        }


class StepFailedError(dg.Failure):
    pass


class ComputeResource(dg.ConfigurableResource):
    """Runs GPU steps on the capacity pool the placement policy picks.

    `pools_file` is a pool catalog (YAML); empty means the packaged default, which maps
    every pool to this machine.
    """

    storage_root: str
    pools_file: str = ""

    def pools(self) -> dict[str, Pool]:
        return load_pools(self.pools_file or None)

    def plan(self, spec: StepSpec) -> PlacementPlan:
        return plan_placement(spec, self.pools())

    def _choose_pool(self, plan: PlacementPlan, cooldowns: Cooldowns, refused: set[str], context) -> Pool:
        """The first pool of the plan that is neither cooling down nor refused this step;
        if every pool is cooling down, the one whose cool-down ends first."""
        candidates = [p for p in plan.ranked if p.name not in refused]
        if not candidates:
            raise StepFailedError(
                description=(
                    f"No pool had capacity for {plan.step}: {', '.join(sorted(refused))} refused it. "
                    "Wait for capacity, raise the pools' limits, or add a pool to the catalog."
                )
            )
        waiting = {p.name: cooldowns.active(p.name) for p in candidates}
        for pool in candidates:
            if waiting[pool.name] is None:
                return pool
        pool = min(candidates, key=lambda p: waiting[p.name].until)
        context.log.info(f"every pool for {plan.step} is cooling down; using {pool.name}, whose cool-down ends first")
        return pool

    def run(
        self,
        context: dg.AssetExecutionContext,
        spec: StepSpec,
        *,
        lineage: str,
    ) -> StepRun:
        """Place `spec`, run it, fail over when a pool refuses it, resume it after each
        preemption (on the same pool or the next), and account for every attempt."""
        storage = Storage.at(self.storage_root)
        plan = self.plan(spec)
        cooldowns = Cooldowns(storage)
        context.log.info(f"placement for {spec.name}: {plan.first.name} ({plan.first.purchasing.value})\n{plan.evidence_markdown()}")
        step = StepRun(spec=spec, plan=plan, pool=plan.first, checkpoint_uri=storage.checkpoints(lineage))
        partition = context.partition_key if context.has_partition_key else None
        asset = context.asset_key.to_user_string()
        refused: set[str] = set()
        # Refusals cost nothing but a try per pool; preemptions are bounded by the step's budget.
        for attempt in range(1, spec.max_preemptions + len(plan.ranked) + 2):
            pool = self._choose_pool(plan, cooldowns, refused, context)
            step.pool = pool
            extras = {
                "config": spec.config,
                "checkpoint_uri": step.checkpoint_uri,
                "checkpoint_every_steps": spec.checkpoint_every_steps,
                # Young/Daly for this pool's interruption rate (None: no time-based cadence).
                "checkpoint_interval_seconds": plan.verdict(pool.name).checkpoint_interval_seconds,
                "lineage": {"step": spec.name, "lineage": lineage, "run_id": context.run_id, "asset": asset},
                "attempt": attempt,
                "pool": pool.name,
                "storage_root": self.storage_root,
                "log_uri": storage.uri("logs", context.run_id, f"{spec.name}-attempt{attempt}.log"),
            }
            started = dt.datetime.now(dt.UTC)
            result = backend_for(pool.backend.value).run_attempt(context, pool, spec, extras)
            ended = dt.datetime.now(dt.UTC)
            record = AttemptRecord.for_attempt(
                run_id=context.run_id,
                step=spec.name,
                asset=asset,
                partition=partition,
                attempt=attempt,
                pool=pool,
                gpus=spec.gpus,
                started=started,
                ended=ended,
                productive_seconds=result.committed_seconds,
                checkpoint_seconds=result.checkpoint_seconds,
                queue_seconds=result.queue_seconds,
                lane=spec.tenant,
                outcome=result.outcome.value,
                exit_code=result.exit_code,
            )
            record_attempt(storage, record)
            step.attempts.append(record)
            step.logs.append(result.log_uri)
            if result.outcome is AttemptOutcome.succeeded:
                step.result = result.metadata
                return step
            if result.outcome is AttemptOutcome.refused:
                refused.add(pool.name)
                cooldowns.start(pool, "refused: no capacity")
                context.log.warning(f"{pool.name} refused {spec.name} ({result.log_tail}); failing over to the next pool in the plan")
                continue
            if result.outcome is AttemptOutcome.preempted:
                if step.preemptions > spec.max_preemptions:
                    break
                cooldowns.start(pool, "preempted")
                context.log.warning(
                    f"{spec.name} attempt {attempt} on {pool.name} was preempted (exit {result.exit_code}); "
                    "relaunching from its latest checkpoint, on another pool if one is free of cool-down"
                )
                continue
            raise StepFailedError(
                description=(
                    f"{spec.name} failed on pool {pool.name} (exit code {result.exit_code}). The last lines of its "
                    f"output ({result.log_uri}):\n{result.log_tail}\nFix the workload or its config and re-materialize."
                ),
                metadata={
                    "ledger": dg.MetadataValue.md(ledger_markdown(step.attempts)),
                    **({"log": dg.MetadataValue.path(result.log_uri)} if result.log_uri else {}),
                },
            )
        raise StepFailedError(
            description=(
                f"{spec.name} was preempted {step.preemptions} times, more than its limit of "
                f"{spec.max_preemptions}. Raise `max_preemptions` or move it to steadier capacity."
            ),
            metadata={"ledger": dg.MetadataValue.md(ledger_markdown(step.attempts))},
        )
