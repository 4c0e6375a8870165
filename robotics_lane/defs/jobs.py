"""Jobs of the Robotics lane."""

import dagster as dg

from robotics_lane.defs.assets.failure_labels import FAILURE_LABELS
from robotics_lane.defs.assets.policy import POLICY, SIM_EVALUATION
from robotics_lane.defs.assets.real_robot import EVAL_REQUEST, REAL_EVALUATION
from robotics_lane.defs.assets.rollouts import SIM_ROLLOUTS
from robotics_lane.defs.assets.teleop import TELEOP_EPISODES
from robotics_lane.defs.partitions import nightly_sweeps, robot_evals, teleop_sessions

teleop_ingest_job = dg.define_asset_job(
    "teleop_ingest",
    selection=dg.AssetSelection.assets(TELEOP_EPISODES),
    partitions_def=teleop_sessions,
    description="Verify and validate one teleop session (bad sessions go to quarantine).",
)
nightly_sweep_job = dg.define_asset_job(
    "nightly_sweep",
    selection=dg.AssetSelection.assets(SIM_ROLLOUTS),
    partitions_def=nightly_sweeps,
    description="One night's rollouts for one sweep configuration, on spot capacity.",
)
policy_round_job = dg.define_asset_job(
    "policy_round",
    selection=dg.AssetSelection.assets(POLICY, SIM_EVALUATION, EVAL_REQUEST),
    description="Train the policy on all demonstrations, evaluate it in simulation, ask the robot cell to evaluate it.",
)
robot_eval_ingest_job = dg.define_asset_job(
    "robot_eval_ingest",
    selection=dg.AssetSelection.assets(REAL_EVALUATION, FAILURE_LABELS),
    partitions_def=robot_evals,
    description="Ingest the robot cell's results for one evaluation; failed trials are labelled with how they failed and flagged for relabelling.",
)
