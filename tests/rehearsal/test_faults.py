"""Faults while runs are in flight, each asserted by its outcome (run states, materializations,
ledger rows):

- the daemon and the lane's code server killed while lab-b's ingest runs (SIGKILL, no clean
  shutdown), both started again as their supervisor would: the drop is ingested once, the
  round runs once, no GPU step is booked twice;
- a run's worker killed (its container, as a lost node ends a run pod): run monitoring notices
  and starts a new worker for the same run, which ends succeeded without redoing what was done;
  killed while its GPU step runs on Slurm, the step's job is stopped and booked once before the
  step runs again;
- PostgreSQL restarted under a run: the run ends clearly and the loop goes on.
"""

from __future__ import annotations

import os
import time

import dagster as dg
import pytest

from cell_lane.omics import load_reference_expression
from cell_lane.plate_layout import GENES_PER_PLATE
from control_plane.accounting.ledger import Ledger, read_ledger
from rehearsal.lab import upload_drop
from rehearsal.services import podman
from rehearsal.stack import Stack
from tests.helpers import good_plate
from tests.rehearsal.conftest import failure_of, wait_for_run

pytestmark = pytest.mark.rehearsal

LAB = "lab-b"
DROP = "rehearsal-plate-faults"
PARTITION = f"{LAB}/{DROP}"
RUNNING = {dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.SUCCESS}  # past the queue: launched


def _runs_of(instance: dg.DagsterInstance, job: str, partition: str) -> list[dg.DagsterRun]:
    return [r for r in instance.get_runs(limit=500) if r.job_name == job and r.tags.get("dagster/partition") == partition]


def _send_plate(stack: Stack, partition: str, plate: str, block: int, seed: int) -> None:
    """The lab of `partition` uploads drop `<lab>/<drop_id>`: one good plate of the expression
    matrix's genes block `block` (a plate of genes no earlier drop measured)."""
    lab, drop_id = partition.split("/")
    genes = list(load_reference_expression().var_names[block * GENES_PER_PLATE : (block + 1) * GENES_PER_PLATE])
    upload_drop(stack, lab, drop_id, {"plates/plate.csv": good_plate(plate, genes=genes, seed=seed).to_csv(index=False).encode()},
                assay="viability", instrument="reader-1", project="rehearsal")


def _ingest_under_way(instance: dg.DagsterInstance, stack: Stack, partition: str, statuses: set[dg.DagsterRunStatus]) -> dg.DagsterRun:
    """The ingest of `partition` once the daemon has launched it and it is in one of `statuses`."""
    deadline = time.monotonic() + 300
    while not (runs := [r for r in _runs_of(instance, "assay_ingest", partition) if r.status in statuses]):
        assert time.monotonic() < deadline, f"the daemon started no ingest of {partition}\n{stack.logs()}"
        time.sleep(1)
    return runs[0]


def test_a_killed_daemon_and_code_server_lose_nothing(stack: Stack, instance: dg.DagsterInstance, timings: dict[str, float]):
    uploaded_at = time.time()
    _send_plate(stack, PARTITION, "PR002", block=1, seed=12)

    # Once the ingest is running, kill the daemon (SIGKILL); the run goes on without it.
    launched = _ingest_under_way(instance, stack, PARTITION, RUNNING)
    stack.services["daemon"].kill()
    if stack.image:  # and the Cell code server, under the run: the run is a container of its own
        stack.services["code-server-cell"].kill()
    timings["faults_killed_under_the_run"] = instance.get_run_by_id(launched.run_id).status == dg.DagsterRunStatus.STARTED  # type: ignore[assignment]
    ingest = wait_for_run(instance, stack, lambda r: r.job_name == "assay_ingest" and r.tags.get("dagster/partition") == PARTITION,
                          f"the ingest of {PARTITION}", down={"daemon", "code-server-cell"})
    assert ingest.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, ingest)}\n{stack.logs()}"

    # As processes, a run is a process of its code server (the DefaultRunLauncher): the code
    # server is killed after the run instead, before the round could start from it.
    if not stack.image:
        stack.services["code-server-cell"].kill()
    time.sleep(5)
    stack.restart("code-server-cell")
    stack.restart("daemon")
    training = wait_for_run(instance, stack, lambda r: r.job_name == "cell_training_round" and r.tags.get("dagster/partition") == LAB, f"{LAB}'s training round")
    assert training.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, training)}\n{stack.logs()}"
    timings["faults_upload_to_proposal_s"] = round(time.time() - uploaded_at, 1)

    # One ingest and one round: the restarted daemon started neither again.
    time.sleep(35)  # past one more tick of each sensor
    assert len(_runs_of(instance, "assay_ingest", PARTITION)) == 1
    assert len(_runs_of(instance, "cell_training_round", LAB)) == 1
    booked = read_ledger(Ledger(stack.env["SINEWGRID_LEDGER_URL"]), tenant=LAB)
    booked = booked[booked["backend"] != "model-gateway"]
    assert len(booked) >= 2 and not booked.duplicated(["run_id", "step", "attempt"]).any(), booked[["run_id", "step", "attempt"]]
    assert set(booked["outcome"]) == {"succeeded"}, booked[["step", "outcome"]]


