"""Pool health: qualification before a step lands, drains, the straggler detector, the
ledger's `cause` column (added in place to a ledger created before it existed)."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from workload_runtime.messages import Telemetry
from control_plane.compute.health import Drains, Qualifications
from control_plane.accounting.ledger import Ledger, read_ledger
from control_plane.compute.monitor import AttemptMonitor, straggling
from control_plane.catalog.pools import load_pools
from control_plane.catalog.step_spec import StepSpec
from workload_runtime.storage import Storage
from testbed.counting_step import counting_spec, materialize_counting, result_metadata


def _catalog(tmp_path: Path, **first: object) -> Path:
    def pool(price: float, **extra: object) -> dict:
        return {
            "provider": "test", "region": "local", "backend": "local", "purchasing": "on_demand", "accelerator": "local",
            "gpus_per_node": 1, "price_per_gpu_hour": price, **extra,
        }

    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": {"first": pool(1.0, **first), "second": pool(2.0)}}))
    return path


def test_a_pool_whose_health_check_fails_is_drained_before_the_step_lands(home, tmp_path):
    catalog = _catalog(tmp_path, health_check=["sh", "-c", "echo GPU 0 fell off the bus >&2; exit 1"])
    md = result_metadata(materialize_counting(home, catalog, counting_spec()))
    assert md["pool"] == "second" and md["attempts"] == 1  # nothing ran on `first`
    assert list(read_ledger(Storage.at(str(home)))["pool"]) == ["second"]
    drain = Drains(Storage.at(str(home))).active("first")
    assert drain is not None and "fell off the bus" in drain.reason and drain.remaining_seconds > 1000

    # The command line lists it and puts it back.
    from sinewgrid.cli import app

    env = {"SINEWGRID_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    listed = CliRunner().invoke(app, ["pools", "drained"], env=env)
    assert listed.exit_code == 0 and "first" in listed.output and "fell off" in listed.output
    undrained = CliRunner().invoke(app, ["pools", "undrain", "first"], env=env)
    assert undrained.exit_code == 0 and Drains(Storage.at(str(home))).active("first") is None


def test_a_pool_that_sells_gpus_it_does_not_have_fails_its_probe(home, tmp_path):
    # This machine has no GPU: a pool claiming an H100 here is exactly what qualification is for.
    catalog = _catalog(tmp_path, accelerator="h100-80gb")
    md = result_metadata(materialize_counting(home, catalog, counting_spec()))
    assert md["pool"] == "second"
    reason = Drains(Storage.at(str(home))).active("first").reason
    assert "qualification probe failed" in reason and "CUDA sees none" in reason


def test_a_qualification_pass_is_remembered_with_what_the_probe_saw(home, tmp_path):
    catalog = _catalog(tmp_path)
    first = load_pools(catalog)["first"]
    qualifications = Qualifications(Storage.at(str(home)))
    materialize_counting(home, catalog, counting_spec())  # it needs numpy only: the probe imports that
    passed = qualifications.fresh(first, "default", ["numpy"])
    assert passed is not None and passed["imports"] == ["numpy"]
    assert "numpy" in passed["checks"]["runtime"] and "torch" not in passed["checks"]["runtime"]
    assert "round trip" in passed["checks"]["storage"]
    # A step that needs torch is not covered by that pass: the pool is qualified for it too, and
    # each keeps its own pass (a numpy step and a torch step on one pool do not undo each other).
    assert qualifications.fresh(first, "default", ["torch", "safetensors"]) is None
    materialize_counting(home, catalog, counting_spec(imports=["torch", "safetensors"]))
    again = qualifications.fresh(first, "default", ["safetensors", "torch"])
    assert again is not None and "torch" in again["checks"]["runtime"] and again["at"] > passed["at"]
    assert qualifications.fresh(first, "default", ["numpy"]) == passed
    # A pool set not to qualify is never probed.
    other = tmp_path / "other"
    (other / "home").mkdir(parents=True)
    unqualified, home2 = _catalog(other, qualify=False), other / "home"
    materialize_counting(home2, unqualified, counting_spec())
    assert Qualifications(Storage.at(str(home2))).fresh(load_pools(unqualified)["first"], "default", ["numpy"]) is None


def test_every_pool_drained_is_a_clear_failure(home, tmp_path):
    catalog = _catalog(tmp_path)
    storage = Storage.at(str(home))
    for pool in load_pools(catalog).values():
        Drains(storage).drain(pool, "NHC: disk full")
    with pytest.raises(Exception, match=r"No pool could take test.counting: first is drained \(NHC: disk full"):
        materialize_counting(home, catalog, counting_spec())


# The straggler detector ----------------------------------------------------------------------


def test_straggling_needs_every_recent_report_slow():
    steady = [0.01] * 6
    assert not straggling(steady, factor=3, patience=3)[0]
    assert straggling([0.01] * 4 + [0.05] * 3, factor=3, patience=3)[0]
    assert not straggling([0.01] * 4 + [0.05, 0.01, 0.05], factor=3, patience=3)[0]  # one fast report: not yet
    assert not straggling([0.01, 0.05, 0.05, 0.05], factor=3, patience=3)[0]  # too little history to judge
    # seen late (the monitor polled less often than the workload reported): still slower than the start
    assert straggling([0.01] * 5 + [0.05] * 12, factor=3, patience=3)[0]


def test_the_report_policy_only_reports():
    pool = next(iter(load_pools(None).values()))
    spec = StepSpec(name="s", entry_point="m", tenant="t", on_straggler="report")
    # what a workload sends through Pipes (workload_runtime/messages.py), as the monitor receives it
    messages = [Telemetry(step=10 * (i + 1), step_seconds=s).payload() for i, s in enumerate([0.01] * 4 + [0.1] * 3)]
    monitor = AttemptMonitor(pool, spec, messages=lambda: messages, node_problem=lambda: None)
    assert monitor.poll() is None and [f.cause for f in monitor.flags] == ["straggler"]
    replace = AttemptMonitor(pool, spec.model_copy(update={"on_straggler": "replace"}), messages=lambda: messages, node_problem=lambda: None)
    flag = replace.poll()
    assert flag is not None and flag.action == "replace" and "10.0×" in flag.detail


# The ledger's cause column ---------------------------------------------------------------------


def test_an_old_ledger_gets_the_cause_column_in_place(tmp_path):
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE ledger_attempts (id INTEGER PRIMARY KEY, run_id VARCHAR(64) NOT NULL)")
        conn.execute("INSERT INTO ledger_attempts (run_id) VALUES ('before')")
    Ledger(f"sqlite:///{db}").engine  # opening it migrates
    with sqlite3.connect(db) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(ledger_attempts)")]
        assert "cause" in columns
        assert conn.execute("SELECT cause FROM ledger_attempts").fetchone() == ("",)


def test_a_booked_attempt_keeps_its_cause(tmp_path):
    from control_plane.accounting.records import AttemptRecord

    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    now = dt.datetime.now(dt.UTC)
    pool = next(iter(load_pools(None).values()))
    ledger.record(AttemptRecord.for_attempt(
        pool=pool, run_id="r", step="s", asset="a/b", partition=None, attempt=1, gpus=1, started=now - dt.timedelta(seconds=10),
        ended=now, productive_seconds=4, outcome="preempted", cause="straggler",
    ))
    frame = ledger.frame()
    assert list(frame["cause"]) == ["straggler"] and frame["lost_preemption_seconds"].iloc[0] == pytest.approx(6)
    assert os.path.exists(tmp_path / "l.db")


def test_report_by_cause_names_every_cause(tmp_path):
    from control_plane.accounting.records import AttemptRecord
    from control_plane.accounting.reports import summary

    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    now = dt.datetime.now(dt.UTC)
    pool = next(iter(load_pools(None).values()))
    for attempt, (outcome, cause) in enumerate([("preempted", "straggler"), ("succeeded", None)], start=1):
        ledger.record(AttemptRecord.for_attempt(
            pool=pool, run_id="r", step="s", asset="a/b", partition=None, attempt=attempt, gpus=1,
            started=now - dt.timedelta(seconds=10 * attempt), ended=now - dt.timedelta(seconds=10 * attempt - 5),
            productive_seconds=2, outcome=outcome, cause=cause,
        ))
    table = summary(ledger.frame(), by="cause")
    assert set(table["cause"]) == {"straggler", "none (succeeded)"}
    assert table.set_index("cause").loc["straggler", "lost_preemption_gpu_hours"] > 0
