"""Faults while a lab's drop goes through: the daemon is killed while the ingest runs, the lane's
code server after it (SIGKILL, no clean shutdown), both started again as their supervisor would. Nothing is lost: the drop is ingested once, the round runs once, and no
GPU step is booked twice."""

from __future__ import annotations

import time

import dagster as dg
import pytest

from cell_lane.omics import load_reference_expression
from cell_lane.plate_layout import GENES_PER_PLATE
from control_plane.accounting.ledger import Ledger, read_ledger
from rehearsal.lab import upload_drop
from rehearsal.stack import Stack
from tests.helpers import good_plate
from tests.rehearsal.conftest import wait_for_run

pytestmark = pytest.mark.rehearsal

LAB = "lab-b"
DROP = "rehearsal-plate-faults"
PARTITION = f"{LAB}/{DROP}"
RUNNING = {dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.SUCCESS}  # past the queue: launched


def _runs_of(instance: dg.DagsterInstance, job: str, partition: str) -> list[dg.DagsterRun]:
    return [r for r in instance.get_runs(limit=500) if r.job_name == job and r.tags.get("dagster/partition") == partition]


def test_a_killed_daemon_and_code_server_lose_nothing(stack: Stack, instance: dg.DagsterInstance, timings: dict[str, float]):
    genes = list(load_reference_expression().var_names[GENES_PER_PLATE : 2 * GENES_PER_PLATE])
    uploaded_at = time.time()
    upload_drop(stack, LAB, DROP, {"plates/plate.csv": good_plate("PR002", genes=genes, seed=12).to_csv(index=False).encode()},
                assay="viability", instrument="reader-1", project="rehearsal")

    # Once the ingest is running, kill the daemon (SIGKILL); the run goes on without it.
    deadline = time.monotonic() + 300
    while not [r for r in _runs_of(instance, "assay_ingest", PARTITION) if r.status in RUNNING]:
        assert time.monotonic() < deadline, f"the daemon started no ingest of {PARTITION}\n{stack.logs()}"
        time.sleep(1)
    stack.services["daemon"].kill()
    ingest = wait_for_run(instance, stack, lambda r: r.job_name == "assay_ingest" and r.tags.get("dagster/partition") == PARTITION,
                          f"the ingest of {PARTITION}", down={"daemon"})
    assert ingest.status == dg.DagsterRunStatus.SUCCESS, stack.logs()

    # Then the Cell code server, before the round starts from it (with the daemon down, none can).
    # Not during a run: here a run is a process of its code server (the DefaultRunLauncher), where
    # in production it is a pod of its own that a code server's death does not touch.
    stack.services["code-server-cell"].kill()
    time.sleep(5)
    stack.restart("code-server-cell")
    stack.restart("daemon")
    training = wait_for_run(instance, stack, lambda r: r.job_name == "cell_training_round" and r.tags.get("dagster/partition") == LAB, f"{LAB}'s training round")
    assert training.status == dg.DagsterRunStatus.SUCCESS, stack.logs()
    timings["faults_upload_to_proposal_s"] = round(time.time() - uploaded_at, 1)

    # One ingest and one round: the restarted daemon started neither again.
    time.sleep(35)  # past one more tick of each sensor
    assert len(_runs_of(instance, "assay_ingest", PARTITION)) == 1
    assert len(_runs_of(instance, "cell_training_round", LAB)) == 1
    booked = read_ledger(Ledger(stack.env["SINEWGRID_LEDGER_URL"]), tenant=LAB)
    booked = booked[booked["backend"] != "model-gateway"]
    assert len(booked) >= 2 and not booked.duplicated(["run_id", "step", "attempt"]).any(), booked[["run_id", "step", "attempt"]]
    assert set(booked["outcome"]) == {"succeeded"}, booked[["step", "outcome"]]
