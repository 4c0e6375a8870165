"""What the loop did, read back from the instance and the ledger: for the demo and `sinewgrid summary`."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import dagster as dg
import numpy as np
import pandas as pd

from control_plane.accounting.ledger import read_ledger
from workload_runtime.storage import Storage, fs_for, read_bytes

FINETUNED = dg.AssetKey(["cell", "finetuned_model"])
FOUNDATION = dg.AssetKey(["cell", "foundation_model"])


def _value(metadata: dict, key: str):
    entry = metadata.get(key)
    return getattr(entry, "value", entry)


@dataclass
class RoundRow:
    tenant: str
    round: int
    run_id: str
    assayed_genes: int
    held_out_rmse: float
    baseline_rmse: float
    spearman: float
    pool: str
    cost_usd: float
    predictions_uri: str


def training_rounds(instance: dg.DagsterInstance) -> list[RoundRow]:
    """Each fine-tune, numbered per tenant (the partition of its materialization), oldest first."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=FINETUNED), limit=1000, ascending=True).records
    rows = []
    counts: dict[str, int] = {}
    for record in records:
        md = record.asset_materialization.metadata
        tenant = record.partition_key or ""
        counts[tenant] = counts.get(tenant, 0) + 1
        rows.append(
            RoundRow(
                tenant=tenant,
                round=counts[tenant],
                run_id=record.run_id,
                assayed_genes=int(_value(md, "n_assayed_genes") or 0),
                held_out_rmse=float(_value(md, "held_out_rmse") or np.nan),
                baseline_rmse=float(_value(md, "baseline_rmse") or np.nan),
                spearman=float(_value(md, "held_out_spearman") or np.nan),
                pool=str(_value(md, "pool")),
                cost_usd=float(_value(md, "cost_usd") or 0.0),
                predictions_uri=str(_value(md, "predictions_uri")),
            )
        )
    return rows


def _with_tokens(ledger: pd.DataFrame) -> pd.DataFrame:
    """The ledger with `tokens` (in plus out) and `token_cost_usd` as numbers, missing as 0: a
    model task books tokens and no GPU time, a GPU step the reverse."""
    number = lambda column: pd.to_numeric(ledger[column], errors="coerce").fillna(0)  # noqa: E731
    return ledger.assign(tokens=(number("tokens_in") + number("tokens_out")).astype("int64"), token_cost_usd=number("token_cost_usd").astype(float))


GATEWAY = "model-gateway"  # the ledger's backend for model tasks (model_gateway/usage.py)


def ledger_by_step(storage: Storage) -> pd.DataFrame:
    """Per GPU step, pool and purchasing mode: attempts, time, GPU-hours and cost."""
    ledger = read_ledger(storage.ledger())
    if ledger.empty:
        return ledger
    ledger = ledger[ledger["backend"] != GATEWAY]
    return (
        _with_tokens(ledger).groupby(["step", "pool", "purchasing"], as_index=False)
        .agg(
            attempts=("attempt", "size"),
            preempted=("outcome", lambda s: int((s == "preempted").sum())),
            wall_seconds=("wall_seconds", "sum"),
            productive_seconds=("productive_seconds", "sum"),
            gpu_hours=("gpu_hours", "sum"),
            tokens=("tokens", "sum"),
            gpu_cost_usd=("gpu_cost_usd", "sum"),
            token_cost_usd=("token_cost_usd", "sum"),
            cost_usd=("cost_usd", "sum"),
        )
        .assign(goodput=lambda f: f["productive_seconds"] / f["wall_seconds"].where(f["wall_seconds"] > 0))
    )


def model_tasks(storage: Storage) -> pd.DataFrame:
    """Per model task (and its evaluations), model and purchasing mode: items, tokens, cache hits,
    token cost and cost per completed item."""
    ledger = read_ledger(storage.ledger())
    if ledger.empty:
        return ledger
    rows = _with_tokens(ledger[ledger["backend"] == GATEWAY])
    number = lambda column: pd.to_numeric(rows[column], errors="coerce").fillna(0).astype("int64")  # noqa: E731
    rows = rows.assign(tokens_in=number("tokens_in"), tokens_out=number("tokens_out"), tokens_cached=number("tokens_cached"), cache_hits=number("cache_hits"))
    table = rows.groupby(["step", "model", "purchasing"], as_index=False).agg(
        items=("attempt", "size"),
        completed=("completed_task", "sum"),
        tokens_in=("tokens_in", "sum"),
        tokens_out=("tokens_out", "sum"),
        tokens_cached=("tokens_cached", "sum"),
        cache_hits=("cache_hits", "sum"),
        token_cost_usd=("token_cost_usd", "sum"),
    )
    return table.assign(cost_per_completed=lambda f: f["token_cost_usd"] / f["completed"].where(f["completed"] > 0))


def ledger_by_tenant(storage: Storage) -> pd.DataFrame:
    """Cost (GPU and tokens), tokens and goodput per tenant: the ledger's `tenant` column where it has one, else its `lane`
    (which holds the step's tenant in ledgers written before the column)."""
    ledger = read_ledger(storage.ledger())
    if ledger.empty:
        return ledger
    lane = ledger["lane"].fillna("").astype(str)
    tenant = ledger["tenant"].fillna("").astype(str) if "tenant" in ledger.columns else lane
    return (
        _with_tokens(ledger).assign(tenant=tenant.where(tenant != "", lane))
        .groupby("tenant", as_index=False)
        .agg(
            steps=("step", "nunique"),
            attempts=("attempt", "size"),
            wall_seconds=("wall_seconds", "sum"),
            productive_seconds=("productive_seconds", "sum"),
            gpu_hours=("gpu_hours", "sum"),
            tokens=("tokens", "sum"),
            gpu_cost_usd=("gpu_cost_usd", "sum"),
            token_cost_usd=("token_cost_usd", "sum"),
            cost_usd=("cost_usd", "sum"),
        )
        .assign(goodput=lambda f: f["productive_seconds"] / f["wall_seconds"].where(f["wall_seconds"] > 0))
    )


def quarantined(storage: Storage) -> list[dict]:
    """Every quarantine report, of every kind of drop (assays, teleop sessions, robot results)."""
    fs, base = fs_for(storage.uri("quarantine"))
    if not fs.exists(base):
        return []
    return [json.loads(fs.cat_file(p)) for p in sorted(fs.glob(f"{base}/*/*/QUARANTINE.json"))]


def truth_rmse(predictions_uri: str, truth: pd.Series) -> float:
    """Error of a round's predictions against the lab stand-in's hidden truth, on genes never assayed."""
    table = pd.read_parquet(io.BytesIO(read_bytes(predictions_uri)))
    unassayed = table[~table["assayed"]]
    true = truth.reindex(unassayed["gene"]).to_numpy()
    return float(np.sqrt(np.nanmean((unassayed["predicted_effect"].to_numpy() - true) ** 2)))
