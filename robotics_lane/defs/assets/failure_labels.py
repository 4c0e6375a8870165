"""Failure labels: every failed real-robot trial labelled with how it failed, by a model, in batch."""

import io
import posixpath
from pathlib import Path

import dagster as dg
import pandas as pd

from data_layer.provenance import drop_id, record_result
from robotics_lane.defs.assets.real_robot import HELD_OUT_TASKS, KIND, REAL_EVALUATION
from robotics_lane.defs.partitions import robot_evals
from robotics_lane.episodes.lerobot_v3 import read_dataset
from robotics_lane.episodes.summaries import episode_summary, trial_id
from shared_resources.resources import ModelGatewayResource, StorageResource
from workload_runtime.storage import exists, read_bytes, read_json, write_bytes_atomic

FAILURE_LABELS = dg.AssetKey(["robotics", "failure_labels"])
TASK_FOLDER = Path(__file__).resolve().parents[2] / "tasks" / "label-failure"


@dg.asset(key=FAILURE_LABELS, deps=[REAL_EVALUATION], partitions_def=robot_evals, group_name="robotics_policy", kinds={"parquet", "llm"})
def failure_labels(context: dg.AssetExecutionContext, storage: StorageResource, models: ModelGatewayResource) -> dg.MaterializeResult:
    """Why each failed real-robot trial failed (the pole fell left, right or at the start; the cart hit
    the end of its track), read from the trial's episode by a language model. The labels go with
    the trials the operator demonstrates again, and show which failures the next policy must fix.

    The model is chosen by the model gateway: the cheapest one whose labels on the task's own
    evaluation set meet its quality bar, sent as one batch at the batch price behind a deadline.
    Tokens and cost per labelled trial are in the metadata and in the ledger beside GPU hours.
    """
    store = storage.get()
    eval_id = context.partition_key
    trials_uri = store.curated(KIND, eval_id, "trials.parquet")
    if not exists(trials_uri):
        raise dg.Failure(f"no ingested trials for {eval_id} ({trials_uri}): materialize robotics/real_robot_evaluation for it first.")
    trials = pd.read_parquet(io.BytesIO(read_bytes(trials_uri)))
    failed = trials[~trials["success"].astype(bool)]
    raw = store.raw(KIND, eval_id)
    manifest = read_json(posixpath.join(raw, "manifest.json"))
    policy_version = str(manifest.get("policy_version", ""))
    request_uri = store.outbox("robot_eval", eval_id, "request.json")
    tasks = {t["task_id"]: t["task"] for t in (read_json(request_uri)["tasks"] if exists(request_uri) else HELD_OUT_TASKS)}
    info, episodes = read_dataset(posixpath.join(raw, "episodes"))
    items = []
    for record in failed.to_dict("records"):
        payload = episode_summary(
            record, episodes[int(record["episode_index"])], eval_id=eval_id, policy_version=policy_version,
            max_steps=int(tasks.get(record["task_id"], {}).get("max_steps", 200)), fps=info.fps,
        )
        items.append((trial_id(eval_id, record["trial"]), payload))
    if not items:
        return dg.MaterializeResult(metadata={"failed_trials": 0, "status": "nothing to label: every trial succeeded"})
    evaluation = f"robotics/real_robot_evaluation/{eval_id}"
    run = models.run_task(context, str(TASK_FOLDER), items, inputs=[evaluation], lane="robotics")
    labels = run.frame()
    labels.insert(1, "ended_by", [p["ended_by"] for _, p in items])
    uri = store.curated("failure_labels", eval_id, "labels.parquet")
    buffer = io.BytesIO()
    labels.to_parquet(buffer, index=False)
    write_bytes_atomic(uri, buffer.getvalue())
    counts = labels.groupby("failure_mode").size().rename("trials").reset_index() if "failure_mode" in labels else pd.DataFrame()
    provenance = record_result(
        store, f"robotics/failure_labels/{eval_id}", "labels", f"{len(run.completed)} failed trials labelled by {run.route.primary.id}",
        inputs=[evaluation, drop_id(KIND, eval_id)], uri=uri, facts={"task": run.task.ref, "model": run.route.primary.id},
    )
    return dg.MaterializeResult(
        metadata={
            "failed_trials": len(items),
            "labels": dg.MetadataValue.md(counts.to_markdown(index=False) if len(counts) else "none"),
            "labels_file": dg.MetadataValue.path(uri),
            **run.metadata(),
            **provenance,
        }
    )
