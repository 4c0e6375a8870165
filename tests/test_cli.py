"""`sinewgrid demo` runs the whole loop to its summary on a fresh storage root."""

from __future__ import annotations

import json

import dagster as dg

from robotics_lane.defs.policy_versions import policy_versions, verdict
from tests.fixtures.demo import DemoRun
from workload_runtime.envelope import open_bytes
from workload_runtime.keys import LocalKeyring


def test_demo_runs_both_loops_to_the_summary(demo_run: DemoRun):
    """The session's demo run (tests/fixtures/demo.py: `sinewgrid demo --rounds 2` on a fresh root)."""
    home = demo_run.home
    assert demo_run.returncode == 0, demo_run.stdout[-3000:] + demo_run.stderr[-3000:]
    out = demo_run.stdout
    assert "GPU steps: where they ran and what they cost" in out
    assert "cell.foundation_model" in out and "cell-steady" in out and "cell-burst" in out
    assert "The model of each lab, round by round" in out and "Per tenant: GPU hours and tokens" in out
    # Token work in both lanes, beside the GPU work: each lab's notes went where its agreement allows.
    assert "Model tasks: tokens bought through the model gateway" in out and "label-failure@v1" in out and "gene-rationale@v1" in out
    assert "seed-plate-bad-export" in out and "duplicate_well" in out
    assert "[lab-a] lab plates" in out and "[lab-b] lab plates" in out  # both labs' loops, side by side

    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        rounds = instance.fetch_materializations(dg.AssetKey(["cell", "finetuned_model"]), limit=10).records
        assert sorted(r.partition_key for r in rounds) == ["lab-a"] * 3 + ["lab-b"] * 3  # per lab: the seed round and two lab rounds
        for lab in ("lab-a", "lab-b"):
            assayed = sorted(int(r.asset_materialization.metadata["n_assayed_genes"].value) for r in rounds if r.partition_key == lab)
            assert assayed == [76, 114, 152], lab
        assert set(instance.get_dynamic_partitions("lab_assay_drops")) >= {f"{lab}/{d}" for lab in ("lab-a", "lab-b") for d in ("seed-plate-001", "seed-plate-002", "seed-plate-bad-export")}
        notes = instance.fetch_materializations(dg.AssetKey(["cell", "plate_rationale"]), limit=10).records
        models = {(r.partition_key, r.asset_materialization.metadata["model"].value) for r in notes}
        assert models == {("lab-a", "standin-anthropic/brisk-2"), ("lab-b", "standin-selfhosted/open-8b")}  # lab-b allows no outside model

    # Robotics: a real Isaac Lab sweep and a MuJoCo sweep ran on the spot pool, a policy was
    # trained and evaluated, the robot cell's results came back.
    isaac = list((home / "rollouts").glob("*/cartpole-isaaclab.*/dataset/meta/info.json"))  # <sweep>.<scene hash8>
    assert len(isaac) == 1 and json.loads(isaac[0].read_text())["total_episodes"] == 4
    assert "The policy, version by version" in out and "robot-sim-spot" in out
    assert "corrective demonstrations for failed real-robot trials" in out  # failures became new data
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        real = instance.fetch_materializations(dg.AssetKey(["robotics", "real_robot_evaluation"]), limit=10).records
        assert real and all(r.asset_materialization.metadata["status"].value == "valid" for r in real)
        versions = policy_versions(instance)
    # The policy version by version: what it learnt from, sim and real success with their intervals,
    # and one sentence on whether real success rose. Two versions were evaluated on the real robot;
    # the second learnt from one corrective demonstration per failed trial of the first, and did better.
    evaluated = [v for v in versions if v.real is not None]
    assert len(evaluated) == 2 and evaluated == versions[:2], versions
    flat = " ".join(out.split())  # rich wraps long lines
    for v in versions:
        assert v.label in out and str(v.sim) in flat, v
    for v in evaluated:
        assert str(v.real) in flat, v
    assert versions[0].corrective_episodes == 0 and versions[1].corrective_episodes == versions[0].failed_real_trials > 0
    assert verdict(versions) in flat and verdict(versions).startswith("Real success rose from"), versions
    # Real success rose. (The sweep's seeds follow the night, so the figures change by the day; that
    # the intervals separate is checked on a fixed night in tests/test_robot_loop.py.)
    assert evaluated[1].real.rate > evaluated[0].real.rate, versions
    assert (home / "quarantine" / "teleop" / "teleop-session-glitch" / "QUARANTINE.json").exists()

    for lab in ("lab-a", "lab-b"):
        # Sealed with the lab's key, as everything under its root outside landing/ and outbox/ is.
        sealed = (home / "tenants" / lab / "quarantine" / "assays" / "seed-plate-bad-export" / "QUARANTINE.json").read_bytes()
        quarantine = json.loads(open_bytes(sealed, LocalKeyring(lab, home.parent / "keys" / f"{lab}.key")))
        assert {i["rule"] for i in quarantine["issues"]} == {"duplicate_well", "non_numeric_readout"}
        assert len(list((home / "tenants" / lab / "outbox" / "plates").iterdir())) == 3

    # A second tick finds nothing new: every sensor is idempotent against the same instance.
    again = demo_run.sinewgrid("tick")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "no new complete drops" in again.stdout
    assert "no new valid" in again.stdout
    assert "nightly_sweep_schedule" in again.stdout and "already run" in again.stdout

    # Every result can be traced: the demo names the newest ones, and their lineage reaches the drops.
    assert "cell/next_plate_proposal/" in out and "sinewgrid lineage robotics/real_robot_evaluation/" in out
    proposal_line = next(line for line in out.splitlines() if "sinewgrid lineage --tenant" in line and "cell/next_plate_proposal/" in line)
    traced = demo_run.sinewgrid(*proposal_line.split("sinewgrid ", 1)[1].split())  # the lab's lineage, under its root, opened with its key
    assert traced.returncode == 0, traced.stderr[-2000:]
    assert "drop/assays/seed-plate-001" in traced.stdout and "cell/omics@" in traced.stdout and "cell/foundation_model/" in traced.stdout
    # The real-robot evaluation reaches the scene versions its policy's sweeps ran in.
    real_line = next(line for line in out.splitlines() if "sinewgrid lineage robotics/real_robot_evaluation/" in line)
    real_traced = demo_run.sinewgrid(*real_line.split("sinewgrid ", 1)[1].split())
    assert real_traced.returncode == 0 and "robotics/scenes@cartpole-mujoco-" in real_traced.stdout, real_traced.stdout[-3000:]
    assert "robotics/scenes@cartpole-isaaclab-" in real_traced.stdout
    listed = demo_run.sinewgrid("data", "list")
    assert listed.returncode == 0 and all(d in listed.stdout for d in ("robotics/teleop", "robotics/rollouts", "robotics/scenes"))
    lab_listed = demo_run.sinewgrid("data", "list", "--tenant", "lab-a")  # a lab's data: in its own registry
    assert lab_listed.returncode == 0 and all(d in lab_listed.stdout for d in ("cell/assays", "cell/omics"))
