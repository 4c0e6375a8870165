"""Exact plans: the planner's plan is the cheapest one (checked by brute force, not by the planner's own
integer program), a job that can be placed is placed, and the plan says how it was found."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from control_plane.catalog.pools import Catalog, Pool, PoolCatalogError, load_catalog
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement import exact
from control_plane.placement.cost_model import PlanContext, assess
from control_plane.placement.greedy import assign, plan_cost
from control_plane.placement.improve import improve
from control_plane.placement.planner import InfeasiblePlanError, plan_job
from control_plane.placement.ranking import plan_placement

T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)


def _pool(name: str, **kw) -> Pool:
    fields = {
        "provider": "aws",
        "region": "us-east-1",
        "backend": "local",
        "purchasing": "on_demand",
        "accelerator": "h100-80gb",
        "gpus_per_node": 8,
        "nodes": 1,
        "price_per_gpu_hour": 2.0,
    }
    return Pool(name=name, **{**fields, **kw})


def _step(name: str, **kw) -> StepSpec:
    return StepSpec(
        name=name, entry_point="x", tenant="cell", start=kw.pop("start", T0), **kw
    )


def _brute_force(steps: list[StepSpec], pools: list[Pool]) -> float:
    """The cheapest plan by trying every assignment: quota checked hour by hour, each commitment worth
    (price − marginal) per covered GPU-hour up to its size. Independent of the planner's code paths
    except the per-pair cost terms of the cost model."""
    a = assess(steps, pools, PlanContext(epoch=T0))
    best = np.inf
    for choice in itertools.product(range(len(pools)), repeat=len(steps)):
        if not all(a.feasible[i, j] for i, j in enumerate(choice)):
            continue
        ok = True
        for j, pool in enumerate(pools):
            on = [i for i, c in enumerate(choice) if c == j]
            for t in np.arange(0, 48, 0.25):
                held = sum(
                    a.held_gpus[i, j]
                    for i in on
                    if a.start_hours[i] <= t < a.end_hours[i, j]
                )
                ok &= held <= pool.total_gpus
        if not ok:
            continue
        cost = 0.0
        for j, pool in enumerate(pools):
            on = [i for i, c in enumerate(choice) if c == j]
            hours = sum(a.gpu_hours[i, j] for i in on)
            cost += sum(
                pool.price_per_gpu_hour * a.gpu_hours[i, j] + a.egress_usd[i, j]
                for i in on
            )
            cost -= (pool.price_per_gpu_hour - pool.marginal_price_per_gpu_hour) * min(
                hours, pool.committed_gpu_hours or 0.0
            )
        best = min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_costs_what_brute_force_finds_cheapest(seed):
    rng = np.random.default_rng(seed)
    pools = [
        _pool(
            "res",
            purchasing="reserved",
            price_per_gpu_hour=3.0,
            committed_gpu_hours=float(rng.integers(20, 60)),
            marginal_price_per_gpu_hour=0.3,
        ),
        _pool(
            "spot",
            purchasing="spot",
            price_per_gpu_hour=1.2,
            interruption_rate_per_hour=0.1,
        ),
        _pool("od", price_per_gpu_hour=2.5, nodes=2),
    ]
    steps = [
        _step(
            f"s{k}",
            gpus=int(rng.choice([2, 4, 8])),
            expected_hours=float(rng.integers(1, 8)),
            checkpoints=bool(rng.random() < 0.6),
            start=T0 + dt.timedelta(hours=float(rng.integers(0, 6))),
        )
        for k in range(5)
    ]
    optimum = _brute_force(steps, pools)
    plan = plan_job("j", steps, Catalog({p.name: p for p in pools}))
    assert plan.method.name == "exact"
    assert plan.totals()["cost_usd"] == pytest.approx(optimum, rel=1e-6)


def _tight():
    """s1 (4 GPUs) fits only A or the dear C; s2 and s3 (8 GPUs) fit A or B. Placed s1, s2, s3 in that
    order, s3 finds no room: s1 must move out of A first."""
    a = _pool("A", price_per_gpu_hour=1.0)
    b = _pool("B", price_per_gpu_hour=2.0, accelerator="h200-141gb")
    c = _pool("C", price_per_gpu_hour=100.0, gpus_per_node=4)
    steps = [
        _step("s1", gpus=4, expected_hours=1, accelerators=["h100-80gb"]),
        _step("s2", gpus=8, expected_hours=1),
        _step("s3", gpus=8, expected_hours=1),
    ]
    return steps, Catalog({p.name: p for p in (a, b, c)})


def test_local_search_moves_an_earlier_step_to_make_room():
    steps, catalog = _tight()
    a = assess(steps, list(catalog.pools.values()), PlanContext(epoch=T0))
    stuck = assign(a, a.feasible, [0, 1, 2])
    assert stuck.unplaced == [2]
    fixed = improve(a, stuck, seconds=5)
    assert fixed.unplaced == []
    assert plan_cost(a, fixed) == pytest.approx(8 * 1 + 8 * 2 + 4 * 100)


def test_beyond_the_integer_program_the_plan_says_greedy_and_bounds_its_gap(
    monkeypatch,
):
    monkeypatch.setattr(exact, "MAX_PAIRS", 0)
    steps, catalog = _tight()
    plan = plan_job("j", steps, catalog)
    assert (
        plan.method.name == "greedy+local-search"
        and plan.method.exact_status == "too_big"
    )
    assert plan.totals()["cost_usd"] == pytest.approx(424.0)
    assert plan.method.gap_bound is not None and plan.method.gap_bound >= 0
    assert plan.method.lower_bound_usd <= plan.totals()["cost_usd"]


def test_a_job_no_plan_can_place_is_refused_with_the_proof_and_the_step():
    steps = [
        _step("a", gpus=8, expected_hours=2),
        _step("b", gpus=8, expected_hours=2, start=T0 + dt.timedelta(hours=1)),
    ]
    with pytest.raises(
        InfeasiblePlanError, match="HiGHS proved that no plan places every step"
    ) as error:
        plan_job("j", steps, Catalog({"only": _pool("only")}))
    assert error.value.unplaced[0]["step"] in {"a", "b"}
    assert any(
        "quota: 8 of 8 GPUs already planned" in line
        for line in error.value.unplaced[0]["why"]
    )


def test_plan_json_streams_rows_honours_no_evidence_and_carries_times(tmp_path):
    from sinewgrid.cli import app

    result = CliRunner().invoke(
        app,
        [
            "plan",
            "deploy/jobs/robotics.yaml",
            "--pools",
            "deploy/pools",
            "--json",
            "--no-evidence",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (
        doc["totals"]["method"] in {"exact", "greedy+local-search"}
        and "gap_bound" in doc["totals"]
    )
    row = doc["steps"][0]
    assert "evidence" not in row
    assert dt.datetime.fromisoformat(row["end_at"]) > dt.datetime.fromisoformat(
        row["start_at"]
    )
    assert {"transfer_hours", "deadline_at"} <= set(row)


def test_plan_json_of_a_refused_job_names_the_unplaced_steps(tmp_path):
    from sinewgrid.cli import app

    job = tmp_path / "job.yaml"
    job.write_text(
        "job: j\ntenant: cell\nstart: 2026-12-07T00:00:00Z\nsteps:\n"
        "  a: {gpus: 1, expected_hours: 2}\n  b: {gpus: 1, expected_hours: 2, start_hours: 1}\n"
    )
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n  one: {provider: aws, region: r, backend: local, purchasing: on_demand, accelerator: l4, "
        "gpus_per_node: 1, price_per_gpu_hour: 2}\n"
    )
    result = CliRunner().invoke(
        app, ["plan", str(job), "--pools", str(pools), "--json"]
    )  # one GPU, two overlapping steps
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert (
        doc["refused"]
        and [u["step"] for u in doc["unplaced"]]
        and doc["unplaced"][0]["why"]
    )


# --- capacity words ----------------------------------------------------------------------------


def test_a_pool_offering_every_kind_runs_a_steady_step_and_unspecified_does_not():
    catalog = Catalog(
        {
            "every": _pool("every", capacity="every", price_per_gpu_hour=3.0),
            "plain": _pool("plain"),
        }
    )
    plan = plan_placement(_step("s", capacity="steady"), catalog)
    assert [p.name for p in plan.ranked] == ["every"]
    assert plan.verdict("plain").reasons == [
        "offers no particular kind of capacity (`capacity: unspecified`), step needs steady"
    ]
    assert [p.name for p in plan_placement(_step("s"), catalog).ranked] == [
        "plain",
        "every",
    ]


def test_the_ambiguous_old_pool_capacity_any_is_refused_naming_file_and_pool(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(
        "pools:\n  p1: {provider: aws, region: r, backend: local, purchasing: spot, accelerator: l4, "
        "gpus_per_node: 1, price_per_gpu_hour: 2, capacity: any}\n"
    )
    with pytest.raises(
        PoolCatalogError,
        match=r"pools\.yaml: pool `p1`, field `capacity`: .*`capacity: every`.*`capacity: unspecified`",
    ):
        load_catalog(path)


# --- fields apply to any pool that has them -----------------------------------------------------


def test_a_commitment_counts_on_any_pool_that_has_one():
    savings_plan = _pool(
        "od-committed",
        price_per_gpu_hour=3.0,
        committed_gpu_hours=50,
        marginal_price_per_gpu_hour=0.5,
    )
    plan = plan_placement(
        _step("s", gpus=8, expected_hours=10), Catalog({"od-committed": savings_plan})
    )
    assert plan.verdict("od-committed").expected_cost_usd == pytest.approx(
        50 * 0.5 + 30 * 3.0
    )


def test_a_window_binds_any_pool_that_has_one():
    windowed = _pool(
        "od-window", window_start=T0, window_end=T0 + dt.timedelta(hours=4)
    )
    plan = plan_placement(
        _step("s", expected_hours=6), Catalog({"od-window": windowed})
    )
    assert plan.ranked == [] and plan.verdict("od-window").refused_by == ["window"]


def test_a_step_that_cannot_checkpoint_is_refused_on_any_pool_that_interrupts():
    flaky = _pool("preemptible-partition", interruption_rate_per_hour=0.05)
    plan = plan_placement(_step("s", checkpoints=False), Catalog({"flaky": flaky}))
    assert plan.ranked == []
    assert plan.verdict("preemptible-partition").reasons == [
        "on_demand refused: the pool is interrupted (0.05 per node-hour) and the step does not checkpoint (checkpoints: false)"
    ]
    checkpointing = plan_placement(
        _step("s", checkpoints=True, gpus=8, expected_hours=10),
        Catalog({"flaky": flaky}),
    )
    assert checkpointing.verdict("preemptible-partition").rework_fraction > 0


def test_what_the_solver_prints_goes_to_stderr_so_plan_json_stays_json(capfd):
    # HiGHS writes some progress lines from C++ straight to file descriptor 1, whatever its
    # display option; while it solves, that descriptor points at stderr.
    with exact.solver_output_to_stderr():
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
    print("after")
    out, err = capfd.readouterr()
    assert out == "after\n" and "HighsMipSolverData" in err
