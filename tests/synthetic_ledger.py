"""A small ledger written by hand, whose reports can be worked out on paper.

Two lanes, two providers, two projects, three runs. Every attempt starts on a whole hour and
lasts whole minutes so the expected figures below are exact.
"""

from __future__ import annotations

import datetime as dt

from control_plane.accounting.records import AttemptRecord

DAY1 = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
DAY2 = DAY1 + dt.timedelta(days=1)

# (run, step, attempt, lane, project, provider, purchasing, price, gpus, start, minutes, productive min, outcome, queue min, checkpoint min, task done)
ROWS = [
    # run r1 (cell, project "screen"): preempted on spot at aws, then finished on aws on-demand
    ("r1", "cell.pretrain", 1, "cell", "screen", "aws", "spot", 1.0, 2, DAY1, 60, 30, "preempted", 0, 0, False),
    ("r1", "cell.pretrain", 2, "cell", "screen", "aws", "on_demand", 3.0, 2, DAY1 + dt.timedelta(hours=1), 60, 45, "succeeded", 0, 6, True),
    # run r2 (cell, project "screen"): refused by gcp (waited 6 minutes), then finished on gcp
    ("r2", "cell.finetune", 1, "cell", "screen", "gcp", "spot", 1.0, 1, DAY1 + dt.timedelta(hours=3), 6, 0, "refused", 6, 0, False),
    ("r2", "cell.finetune", 2, "cell", "screen", "gcp", "on_demand", 2.0, 1, DAY1 + dt.timedelta(hours=4), 30, 30, "succeeded", 0, 0, True),
    # run r3 (robotics, project "grasp"): a failed rollout and a successful one on gcp, day two
    ("r3", "robotics.rollouts", 1, "robotics", "grasp", "gcp", "spot", 0.5, 4, DAY2, 30, 0, "failed", 0, 0, False),
    ("r3", "robotics.rollouts", 2, "robotics", "grasp", "gcp", "spot", 0.5, 4, DAY2 + dt.timedelta(hours=1), 60, 54, "succeeded", 0, 0, True),
]


def synthetic_records() -> list[AttemptRecord]:
    records = []
    for run, step, attempt, lane, project, provider, purchasing, price, gpus, start, minutes, productive, outcome, queue, ckpt, done in ROWS:
        records.append(
            AttemptRecord.build(
                run_id=run,
                step=step,
                asset=f"{lane}/{step.split('.', 1)[1]}",
                partition=None,
                attempt=attempt,
                pool=f"{provider}-{purchasing}",
                provider=provider,
                region="eu",
                backend="slurm",
                purchasing=purchasing,
                price_per_gpu_hour=price,
                gpus=gpus,
                started=start,
                ended=start + dt.timedelta(minutes=minutes),
                productive_seconds=productive * 60,
                outcome=outcome,
                exit_code={"succeeded": 0, "preempted": 75, "failed": 1}.get(outcome),
                queue_seconds=queue * 60,
                checkpoint_seconds=ckpt * 60,
                lane=lane,
                project=project,
                completed_task=done,
            )
        )
    return records


# Worked out by hand from ROWS (cost = hours × GPUs × price; goodput weighs each attempt by its GPUs).
# cell:     cost 1×2×1 + 1×2×3 + 0.1×1×1 + 0.5×1×2 = 2 + 6 + 0.1 + 1 = 9.1;  GPU-min allocated 120+120+6+30 = 276,
#           productive 60+90+0+30 = 180 → goodput 180/276; 2 tasks completed → 4.55 per task.
# robotics: cost 0.5×4×0.5 + 1×4×0.5 = 1 + 2 = 3;  GPU-min allocated 120+240 = 360, productive 216 → 0.6; 1 task → 3.
# aws:      cost 8, allocated 240, productive 150 → 0.625, 1 task → 8.   gcp: cost 4.1, allocated 396, productive 246, 2 tasks → 2.05.
EXPECTED = {
    "lane": {"cell": (9.1, 180 / 276, 4.55), "robotics": (3.0, 0.6, 3.0)},
    "provider": {"aws": (8.0, 150 / 240, 8.0), "gcp": (4.1, 246 / 396, 2.05)},
    "project": {"screen": (9.1, 180 / 276, 4.55), "grasp": (3.0, 0.6, 3.0)},
    "run": {"r1": (8.0, 150 / 240, 8.0), "r2": (1.1, 30 / 36, 1.1), "r3": (3.0, 0.6, 3.0)},
}
# Lost time in seconds by reason (plain seconds, not GPU-weighted):
# preemption: r1/1 60−30 = 30 min; queueing: r2/1 6 min; failure: r3/1 30 min;
# rework: r1/2 60−45−6 = 9 min, r3/2 6 min → 15 min. Checkpoint writing: 6 min.
EXPECTED_LOST_SECONDS = {"preemption": 1800.0, "queueing": 360.0, "failure": 1800.0, "rework": 900.0}
EXPECTED_CHECKPOINT_SECONDS = 360.0
TOTAL_COST = 12.1
# The same in GPU-hours (× GPUs): preemption 30 min × 2; failure 30 min × 4; queueing 6 min × 1;
# rework 9 min × 2 + 6 min × 4 = 42 GPU-min; checkpoint 6 min × 2; productive 396 GPU-min.
# They add up to the 10.6 GPU-hours allocated.
EXPECTED_LOST_GPU_HOURS = {"preemption": 1.0, "failure": 2.0, "queueing": 0.1, "rework": 0.7}
EXPECTED_CHECKPOINT_GPU_HOURS = 0.2
EXPECTED_PRODUCTIVE_GPU_HOURS = 6.6
EXPECTED_GPU_HOURS = 10.6
# Cost by provider × purchasing: aws spot 2, aws on-demand 6, gcp spot 0.1 + 3, gcp on-demand 1.
EXPECTED_BREAKDOWN = {("aws", "on_demand"): 6.0, ("aws", "spot"): 2.0, ("gcp", "on_demand"): 1.0, ("gcp", "spot"): 3.1}
