"""Held-out real-robot evaluation: a request to the robot cell, its results, and the failures."""

import io
import json
import posixpath

import dagster as dg
import pandas as pd

from robotics_lane.defs.assets.policy import POLICY, SIM_EVALUATION, rate_metadata
from robotics_lane.defs.checks import EPISODES_VALID_CHECK, RESULTS_MANIFEST_CHECK
from robotics_lane.episodes.validation import validate_dataset
from robotics_lane.scenes.registration import scenes_upstream
from robotics_lane.defs.partitions import robot_evals
from robotics_lane.defs.policy_versions import policy_versions, success_chart_png, verdict, versions_markdown
from robotics_lane.robot_cell_protocol import HELD_OUT_TASKS, TRIALS_PER_TASK, eval_request, relabel_request
from robotics_lane.stats import wilson_interval
from data_layer.run_comparison import image_markdown
from control_plane.intake.landing import read_drop, write_raw
from workload_runtime.data_issues import DropIssue
from data_layer.provenance import drop_id, record_drop, record_result, track_evaluation
from control_plane.intake.quarantine import quarantined
from shared_resources.resources import StorageResource
from workload_runtime.storage import exists, read_json, write_bytes_atomic, write_json_atomic

KIND = "robot_eval"
EVAL_REQUEST = dg.AssetKey(["robotics", "real_robot_eval_request"])
REAL_EVALUATION = dg.AssetKey(["robotics", "real_robot_evaluation"])
TRIAL_FIELDS = ("trial", "task_id", "seed", "success", "return", "length", "failure_mode", "episode_index")


class EvalRequestSettings(dg.Config):
    trials_per_task: int = TRIALS_PER_TASK


@dg.asset(key=EVAL_REQUEST, deps=[POLICY, SIM_EVALUATION], group_name="robotics_policy", kinds={"json"})
def real_robot_eval_request(context: dg.AssetExecutionContext, config: EvalRequestSettings, storage: StorageResource) -> dg.MaterializeResult:
    """The request the robot cell runs next: which policy version, which held-out tasks, how many
    trials. Written to `outbox/robot_eval/<eval_id>/request.json`; the cell's results come back
    through landing/robot_eval/ and `robotics/real_robot_evaluation`.
    """
    store = storage.get()
    current = read_json(store.artifacts("robotics", "policy", "latest.json"))
    eval_id = f"eval-{current['version']}"
    request = eval_request(eval_id, current["version"], current["checkpoint_uri"], config.trials_per_task, store.landing(KIND, eval_id))
    uri = store.outbox("robot_eval", eval_id, "request.json")
    if not exists(uri):
        write_json_atomic(uri, request)
    return dg.MaterializeResult(metadata={"eval_id": eval_id, "request": dg.MetadataValue.path(uri), "policy_version": current["version"], "trials": config.trials_per_task * len(HELD_OUT_TASKS)})


def parse_trials(data: bytes) -> tuple[pd.DataFrame | None, list[DropIssue]]:
    issues, rows = [], []
    for line_number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            issues.append(DropIssue("trials_json", f"line {line_number} is not JSON ({exc.msg}); write one JSON object per line.", "trials.jsonl", line_number))
            continue
        missing = [f for f in TRIAL_FIELDS if f not in record]
        if missing:
            issues.append(DropIssue("trials_field", f"line {line_number} lacks {', '.join(missing)}; every trial needs {', '.join(TRIAL_FIELDS)}.", "trials.jsonl", line_number))
        rows.append(record)
    if not rows and not issues:
        issues.append(DropIssue("trials_json", "trials.jsonl holds no trials.", "trials.jsonl"))
    return (pd.DataFrame(rows) if rows and not issues else None), issues


