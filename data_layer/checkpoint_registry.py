"""Every checkpoint under a storage root, searchable: valid ones, torn step folders, and runs.

Checkpoints live at `<root>/checkpoints/<lineage>/step-NNNNNNNN/` (see `checkpoints.py`); the
lineage names the model and the run, e.g. `cell/foundation_model/3fa2b1-9c0d1e2f3a`:
the model is its first two segments (`cell/foundation_model`), the run is the rest.

    registry = CheckpointRegistry(root)
    registry.entries(model="cell/foundation_model", dataset="cell/omics@3fa2b1")
    registry.best("cell/foundation_model/3fa2b1-9c0d1e2f3a", metric="loss")

The registry reads the whole tree with one listing and fetches every manifest in one
concurrent batch, so it costs a few round trips on S3 however many checkpoints there are.
A step folder with no manifest, an unreadable one, or files missing or of the wrong size
is *torn*: it is listed apart (`torn()`), never as a checkpoint. (`CheckpointStore.latest_valid()`
also checks each file's sha256 when it loads one; a listing only compares sizes.)

What retention keeps and removes is in `checkpoint_retention.py`.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workload_runtime.checkpoints import MANIFEST
from workload_runtime.storage import Storage, fs_for, read_objects

_STEP_PREFIX = "step-"


def is_step_dir(name: str) -> bool:
    """True for a step folder's name, `step-NNNNNNNN`."""
    return name.startswith(_STEP_PREFIX) and len(name) == 13 and name[5:].isdigit()


def split_lineage(lineage: str) -> tuple[str, str]:
    """(model, run) of a lineage: `cell/foundation_model/abc` -> (`cell/foundation_model`, `abc`)."""
    parts = lineage.strip("/").split("/")
    return "/".join(parts[:2]), "/".join(parts[2:])


def model_matches(model: str, wanted: str | None) -> bool:
    """True if `wanted` is empty, the model itself, or a prefix of it (`cell` matches `cell/foundation_model`)."""
    if not wanted:
        return True
    wanted = wanted.strip("/")
    return model == wanted or model.startswith(wanted + "/")


def dataset_matches(refs: Iterable[str], wanted: str) -> bool:
    """True if any ref (`cell/omics@3fa2b1`) is `wanted`, or has `wanted` as its name or its version."""
    for ref in refs:
        name, _, version = ref.partition("@")
        if wanted in (ref, name) or (version and wanted == version):
            return True
    return False


