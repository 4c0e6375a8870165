"""The `compute` resource: run a step on the pool placement picks, resume it when preempted.

Assets decide what runs; this resource decides where, launches the workload through
Dagster Pipes on the pool's backend, relaunches it from its checkpoint when the capacity
is taken away, records every attempt in the ledger, and returns metadata for the asset.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from shared_resources.compute.backends import AttemptOutcome, AttemptResult, Refusal, backend_for
from shared_resources.compute.cooldowns import Cooldowns
from shared_resources.compute.health import Drains, Qualifications, probe_spec
from shared_resources.compute.monitor import STRAGGLER, UNHEALTHY
from shared_resources.accounting.ledger import AttemptRecord, ledger_markdown, record_attempt
from shared_resources.data.lineage import code_version
from shared_resources.placement.ranking import PlacementPlan, plan_placement
from shared_resources.catalog.pools import Pool, load_pools
from shared_resources.catalog.step_spec import StepSpec
from shared_resources.runtime.storage import Storage


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
    # One entry per attempt: when it was submitted, ran, resumed, ended and was contained (unix
    # times), why it ended, the steps it resumed from and reached, what the monitor flagged.
    timeline: list[dict[str, Any]] = field(default_factory=list)

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

    @property
    def final_checkpoint(self) -> str:
        """The URI of the checkpoint the workload finished with (its result), else the run's folder."""
        value = self.result.get("checkpoint_uri")
        return str(getattr(value, "value", value) or self.checkpoint_uri)

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
            **({"recovery": dg.MetadataValue.md(timeline_markdown(self.timeline))} if len(self.timeline) > 1 else {}),
            **({"workload_log": dg.MetadataValue.path(self.logs[-1])} if self.logs and self.logs[-1] else {}),
        }


