"""`sinewgrid tick` evaluates sensors upstream first: a tick ingests new drops before the
retraining sensor looks for them, whatever order the code location lists its sensors in."""

from __future__ import annotations

import pytest

from sinewgrid.ticker import upstream_first


@pytest.mark.parametrize(
    ("module", "ingest", "retrain", "watcher"),
    [
        ("cell_lane.definitions", {"assay_drop_sensor"}, "training_round_sensor", "cell_gpu_job_watcher"),
        ("robotics_lane.definitions", {"teleop_session_sensor", "robot_eval_sensor"}, "policy_round_sensor", "robotics_gpu_job_watcher"),
    ],
)
def test_ingest_ticks_before_retraining_and_the_watcher_last(module, ingest, retrain, watcher):
    import importlib

    defs = importlib.import_module(module).defs
    for listed in (list(defs.sensors), list(reversed(list(defs.sensors)))):
        order = [s.name for s in upstream_first(defs, listed)]
        assert max(order.index(name) for name in ingest) < order.index(retrain) < order.index(watcher) == len(order) - 1
