"""The Robotics code location: teleop episodes, nightly sim sweeps, policy, sim and real evaluation."""

import dagster as dg

from robotics_lane.assets import policy, real_robot, rollouts, teleop
from robotics_lane.assets.policy import POLICY
from robotics_lane.assets.rollouts import SIM_ROLLOUTS
from robotics_lane.assets.teleop import TELEOP_EPISODES
from robotics_lane.jobs import nightly_sweep_job, policy_round_job, robot_eval_ingest_job, teleop_ingest_job
from robotics_lane.partitions import robot_evals, teleop_sessions
from robotics_lane.sweeps import SWEEPS
from sensors.inflight_watcher import make_inflight_watcher
from sensors.landing_drops import make_landing_sensor
from sensors.retraining import make_retraining_sensor
from sensors.schedules import make_nightly_schedule
from shared_resources.resources import platform_resources

teleop_session_sensor = make_landing_sensor(
    name="teleop_session_sensor",
    kind="teleop",
    job_name=teleop_ingest_job.name,
    partitions_def=teleop_sessions,
    description="Watches landing/teleop/ for complete teleop sessions (LeRobot v3 + manifest.json) and ingests each once.",
)
robot_eval_sensor = make_landing_sensor(
    name="robot_eval_sensor",
    kind="robot_eval",
    job_name=robot_eval_ingest_job.name,
    partitions_def=robot_evals,
    description="Watches landing/robot_eval/ for the robot cell's results and ingests each evaluation once.",
)
policy_round_sensor = make_retraining_sensor(
    name="policy_round_sensor",
    upstream=[TELEOP_EPISODES, SIM_ROLLOUTS],
    accepted_status="valid",
    training_set=POLICY,
    job_name=policy_round_job.name,
    ingest_job_name=[teleop_ingest_job.name, nightly_sweep_job.name],
    description="Starts a policy round when new teleop sessions or sweeps are in and none is still running.",
)
nightly_sweep_schedule = make_nightly_schedule(
    name="nightly_sweep_schedule",
    job_name=nightly_sweep_job.name,
    night_dimension="night",
    config_dimension="sweep",
    configs=sorted(SWEEPS),
    description="Every night at 02:00 UTC: one spot-backed rollout sweep per configuration for the night that ended.",
)
gpu_job_watcher = make_inflight_watcher(name="robotics_gpu_job_watcher", asset_prefix="robotics/")

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([teleop, rollouts, policy, real_robot]),
    jobs=[teleop_ingest_job, nightly_sweep_job, policy_round_job, robot_eval_ingest_job],
    sensors=[teleop_session_sensor, robot_eval_sensor, policy_round_sensor, gpu_job_watcher],
    schedules=[nightly_sweep_schedule],
    resources=platform_resources(),
)
