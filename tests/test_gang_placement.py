"""Placement knows gangs: interconnect domains, standby spares, whole nodes held and paid for.

Every number below is worked by hand from docs/placement.md ("Gangs: domains and spares").
"""

from __future__ import annotations

import datetime as dt

import pytest
from typer.testing import CliRunner

from control_plane.catalog.pools import Catalog, Pool, PoolCatalogError, load_pools
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.planner import plan_job
from control_plane.placement.ranking import plan_placement

T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)


def _pool(name: str, **kw) -> Pool:
    fields = {"provider": "aws", "region": "us-east-1", "backend": "local", "purchasing": "on_demand", "accelerator": "h100-80gb",
              "gpus_per_node": 8, "nodes": 16, "price_per_gpu_hour": 2.0}
    return Pool(name=name, **{**fields, **kw})


def _catalog(*pools: Pool) -> Catalog:
    return Catalog({p.name: p for p in pools})


def _pretrain(**kw) -> StepSpec:
    """The Cell pretraining's shape (deploy/jobs/cell.yaml): 8 nodes × 8 GPUs, one rank per GPU."""
    fields = {"name": "pretrain", "entry_point": "x", "tenant": "cell", "start": T0, "gpus": 64, "nodes": 8, "ranks_per_node": 8,
              "tightly_coupled": True, "expected_hours": 10}
    return StepSpec(**{**fields, **kw})


# --- interconnect domains ------------------------------------------------------------------


def test_a_tightly_coupled_gang_is_refused_where_its_nodes_span_two_domains():
    plan = plan_placement(_pretrain(), _catalog(_pool("islands", nodes_per_domain=4)))
    assert plan.ranked == []
    verdict = plan.verdict("islands")
    assert verdict.refused_by == ["interconnect"]
    assert verdict.reasons == ["tightly coupled: needs 8 nodes × 8 = 64 GPUs in one interconnect domain; the pool's interconnect domains hold 4 nodes × 8 = 32. With `span_domains: true` it would be split over 2 interconnect domains, the slower links costed"]


def test_a_tightly_coupled_gang_lands_where_one_domain_holds_all_its_nodes():
    catalog = _catalog(
        _pool("islands-of-8", nodes_per_domain=8),
        _pool("fabric-in-gpus", interconnect_domain_gpus=64, price_per_gpu_hour=2.5),  # the same, said in GPUs: 8 nodes
        _pool("fabric-too-small", interconnect_domain_gpus=32, price_per_gpu_hour=1.0),  # 4 nodes, whatever its price
    )
    plan = plan_placement(_pretrain(), catalog)
    assert [p.name for p in plan.ranked] == ["islands-of-8", "fabric-in-gpus"]
    assert plan.verdict("fabric-too-small").reasons == [
        "tightly coupled: needs 8 nodes × 8 = 64 GPUs in one interconnect domain; the pool's interconnect domains hold 4 nodes × 8 = 32. With `span_domains: true` it would be split over 2 interconnect domains, the slower links costed"
    ]


def test_a_loosely_coupled_gang_may_span_domains_and_a_pool_without_a_fabric_refuses_coupled_work():
    catalog = _catalog(_pool("islands", nodes_per_domain=4), _pool("ethernet"))
    assert [p.name for p in plan_placement(_pretrain(tightly_coupled=False), catalog).ranked] == ["ethernet", "islands"]
    plan = plan_placement(_pretrain(), catalog)
    assert plan.ranked == []
    assert plan.verdict("ethernet").reasons == ["tightly coupled across 64 GPUs, but the pool declares no fast domain (`nodes_per_domain` or `topology` in the catalog)"]


# --- standby spares ------------------------------------------------------------------------


def test_standby_spares_are_not_offered_for_fitting():
    pool = _pool("reservation", nodes=8, nodes_per_domain=8, spare_nodes=1)
    assert pool.offered_nodes == 7 and pool.total_gpus == 56
    plan = plan_placement(_pretrain(), _catalog(pool))
    assert plan.ranked == []
    assert plan.verdict("reservation").reasons[0] == (
        "needs 8 nodes, pool offers 7: of its 8, 1 stand by as spares to replace a gang's failed node"
    )
    assert [p.name for p in plan_placement(_pretrain(gpus=56, nodes=7), _catalog(pool)).ranked] == ["reservation"]