def attempt_timeline(attempt: int, pool: Pool, submitted: float, result: AttemptResult) -> dict[str, Any]:
    """What one attempt did, when (unix times), for recovery measurements and the UI."""
    steps = [int(m["step"]) for m in result.messages if m.get("event") in ("telemetry", "checkpoint", "progress") and "step" in m]
    resumed = [m for m in result.messages if m.get("event") == "resumed"]
    saved = [m for m in result.messages if m.get("event") == "checkpoint" and "at" in m]
    pace = sorted(float(m["step_seconds"]) for m in result.messages if m.get("event") == "telemetry" and m.get("step_seconds"))
    return {
        "attempt": attempt,
        "pool": pool.name,
        "backend": pool.backend.value,
        "outcome": result.outcome.value,
        "cause": result.cause,
        "submitted_at": submitted,
        "running_at": result.running_at,
        "resumed_at": result.first_event_at("resumed"),
        "resumed_step": int(resumed[0]["step"]) if resumed else None,
        "last_step": max(steps, default=None),
        "ended_at": result.ended_at,
        "contained_at": None,
        "last_checkpoint_step": int(saved[-1]["step"]) if saved else None,
        "last_checkpoint_at": float(saved[-1]["at"]) if saved else None,
        "step_seconds": pace[len(pace) // 2] if pace else None,  # median of the telemetry reports
        "checkpoints": sum(1 for m in result.messages if m.get("event") == "checkpoint" and "checkpoint_seconds" in m),
        "checkpoint_seconds": result.checkpoint_seconds,
        "flags": result.flags,
    }


def disqualified_timeline(attempt: int, pool: Pool, at: float, problem: str) -> dict[str, Any]:
    """The timeline entry of a pool that failed qualification: nothing ran, the pool was drained."""
    return {
        "attempt": attempt, "pool": pool.name, "backend": pool.backend.value, "outcome": "disqualified", "cause": UNHEALTHY,
        "submitted_at": at, "running_at": None, "resumed_at": None, "resumed_step": None, "last_step": None,
        "last_checkpoint_step": None, "last_checkpoint_at": None, "step_seconds": None, "ended_at": at, "contained_at": at,
        "checkpoints": 0, "checkpoint_seconds": 0.0,
        "flags": [{"cause": UNHEALTHY, "detail": problem, "action": "replace", "at": at}],
    }


def timeline_markdown(timeline: list[dict[str, Any]]) -> str:
    """The attempts of a step as a table of what happened when (seconds since the first submission)."""
    if not timeline:
        return ""
    t0 = timeline[0]["submitted_at"]

    def since(value: float | None) -> str:
        return f"{value - t0:.2f}" if value is not None else "—"

    lines = ["| attempt | pool | outcome | cause | submitted | running | resumed (step) | ended | contained |", "|---|---|---|---|---|---|---|---|---|"]
    for t in timeline:
        resumed = f"{since(t['resumed_at'])} ({t['resumed_step']})" if t["resumed_at"] is not None else "—"
        lines.append(
            f"| {t['attempt']} | `{t['pool']}` | {t['outcome']} | {t['cause'] or '—'} | {since(t['submitted_at'])} | "
            f"{since(t['running_at'])} | {resumed} | {since(t['ended_at'])} | {since(t['contained_at'])} |"
        )
    return "\n".join(lines)


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

    def _choose_pool(self, plan: PlacementPlan, cooldowns: Cooldowns, drains: Drains, refused: set[str], context) -> Pool:
        """The first pool of the plan that is neither drained, cooling down nor refused this
        step; if every pool is cooling down, the one whose cool-down ends first."""
        drained = {p.name: d for p in plan.ranked if (d := drains.active(p.name)) is not None}
        candidates = [p for p in plan.ranked if p.name not in refused and p.name not in drained]
        if not candidates:
            why = [f"{name} refused it" for name in sorted(refused)] + [
                f"{name} is drained ({d.reason}; {d.remaining_seconds:.0f}s left, or `sinewgrid pools undrain {name}`)" for name, d in drained.items()
            ]
            raise StepFailedError(
                description=(
                    f"No pool {'could take' if drained else 'had capacity for'} {plan.step}: {'; '.join(why)}. "
                    "Wait for capacity, fix or undrain a pool, raise the pools' limits, or add a pool to the catalog."
                )
            )
        waiting = {p.name: cooldowns.active(p.name) for p in candidates}
        for pool in candidates:
            if waiting[pool.name] is None:
                return pool
        pool = min(candidates, key=lambda p: waiting[p.name].until)
        context.log.info(f"every pool for {plan.step} is cooling down; using {pool.name}, whose cool-down ends first")
        return pool

    def _qualify(self, context, pool: Pool, spec: StepSpec, storage: Storage, attempt: int) -> tuple[AttemptOutcome, str, AttemptResult | None]:
        """Qualify `pool` for `spec` (see `health.py`): succeeded, refused (no capacity for the
        probe either: its result is the attempt's) or failed with the problem in words."""
        if not pool.qualify:
            return AttemptOutcome.succeeded, "", None
        backend = backend_for(pool.backend.value)
        problem = getattr(backend, "qualify", lambda _pool: None)(pool)
        if isinstance(problem, Refusal):
            return AttemptOutcome.refused, problem, AttemptResult(AttemptOutcome.refused, None, log_tail=str(problem), cause="refused", ended_at=time.time())
        if problem:
            return AttemptOutcome.failed, problem, None
        qualifications = Qualifications(storage)
        if qualifications.fresh(pool, spec.runtime):
            return AttemptOutcome.succeeded, "", None
        probe = probe_spec(spec, pool)
        extras = {
            "config": probe.config,
            "attempt": attempt,
            "storage_root": self.storage_root,
            "log_uri": storage.uri("logs", context.run_id, f"{probe.name}-{pool.name}.log"),
        }
        result = backend.run_attempt(context, pool, probe, extras)
        if result.outcome is AttemptOutcome.succeeded:
            checks = next((m.get("checks", {}) for m in result.messages if m.get("event") == "qualified"), {})
            qualifications.record(pool, spec.runtime, checks)
            context.log.info(f"{pool.name} qualified for {spec.name}: " + "; ".join(f"{k}: {v}" for k, v in checks.items()))
            return AttemptOutcome.succeeded, "", result
        if result.outcome is AttemptOutcome.refused:
            return AttemptOutcome.refused, result.log_tail, result
        return AttemptOutcome.failed, f"qualification probe failed (exit {result.exit_code}): {result.log_tail.strip()[-800:]}", result

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
        cooldowns, drains = Cooldowns(storage), Drains(storage)
        context.log.info(f"placement for {spec.name}: {plan.first.name} ({plan.first.purchasing.value})\n{plan.evidence_markdown()}")
        step = StepRun(spec=spec, plan=plan, pool=plan.first, checkpoint_uri=storage.checkpoints(lineage))
        partition = context.partition_key if context.has_partition_key else None
        asset = context.asset_key.to_user_string()
        refused: set[str] = set()
        # Refusals cost nothing but a try per pool; preemptions are bounded by the step's budget.
        for attempt in range(1, spec.max_preemptions + len(plan.ranked) + 2):
            pool = self._choose_pool(plan, cooldowns, drains, refused, context)
            step.pool = pool
            started = dt.datetime.now(dt.UTC)
            qualified, problem, probe = self._qualify(context, pool, spec, storage, attempt)
            if qualified is AttemptOutcome.failed:
                drain = drains.drain(pool, problem)
                context.log.warning(
                    f"{pool.name} failed qualification for {spec.name} and is drained for {pool.drain_seconds:g}s "
                    f"(`sinewgrid pools undrain {pool.name}` puts it back): {problem}"
                )
                step.timeline.append(disqualified_timeline(attempt, pool, drain.since, problem))
                continue
            extras = {
                "config": spec.config,
                "checkpoint_uri": step.checkpoint_uri,
                "checkpoint_every_steps": spec.checkpoint_every_steps,
                "telemetry_seconds": spec.telemetry_seconds,
                # Young/Daly for this pool's interruption rate (None: no time-based cadence).
                "checkpoint_interval_seconds": plan.verdict(pool.name).checkpoint_interval_seconds,
                "lineage": {
                    "step": spec.name,
                    "lineage": lineage,
                    "run_id": context.run_id,
                    "asset": asset,
                    "datasets": [d.name for d in spec.datasets],
                    "code_version": code_version(),
                },
                "attempt": attempt,
                "pool": pool.name,
                "storage_root": self.storage_root,
                "log_uri": storage.uri("logs", context.run_id, f"{spec.name}-attempt{attempt}.log"),
            }
            if qualified is AttemptOutcome.refused and probe is not None:
                result = probe  # no capacity even for the probe: the pool refused the step
            else:
                started = dt.datetime.now(dt.UTC)
                result = backend_for(pool.backend.value).run_attempt(context, pool, spec, extras)
            timeline = attempt_timeline(attempt, pool, started.timestamp(), result)
            step.timeline.append(timeline)
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
                cause=result.cause,
            )
            record_attempt(storage, record)
            step.attempts.append(record)
            step.logs.append(result.log_uri)
            for flag in result.flags:
                if flag["action"] == "report":
                    context.log.warning(f"{spec.name} on {pool.name}: {flag['cause']}: {flag['detail']} (policy: report; the step ran on)")
            if result.outcome is AttemptOutcome.succeeded:
                step.result = result.metadata
                return step
            if result.outcome is AttemptOutcome.refused:
                refused.add(pool.name)
                cooldowns.start(pool, "refused: no capacity")
                timeline["contained_at"] = time.time()
                context.log.warning(f"{pool.name} refused {spec.name} ({result.log_tail}); failing over to the next pool in the plan")
                continue
            if result.outcome is AttemptOutcome.preempted:
                if result.cause in (STRAGGLER, UNHEALTHY):
                    flag = next(f for f in result.flags if f["cause"] == result.cause)
                    drains.drain(pool, f"{result.cause}: {flag['detail']}")
                    context.log.warning(f"drained {pool.name} for {pool.drain_seconds:g}s ({result.cause}); {spec.name} moves to the next pool")
                else:
                    cooldowns.start(pool, "preempted")
                timeline["contained_at"] = time.time()
                if step.preemptions > spec.max_preemptions:
                    break
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
