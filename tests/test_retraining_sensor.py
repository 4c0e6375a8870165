"""The training-round sensor: waits for ingest, fires once per batch of new valid plates, per lab."""

from __future__ import annotations

import dagster as dg
import pytest

from cell_lane.defs.assets.dataset import omics_dataset
from cell_lane.definitions import defs
from cell_lane.defs.sensors import training_round_sensor
from tests.helpers import LAB, drop_plate, good_plate, ingest_drop, lab_drop, lab_storage


@pytest.fixture
def storage(root: str):
    return lab_storage(root)


def _evaluate(instance):
    with dg.build_sensor_context(instance_ref=instance.get_ref(), definitions=defs) as context:
        return training_round_sensor.evaluate_tick(context)


def _ingest(instance, resources, drop_id, tenant=LAB):
    return ingest_drop(instance, resources, drop_id, tenant)


def test_nothing_to_train_on_an_empty_instance(instance):
    result = _evaluate(instance)
    assert result.run_requests == [] and "no new valid" in result.skip_message


def test_new_valid_plates_start_one_round_and_only_one(instance, resources, storage):
    drop_plate(storage, "a")
    drop_plate(storage, "b", good_plate(seed=1))
    _ingest(instance, resources, "a")
    _ingest(instance, resources, "b")
    first = _evaluate(instance)
    assert len(first.run_requests) == 1
    assert first.run_requests[0].job_name in (None, "cell_training_round")
    assert first.run_requests[0].partition_key == LAB
    # once the training set has been rebuilt, the same plates do not start another round
    dg.materialize([omics_dataset], instance=instance, resources=resources, partition_key=LAB)
    assert _evaluate(instance).run_requests == []


def test_a_quarantined_drop_does_not_start_a_round(instance, resources, storage):
    bad = good_plate()
    drop_plate(storage, "bad", bad[bad["sample_type"] != "pos_ctrl"])
    assert not _ingest(instance, resources, "bad").success
    assert _evaluate(instance).run_requests == []


def test_waits_while_ingest_runs_are_in_flight(instance, resources, storage):
    drop_plate(storage, "a")
    _ingest(instance, resources, "a")
    job = defs.resolve_job_def("assay_ingest")
    instance.create_run_for_job(job_def=job, status=dg.DagsterRunStatus.STARTED, tags={"dagster/partition": lab_drop("a")})
    result = _evaluate(instance)
    assert result.run_requests == [] and "waiting for 1 ingest run" in result.skip_message


def test_upstream_that_lands_while_a_round_runs_starts_the_next_round(instance):
    """A round reads its upstream once it has started: data accepted while it ran may not be in it,
    though its own materialization comes later. That data still starts the next round (the
    production rehearsal lost a teleop session this way, ingested while a policy round trained)."""
    from sensors.retraining import make_retraining_sensor

    upstream, trained = dg.AssetKey("episodes"), dg.AssetKey("policy")

    def accepted(name: str) -> None:
        instance.report_runless_asset_event(dg.AssetMaterialization(upstream, partition=name, metadata={"status": "valid"}))

    @dg.asset(key=trained)
    def policy() -> None:
        accepted("landed-while-training")  # after this round read its upstream, before it materializes

    sensor = make_retraining_sensor(name="rounds", upstream=upstream, accepted_status="valid", training_set=trained,
                                    job_name="rounds_job", ingest_job_name="ingest_job", description="test")  # fmt: skip
    accepted("first")
    dg.materialize([policy], instance=instance)
    with dg.build_sensor_context(instance=instance) as context:
        result = sensor.evaluate_tick(context)
    assert [r.tags["sinewgrid/trigger"] for r in result.run_requests] == ["episodes:landed-while-training"], result.skip_message
