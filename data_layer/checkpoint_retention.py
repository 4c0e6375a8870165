"""Checkpoint retention: which checkpoints to keep and which to remove, run by run
(`plan_retention`, `RetentionPlan`), removing them (`apply_retention`), and the checkpoints
the platform's `latest.json` pointers name, which it must keep (`pointer_protections`).

    registry = CheckpointRegistry(root)
    plan = plan_retention(registry, keep_latest=1, keep_best=1, protect=pointer_protections(root))
    print(plan.markdown()); apply_retention(plan)

Retention works run by run and never touches anything but step folders under
`<root>/checkpoints/`: a run's `run.json` and `metrics.parquet` (see `experiments.py`) stay.
"""

from __future__ import annotations

import json
import posixpath
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from data_layer.checkpoint_registry import CheckpointEntry, CheckpointRegistry, TornCheckpoint, human_bytes, is_step_dir, ranking
from workload_runtime.checkpoints import MANIFEST
from workload_runtime.storage import Storage, fs_for, read_objects

POINTER_NAME = "latest.json"


def plan_retention(
    registry: CheckpointRegistry,
    keep_latest: int = 1,
    keep_best: int = 1,
    metric: str = "loss",
    mode: str = "min",
    model: str | None = None,
    run: str | None = None,
    protect: Iterable[str] = (),
    include_torn: bool = False,
) -> RetentionPlan:
    """What to keep and what to remove of `registry`'s checkpoints, run by run (nothing is removed here).

    Keeps, per run: the newest `keep_latest` checkpoints (at least 1: a resumed run starts
    from the newest), the `keep_best` best by `metric` (a run whose checkpoints carry no
    such metric keeps only the newest), every final checkpoint, and every checkpoint named
    in `protect` (a step folder's URI; a run folder's URI, as the `latest.json` pointers
    hold, protects that run's newest checkpoint, the one a reader of it loads). With
    `include_torn`, torn step folders older than their run's newest valid checkpoint are
    removed too (a newer torn one may still be being written).
    """
    if keep_latest < 1:
        raise ValueError(
            f"keep_latest must be at least 1, not {keep_latest}: a run's newest checkpoint is the one it resumes from"
        )
    if keep_best < 0:
        raise ValueError(f"keep_best must be 0 or more, not {keep_best}")
    better = ranking(mode)
    protected = {p.rstrip("/") for p in protect}
    by_lineage: dict[str, list[CheckpointEntry]] = defaultdict(list)
    for entry in registry.entries(model=model, run=run):
        by_lineage[entry.lineage].append(entry)
    keep: list[tuple[CheckpointEntry, str]] = []
    remove: list[tuple[CheckpointEntry, str]] = []
    newest_step: dict[str, int] = {}
    for lineage, entries in sorted(by_lineage.items()):
        newest_first = sorted(entries, key=lambda e: -e.step)
        newest_step[lineage] = newest_first[0].step
        reasons: dict[str, list[str]] = defaultdict(list)
        for rank, entry in enumerate(newest_first[:keep_latest], start=1):
            reasons[entry.uri].append("latest" if rank == 1 else f"latest #{rank}")
        scored = sorted((e for e in entries if metric in e.metrics), key=lambda e: better(e, metric))
        for rank, entry in enumerate(scored[:keep_best], start=1):
            label = "best" if rank == 1 else f"best #{rank}"
            reasons[entry.uri].append(f"{label} {metric} ({entry.metrics[metric]:.6g})")
        for entry in entries:
            if entry.final:
                reasons[entry.uri].append("final")
            if entry.uri in protected:
                reasons[entry.uri].append("protected (named by a pointer)")
        if newest_first[0].lineage_uri in protected:
            reasons[newest_first[0].uri].append("protected (its run folder is named by a pointer)")
        why_not = f"not among the newest {keep_latest}" + (
            f" or the best {keep_best} by {metric}" if scored and keep_best else f" (no {metric} recorded)" if keep_best else ""
        )
        for entry in sorted(entries, key=lambda e: e.step):
            if reasons.get(entry.uri):
                keep.append((entry, ", ".join(reasons[entry.uri])))
            else:
                remove.append((entry, why_not))
    remove_torn: list[tuple[TornCheckpoint, str]] = []
    if include_torn:
        for torn in registry.torn(model, run):
            newest = newest_step.get(torn.lineage)
            if newest is not None and torn.step < newest:
                remove_torn.append((torn, f"torn ({torn.reason}), older than the newest valid step {newest}"))
    return RetentionPlan(
        root=registry.root,
        keep=keep,
        remove=remove,
        remove_torn=remove_torn,
        metric=metric,
        mode=mode,
        keep_latest=keep_latest,
        keep_best=keep_best,
    )


