"""The job planner and its cost model: each rule on small cases with answers worked by hand."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest
from typer.testing import CliRunner

from control_plane.placement.cost_model import young_daly_interval_hours
from control_plane.placement.ranking import checkpoint_interval_seconds, plan_placement, spot_rework_fraction
from control_plane.placement.planner import InfeasiblePlanError, plan_job
from control_plane.catalog.egress import EgressRates, EgressTable
from control_plane.catalog.pools import Catalog, Pool, TenantLimits
from control_plane.catalog.step_spec import DatasetRef, StepSpec

T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)


def _pool(name: str, **kw) -> Pool:
    fields = dict(provider="aws", region="us-east-1", backend="local", purchasing="on_demand", accelerator="h100-80gb",
                  gpus_per_node=8, nodes=1, price_per_gpu_hour=2.0)
    return Pool(name=name, **{**fields, **kw})


def _step(name: str = "s", **kw) -> StepSpec:
    return StepSpec(name=name, entry_point="x", tenant=kw.pop("tenant", "cell"), start=kw.pop("start", T0), **kw)


def _catalog(*pools: Pool, **kw) -> Catalog:
    return Catalog({p.name: p for p in pools}, **kw)


# --- Young/Daly -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delta_minutes", "mtbi_hours", "expected_hours"),
    [
        (5, 24, 2.0),  # √(2 · 5 min · 1440 min) = √14400 min = 120 min
        (10, 5, math.sqrt(2 * 10 * 300) / 60),  # 77.46 min
        (1, 1, math.sqrt(2 * 1 * 60) / 60),  # 10.95 min
        (30, 0.2, 0.2),  # δ ≥ 2M: Daly's bound, the interval is M
    ],
)
def test_young_daly_interval_matches_the_first_order_formula(delta_minutes, mtbi_hours, expected_hours):
    assert young_daly_interval_hours(delta_minutes / 60, mtbi_hours) == pytest.approx(expected_hours)
    rate = 1 / mtbi_hours
    assert checkpoint_interval_seconds(rate, delta_minutes * 60) == pytest.approx(expected_hours * 3600)


def test_interval_shrinks_with_the_node_count_and_rework_is_root_two_delta_over_m():
    # 4 nodes each interrupted every 24 h: M = 6 h; τ = √(2 · 5 min · 360 min) = 60 min.
    assert checkpoint_interval_seconds(1 / 24, 300, nodes=4) == pytest.approx(3600)
    # waste √(2δ/M) = √(2 · 5 / 360) = 0.1667
    assert spot_rework_fraction(1 / 24, 300, nodes=4) == pytest.approx(math.sqrt(10 / 360))
    assert checkpoint_interval_seconds(0.0, 300) is None


# --- the cost model, one rule at a time -----------------------------------------------------


def test_spot_costs_its_price_plus_expected_rework_and_states_the_cadence():
    spot = _pool("spot", purchasing="spot", price_per_gpu_hour=1.0, interruption_rate_per_hour=1 / 24)
    plan = plan_placement(_step(gpus=8, expected_hours=10, checkpoint_seconds=300), _catalog(spot))
    v = plan.verdict("spot")
    rework = math.sqrt(2 * 300 / 3600 / 24)  # √(2δ/M) = 0.0833
    assert v.expected_cost_usd == pytest.approx(8 * 10 * 1.0 * (1 + rework))
    assert v.checkpoint_interval_seconds == pytest.approx(7200)
    assert any("checkpoint every 2.0 h (Young/Daly: δ=300 s, M=24.0 h on 1 node(s))" in r for r in v.reasons)


def test_spot_refused_for_a_step_that_does_not_checkpoint():
    plan = plan_placement(_step(checkpoints=False), _catalog(_pool("spot", purchasing="spot", interruption_rate_per_hour=0.1)))
    assert plan.ranked == []
    assert plan.verdict("spot").reasons == ["spot refused: step does not checkpoint (checkpoints: false)"]


def test_commitment_already_paid_costs_only_its_marginal_price_then_list_price():
    reserved = _pool("res", purchasing="reserved", price_per_gpu_hour=3.0, committed_gpu_hours=50, marginal_price_per_gpu_hour=0.5)
    ondemand = _pool("od", price_per_gpu_hour=2.0)
    plan = plan_placement(_step(gpus=8, expected_hours=10), _catalog(reserved, ondemand))
    # 80 GPU-h: 50 covered at $0.50 = $25, 30 more at $3.00 = $90 → $115 < on-demand 80 × $2 = $160
    assert plan.verdict("res").expected_cost_usd == pytest.approx(115.0)
    assert [p.name for p in plan.ranked] == ["res", "od"]


def test_block_only_inside_its_window():
    block = _pool("blk", purchasing="block", price_per_gpu_hour=1.0,
                  window_start=dt.datetime(2026, 12, 1, tzinfo=dt.UTC), window_end=dt.datetime(2026, 12, 7, 6, tzinfo=dt.UTC))
    catalog = _catalog(block, _pool("od"))
    assert plan_placement(_step(expected_hours=5), catalog).first.name == "blk"  # 00:00–05:00 fits
    late = plan_placement(_step(expected_hours=8), catalog)  # 00:00–08:00 runs past 06:00
    assert late.first.name == "od"
    assert "block refused: its window 2026-12-01 00:00–2026-12-07 06:00 UTC does not hold the step" in late.verdict("blk").reasons[0]


def test_data_gravity_egress_cost_and_words():
    data = [DatasetRef(name="omics", size_gb=2100, provider="aws", region="us-east-1")]
    near = _pool("near", price_per_gpu_hour=2.00)
    far = _pool("far", region="eu-west-1", price_per_gpu_hour=1.95)
    egress = EgressTable(default=EgressRates(cross_region=0.09, gbps=10))
    plan = plan_placement(_step(gpus=8, expected_hours=10, datasets=data), _catalog(near, far, egress=egress))
    # far: the 8 GPUs are held (and billed) while 2.1 TB moves at 10 Gb/s: 2100·8/10/3600 = 0.4667 h, so
    # (80 + 8 × 0.4667) × 1.95 = 163.28, + 2100 × 0.09 = 189 → 352.28; near: 160. Compute goes to the data.
    assert [p.name for p in plan.ranked] == ["near", "far"]
    assert plan.verdict("far").expected_cost_usd == pytest.approx(352.28)
    assert plan.verdict("far").transfer_hours == pytest.approx(2100 * 8 / 10 / 3600)
    assert "egress 2.1 TB aws us-east-1 → aws eu-west-1 adds $189.00 and 28 min" in plan.verdict("far").reasons
    assert "data already in aws us-east-1 (2.1 TB)" in plan.verdict("near").reasons


def test_tightly_coupled_step_only_where_it_fits_one_domain():
    plan = plan_placement(
        _step(gpus=16, nodes=2, tightly_coupled=True),
        _catalog(_pool("ib", nodes=2, interconnect_domain_gpus=16), _pool("eth", nodes=4, price_per_gpu_hour=1.0)),
    )
    assert [p.name for p in plan.ranked] == ["ib"]
    assert "declares no fast domain" in plan.verdict("eth").reasons[0]


def test_deadline_counts_transfer_and_rework():
    data = [DatasetRef(name="d", size_gb=9000, provider="gcp", region="us-central1")]  # 2 h at 10 Gb/s
    plan = plan_placement(_step(expected_hours=5, deadline_hours=6, datasets=data), _catalog(_pool("od")))
    assert plan.ranked == []
    assert "after the deadline 2026-12-07 06:00 UTC" in plan.verdict("od").reasons[0]


def test_tenant_limits_allow_providers_and_regions():
    catalog = _catalog(_pool("aws"), _pool("gcp", provider="gcp", region="us-central1"),
                       tenants={"cell": TenantLimits(providers=["gcp"])})
    plan = plan_placement(_step(), catalog)
    assert [p.name for p in plan.ranked] == ["gcp"]
    assert plan.verdict("aws").reasons == ["tenant `cell` may not use aws us-east-1 (allowed providers: gcp; regions: any)"]


# --- the whole job --------------------------------------------------------------------------


def test_quota_shared_over_time_sends_the_overlapping_step_to_the_next_pool():
    cheap, dear = _pool("cheap", price_per_gpu_hour=1.0), _pool("dear", price_per_gpu_hour=2.0)
    steps = [_step("a", gpus=8, expected_hours=4), _step("b", gpus=8, expected_hours=4, start=T0 + dt.timedelta(hours=2)),
             _step("c", gpus=8, expected_hours=4, start=T0 + dt.timedelta(hours=4))]
    plan = plan_job("j", steps, _catalog(cheap, dear))
    assert [r["pool"] for r in plan.rows()] == ["cheap", "dear", "cheap"]
    assert plan.totals()["cost_usd"] == pytest.approx(32 + 64 + 32)
    quota = plan.placement(1).verdict("cheap")
    assert not quota.feasible and quota.reasons[0].startswith("quota: 8 of 8 GPUs already planned on it")


def test_scarce_commitment_goes_to_the_step_that_saves_most():
    reserved = _pool("res", purchasing="reserved", price_per_gpu_hour=4.0, committed_gpu_hours=80, nodes=2)
    spot = _pool("spot", purchasing="spot", price_per_gpu_hour=1.0, interruption_rate_per_hour=0.05, nodes=2)
    ondemand = _pool("od", price_per_gpu_hour=3.0, nodes=2)
    # `sweep` could use spot; `train` cannot checkpoint, so it should get the commitment.
    steps = [_step("sweep", gpus=8, expected_hours=10), _step("train", gpus=8, expected_hours=10, checkpoints=False)]
    rows = {r["step"]: r for r in plan_job("j", steps, _catalog(reserved, spot, ondemand)).rows()}
    assert rows["train"]["pool"] == "res" and rows["train"]["cost_usd"] == 0.0
    assert rows["sweep"]["pool"] == "spot"


def test_infeasible_job_names_the_constraint_no_pool_meets():
    with pytest.raises(InfeasiblePlanError, match=r"step `big`.*\n  No pool meets: nodes, gpus"):
        plan_job("j", [_step("big", gpus=64, nodes=8)], _catalog(_pool("a"), _pool("b")))
    with pytest.raises(InfeasiblePlanError, match=r"over the budget \$100.00 by \$60.00"):
        plan_job("j", [_step(gpus=8, expected_hours=10)], _catalog(_pool("a")), budget_usd=100)


def test_plan_command_prints_table_totals_evidence_and_json():
    from sinewgrid.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["plan", "deploy/jobs/robotics.yaml", "--pools", "deploy/pools"])
    assert result.exit_code == 0, result.output
    assert "Capacity plan: robotics-december-week" in result.output and "ILLUSTRATIVE" in result.output
    assert "spot refused: step does not checkpoint" in result.output
    result = runner.invoke(app, ["plan", "deploy/jobs/cell.yaml", "--pools", "deploy/pools", "--json"])
    doc = json.loads(result.output)
    pretrain = doc["steps"][0]
    assert pretrain["step"] == "foundation-pretrain" and pretrain["pool"] == pretrain["evidence"][0]["pool"]
    assert doc["totals"]["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in doc["steps"]))
    assert all(not v["feasible"] for s in doc["steps"] for v in s["evidence"] if v["pool"].startswith("gpucloud"))


def test_when_cost_regret_leaves_a_step_without_room_the_planner_packs_biggest_first():
    # s1 (4 GPUs) runs only on A or the dear C, so its regret is the largest and it goes first,
    # taking half of A; then s2 takes B and s3 (8 GPUs) fits nowhere. Biggest first places all:
    # s2 on A, s3 on B, s1 on C — worked by hand: 8·1 + 8·2 + 4·100 = $424 for one hour.
    a = _pool("A", price_per_gpu_hour=1.0)
    b = _pool("B", price_per_gpu_hour=2.0, accelerator="h200-141gb")
    c = _pool("C", price_per_gpu_hour=100.0, gpus_per_node=4)
    steps = [
        _step("s1", gpus=4, expected_hours=1, accelerators=["h100-80gb"]),
        _step("s2", gpus=8, expected_hours=1),
        _step("s3", gpus=8, expected_hours=1),
    ]
    plan = plan_job("tight", steps, _catalog(a, b, c))
    where = {row["step"]: row["pool"] for row in plan.rows()}
    assert where["s1"] == "C" and {where["s2"], where["s3"]} == {"A", "B"}
    assert plan.totals()["cost_usd"] == pytest.approx(424.0)


def test_equal_cost_ties_go_to_the_pool_name_not_the_catalog_order():
    """docs/placement.md: on equal cost, the pool that moves less data, then by name."""
    zeta, alpha = _pool("zeta"), _pool("alpha")
    plan = plan_job("j", [_step("s", gpus=8, expected_hours=1)], _catalog(zeta, alpha))
    assert [r["pool"] for r in plan.rows()] == ["alpha"]
    assert plan_placement(_step("s", gpus=8, expected_hours=1), _catalog(zeta, alpha)).first.name == "alpha"


def test_a_step_without_gpus_is_billed_as_one_gpu_as_the_docs_say():
    """docs/placement.md: a `gpus: 0` step (CPU work) takes a slot of a node, billed as one GPU."""
    plan = plan_job("j", [_step("cpu", gpus=0, expected_hours=2)], _catalog(_pool("p", price_per_gpu_hour=3.0)))
    assert plan.totals()["cost_usd"] == pytest.approx(3.0 * 1 * 2)


POOL_YAML = """
pools:
  {name}:
    provider: aws
    region: us-east-1
    backend: local
    purchasing: on_demand
    accelerator: h100-80gb
    gpus_per_node: 8
    price_per_gpu_hour: 2.0
"""
EGRESS_YAML = "egress:\n  default: {cross_provider: 0.5}\n"


@pytest.mark.parametrize("egress_file", ["a-egress.yaml", "z-egress.yaml"])
def test_a_folder_s_egress_default_comes_from_the_file_that_sets_it_whatever_its_name(tmp_path, egress_file):
    from control_plane.catalog.pools import load_catalog

    (tmp_path / "m-pools.yaml").write_text(POOL_YAML.format(name="p"))
    (tmp_path / egress_file).write_text(POOL_YAML.format(name="e") + EGRESS_YAML)
    assert load_catalog(tmp_path).egress.default.cross_provider == 0.5


def test_two_files_with_different_egress_defaults_are_refused_by_name(tmp_path):
    from control_plane.catalog.pools import PoolCatalogError, load_catalog

    (tmp_path / "a.yaml").write_text(POOL_YAML.format(name="p") + EGRESS_YAML)
    (tmp_path / "b.yaml").write_text(POOL_YAML.format(name="q") + "egress:\n  default: {cross_provider: 0.09}\n")
    with pytest.raises(PoolCatalogError, match=r"b\.yaml: `egress.default` differs from the one set in .*a\.yaml"):
        load_catalog(tmp_path)
