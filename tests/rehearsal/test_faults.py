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


def test_a_postgresql_restart_under_a_run_ends_it_clearly_and_the_loop_goes_on(stack: Stack, instance: dg.DagsterInstance, timings: dict[str, float]):
    """PostgreSQL (the instance and the ledger) restarts while lab-a's next drop is being ingested:
    every connection is cut for 5 s. The run ends, succeeded or clearly failed, never stuck; the
    services come back (their supervisor restarts any that exited, as Kubernetes would, and the
    test says which); the lab's following drop goes through to a new round."""
    lab = "lab-a"
    before = {r.run_id for r in instance.get_runs(limit=500)}
    genes = list(load_reference_expression().var_names[2 * GENES_PER_PLATE : 3 * GENES_PER_PLATE])
    hit = f"{lab}/rehearsal-plate-pg-restart"
    upload_drop(stack, lab, hit.split("/")[1], {"plates/plate.csv": good_plate("PR003", genes=genes, seed=13).to_csv(index=False).encode()},
                assay="viability", instrument="reader-1", project="rehearsal")
    deadline = time.monotonic() + 300
    while not [r for r in _runs_of(instance, "assay_ingest", hit) if r.status in RUNNING]:
        assert time.monotonic() < deadline, f"the daemon started no ingest of {hit}\n{stack.logs()}"
        time.sleep(1)
    stack.postgres.restart(down_s=5)

    time.sleep(20)  # the services' own retries first
    exited = sorted(name for name, service in stack.services.items() if not service.alive)
    for name in exited:
        stack.restart(name)
    timings["pg_restart_services_restarted"] = exited  # type: ignore[assignment]
    ended = wait_for_run(instance, stack, lambda r: r.job_name == "assay_ingest" and r.tags.get("dagster/partition") == hit, f"the ingest of {hit}")
    assert ended.status in {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE}
    timings["pg_restart_ingest_status"] = ended.status.value  # type: ignore[assignment]

    # The loop goes on: the lab's next drop is ingested and starts a new round of its own.
    genes = list(load_reference_expression().var_names[3 * GENES_PER_PLATE : 4 * GENES_PER_PLATE])
    after = f"{lab}/rehearsal-plate-after-pg"
    upload_drop(stack, lab, after.split("/")[1], {"plates/plate.csv": good_plate("PR004", genes=genes, seed=14).to_csv(index=False).encode()},
                assay="viability", instrument="reader-1", project="rehearsal")
    ingest = wait_for_run(instance, stack, lambda r: r.job_name == "assay_ingest" and r.tags.get("dagster/partition") == after, f"the ingest of {after}")
    assert ingest.status == dg.DagsterRunStatus.SUCCESS, stack.logs()
    training = wait_for_run(instance, stack, lambda r: r.run_id not in before and r.job_name == "cell_training_round" and r.tags.get("dagster/partition") == lab,
                            f"{lab}'s round after the restart")
    assert training.status == dg.DagsterRunStatus.SUCCESS, stack.logs()
    deadline = time.monotonic() + 600  # every run started since: finished, none stuck
    while stuck := [r.run_id for r in instance.get_runs(limit=500) if r.run_id not in before and r.status not in {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE}]:
        assert time.monotonic() < deadline, f"runs left unfinished: {stuck}\n{stack.logs()}"
        time.sleep(5)
    booked = read_ledger(Ledger(stack.env["SINEWGRID_LEDGER_URL"]))
    booked = booked[booked["backend"] != "model-gateway"]
    assert not booked.duplicated(["run_id", "step", "attempt"]).any(), booked[["run_id", "step", "attempt"]]
