"""The data agreements as Dagster asset checks (the rules are in `control_plane/tenancy/agreements.py`).

A training asset that may learn from more than one tenant's data declares
`shared_training_check_spec(...)` among its `check_specs` and, before it trains, calls
`require_shared_training(context, verdict)`:

- allowed: it returns the passing check result, for `dg.MaterializeResult(check_results=[...])`;
- refused: it records the failing blocking check (which tenants, whose agreement says no, what
  to change) and raises `dg.Failure`: nothing is trained, nothing is materialized, and the assets
  downstream do not run.

The check stops the run before training rather than after it: a model trained on data its
owners did not allow to be shared is already the breach, even if no one uses it.
"""

import dagster as dg

from control_plane.tenancy.agreements import AgreementVerdict, describe

SHARED_TRAINING_CHECK = "inputs_agree_to_shared_training"


def shared_training_check_spec(asset: dg.AssetKey | str) -> dg.AssetCheckSpec:
    """The blocking check a training asset declares."""
    return dg.AssetCheckSpec(
        SHARED_TRAINING_CHECK,
        asset=asset,
        blocking=True,
        description=(
            "A model that learns from more than one tenant's data is trained only if every input's data "
            "agreement allows shared models (docs/tenancy.md, 'Agreements')."
        ),
    )


def _metadata(verdict: AgreementVerdict) -> dict[str, dg.MetadataValue]:
    rows = ["| dataset version | tenant | agreement |", "|---|---|---|"]
    rows += [
        f"| `{d.ref}` | {d.tenant or 'platform'} | {describe(d.agreement) if d.agreement is not None else 'none recorded'} |"
        for d in verdict.inputs
    ]
    return {
        "tenants": dg.MetadataValue.text(", ".join(verdict.tenants) or "none"),
        "refusing": dg.MetadataValue.text(", ".join(verdict.refusing) or "none"),
        "reason": dg.MetadataValue.text(verdict.reason),
        "inputs": dg.MetadataValue.md("\n".join(rows)),
    }


def shared_training_result(verdict: AgreementVerdict) -> dg.AssetCheckResult:
    """The check's result for the asset's own `MaterializeResult`."""
    return dg.AssetCheckResult(
        check_name=SHARED_TRAINING_CHECK,
        passed=verdict.allowed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=verdict.reason,
        metadata=_metadata(verdict),
    )


def require_shared_training(
    context: dg.AssetExecutionContext, verdict: AgreementVerdict, asset_key: dg.AssetKey | None = None
) -> dg.AssetCheckResult:
    """Before training: the passing result, or the failing blocking check recorded and `dg.Failure` raised."""
    if verdict.allowed:
        return shared_training_result(verdict)
    key = asset_key or context.asset_key
    context.log_event(
        dg.AssetCheckEvaluation(
            asset_key=key,
            check_name=SHARED_TRAINING_CHECK,
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            description=verdict.reason,
            metadata=_metadata(verdict),
            blocking=True,
        )
    )
    raise dg.Failure(
        description=f"{key.to_user_string()} was not trained: {verdict.reason}",
        metadata={"refusing": dg.MetadataValue.text(", ".join(verdict.refusing))},
    )
