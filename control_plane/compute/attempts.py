"""One attempt of a step on one pool: qualify the pool, build the workload's inputs, launch it
on the pool's backend, and book it in the ledger."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import dagster as dg

from control_plane.accounting.ledger import record_attempt
from control_plane.accounting.records import AttemptRecord
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends import backend_for
from control_plane.compute.backends.base import AttemptOutcome, AttemptResult, Refusal
from control_plane.compute.causes import Cause
from control_plane.compute.health import Qualifications, probe_spec
from control_plane.settings import code_version
from control_plane.placement.ranking import PlacementPlan
from workload_runtime.inputs import LineageStamp, WorkloadInputs
from workload_runtime.messages import Qualified, of_kind
from workload_runtime.storage import Storage
from workload_runtime.tenant_access import TenantAccess
from control_plane.tenancy.control import lane_of


@dataclass(frozen=True)
class Qualification:
    """Whether a pool may take the step now: `succeeded`, `refused` (no capacity even for the
    probe: `probe` is the attempt's result) or `failed` (`problem` says why, in words)."""

    outcome: AttemptOutcome
    problem: str = ""
    probe: AttemptResult | None = None
    node: str = ""  # a gang's probe: the first node that failed its checks (the others passed or failed too)


def qualify(context: dg.AssetExecutionContext, pool: Pool, spec: StepSpec, storage: Storage, attempt: int) -> Qualification:
    """Qualify `pool` for `spec` (see `health.py`): the backend's own check, then a probe job
    in the step's runtime unless a recent pass is remembered."""
    if not pool.qualify:
        return Qualification(AttemptOutcome.succeeded)
    backend = backend_for(pool.backend)
    problem = backend.qualify(pool)
    if isinstance(problem, Refusal):
        refused = AttemptResult(AttemptOutcome.refused, None, log_tail=str(problem), cause=Cause.refused, ended_at=time.time())
        return Qualification(AttemptOutcome.refused, problem, refused)
    if problem:
        return Qualification(AttemptOutcome.failed, problem)
    qualifications = Qualifications(storage)
    if qualifications.fresh(pool, spec.runtime, spec.imports):
        return Qualification(AttemptOutcome.succeeded)
    probe = probe_spec(spec, pool)
    inputs = WorkloadInputs(
        config=probe.config,
        attempt=attempt,
        pool=pool.name,
        storage_root=storage.root,
        log_uri=storage.uri("logs", context.run_id, f"{probe.name}-{pool.name}.log"),
    )
    result = backend.run_attempt(context, pool, probe, inputs)
    if result.outcome is AttemptOutcome.succeeded:
        checks = next((m.checks for m in of_kind(result.messages, Qualified)), {})
        qualifications.record(pool, spec.runtime, spec.imports, checks)
        context.log.info(f"{pool.name} qualified for {spec.name}: " + "; ".join(f"{k}: {v}" for k, v in checks.items()))
        return Qualification(AttemptOutcome.succeeded, probe=result)
    if result.outcome is AttemptOutcome.refused:
        return Qualification(AttemptOutcome.refused, result.log_tail, result)
    failed = next((m.failed_nodes for m in of_kind(result.messages, Qualified) if m.failed_nodes), {})
    if failed:
        return Qualification(AttemptOutcome.failed, "; ".join(failed.values()), result, node=next(iter(failed)))
    return Qualification(AttemptOutcome.failed, f"qualification probe failed (exit {result.exit_code}): {result.log_tail.strip()[-800:]}", result)


def workload_inputs(
    context: dg.AssetExecutionContext, spec: StepSpec, plan: PlacementPlan, pool: Pool, storage: Storage, *, lineage: str, checkpoint_uri: str, attempt: int,
    tenant: TenantAccess | None = None,
) -> WorkloadInputs:
    """What the workload receives for this attempt besides its config: its tenant's access
    (storage root, credentials, key) and no other's."""
    return WorkloadInputs(
        config=spec.config,
        checkpoint_uri=checkpoint_uri,
        checkpoint_every_steps=spec.checkpoint_every_steps,
        telemetry_seconds=spec.telemetry_seconds,
        # Young/Daly for this pool's interruption rate (None: no time-based cadence).
        checkpoint_interval_seconds=plan.verdict(pool.name).checkpoint_interval_seconds,
        lineage=LineageStamp(
            step=spec.name,
            lineage=lineage,
            run_id=context.run_id,
            asset=context.asset_key.to_user_string(),
            datasets=[d.name for d in spec.datasets],
            code_version=code_version(),
        ),
        attempt=attempt,
        pool=pool.name,
        storage_root=storage.root,
        log_uri=storage.uri("logs", context.run_id, f"{spec.name}-attempt{attempt}.log"),
        failpoint=spec.failpoint,
        tenant=tenant,
    )


def launch(context: dg.AssetExecutionContext, pool: Pool, spec: StepSpec, inputs: WorkloadInputs) -> AttemptResult:
    """Run the attempt on the pool's backend."""
    return backend_for(pool.backend).run_attempt(context, pool, spec, inputs)


def book(
    context: dg.AssetExecutionContext, storage: Storage, spec: StepSpec, pool: Pool, attempt: int, started: dt.datetime, result: AttemptResult
) -> AttemptRecord:
    """Write the attempt to the ledger: its pool, time, productive time, cost and cause."""
    record = AttemptRecord.for_attempt(
        run_id=context.run_id,
        step=spec.name,
        asset=context.asset_key.to_user_string(),
        partition=context.partition_key if context.has_partition_key else None,
        attempt=attempt,
        pool=pool,
        gpus=spec.gpus,
        ranks=spec.world_size,
        node=result.node,
        started=started,
        ended=dt.datetime.now(dt.UTC),
        productive_seconds=result.committed_seconds,
        checkpoint_seconds=result.checkpoint_seconds,
        queue_seconds=result.queue_seconds,
        lane=lane_of(spec.tenant),
        tenant=spec.tenant,
        outcome=result.outcome.value,
        exit_code=result.exit_code,
        cause=result.cause,
        cache_bytes=result.data_bytes[0],
        store_bytes=result.data_bytes[1],
    )
    record_attempt(storage, record)
    return record
