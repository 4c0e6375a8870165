"""What the loop did, read back from the instance and the ledger: for the demo and `sinewgrid summary`."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import dagster as dg
import numpy as np
import pandas as pd

from control_plane.accounting import reports
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


def _with_tokens(table: pd.DataFrame) -> pd.DataFrame:
    """A table with `tokens`, in plus out, as numbers, missing as 0: a model task books tokens and
    no GPU time, a GPU step the reverse."""
    number = lambda column: pd.to_numeric(table[column], errors="coerce").fillna(0)  # noqa: E731
    return table.assign(tokens=(number("tokens_in") + number("tokens_out")).astype("int64"), token_cost_usd=number("token_cost_usd").astype(float))


GATEWAY = reports.GATEWAY_BACKEND  # the ledger's backend for model tasks (model_gateway/usage.py)


def ledger_by_step(storage: Storage) -> pd.DataFrame:
    """Per GPU step, pool and purchasing mode: attempts, GPU-hours (allocated and productive),
    goodput and cost, as the reports figure them (`reports.summary`: GPU-weighted goodput)."""
    ledger = read_ledger(storage.ledger())
    if ledger.empty:
        return ledger
    table = reports.summary(ledger[ledger["backend"] != GATEWAY], ["task", "pool", "purchasing"])
    return _with_tokens(table.rename(columns={"task": "step"})).sort_values(["step", "pool", "purchasing"], ignore_index=True)


def model_tasks(storage: Storage) -> pd.DataFrame:
    """Per model task (and its evaluations), model and purchasing mode: items, tokens, cache hits,
    token cost and cost per completed item (`reports.summary`; an item is a task of its own)."""
    ledger = read_ledger(storage.ledger())
    if ledger.empty:
        return ledger
    table = reports.summary(ledger[ledger["backend"] == GATEWAY], ["task", "model", "purchasing"])
    return table.rename(
        columns={"task": "step", "attempts": "items", "completed_tasks": "completed", "cost_per_completed_task": "cost_per_completed"}
    ).sort_values(["step", "model", "purchasing"], ignore_index=True)


def ledger_by_tenant(storage: Storage) -> pd.DataFrame:
    """Cost (GPU and tokens), tokens and goodput per tenant, as the reports figure them
    (`reports.summary(..., "tenant")`: a row booked before the `tenant` column counts as its lane's)."""
    ledger = read_ledger(storage.ledger())
    if ledger.empty:
        return ledger
    return _with_tokens(reports.summary(ledger, "tenant")).sort_values("tenant", ignore_index=True)


def quarantined(storage: Storage) -> list[dict]:
    """Every quarantine report, of every kind of drop (assays, teleop sessions, robot results)."""
    fs, base = fs_for(storage.uri("quarantine"))
    if not fs.exists(base):
        return []
    return [json.loads(read_bytes(fs.unstrip_protocol(p) if "://" in storage.root else p)) for p in sorted(fs.glob(f"{base}/*/*/QUARANTINE.json"))]


def truth_rmse(predictions_uri: str, truth: pd.Series) -> float:
    """Error of a round's predictions against the lab stand-in's hidden truth, on genes never assayed."""
    table = pd.read_parquet(io.BytesIO(read_bytes(predictions_uri)))
    unassayed = table[~table["assayed"]]
    true = truth.reindex(unassayed["gene"]).to_numpy()
    return float(np.sqrt(np.nanmean((unassayed["predicted_effect"].to_numpy() - true) ** 2)))
