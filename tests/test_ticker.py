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


def test_a_tick_leaves_sigterm_as_it_found_it():
    """Started in the background by a script, `sinewgrid` ignores SIGINT; after a run Dagster
    leaves SIGTERM at SIGINT's handler, so `kill` would no longer stop it. A tick puts it back."""
    import signal

    import dagster as dg

    from sinewgrid.ticker import SensorTick, _run_requests

    @dg.asset
    def one():
        return 1

    defs = dg.Definitions(assets=[one], jobs=[dg.define_asset_job("one_job", [one])])
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with dg.instance_for_test() as instance:
            tick = SensorTick("test", "a_sensor")
            _run_requests(tick, defs, instance, [dg.RunRequest()], "one_job", "dagster/sensor_name", "a_sensor", None, None)
        assert [run.success for run in tick.runs] == [True]
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
