"""The `compute` resource: run a step on the pool placement picks, resume it when preempted.

Assets decide what runs; this resource decides where. Each turn of its loop asks placement
for a pool (`PoolChooser`), runs one attempt there (`attempts.py`: qualify, launch through
Dagster Pipes on the pool's backend, book in the ledger), and asks the pool's recovery policy
(`recovery.py`) what comes next: done, retry here, move on, or give up.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time

import dagster as dg

from control_plane.accounting.budgets import BudgetExceeded, enforce
from control_plane.accounting.records import ledger_markdown
from control_plane.catalog.pools import Pool, load_pools
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute import attempts, pace
from control_plane.compute.backends import backend_for
from control_plane.compute.backends.base import AttemptOutcome, AttemptResult
from control_plane.compute.causes import Cause
from control_plane.compute.cooldowns import Cooldowns
from control_plane.compute.health import Drains
from control_plane.compute.left_behind import stop_left_behind
from control_plane.compute.recovery import Action, Decision, Ending, Outcome, RecoveryPolicy, policy_named
from control_plane.compute.step_run import StepFailedError, StepRun, attempt_timeline, disqualified_timeline
from control_plane.placement.ranking import PlacementPlan, plan_placement
from control_plane.queues.waiting_step import Admission, Mover, quota_preemption
from workload_runtime.storage import Storage
from control_plane.tenancy.control import lane_of, tenant_access_of

class PoolChooser:
    """The next pool for a step: the plan's order, minus pools that are drained or refused the
    step; a cooling pool only when every other is cooling too (the one whose cool-down ends
    first). A `retry` decision asks for the same pool again; one that replaces a gang's node
    also keeps that node out of the step's later attempts on the pool (`spec_on`)."""

    def __init__(self, plan: PlacementPlan, storage: Storage):
        self.plan, self.cooldowns, self.drains = plan, Cooldowns(storage), Drains(storage)
        self.excluded: set[str] = set()
        self.again: str | None = None
        self.replaced: dict[str, list[str]] = {}  # pool -> nodes of it this step no longer uses

    def spec_on(self, spec: StepSpec, pool: Pool) -> StepSpec:
        """The step as it runs on `pool`: without the nodes replaced there."""
        replaced = self.replaced.get(pool.name, [])
        # Each node once, so that asking again of a step already without them changes nothing.
        return spec.model_copy(update={"exclude_nodes": list(dict.fromkeys([*spec.exclude_nodes, *replaced]))}) if replaced else spec

    def spare_nodes(self, spec: StepSpec, pool: Pool) -> int:
        """Nodes of `pool` a gang could take instead of one of its own: none for a single process."""
        if not spec.gang:
            return 0
        return max(0, pool.nodes - spec.nodes - len(self.spec_on(spec, pool).exclude_nodes))

    def candidates(self, context: dg.AssetExecutionContext) -> list[Pool]:
        """The pools the next attempt may use, best first: the plan's order less the pools drained
        or refused, a `retry`'s pool first, pools cooling down last (the soonest ready first)."""
        drained = {p.name: d for p in self.plan.ranked if (d := self.drains.active(p.name)) is not None}
        candidates = [p for p in self.plan.ranked if p.name not in self.excluded and p.name not in drained]
        if not candidates:
            why = [f"{name} refused it" for name in sorted(self.excluded)] + [
                f"{name} is drained ({d.reason}; {d.remaining_seconds:.0f}s left, or `sinewgrid pools undrain {name}`)" for name, d in drained.items()
            ]
            raise StepFailedError(
                description=(
                    f"No pool {'could take' if drained else 'had capacity for'} {self.plan.step}: {'; '.join(why)}. "
                    "Wait for capacity, fix or undrain a pool, raise the pools' limits, or add a pool to the catalog."
                )
            )
        if self.again is not None and any(p.name == self.again for p in candidates):
            return sorted(candidates, key=lambda p: p.name != self.again)
        waiting = {p.name: self.cooldowns.active(p.name) for p in candidates}
        ready = [p for p in candidates if waiting[p.name] is None]
        cooling = sorted((p for p in candidates if waiting[p.name] is not None), key=lambda p: waiting[p.name].until)
        if not ready:
            context.log.info(f"every pool for {self.plan.step} is cooling down; using {cooling[0].name}, whose cool-down ends first")
        return ready + cooling

    def apply(self, decision: Decision, pool: Pool) -> None:
        if decision.drain:
            self.drains.drain(pool, decision.drain)
        if decision.cool_down:
            self.cooldowns.start(pool, decision.cool_down)
        if decision.exclude:
            self.excluded.add(pool.name)
        if decision.action is Action.retry:
            self.again = pool.name
        if decision.replace_node:
            self.replaced.setdefault(pool.name, []).append(decision.replace_node)


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

    def run(self, context: dg.AssetExecutionContext, spec: StepSpec, *, lineage: str) -> StepRun:
        """Place `spec`, run it, fail over when a pool refuses it, resume it after each
        preemption (on the same pool or the next), and account for every attempt."""
        storage = Storage.at(self.storage_root)
        _within_budget(storage, spec)
        access = tenant_access_of(self.storage_root, spec.tenant)
        plan = self.plan(pace.measured(storage, spec))  # throughputs its own runs measured, where they compare
        policies = _policies(spec, plan)
        chooser = PoolChooser(plan, storage)
        context.log.info(f"placement for {spec.name}: {plan.first.name} ({plan.first.purchasing.value})\n{plan.evidence_markdown()}")
        # A tenant's checkpoints live under its own root, where its credentials and key reach.
        home = Storage.at(access.storage_root) if access is not None else storage
        step = StepRun(spec=spec, plan=plan, pool=plan.first, checkpoint_uri=home.checkpoints(lineage), access=access)
        # A resumed run: its earlier worker's job for this step stops before this worker starts one.
        before = stop_left_behind(context, spec, storage, self.pools(), step.checkpoint_uri)
        # Refusals cost nothing but a try per pool (a pool that refused is not tried again);
        # preemptions are bounded by the step's `max_preemptions` (recovery gives up past it),
        # except those admission makes, which the queues bound.
        gate = Admission(context, spec, storage, self.pools(), step.checkpoint_uri)
        for number in itertools.count(before + 1):
            pool = step.pool = gate.pool(chooser)
            try:
                with Mover(gate, plan.ranked, pool):  # onto committed capacity of the plan, should some come free
                    outcome, result = self._attempt(context, step, pool, storage, number, lineage, chooser)
            finally:
                gate.attempt_ended()
            decision = policies[pool.name].decide(outcome)
            chooser.apply(decision, pool)
            if decision.replace_node:
                _replace_node(context, spec, pool, decision.replace_node, outcome)
            _say(context, spec, pool, number, outcome, decision, result)
            if outcome.ending in (Ending.refused, Ending.preempted):
                step.timeline[-1]["contained_at"] = time.time()
            if decision.action is Action.done:
                step.result = result.metadata
                return step
            if decision.action is Action.give_up:
                if outcome.ending is Ending.failed:
                    raise _failed(step, pool, result)
                break
        raise StepFailedError(
            description=(
                f"{spec.name} was preempted {step.preemptions} times, more than its limit of "
                f"{spec.max_preemptions}. Raise `max_preemptions` or move it to steadier capacity."
            ),
            metadata={"ledger": dg.MetadataValue.md(ledger_markdown(step.attempts))},
        )

    def _attempt(
        self, context: dg.AssetExecutionContext, step: StepRun, pool: Pool, storage: Storage, number: int, lineage: str, chooser: PoolChooser
    ) -> tuple[Outcome, AttemptResult | None]:
        """One try on `pool`: qualify it, launch the workload, book the attempt."""
        spec = chooser.spec_on(step.spec, pool)
        started = dt.datetime.now(dt.UTC)
        qualified = attempts.qualify(context, pool, spec, storage, number)
        if qualified.outcome is AttemptOutcome.failed:
            step.timeline.append(disqualified_timeline(number, pool, time.time(), qualified.problem, node=qualified.node))
            spares = chooser.spare_nodes(spec, pool)
            return Outcome(Ending.disqualified, cause=Cause.unhealthy_node, problem=qualified.problem, node=qualified.node, spare_nodes=spares), None
        if qualified.outcome is AttemptOutcome.refused and qualified.probe is not None:
            result = qualified.probe  # no capacity even for the probe: the pool refused the step
        else:
            started = dt.datetime.now(dt.UTC)
            inputs = attempts.workload_inputs(
                context, spec, step.plan, pool, storage, lineage=lineage, checkpoint_uri=step.checkpoint_uri, attempt=number, tenant=step.access
            )
            result = attempts.launch(context, pool, spec, inputs)
        if result.outcome is AttemptOutcome.preempted:
            quota_preemption(context, storage, spec, step.checkpoint_uri, started.timestamp(), result)
        step.timeline.append(attempt_timeline(number, pool, started.timestamp(), result))
        pace.record(storage, spec, pool, step.timeline[-1]["step_seconds"])
        step.attempts.append(attempts.book(context, storage, spec, pool, number, started, result))
        step.logs.append(result.log_uri)
        for flag in result.flags:
            if flag["action"] == "report":
                context.log.warning(f"{spec.name} on {pool.name}: {flag['cause']}: {flag['detail']} (policy: report; the step ran on)")
        outcome = Outcome(
            Ending(result.outcome.value), cause=result.cause, problem=result.log_tail, preemptions=step.preemptions,
            max_preemptions=spec.max_preemptions, flags=result.flags, node=result.node, spare_nodes=chooser.spare_nodes(spec, pool),
        )
        return outcome, result


