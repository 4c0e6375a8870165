"""`sinewgrid tick` evaluates sensors upstream first: a tick ingests new drops before the
retraining sensor looks for them, whatever order the code location lists its sensors in."""

from __future__ import annotations

import dagster as dg
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


# A sensor that asks for the run `key-<cursor // 2>` and adds (then deletes) a dynamic partition,
# moving its cursor on every tick: every second tick repeats the run key of the one before.
DROPS = dg.DynamicPartitionsDefinition(name="drops")


@dg.asset(partitions_def=DROPS)
def drop_size(context) -> int:
    return len(context.partition_key)


DROP_JOB = dg.define_asset_job("drop_job", [drop_size])


@dg.sensor(job=DROP_JOB)
def drop_sensor(context):
    ticks = int(context.cursor or 0)
    key = f"drop-{ticks // 2}"
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"key-{ticks // 2}", partition_key=key)],
        dynamic_partitions_requests=[DROPS.build_add_request([key]), *([DROPS.build_delete_request(["gone"])] if ticks == 2 else [])],
        cursor=str(ticks + 1),
    )

def test_a_sensor_tick_keeps_its_cursor_in_the_instance_and_runs_each_run_key_once(tmp_path):
    from sinewgrid.ticker import tick_sensor

    defs = dg.Definitions(assets=[drop_size], jobs=[DROP_JOB], sensors=[drop_sensor])
    sensor = drop_sensor
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        instance.add_dynamic_partitions("drops", ["gone"])
        first = tick_sensor("here", defs, sensor, instance)
        assert [(r.partition, r.success) for r in first.runs] == [("drop-0", True)] and first.new_partitions == ["drop-0"]
        second = tick_sensor("here", defs, sensor, instance)  # cursor 1: the same run key again
        assert second.runs == [] and second.already_run == ["key-0"]
        third = tick_sensor("here", defs, sensor, instance)  # cursor 2: a new key, and "gone" deleted
        assert [r.partition for r in third.runs] == ["drop-1"] and third.deleted_partitions == ["gone"]
        assert sorted(instance.get_dynamic_partitions("drops")) == ["drop-0", "drop-1"]
        runs = instance.get_run_records(filters=dg.RunsFilter(tags={"dagster/sensor_name": "drop_sensor"}))
        assert sorted(r.dagster_run.tags["dagster/run_key"] for r in runs) == ["key-0", "key-1"]
    with dg.instance_for_test(temp_dir=str(tmp_path)) as reopened:  # the cursor lives in the instance, not the process
        assert tick_sensor("here", defs, sensor, reopened).already_run == ["key-1"]
