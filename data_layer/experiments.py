"""Experiment tracking: each training run's figures, stored with the run in open formats.

Beside a run's checkpoints, under `<root>/checkpoints/<lineage>/`:

    run.json          summary metrics, config, datasets, code version, pool, cost, Dagster run id,
                      checkpoint URI, evaluations (e.g. the policy's sim success rate), recorded_at
    metrics.parquet   every curve in long format: columns metric, step, value

`metrics.parquet` is written first and `run.json` last, so a run listed is a run whose
curves are there. Both are plain files: `json.load`, `pandas.read_parquet`. Retention
(`checkpoint_retention.py`) only removes step folders, never these two.

    record_run(root, "cell/foundation_model/abc", curves={"loss": losses}, summary={"final_loss": 0.41},
               config=cfg, datasets=["cell/omics@3fa2b1"], code_version="9c0d1e2")
    record_evaluation(root, "robotics/policy/v1", "sim", {"sim_success_rate": 0.85})

Comparing two runs and plotting curves is in `run_comparison.py`.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from data_layer.checkpoint_registry import as_number, model_matches, split_lineage
from workload_runtime.storage import Storage, fs_for, read_bytes, read_objects, write_bytes_atomic, write_json_atomic

RUN_FILE = "run.json"
METRICS_FILE = "metrics.parquet"
FORMAT = "sinewgrid.run/v1"
# Keys of `extra` that have a field of their own in run.json.
_LIFTED = ("pool", "cost_usd", "dagster_run_id", "checkpoint_uri")


class RunNotFound(LookupError):
    """No run.json for a lineage; the message names the path and the runs there are."""


def _check_lineage(lineage: str) -> str:
    clean = lineage.strip().strip("/")
    parts = clean.split("/")
    if len(parts) < 3 or any(p in ("", ".", "..") for p in parts) or any(p.startswith("step-") for p in parts):
        raise ValueError(
            f"{lineage!r} is not a run lineage: expected <lane>/<model>/<run>, e.g. cell/foundation_model/3fa2b1-9c0d1e2f3a "
            "(`sinewgrid runs list` shows them)"
        )
    return clean


def run_folder(root: str, lineage: str) -> str:
    """`<root>/checkpoints/<lineage>`: where a run's checkpoints, run.json and metrics.parquet live."""
    return Storage.at(root).checkpoints(_check_lineage(lineage))