def _within_budget(storage: Storage, spec: StepSpec) -> None:
    """A step whose project (its lane, as the ledger books it) or tenant is at its budget's limit
    does not start: nothing is qualified, submitted or booked (control_plane/accounting/budgets.py)."""
    try:
        enforce(storage, project=lane_of(spec.tenant), tenant=spec.tenant)
    except BudgetExceeded as exc:
        raise StepFailedError(description=f"{spec.name} was not started. {exc}", metadata=exc.metadata(), allow_retries=False) from None


def _policies(spec: StepSpec, plan: PlacementPlan) -> dict[str, RecoveryPolicy]:
    """Each pool's recovery policy for this step, checked before anything runs."""
    try:
        return {p.name: policy_named(spec.recovery or p.recovery, f"step {spec.name}, pool {p.name}") for p in plan.ranked}
    except ValueError as exc:
        raise StepFailedError(description=f"{exc}. Fix `recovery` of the step or of the pool in the catalog.") from None


def _replace_node(context: dg.AssetExecutionContext, spec: StepSpec, pool: Pool, node: str, outcome: Outcome) -> None:
    """Drain the gang's bad node on its engine (where the engine has nodes to drain) and say so."""
    reason = f"sinewgrid: {outcome.cause} in {spec.name}"
    try:
        drained = backend_for(pool.backend).drain_node(pool, node, reason)
    except Exception as exc:  # noqa: BLE001 - the gang still leaves the node out (`exclude_nodes`)
        context.log.warning(f"{spec.name} on {pool.name}: could not drain node {node} on its engine ({exc!r}); the gang leaves it out all the same")
        drained = False
    context.log.warning(
        f"{spec.name} on {pool.name}: node {node} ({outcome.cause}) is replaced by a spare; "
        f"{'drained it, ' if drained else ''}the gang resumes from its latest checkpoint on the same pool without it"
    )