def test_a_gang_pays_for_the_standby_spares_and_a_dearer_pool_without_spares_wins():
    # cheap: (64 working + 2 × 8 spare) GPUs × 10 h × $2.00 = $1,600, of which the spares $320;
    # dear: 64 × 10 × $2.20 = $1,408. The spares decide it.
    cheap = _pool("cheap-with-spares", spare_nodes=2, nodes_per_domain=16)
    dear = _pool("dear-without", price_per_gpu_hour=2.20, nodes_per_domain=16)
    plan = plan_placement(_pretrain(), _catalog(cheap, dear))
    assert [p.name for p in plan.ranked] == ["dear-without", "cheap-with-spares"]
    v = plan.verdict("cheap-with-spares")
    assert v.expected_cost_usd == pytest.approx(1600.0)
    assert (v.spare_gpu_hours, v.spare_usd) == (pytest.approx(160.0), pytest.approx(320.0))
    assert "+2 standby spare node(s) held while the gang runs: 160.0 GPU-h, $320.00" in v.reasons
    assert plan.verdict("dear-without").spare_usd == 0.0
    # One process on 8 GPUs has no node to replace: it pays no spares, so the cheap pool wins.
    single = plan_placement(_pretrain(gpus=8, nodes=1, ranks_per_node=None, tightly_coupled=False), _catalog(cheap, dear))
    assert [p.name for p in single.ranked] == ["cheap-with-spares", "dear-without"]
    assert single.verdict("cheap-with-spares").expected_cost_usd == pytest.approx(160.0)


def test_spares_draw_on_a_commitment_like_the_working_nodes():
    # 800 GPU-h billed (640 working + 160 spare); 700 covered at $0.50 = $350, 100 more at $4.00 = $400.
    # The spares' part is their share of the hours: $750 × 160 / 800 = $150.
    reserved = _pool("reserved", purchasing="reserved", price_per_gpu_hour=4.0, committed_gpu_hours=700,
                     marginal_price_per_gpu_hour=0.5, spare_nodes=2, nodes_per_domain=16)
    v = plan_placement(_pretrain(), _catalog(reserved)).verdict("reserved")
    assert v.committed_gpu_hours_used == pytest.approx(700.0)
    assert v.compute_usd == pytest.approx(750.0)
    assert v.spare_usd == pytest.approx(150.0)


# --- whole nodes: quota and bill -----------------------------------------------------------


def test_a_gang_holds_whole_nodes_against_the_quota():
    # The gang uses 4 of each node's 8 GPUs on 2 nodes, but holds both nodes: 16 GPUs, $16 for the hour.
    # The one-GPU step beside it finds no room on `a` and goes to the dearer `b`; counted by GPUs
    # asked (8), the gang would have left it room on `a`.
    a, b = _pool("a", nodes=2, price_per_gpu_hour=1.0), _pool("b", nodes=2, price_per_gpu_hour=2.0)
    gang = StepSpec(name="gang", entry_point="x", tenant="cell", start=T0, gpus=8, nodes=2, ranks_per_node=4, expected_hours=1)
    single = StepSpec(name="single", entry_point="x", tenant="cell", start=T0, gpus=1, expected_hours=1)
    plan = plan_job("j", [gang, single], _catalog(a, b))
    rows = {r["step"]: r for r in plan.rows()}
    assert (rows["gang"]["pool"], rows["gang"]["gpus_held"], rows["gang"]["cost_usd"]) == ("a", 16, pytest.approx(16.0))
    assert (rows["single"]["pool"], rows["single"]["gpus_held"], rows["single"]["cost_usd"]) == ("b", 1, pytest.approx(2.0))
    quota = plan.placement(1).verdict("a")
    assert not quota.feasible and quota.reasons[0].startswith("quota: 16 of 16 GPUs already planned on it")
    assert any(r.startswith("a gang takes whole nodes: holds and pays for 2 × 8 = 16 GPUs (uses 8)") for r in plan.placement(0).verdict("a").reasons)