def human_bytes(n: float) -> str:
    """`1536` -> `1.5 KiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def as_number(value: Any) -> float | None:
    """A finite float from a plain number or a Dagster-style `{"type": ..., "raw_value": n}`; else None."""
    if isinstance(value, Mapping) and "raw_value" in value:
        value = value["raw_value"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def manifest_metrics(meta: Mapping[str, Any]) -> dict[str, float]:
    """The figures a checkpoint's `meta` carries: `loss` (the last of `losses`), and every
    numeric entry of `result` (the final checkpoint's result metadata) and of `metrics`."""
    metrics: dict[str, float] = {}
    losses = meta.get("losses")
    if isinstance(losses, list) and losses:
        last = as_number(losses[-1])
        if last is not None:
            metrics["loss"] = last
    for section in ("result", "metrics"):
        values = meta.get(section)
        if isinstance(values, Mapping):
            for key, value in values.items():
                number = as_number(value)
                if number is not None:
                    metrics[str(key)] = number
    return metrics


@dataclass(frozen=True)
class CheckpointEntry:
    """One valid checkpoint as its manifest describes it."""

    uri: str  # the step folder: open it with CheckpointStore(lineage folder) or safetensors
    lineage: str
    model: str
    run: str
    step: int
    final: bool
    created_at: str  # ISO 8601, UTC
    bytes: int  # every file in the step folder
    metrics: dict[str, float] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    code_version: str = ""
    dagster_run_id: str = ""

    @property
    def lineage_uri(self) -> str:
        return posixpath.dirname(self.uri)


@dataclass(frozen=True)
class TornCheckpoint:
    """A step folder that is not a whole checkpoint (its writer died, or it is half removed)."""

    uri: str
    lineage: str
    step: int
    reason: str
    bytes: int


@dataclass(frozen=True)
class RunSummary:
    """One run's checkpoints at a glance."""

    lineage: str
    model: str
    run: str
    checkpoints: int
    latest_step: int
    final: bool
    bytes: int
    metric: str
    best_value: float | None
    best_step: int | None
    torn: int


def ranking(mode: str):
    """A sort key `(entry, metric)` that puts the best checkpoint first: lowest for "min", highest for "max"."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max' (lower is better, or higher is better), not {mode!r}")
    # Ties go to the newer checkpoint.
    return (lambda e, m: (e.metrics[m], -e.step)) if mode == "min" else (lambda e, m: (-e.metrics[m], -e.step))


class CheckpointRegistry:
    """Every checkpoint under `<root>/checkpoints/`, read once (call `refresh()` to re-read)."""

    def __init__(self, root: str):
        self.root = Storage.at(root).root
        self.checkpoints_uri = Storage(self.root).uri("checkpoints")
        self._entries: list[CheckpointEntry] | None = None
        self._torn: list[TornCheckpoint] = []
        self._files: dict[str, list[str]] = {}  # step folder path -> its files' paths, from the last listing

    # Reading ------------------------------------------------------------------------------
    def refresh(self) -> CheckpointRegistry:
        """Read the tree again: one listing, then every manifest in one batch."""
        fs, base = fs_for(self.checkpoints_uri)
        base = base.rstrip("/")
        listing = fs.find(base, withdirs=True, detail=True)
        folders: dict[tuple[str, int], dict[str, int]] = defaultdict(dict)
        for path, info in listing.items():
            rel = path.rstrip("/")[len(base) + 1 :] if path.startswith(base + "/") else ""
            parts = rel.split("/") if rel else []
            index = next((i for i, part in enumerate(parts) if i >= 1 and is_step_dir(part)), None)
            if index is None:
                continue  # run.json, metrics.parquet, lineage folders
            key = ("/".join(parts[:index]), int(parts[index][len(_STEP_PREFIX) :]))
            inside = "/".join(parts[index + 1 :])
            folders[key]  # a folder with nothing in it is still a (torn) step folder
            if inside and info.get("type") != "directory":
                folders[key][inside] = int(info.get("size") or 0)
        manifest_paths = {key: f"{base}/{key[0]}/{_STEP_PREFIX}{key[1]:08d}/{MANIFEST}" for key, files in folders.items() if MANIFEST in files}
        raw = read_objects(fs, list(manifest_paths.values()))
        entries, torn = [], []
        self._files = {
            f"{base}/{lineage}/{_STEP_PREFIX}{step:08d}": [f"{base}/{lineage}/{_STEP_PREFIX}{step:08d}/{name}" for name in files]
            for (lineage, step), files in folders.items()
        }
        for (lineage, step), files in sorted(folders.items()):
            uri = posixpath.join(self.checkpoints_uri, lineage, f"{_STEP_PREFIX}{step:08d}")
            size = sum(files.values())
            data = raw.get(manifest_paths[(lineage, step)]) if (lineage, step) in manifest_paths else None
            manifest, problem = _parse_manifest(data, files)
            if manifest is None:
                torn.append(TornCheckpoint(uri, lineage, step, problem, size))
                continue
            origin = manifest.get("lineage") if isinstance(manifest.get("lineage"), Mapping) else {}
            meta = manifest.get("meta") if isinstance(manifest.get("meta"), Mapping) else {}
            model, run = split_lineage(lineage)
            entries.append(
                CheckpointEntry(
                    uri=uri,
                    lineage=lineage,
                    model=model,
                    run=run,
                    step=step,
                    final=bool(manifest.get("final")),
                    created_at=str(manifest.get("created_at", "")),
                    bytes=size,
                    metrics=manifest_metrics(meta),
                    datasets=[str(d) for d in origin.get("datasets", []) or []],
                    code_version=str(origin.get("code_version", "") or ""),
                    dagster_run_id=str(origin.get("run_id", "") or ""),
                )
            )
        self._entries, self._torn = entries, torn
        return self

    def step_files(self, path: str) -> list[str]:
        """The paths of the files of the step folder at `path` (a filesystem path), as the last listing saw them."""
        return self._files.get(path, [])

    def _all(self) -> list[CheckpointEntry]:
        if self._entries is None:
            self.refresh()
        return self._entries  # type: ignore[return-value]

    def entries(
        self, model: str | None = None, run: str | None = None, step: int | None = None, dataset: str | None = None
    ) -> list[CheckpointEntry]:
        """Valid checkpoints, by lineage then step. `model` may be a lane (`cell`) or a model
        (`cell/foundation_model`); `run` the run id or the whole lineage; `dataset` a full ref
        (`cell/omics@3fa2b1`), a dataset name (`cell/omics`) or a version (`3fa2b1`)."""
        found = []
        for entry in self._all():
            if not model_matches(entry.model, model):
                continue
            if run and run.strip("/") not in (entry.run, entry.lineage):
                continue
            if step is not None and entry.step != step:
                continue
            if dataset and not dataset_matches(entry.datasets, dataset):
                continue
            found.append(entry)
        return found

    def torn(self, model: str | None = None, run: str | None = None) -> list[TornCheckpoint]:
        """Step folders that are not whole checkpoints, with the reason for each."""
        self._all()
        return [
            t
            for t in self._torn
            if model_matches(split_lineage(t.lineage)[0], model) and (not run or run.strip("/") in (t.lineage, split_lineage(t.lineage)[1]))
        ]

    def lineages(self, model: str | None = None) -> list[str]:
        return sorted({e.lineage for e in self.entries(model=model)})

    def runs(self, model: str | None = None, metric: str = "loss", mode: str = "min") -> list[RunSummary]:
        """One summary per run: checkpoints, newest step, bytes, and its best `metric`."""
        better = ranking(mode)
        torn_by_lineage: dict[str, int] = defaultdict(int)
        for t in self.torn(model):
            torn_by_lineage[t.lineage] += 1
        by_lineage: dict[str, list[CheckpointEntry]] = defaultdict(list)
        for entry in self.entries(model=model):
            by_lineage[entry.lineage].append(entry)
        summaries = []
        for lineage, entries in sorted(by_lineage.items()):
            scored = sorted((e for e in entries if metric in e.metrics), key=lambda e: better(e, metric))
            best = scored[0] if scored else None
            summaries.append(
                RunSummary(
                    lineage=lineage,
                    model=entries[0].model,
                    run=entries[0].run,
                    checkpoints=len(entries),
                    latest_step=max(e.step for e in entries),
                    final=any(e.final for e in entries),
                    bytes=sum(e.bytes for e in entries),
                    metric=metric,
                    best_value=best.metrics[metric] if best else None,
                    best_step=best.step if best else None,
                    torn=torn_by_lineage.get(lineage, 0),
                )
            )
        return summaries

    def _of(self, lineage: str) -> list[CheckpointEntry]:
        found = self.entries(run=lineage)
        lineages = {e.lineage for e in found}
        if len(lineages) > 1:
            raise ValueError(f"{lineage!r} names more than one run ({', '.join(sorted(lineages))}); give the whole lineage")
        return found

    def latest(self, lineage: str) -> CheckpointEntry | None:
        """The newest valid checkpoint of a run (its lineage or run id), or None."""
        found = self._of(lineage)
        return max(found, key=lambda e: e.step) if found else None

    def best(self, lineage: str, metric: str = "loss", mode: str = "min") -> CheckpointEntry | None:
        """The run's checkpoint with the lowest (`mode="min"`) or highest `metric`; None if none has it."""
        better = ranking(mode)
        scored = [e for e in self._of(lineage) if metric in e.metrics]
        return min(scored, key=lambda e: better(e, metric)) if scored else None


def _parse_manifest(data: Any, files: Mapping[str, int]) -> tuple[dict | None, str]:
    """The manifest if the step folder is whole, else None and why not."""
    if data is None:
        return None, f"no {MANIFEST}: its writer stopped before publishing it, or it is half removed"
    if isinstance(data, BaseException):
        return None, f"{MANIFEST} could not be read ({data})"
    try:
        manifest = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"{MANIFEST} is not valid JSON ({exc})"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files", {}), Mapping):
        return None, f"{MANIFEST} is not a checkpoint manifest"
    for name, expected in manifest.get("files", {}).items():
        if name not in files:
            return None, f"{name} is missing"
        want = expected.get("bytes") if isinstance(expected, Mapping) else None
        if want is not None and files[name] != want:
            return None, f"{name} has {files[name]} bytes, its manifest says {want}"
    return manifest, ""
