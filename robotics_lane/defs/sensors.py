"""The Robotics lane's sensors and schedule: teleop sessions and robot-cell results in, policy
rounds, the nightly sweep, and the watcher of its GPU jobs."""

from robotics_lane.defs.assets.policy import POLICY
from robotics_lane.defs.assets.rollouts import SIM_ROLLOUTS
from robotics_lane.defs.assets.teleop import TELEOP_EPISODES
from robotics_lane.defs import jobs
from robotics_lane.defs.partitions import robot_evals, sweep_partition_keys, teleop_sessions
from sensors.inflight_watcher import make_inflight_watcher
from sensors.landing_drops import make_landing_sensor
from sensors.retraining import make_retraining_sensor
from sensors.schedules import make_nightly_schedule

teleop_session_sensor = make_landing_sensor(
    name="teleop_session_sensor",
    kind="teleop",
    job_name=jobs.teleop_ingest_job.name,
    partitions_def=teleop_sessions,
    description="Watches landing/teleop/ for complete teleop sessions (LeRobot v3 + manifest.json) and ingests each once.",
)
robot_eval_sensor = make_landing_sensor(
    name="robot_eval_sensor",
    kind="robot_eval",
    job_name=jobs.robot_eval_ingest_job.name,
    partitions_def=robot_evals,
    description="Watches landing/robot_eval/ for the robot cell's results and ingests each evaluation once.",
)
policy_round_sensor = make_retraining_sensor(
    name="policy_round_sensor",
    upstream=[TELEOP_EPISODES, SIM_ROLLOUTS],
    accepted_status="valid",
    training_set=POLICY,
    job_name=jobs.policy_round_job.name,
    ingest_job_name=[jobs.teleop_ingest_job.name, jobs.nightly_sweep_job.name],
    description="Starts a policy round when new teleop sessions or sweeps are in and none is still running.",
)
nightly_sweep_schedule = make_nightly_schedule(
    name="nightly_sweep_schedule",
    job_name=jobs.nightly_sweep_job.name,
    night_dimension="night",
    config_dimension="sweep",
    configs=sweep_partition_keys(),  # each sweep at its scene's version
    description="{when}: one spot-backed rollout sweep per configuration for the night that ended.",
)
gpu_job_watcher = make_inflight_watcher(name="robotics_gpu_job_watcher", asset_prefix="robotics/")