def test_a_gang_whose_whole_nodes_exceed_the_pool_quota_is_refused():
    pool = _pool("small-quota", nodes=2, quota_gpus=8)
    gang = StepSpec(name="gang", entry_point="x", tenant="cell", gpus=8, nodes=2, ranks_per_node=4)
    plan = plan_placement(gang, _catalog(pool))
    assert plan.verdict("small-quota").reasons == ["a gang takes whole nodes: 2 × 8 = 16 GPUs, pool has 8"]


def test_the_plan_shows_the_spare_cost_in_rows_totals_and_the_plan_command(tmp_path):
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n  hyperpod:\n"
        "    {provider: aws, region: us-east-1, backend: local, purchasing: block, accelerator: h100-80gb,\n"
        "     gpus_per_node: 8, nodes: 10, nodes_per_domain: 10, spare_nodes: 2, price_per_gpu_hour: 2.0}\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        "job: j\ntenant: cell\nstart: 2026-12-07T00:00:00Z\nsteps:\n"
        "  pretrain: {gpus: 64, nodes: 8, ranks_per_node: 8, tightly_coupled: true, expected_hours: 10}\n"
        "  probe: {gpus: 8, expected_hours: 1, start_hours: 10}\n"  # after it: the pretraining holds every offered node
    )
    from control_plane.placement.job_files import plan_job_file
    from sinewgrid.cli import app

    plan = plan_job_file(job, [pools])
    rows = {r["step"]: r for r in plan.rows()}
    assert rows["pretrain"]["spare_usd"] == pytest.approx(320.0) and rows["pretrain"]["cost_usd"] == pytest.approx(1600.0)
    assert rows["probe"]["spare_usd"] == 0.0
    assert plan.totals()["spare_usd"] == pytest.approx(320.0)
    result = CliRunner().invoke(app, ["plan", str(job), "--pools", str(pools)], terminal_width=250)
    assert result.exit_code == 0, result.output
    assert "of which standby spare nodes held for gangs: $320.00 (pretrain on hyperpod $320.00)" in result.output
    assert "+2 standby spare node(s) held while the gang runs: 160.0 GPU-h, $320.00" in result.output


# --- the catalog ---------------------------------------------------------------------------

BASE = "provider: aws, region: r, backend: local, purchasing: reserved, accelerator: h100-80gb, gpus_per_node: 8, price_per_gpu_hour: 2"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ("nodes: 4, spare_nodes: 4", "pool `p1`: `spare_nodes` (4) must be fewer than `nodes` (4)"),
        ("nodes: 4, spare_nodes: -1", "pool `p1`, field `spare_nodes`: Input should be greater than or equal to 0"),
        ("nodes: 4, nodes_per_domain: 8", "pool `p1`: `nodes_per_domain` (8) is more than the pool's `nodes` (4)"),
        ("nodes: 4, nodes_per_domain: 0", "pool `p1`, field `nodes_per_domain`: Input should be greater than or equal to 1"),
        (
            "nodes: 8, nodes_per_domain: 4, interconnect_domain_gpus: 64",
            "pool `p1`: `interconnect_domain_gpus` (64) and `nodes_per_domain` (4) disagree: 4 nodes × 8 GPUs per node = 32",
        ),
    ],
)
def test_bad_domain_and_spare_values_name_the_pool_and_the_fields(tmp_path, fields, expected):
    path = tmp_path / "pools.yaml"
    path.write_text(f"pools:\n  p1: {{{BASE}, {fields}}}\n")
    with pytest.raises(PoolCatalogError) as error:
        load_pools(path)
    assert f"{path}: {expected}" in str(error.value)


def test_both_ways_of_saying_a_domain_agree():
    said_both = _pool("p", nodes=8, nodes_per_domain=4, interconnect_domain_gpus=32)
    in_nodes, in_gpus = _pool("n", nodes=8, nodes_per_domain=4), _pool("g", nodes=8, interconnect_domain_gpus=32)
    assert (said_both.domain_nodes, said_both.domain_gpus) == (in_nodes.domain_nodes, in_nodes.domain_gpus) == (in_gpus.domain_nodes, in_gpus.domain_gpus) == (4, 32)
    assert _pool("none").domain_nodes is None and _pool("none").domain_gpus is None