@pytest.mark.skipif(os.environ.get("SINEWGRID_REHEARSAL_PROCESSES") == "1",
                    reason="as processes, a run is a process of its code server: the DefaultRunLauncher cannot report on its worker")
def test_a_killed_run_worker_is_resumed_by_run_monitoring(stack: Stack, instance: dg.DagsterInstance, timings: dict[str, float]):
    """The container of lab-b's next ingest is killed while the run is in it. The daemon's run
    monitoring finds the worker gone (deploy/dagster.yaml: every 120 s) and starts a new one for
    the same run (`max_resume_run_attempts`), which skips the steps already done: the run ends
    succeeded, the drop is validated once, and the round it leads to runs. That round's worker is
    killed in turn while its pretraining runs on the Slurm pool, a job that outlives it: the
    resumed worker stops it before running the step again, and the ledger shows it once."""
    before = {r.run_id for r in instance.get_runs(limit=500)}
    slurm_jobs_before = set(_slurm_jobs(stack, "")) if stack.slurm else set()
    hit = f"{LAB}/rehearsal-plate-worker-killed"
    _send_plate(stack, hit, "PR005", block=4, seed=15)
    run = _ingest_under_way(instance, stack, hit, {dg.DagsterRunStatus.STARTED})
    killed_at = time.time()
    podman("kill", run.tags["docker/container_id"])

    ended = wait_for_run(instance, stack, lambda r: r.run_id == run.run_id, f"the resumed ingest of {hit}")
    assert ended.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, ended)}\n{stack.logs()}"
    timings["worker_killed_to_success_s"] = round(time.time() - killed_at, 1)
    messages = [e.message for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)]
    assert [m for m in messages if "resum" in m.lower()], messages  # monitoring's own account of what it did
    assert len(_runs_of(instance, "assay_ingest", hit)) == 1  # the same run, not a second one
    validated = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["cell", "validated_assay"]), asset_partitions=[hit]), limit=10
    ).records
    assert len(validated) == 1, [r.run_id for r in validated]

    is_round = lambda r: r.run_id not in before and r.job_name == "cell_training_round" and r.tags.get("dagster/partition") == LAB  # noqa: E731
    if stack.slurm:  # the round's worker killed too, while its pretraining's Slurm job is in flight
        job_id, round_run = _slurm_step_under_way(instance, stack, is_round, "cell.foundation_model", slurm_jobs_before)
        podman("kill", round_run.tags["docker/container_id"])
    training = wait_for_run(instance, stack, is_round, f"{LAB}'s round after the resumed ingest")
    assert training.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, training)}\n{stack.logs()}"
    booked = read_ledger(Ledger(stack.env["SINEWGRID_LEDGER_URL"]), tenant=LAB)
    booked = booked[booked["backend"] != "model-gateway"]
    assert not booked.duplicated(["run_id", "step", "attempt"]).any(), booked[["run_id", "step", "attempt"]]
    if stack.slurm:
        # The resumed worker stopped (or found ended) the job its dead worker left, booked it once as
        # orphaned, and ran the step as the next attempt: never two copies at once.
        pretraining = booked[(booked["run_id"] == training.run_id) & (booked["step"] == "cell.foundation_model")]
        assert list(zip(pretraining["attempt"], pretraining["outcome"])) == [(1, "orphaned"), (2, "succeeded")], pretraining
        jobs = _slurm_jobs(stack, "cell.foundation_model-a")
        left, rerun = jobs[job_id], [j for i, j in jobs.items() if int(i) > int(job_id)][0]
        assert rerun["StartTime"] >= left["EndTime"], (left, rerun)