@dataclass(frozen=True)
class ExperimentRun:
    """One recorded training run (its run.json); `curves()` reads its metrics.parquet."""

    lineage: str
    folder: str
    summary: dict[str, float]
    config: dict[str, Any]
    datasets: list[str]
    code_version: str = ""
    pool: str = ""
    cost_usd: float | None = None
    dagster_run_id: str = ""
    checkpoint_uri: str = ""
    recorded_at: str = ""
    evaluations: dict[str, dict[str, float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return split_lineage(self.lineage)[0]

    @property
    def run(self) -> str:
        return split_lineage(self.lineage)[1]

    @property
    def run_json_uri(self) -> str:
        return posixpath.join(self.folder, RUN_FILE)

    @property
    def metrics_uri(self) -> str:
        return posixpath.join(self.folder, METRICS_FILE)

    def curves(self) -> pd.DataFrame:
        """Every curve, long format: metric, step, value (empty if none were recorded)."""
        fs, path = fs_for(self.metrics_uri)
        if not fs.exists(path):
            return pd.DataFrame({"metric": pd.Series(dtype=str), "step": pd.Series(dtype="int64"), "value": pd.Series(dtype=float)})
        return pd.read_parquet(io.BytesIO(read_bytes(self.metrics_uri)))

    def curve(self, metric: str) -> pd.DataFrame:
        """One curve: step, value, by step."""
        frame = self.curves()
        return frame.loc[frame["metric"] == metric, ["step", "value"]].sort_values("step").reset_index(drop=True)

    def figures(self) -> dict[str, float]:
        """Summary metrics and every evaluation's metrics (as `<evaluation>.<metric>`), in one dict."""
        out = dict(self.summary)
        for name, metrics in sorted(self.evaluations.items()):
            out.update({f"{name}.{k}": v for k, v in metrics.items()})
        return out

    @classmethod
    def from_json(cls, payload: Mapping[str, Any], folder: str) -> ExperimentRun:
        return cls(
            lineage=str(payload["lineage"]),
            folder=folder,
            summary={str(k): float(v) for k, v in (payload.get("summary") or {}).items()},
            config=dict(payload.get("config") or {}),
            datasets=[str(d) for d in payload.get("datasets") or []],
            code_version=str(payload.get("code_version") or ""),
            pool=str(payload.get("pool") or ""),
            cost_usd=None if payload.get("cost_usd") is None else float(payload["cost_usd"]),
            dagster_run_id=str(payload.get("dagster_run_id") or ""),
            checkpoint_uri=str(payload.get("checkpoint_uri") or ""),
            recorded_at=str(payload.get("recorded_at") or ""),
            evaluations={str(n): {str(k): float(v) for k, v in m.items()} for n, m in (payload.get("evaluations") or {}).items()},
            extra=dict(payload.get("extra") or {}),
        )


def _figures(values: Mapping[str, Any], what: str) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{what} {key!r} is {value!r}: only numbers can be recorded as metrics (put other values in config or extra)")
        out[str(key)] = float(value)
    return out


def _curves_frame(curves: Mapping[str, Sequence[Any]]) -> pd.DataFrame:
    """Long format from `{metric: [v, ...]}` (steps 1, 2, ...) or `{metric: [(step, v), ...]}`."""
    rows: list[tuple[str, int, float]] = []
    for metric, points in curves.items():
        seen: set[int] = set()
        for i, point in enumerate(points):
            if isinstance(point, Sequence) and not isinstance(point, str) and len(point) == 2:
                step, value = point
            elif isinstance(point, int | float) and not isinstance(point, bool):
                step, value = i + 1, point
            else:
                raise ValueError(f"curve {metric!r}, item {i}: {point!r} is neither a number nor a (step, value) pair")
            if isinstance(step, bool) or not isinstance(step, int) or isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"curve {metric!r}, item {i}: {point!r} must be an integer step and a number")
            if step in seen:
                raise ValueError(f"curve {metric!r} has step {step} twice; give each step one value")
            seen.add(step)
            rows.append((str(metric), int(step), float(value)))
    frame = pd.DataFrame(rows, columns=["metric", "step", "value"]).astype({"metric": str, "step": "int64", "value": "float64"})
    return frame.sort_values(["metric", "step"], kind="stable").reset_index(drop=True)


def _read_payload(uri: str) -> dict[str, Any] | None:
    """run.json's content, or None if there is none."""
    try:
        payload = json.loads(read_bytes(uri))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{uri} is not valid JSON ({exc}); record the run again to rewrite it") from exc
    if not isinstance(payload, dict) or "lineage" not in payload:
        raise ValueError(f"{uri} is not a run record (no lineage); record the run again to rewrite it")
    return payload


def numeric_figures(metadata: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a result-metadata dict (plain or `{"type": ..., "raw_value": n}`),
    for `record_run(summary=...)`; text, paths and tables are left out."""
    return {str(k): v for k, v in ((k, as_number(v)) for k, v in metadata.items()) if v is not None}


def _normalised(payload: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(payload, sort_keys=True, default=str))


def record_run(
    root: str,
    lineage: str,
    *,
    curves: Mapping[str, Sequence[float]] | Mapping[str, Sequence[tuple[int, float]]],
    summary: Mapping[str, float],
    config: Mapping[str, Any],
    datasets: Sequence[str],
    code_version: str = "",
    extra: Mapping[str, Any] | None = None,
) -> ExperimentRun:
    """Record (or re-record) a run's curves and figures beside its checkpoints.

    `curves` maps a metric to its values per step (`[v1, v2, ...]` are steps 1, 2, ...) or to
    `(step, value)` pairs. `extra` may carry `pool`, `cost_usd`, `dagster_run_id` and
    `checkpoint_uri` (the run folder by default), which get fields of their own; anything else
    is kept under `extra`. Recording the same run again rewrites its own two files with the
    same content (its `recorded_at` too, when nothing changed) and keeps its evaluations.
    """
    lineage = _check_lineage(lineage)
    folder = run_folder(root, lineage)
    frame = _curves_frame(curves)
    extra = dict(extra or {})
    lifted = {key: extra.pop(key) for key in _LIFTED if key in extra}
    if lifted.get("cost_usd") is not None:
        lifted["cost_usd"] = _figures({"cost_usd": lifted["cost_usd"]}, "extra")["cost_usd"]
    try:
        previous = _read_payload(posixpath.join(folder, RUN_FILE)) or {}
    except ValueError:
        previous = {}  # our own file, unreadable: rewrite it whole
    payload = _normalised(
        {
            "format": FORMAT,
            "lineage": lineage,
            "model": split_lineage(lineage)[0],
            "run": split_lineage(lineage)[1],
            "summary": _figures(summary, "summary metric"),
            "config": dict(config),
            "datasets": [str(d) for d in datasets],
            "code_version": code_version,
            "pool": str(lifted.get("pool") or ""),
            "cost_usd": lifted.get("cost_usd"),
            "dagster_run_id": str(lifted.get("dagster_run_id") or ""),
            "checkpoint_uri": str(lifted.get("checkpoint_uri") or folder),
            "evaluations": previous.get("evaluations", {}),
            "extra": extra,
            "metrics_file": METRICS_FILE,
            "curves": sorted(frame["metric"].unique().tolist()),
        }
    )
    unchanged = {k: v for k, v in previous.items() if k != "recorded_at"} == payload
    payload["recorded_at"] = previous["recorded_at"] if unchanged else dt.datetime.now(dt.UTC).isoformat()
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    write_bytes_atomic(posixpath.join(folder, METRICS_FILE), buffer.getvalue())
    write_json_atomic(posixpath.join(folder, RUN_FILE), payload)  # last: publishes the run
    return ExperimentRun.from_json(payload, folder)


def record_evaluation(root: str, lineage: str, name: str, metrics: Mapping[str, float]) -> ExperimentRun:
    """Add (or replace) one evaluation's figures on a recorded run, kept under `evaluations[name]`
    in its run.json, e.g. `record_evaluation(root, policy_lineage, "sim", {"sim_success_rate": 0.85})`."""
    if not name or not name.strip():
        raise ValueError("an evaluation needs a name (e.g. 'sim'), to keep it apart from other evaluations of the run")
    figures = _figures(metrics, f"evaluation {name!r} metric")
    run = load_run(root, lineage)
    payload = _read_payload(run.run_json_uri) or {}
    payload.setdefault("evaluations", {})[name.strip()] = figures
    write_json_atomic(run.run_json_uri, payload)
    return ExperimentRun.from_json(payload, run.folder)


def load_run(root: str, lineage: str) -> ExperimentRun:
    """The recorded run of a lineage; `RunNotFound` names the path and the model's runs if there is none."""
    lineage = _check_lineage(lineage)
    folder = run_folder(root, lineage)
    uri = posixpath.join(folder, RUN_FILE)
    payload = _read_payload(uri)
    if payload is None:
        model = split_lineage(lineage)[0]
        others = [r.lineage for r in list_runs(root, model=model)]
        known = f"Runs of {model}: {', '.join(others)}." if others else f"No run of {model} is recorded yet."
        raise RunNotFound(
            f"no run recorded for {lineage}: {uri} does not exist. {known} "
            "Runs are recorded when their training asset finishes; `sinewgrid runs list` shows every one."
        )
    return ExperimentRun.from_json(payload, folder)


def list_runs(root: str, model: str | None = None, warn: Callable[[str], None] | None = None) -> list[ExperimentRun]:
    """Every recorded run (of a model, or a lane like `cell`), by lineage. One listing and one
    batched read, however many runs; an unreadable run.json is skipped (reported to `warn`)."""
    checkpoints = Storage.at(root).uri("checkpoints")
    fs, base = fs_for(checkpoints)
    base = base.rstrip("/")
    paths = []
    for path in fs.find(base):
        rel = path[len(base) + 1 :]
        parts = rel.split("/")
        if parts[-1] == RUN_FILE and len(parts) >= 4 and not any(p.startswith("step-") for p in parts[:-1]):
            if model_matches(split_lineage("/".join(parts[:-1]))[0], model):
                paths.append(path)
    runs = []
    for path, data in sorted(read_objects(fs, paths).items()):
        lineage = path[len(base) + 1 :].rsplit("/", 1)[0]
        try:
            if isinstance(data, BaseException):
                raise data
            runs.append(ExperimentRun.from_json(json.loads(data), posixpath.join(checkpoints, lineage)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            if warn:
                warn(f"{posixpath.join(checkpoints, lineage, RUN_FILE)} could not be read ({exc}); skipped")
    return runs
