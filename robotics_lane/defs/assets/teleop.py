"""Teleop sessions: a LeRobot v3 dataset from an operator becomes validated training episodes."""


import dagster as dg

from robotics_lane.defs.checks import EPISODES_VALID_CHECK, SESSION_MANIFEST_CHECK
from robotics_lane.episodes.validation import validate_dataset
from robotics_lane.defs.partitions import teleop_sessions
from control_plane.intake.landing import read_drop, write_raw
from data_layer.provenance import drop_id, publish_version, record_drop
from control_plane.intake.quarantine import quarantined
from shared_resources.resources import StorageResource
from workload_runtime.storage import write_json_atomic

KIND = "teleop"
TELEOP_EPISODES = dg.AssetKey(["robotics", "teleop_episodes"])
MANIFEST_FIELDS = ("robot", "operator", "project")


@dg.asset(
    key=TELEOP_EPISODES,
    partitions_def=teleop_sessions,
    group_name="robotics_data",
    kinds={"lerobot", "parquet"},
    check_specs=[
        dg.AssetCheckSpec(SESSION_MANIFEST_CHECK, asset=TELEOP_EPISODES, blocking=True, description="The session's manifest is complete and every file matches its sha256 and size."),
        dg.AssetCheckSpec(EPISODES_VALID_CHECK, asset=TELEOP_EPISODES, blocking=True, description="LeRobot v3 layout, features and shapes, monotonic timestamps at the declared fps, contiguous indices, finite values, actions within bounds, sane episode lengths; every camera video decodes, at the declared resolution and fps, one frame per timestamp."),
    ],
)
def teleop_episodes(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """Demonstrations recorded by a teleoperator: one partition per session, a LeRobot v3.0
    dataset that opens in LeRobot's own reader. Policies learn to imitate these.

    A session that breaks a rule (timestamps, indices, NaNs, out-of-bounds actions, …) goes to
    quarantine with the reason, and the others keep flowing. Each valid session is registered
    as the dataset version `robotics/teleop@<session>` (`sinewgrid data get`, or plain `dvc get`).
    """
    store = storage.get()
    session = context.partition_key
    manifest, contents, issues = read_drop(store, KIND, session, MANIFEST_FIELDS)
    if issues:
        checks = [
            dg.AssetCheckResult(check_name=SESSION_MANIFEST_CHECK, passed=False, metadata={"first": issues[0].describe()}),
            dg.AssetCheckResult(check_name=EPISODES_VALID_CHECK, passed=False, metadata={"skipped": "the files themselves could not be trusted"}),
        ]
        quarantined(context, store, KIND, session, issues, stage="raw", check_results=checks)
    raw = write_raw(store, KIND, manifest, contents)
    record_drop(store, KIND, session, raw, manifest.fields, len(manifest.files))
    info, problems = validate_dataset(raw)
    manifest_ok = dg.AssetCheckResult(check_name=SESSION_MANIFEST_CHECK, passed=True, metadata={"files": len(manifest.files)})
    if problems:
        episodes_bad = dg.AssetCheckResult(check_name=EPISODES_VALID_CHECK, passed=False, metadata={"issues": len(problems), "first": problems[0].describe()})
        quarantined(context, store, KIND, session, problems, stage="validation", check_results=[manifest_ok, episodes_bad])
    registered, version = publish_version(
        store, "robotics/teleop", session, raw, title="teleop demonstrations (LeRobot v3)",
        inputs=[drop_id(KIND, session)], facts={"episodes": info.total_episodes, "robot": str(manifest.fields["robot"])},
    )
    write_json_atomic(store.curated(KIND, session, "dataset.json"), {"dataset": raw, "episodes": info.total_episodes, "ref": registered.ref})
    return dg.MaterializeResult(
        metadata={
            "status": "valid",
            "dataset": dg.MetadataValue.path(raw),
            "episodes": info.total_episodes,
            "frames": info.total_frames,
            "fps": info.fps,
            "robot": str(manifest.fields["robot"]),
            "operator": str(manifest.fields["operator"]),
            "tasks": ", ".join(info.tasks),
            **version,
        },
        check_results=[manifest_ok, dg.AssetCheckResult(check_name=EPISODES_VALID_CHECK, passed=True, metadata={"episodes": info.total_episodes})],
    )
