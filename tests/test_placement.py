"""Pool catalog validation and placement v1: feasible pools ranked by cost, with the evidence."""

from __future__ import annotations

import pytest

from control_plane.placement.ranking import NoFeasiblePoolError, plan_placement, spot_rework_fraction
from control_plane.catalog.pools import Capacity, PoolCatalogError, load_pools
from control_plane.catalog.step_spec import StepSpec


def _spec(**kw) -> StepSpec:
    return StepSpec(name="t.step", entry_point="x", tenant=kw.pop("tenant", "cell"), **kw)


def test_default_catalog_loads_and_maps_to_this_machine():
    pools = load_pools()
    assert {"local", "cell-steady", "cell-burst", "cell-burst-ondemand"} <= set(pools)
    assert all(p.backend == "local" for p in pools.values())


def test_steady_step_goes_to_the_steady_pool_and_refusals_are_explained():
    plan = plan_placement(_spec(capacity=Capacity.steady), load_pools())
    assert plan.first.name == "cell-steady"
    refused = {v.pool: v.reasons for v in plan.verdicts if not v.feasible}
    assert "offers burst capacity, step needs steady" in refused["cell-burst"]
    assert "| 1 | `cell-steady` |" in plan.evidence_markdown()


def test_burst_step_ranks_spot_before_on_demand():
    plan = plan_placement(_spec(capacity=Capacity.burst), load_pools())
    assert [p.name for p in plan.ranked] == ["cell-burst", "cell-burst-ondemand"]
    spot = next(v for v in plan.verdicts if v.pool == "cell-burst")
    assert spot.rework_fraction > 0


def test_spot_refused_for_steps_that_cannot_checkpoint():
    plan = plan_placement(_spec(capacity=Capacity.burst, checkpoints=False), load_pools())
    assert [p.name for p in plan.ranked] == ["cell-burst-ondemand"]


def test_tenant_and_size_limits():
    plan = plan_placement(_spec(tenant="genomics"), load_pools())
    assert [p.name for p in plan.ranked] == ["local"]
    with pytest.raises(NoFeasiblePoolError, match="needs 8 GPUs"):
        plan_placement(_spec(gpus=8), load_pools()).first


def test_budget_refuses_expensive_pools():
    plan = plan_placement(_spec(capacity=Capacity.burst, expected_hours=10, budget_usd=20), load_pools())
    assert [p.name for p in plan.ranked] == ["cell-burst"]
    assert any("exceeds budget" in r for v in plan.verdicts for r in v.reasons)


def test_young_daly_rework_grows_with_interruptions():
    assert spot_rework_fraction(0.0, 10) == 0.0
    assert spot_rework_fraction(0.2, 10) > spot_rework_fraction(0.05, 10) > 0


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("pools:\n  p1:\n    provider: aws\n", "pool `p1`, field `region`: Field required"),
        (
            "pools:\n  p1: {provider: aws, region: us-east-1, backend: nomad, purchasing: spot, accelerator: h100, gpus_per_node: 8, price_per_gpu_hour: 2}\n",
            "pool `p1`, field `backend`",
        ),
        (
            "pools:\n  p1: {provider: aws, region: r, backend: local, purchasing: spot, accelerator: h100, gpus_per_node: -1, price_per_gpu_hour: 2}\n",
            "field `gpus_per_node`",
        ),
        (
            "pools:\n  p1: {provider: aws, region: r, backend: local, purchasing: spot, accelerator: h100, gpus_per_node: 1, price_per_gpu_hour: 2, colour: red}\n",
            "field `colour`",
        ),
        ("pools: [1, 2]\n", "expected a top-level `pools:` mapping"),
        ("pools: {a: [}\n", "not valid YAML"),
    ],
)
def test_catalog_errors_name_file_pool_and_field(tmp_path, yaml_text, expected):
    path = tmp_path / "pools.yaml"
    path.write_text(yaml_text)
    with pytest.raises(PoolCatalogError) as error:
        load_pools(path)
    assert str(path) in str(error.value)
    assert expected in str(error.value)


def test_robotics_steps_find_their_pools():
    pools = load_pools()
    sweep = plan_placement(_spec(tenant="robotics", capacity=Capacity.burst, runtime="isaaclab"), pools)
    assert [p.name for p in sweep.ranked] == ["robot-sim-spot"]
    training = plan_placement(_spec(tenant="robotics", tightly_coupled=True), pools)
    assert [p.name for p in training.ranked] == ["robot-train"]
    assert any("declares no fast domain" in r for v in training.verdicts for r in v.reasons)
    evaluation = plan_placement(_spec(tenant="robotics", capacity=Capacity.evaluation, runtime="isaaclab"), pools)
    assert [p.name for p in evaluation.ranked] == ["robot-eval"]
    no_runtime = plan_placement(_spec(tenant="cell", capacity=Capacity.burst, runtime="isaaclab"), pools)
    assert no_runtime.ranked == []
    assert any("has no `isaaclab` runtime" in r for v in no_runtime.verdicts for r in v.reasons)


def test_unknown_accelerator_and_negative_price_name_pool_and_field(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(
        "pools:\n  p1: {provider: aws, region: r, backend: local, purchasing: spot, accelerator: h100, gpus_per_node: 1, price_per_gpu_hour: -2}\n"
    )
    with pytest.raises(PoolCatalogError) as error:
        load_pools(path)
    assert "pool `p1`, field `accelerator`: unknown accelerator `h100`" in str(error.value)
    assert "pool `p1`, field `price_per_gpu_hour`: Input should be greater than or equal to 0 (got -2)" in str(error.value)


def test_catalog_sections_record_price_provenance_and_errors_name_the_section(tmp_path):
    from control_plane.catalog.pools import load_catalog

    catalog = load_catalog()
    assert catalog.prices.illustrative
    assert "ILLUSTRATIVE" in catalog.price_provenance(catalog.pools["cell-steady"])
    path = tmp_path / "pools.yaml"
    path.write_text(
        "egress: {default: {cross_region: -1}}\nzones: 1\n"
        "pools:\n  p1: {provider: aws, region: r, backend: local, purchasing: spot, accelerator: l4, gpus_per_node: 1, price_per_gpu_hour: 2}\n"
    )
    with pytest.raises(PoolCatalogError) as error:
        load_catalog(path)
    assert "`egress:` section, field `default.cross_region`" in str(error.value)
    assert "unknown top-level section `zones`" in str(error.value)


def test_verdicts_expose_the_checkpoint_interval_for_the_workload():
    plan = plan_placement(_spec(capacity=Capacity.burst, checkpoint_seconds=9), load_pools())
    spot = plan.verdict("cell-burst")  # λ = 0.05/h: M = 20 h; τ = √(2 · 9 s · 72,000 s) = 1,138 s
    assert spot.checkpoint_interval_seconds == pytest.approx((2 * 9 * 72000) ** 0.5)
    assert plan.verdict("cell-burst-ondemand").checkpoint_interval_seconds is None