@dataclass
class RetentionPlan:
    """What retention keeps and removes, each with its reason; nothing is removed until `apply_retention`."""

    root: str
    keep: list[tuple[CheckpointEntry, str]]
    remove: list[tuple[CheckpointEntry, str]]
    remove_torn: list[tuple[TornCheckpoint, str]] = field(default_factory=list)
    metric: str = "loss"
    mode: str = "min"
    keep_latest: int = 1
    keep_best: int = 1

    @property
    def bytes_freed(self) -> int:
        return sum(e.bytes for e, _ in self.remove) + sum(t.bytes for t, _ in self.remove_torn)

    @property
    def bytes_kept(self) -> int:
        return sum(e.bytes for e, _ in self.keep)

    @property
    def empty(self) -> bool:
        return not self.remove and not self.remove_torn

    def rows(self) -> list[dict[str, Any]]:
        """One row per checkpoint: action (keep/remove), lineage, step, final, the metric, bytes, reason."""
        rows = [
            {
                "action": action,
                "lineage": entry.lineage,
                "step": entry.step,
                "final": entry.final,
                self.metric: entry.metrics.get(self.metric),
                "bytes": entry.bytes,
                "reason": reason,
                "uri": entry.uri,
            }
            for action, items in (("keep", self.keep), ("remove", self.remove))
            for entry, reason in items
        ]
        rows += [
            {"action": "remove", "lineage": t.lineage, "step": t.step, "final": False, self.metric: None, "bytes": t.bytes, "reason": reason, "uri": t.uri}
            for t, reason in self.remove_torn
        ]
        return sorted(rows, key=lambda r: (r["lineage"], r["step"]))

    def summary(self) -> str:
        n = len(self.remove) + len(self.remove_torn)
        return (
            f"keeps {len(self.keep)} checkpoint(s) ({human_bytes(self.bytes_kept)}), "
            f"removes {n} ({human_bytes(self.bytes_freed)} freed)"
        )

    def markdown(self) -> str:
        header = f"| action | lineage | step | final | {self.metric} | size | reason |\n|---|---|---|---|---|---|---|"
        lines = [
            f"| {r['action']} | {r['lineage']} | {r['step']} | {'yes' if r['final'] else ''} | "
            f"{'' if r[self.metric] is None else f'{r[self.metric]:.6g}'} | {human_bytes(r['bytes'])} | {r['reason']} |"
            for r in self.rows()
        ]
        body = "\n".join([header, *lines]) if lines else header + "\n| | no checkpoints | | | | | |"
        return f"{body}\n\nRetention {self.summary()}."


def apply_retention(plan: RetentionPlan) -> list[str]:
    """Remove what `plan` removes; return the step-folder URIs removed.

    Every planned folder loses its manifest first (one batched delete on an object store),
    and only then its other files, so a folder caught half removed reads as torn, never as
    another valid checkpoint. The tree is read again first: a checkpoint rewritten since the
    plan was made (another `created_at`), or a torn folder that has since been published, is
    left alone. Only `step-NNNNNNNN` folders under `<root>/checkpoints/` are ever removed.
    """
    current = CheckpointRegistry(plan.root).refresh()
    live = {(e.uri, e.created_at) for e in current.entries()}
    still_torn = {t.uri for t in current.torn()}
    targets = [e.uri for e, _ in plan.remove if (e.uri, e.created_at) in live]
    targets += [t.uri for t, _ in plan.remove_torn if t.uri in still_torn]
    fs, base = fs_for(current.checkpoints_uri)
    folders = []
    for uri in targets:
        path = fs_for(uri)[1].rstrip("/")
        if not path.startswith(base.rstrip("/") + "/") or not is_step_dir(posixpath.basename(path)):
            raise ValueError(f"refusing to remove {uri}: retention only removes step-NNNNNNNN folders under {current.checkpoints_uri}")
        folders.append(path)
    if not folders:
        return []
    files = [f for path in folders for f in current.step_files(path)]
    manifests = [f for f in files if posixpath.basename(f) == MANIFEST]
    if manifests:
        fs.rm(manifests)
    if isinstance(fs, LocalFileSystem):
        for path in folders:
            fs.rm(path, recursive=True)
    else:  # an object store has no folders: the last file gone, the folder is gone
        rest = [f for f in files if posixpath.basename(f) != MANIFEST]
        if rest:
            fs.rm(rest)
    return targets


def pointer_protections(root: str) -> set[str]:
    """Every `checkpoint_uri` a `latest.json` pointer under `<root>/artifacts/` names:
    the checkpoints the platform's other assets read, which retention must keep."""
    storage = Storage.at(root)
    fs, base = fs_for(storage.uri("artifacts"))
    paths = [p for p in fs.find(base) if posixpath.basename(p) == POINTER_NAME]
    found: set[str] = set()
    for data in read_objects(fs, paths).values():
        if isinstance(data, BaseException):
            continue
        try:
            pointer = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(pointer, Mapping):
            found |= {str(v).rstrip("/") for k, v in pointer.items() if k.endswith("checkpoint_uri") and isinstance(v, str)}
    return found