@dg.asset(
    key=REAL_EVALUATION,
    partitions_def=robot_evals,
    group_name="robotics_policy",
    kinds={"lerobot", "json"},
    check_specs=[
        dg.AssetCheckSpec(RESULTS_MANIFEST_CHECK, asset=REAL_EVALUATION, blocking=True, description="The robot cell's results are complete: manifest, checksums, one JSON record per trial."),
        dg.AssetCheckSpec(EPISODES_VALID_CHECK, asset=REAL_EVALUATION, blocking=True, description="The trial episodes form a valid LeRobot v3 dataset."),
    ],
)
def real_robot_evaluation(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """How often the policy succeeded on the real robot on held-out tasks, with a 95% Wilson
    interval, next to its success in simulation: the sim-to-real gap. One partition per
    evaluation the robot cell ran. Failed trials are flagged for relabelling: the operator
    demonstrates them again on the real robot and they join the next training set.
    `success_by_version` plots sim and real success of every policy version so far, with their
    intervals, and says whether real success rose.
    """
    store = storage.get()
    eval_id = context.partition_key
    manifest, contents, issues = read_drop(store, KIND, eval_id, ("robot", "cell", "policy_version"))
    trials = None
    if not issues:
        if "trials.jsonl" not in contents:
            issues = [DropIssue("missing_file", "the results hold no trials.jsonl; post one JSON line per trial.", "trials.jsonl")]
        else:
            trials, issues = parse_trials(contents["trials.jsonl"])
    if issues:
        checks = [
            dg.AssetCheckResult(check_name=RESULTS_MANIFEST_CHECK, passed=False, metadata={"first": issues[0].describe()}),
            dg.AssetCheckResult(check_name=EPISODES_VALID_CHECK, passed=False, metadata={"skipped": "results could not be trusted"}),
        ]
        quarantined(context, store, KIND, eval_id, issues, stage="raw", check_results=checks)
    raw = write_raw(store, KIND, manifest, contents)
    record_drop(store, KIND, eval_id, raw, manifest.fields, len(manifest.files))
    _, problems = validate_dataset(posixpath.join(raw, "episodes"), min_length=1)
    manifest_ok = dg.AssetCheckResult(check_name=RESULTS_MANIFEST_CHECK, passed=True, metadata={"trials": len(trials)})
    if problems:
        episodes_bad = dg.AssetCheckResult(check_name=EPISODES_VALID_CHECK, passed=False, metadata={"first": problems[0].describe()})
        quarantined(context, store, KIND, eval_id, problems, stage="validation", check_results=[manifest_ok, episodes_bad])

    real = rate_metadata(trials)
    policy_version = str(manifest.fields["policy_version"])
    sim_uri = store.artifacts("robotics", "sim_evaluation", "latest.json")
    sim = read_json(sim_uri) if exists(sim_uri) else None
    sim = sim if sim and sim.get("policy_version") == policy_version else None  # the gap is this version's
    failures = trials[~trials["success"].astype(bool)]
    request = read_json(store.outbox("robot_eval", eval_id, "request.json")) if exists(store.outbox("robot_eval", eval_id, "request.json")) else {"tasks": HELD_OUT_TASKS}
    tasks = {t["task_id"]: t["task"] for t in request["tasks"]}
    relabel = relabel_request(eval_id, trials, tasks)
    if relabel is not None:
        write_json_atomic(store.outbox("relabel", eval_id, "request.json"), relabel)
    buffer = io.BytesIO()
    trials.to_parquet(buffer, index=False)
    write_bytes_atomic(store.curated(KIND, eval_id, "trials.parquet"), buffer.getvalue())
    per_task = trials.groupby("task_id")["success"].agg(["sum", "count"]).reset_index()
    per_task["ci95"] = [f"{lo:.2f}–{hi:.2f}" for lo, hi in (wilson_interval(int(s), int(c)) for s, c in zip(per_task["sum"], per_task["count"], strict=True))]
    gap = (sim["success_rate"] - real["success_rate"].value) if sim else float("nan")
    provenance = record_result(
        store, f"robotics/real_robot_evaluation/{eval_id}", "evaluation", f"{len(trials)} held-out trials on the real robot",
        inputs=[f"robotics/policy/{policy_version}", drop_id(KIND, eval_id)], uri=store.curated(KIND, eval_id, "trials.parquet"),
        facts={"success_rate": real["success_rate"].value, "failed_trials": len(failures)},
    )
    track_evaluation(store, f"robotics/policy/{policy_version}", "real", {"real_success_rate": real["success_rate"], "real_ci95_low": real["ci95_low"], "real_ci95_high": real["ci95_high"]})
    metadata = {
        "status": "valid",
        **{f"real_{k}": v for k, v in real.items()},
        "sim_success_rate": dg.MetadataValue.float(round(sim["success_rate"], 4) if sim else float("nan")),
        "sim_ci95": f"{sim['ci95'][0]:.2f}–{sim['ci95'][1]:.2f}" if sim else "no sim evaluation of this version yet",
        "sim_to_real_gap": dg.MetadataValue.float(round(gap, 4)),
        "per_task": dg.MetadataValue.md(per_task.rename(columns={"sum": "successes", "count": "trials"}).to_markdown(index=False)),
        "failed_trials_flagged_for_relabelling": len(failures),
        "policy_version": policy_version,
        "scene_ref": ", ".join(scenes_upstream(store, provenance["lineage_id"])),  # the scenes its policy's rollouts ran in
        **provenance,
        "episodes": dg.MetadataValue.path(posixpath.join(raw, "episodes")),
    }
    versions = policy_versions(context.instance, evaluated=metadata)
    metadata["success_by_version"] = dg.MetadataValue.md(
        image_markdown(success_chart_png(versions), "sim and real success by policy version") + "\n\n" + versions_markdown(versions) + "\n\n" + verdict(versions)
    )
    metadata["real_success_verdict"] = verdict(versions)
    return dg.MaterializeResult(metadata=metadata, check_results=[manifest_ok, dg.AssetCheckResult(check_name=EPISODES_VALID_CHECK, passed=True)])