def _say(context, spec: StepSpec, pool: Pool, number: int, outcome: Outcome, decision: Decision, result: AttemptResult | None) -> None:
    """Tell the run's log what happened and what comes next."""
    if decision.replace_node:
        return  # said by `_replace_node`
    if outcome.ending is Ending.disqualified:
        context.log.warning(
            f"{pool.name} failed qualification for {spec.name} and is drained for {pool.drain_seconds:g}s "
            f"(`sinewgrid pools undrain {pool.name}` puts it back): {outcome.problem}"
        )
    elif outcome.ending is Ending.refused:
        context.log.warning(f"{pool.name} refused {spec.name} ({outcome.problem}); failing over to the next pool in the plan")
    elif outcome.ending is Ending.preempted and decision.drain:
        context.log.warning(f"drained {pool.name} for {pool.drain_seconds:g}s ({outcome.cause}); {spec.name} moves to the next pool")
    elif outcome.ending is Ending.preempted and decision.action is not Action.give_up:
        where = "on the same pool" if decision.action is Action.retry else "on another pool if one is free of cool-down"
        exit_code = result.exit_code if result else None
        context.log.warning(
            f"{spec.name} attempt {number} on {pool.name} was preempted (exit {exit_code}); relaunching from its latest checkpoint, {where}"
        )


def _failed(step: StepRun, pool: Pool, result: AttemptResult) -> StepFailedError:
    return StepFailedError(
        description=(
            f"{step.spec.name} failed on pool {pool.name} (exit code {result.exit_code}). The last lines of its "
            f"output ({result.log_uri}):\n{result.log_tail}\nFix the workload or its config and re-materialize."
        ),
        metadata={
            "ledger": dg.MetadataValue.md(ledger_markdown(step.attempts)),
            **({"log": dg.MetadataValue.path(result.log_uri)} if result.log_uri else {}),
        },
    )