def _slurm_jobs(stack: Stack, name_prefix: str) -> dict[str, dict[str, str]]:
    """The Slurm pool's jobs whose name starts with `name_prefix`, by id: `scontrol show job`'s fields."""
    shown = stack.slurm.cluster.client(["scontrol", "show", "job", "--oneliner"], check=False).stdout  # type: ignore[union-attr]
    jobs = [dict(w.split("=", 1) for w in line.split() if "=" in w) for line in shown.splitlines()]
    return {j["JobId"]: j for j in jobs if j.get("JobName", "").startswith(name_prefix)}


def _slurm_step_under_way(instance: dg.DagsterInstance, stack: Stack, is_run, step: str, seen: set[str]) -> tuple[str, dg.DagsterRun]:
    """The first Slurm job of `step` not `seen` before, once the run `is_run` picks has submitted it, and that run."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        runs = [r for r in instance.get_runs(limit=200) if is_run(r) and r.status == dg.DagsterRunStatus.STARTED]
        fresh = {i: j for i, j in _slurm_jobs(stack, f"{step}-a").items() if i not in seen and j["JobState"] in ("PENDING", "RUNNING")}
        if runs and fresh:
            return min(fresh, key=int), runs[0]
        time.sleep(0.3)
    pytest.fail(f"no Slurm job of {step} in flight under a started run\n{stack.logs()}")


def test_a_postgresql_restart_under_a_run_ends_it_clearly_and_the_loop_goes_on(stack: Stack, instance: dg.DagsterInstance, timings: dict[str, float]):
    """PostgreSQL (the instance and the ledger) restarts while lab-a's next drop is being ingested:
    every connection is cut for 5 s. The run ends, succeeded or clearly failed, never stuck; the
    services come back (their supervisor restarts any that exited, as Kubernetes would, and the
    test says which); the lab's following drop goes through to a new round."""
    lab = "lab-a"
    before = {r.run_id for r in instance.get_runs(limit=500)}
    hit = f"{lab}/rehearsal-plate-pg-restart"
    _send_plate(stack, hit, "PR003", block=2, seed=13)
    _ingest_under_way(instance, stack, hit, RUNNING)
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
    after = f"{lab}/rehearsal-plate-after-pg"
    _send_plate(stack, after, "PR004", block=3, seed=14)
    ingest = wait_for_run(instance, stack, lambda r: r.job_name == "assay_ingest" and r.tags.get("dagster/partition") == after, f"the ingest of {after}")
    assert ingest.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, ingest)}\n{stack.logs()}"
    training = wait_for_run(instance, stack, lambda r: r.run_id not in before and r.job_name == "cell_training_round" and r.tags.get("dagster/partition") == lab,
                            f"{lab}'s round after the restart")
    assert training.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, training)}\n{stack.logs()}"
    deadline = time.monotonic() + 600  # every run started since: finished, none stuck
    while stuck := [r.run_id for r in instance.get_runs(limit=500) if r.run_id not in before and r.status not in {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE}]:
        assert time.monotonic() < deadline, f"runs left unfinished: {stuck}\n{stack.logs()}"
        time.sleep(5)
    booked = read_ledger(Ledger(stack.env["SINEWGRID_LEDGER_URL"]), lane="cell")  # (a Robotics sweep's shards share run, step and attempt)
    booked = booked[booked["backend"] != "model-gateway"]
    assert not booked.duplicated(["run_id", "step", "attempt"]).any(), booked[["run_id", "step", "attempt"]]
