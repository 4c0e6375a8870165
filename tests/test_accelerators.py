"""Plans on mixed catalogs: NVIDIA, AMD, TPU slices and Trainium side by side; NVLink racks.

A step lands only where its code runs (`runs_on`), is costed per unit of work (its throughput
there), never lands where it would need porting (the evidence says what porting would buy), and a
tightly coupled gang fits one fast domain or, when it allows it, is split with the slower links
costed by the all-reduce model (docs/accelerators.md).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from control_plane.catalog.pools import Catalog, Pool, PoolCatalogError, load_catalog
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.cost_model import PlanContext, assess
from control_plane.placement.job_files import JobFileError, plan_job_file
from control_plane.placement.links import allreduce_seconds, split_cost
from control_plane.placement.planner import plan_job
from control_plane.placement.ranking import plan_placement

T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)


def _pool(name: str, accelerator: str, price: float, **fields) -> Pool:
    base = dict(name=name, provider="cloud", region="r1", backend="local", purchasing="on_demand", accelerator=accelerator,
                gpus_per_node=8, nodes=4, price_per_gpu_hour=price)
    return Pool(**{**base, **fields})


def _step(**fields) -> StepSpec:
    return StepSpec(**{"name": "train", "entry_point": "x", "tenant": "t", "gpus": 8, "expected_hours": 10.0, "start": T0, **fields})


def _mixed() -> Catalog:
    pools = [
        _pool("h100", "h100-80gb", 4.0),
        _pool("mi300x", "mi300x", 2.5),
        _pool("tpu-v5e", "tpu-v5e", 2.0, nodes=4, topology={"domain": "tpu_slice", "slice": "2x4"}),  # one 8-chip host a slice
        _pool("trn2", "trn2", 1.5, gpus_per_node=16, nodes=4, nodes_per_domain=4, topology={"domain": "ultraserver"}),
    ]
    return Catalog({p.name: p for p in pools}, files=["mixed"])


def _plan(step: StepSpec, catalog: Catalog):
    return plan_placement(step, catalog, at=T0)


# --- what the code runs on ------------------------------------------------------------------------


def test_a_step_that_says_nothing_runs_cuda_only_and_never_lands_on_tpu_amd_or_trainium():
    plan = _plan(_step(), _mixed())
    assert [p.name for p in plan.ranked] == ["h100"]  # the dearest pool, the only one its code runs on
    for name, family in (("tpu-v5e", "tpu"), ("mi300x", "amd"), ("trn2", "trainium")):
        verdict = plan.verdict(name)
        assert verdict.refused_by == ["family"]
        assert f"({family})" in verdict.reasons[0] and "runs_on" in verdict.reasons[0]


def test_a_step_is_costed_per_unit_of_work_not_per_hour():
    # TPU at $2.00/chip-h but half the work per hour: $4.00 per unit; AMD $2.50 at ×0.9: $2.78; H100 $4.00.
    step = _step(runs_on={"nvidia": 1.0, "amd": 0.9, "tpu": 0.5})
    plan = _plan(step, _mixed())
    assert [p.name for p in plan.ranked][:1] == ["mi300x"]
    cost = {v.pool: v.expected_cost_usd for v in plan.verdicts if v.feasible}
    assert cost["mi300x"] == pytest.approx(8 * 10 / 0.9 * 2.5)
    assert cost["h100"] == pytest.approx(8 * 10 * 4.0)
    assert cost["tpu-v5e"] == pytest.approx(8 * 10 / 0.5 * 2.0)  # 8 chips = one 2x4 slice
    assert any("×0.9 its reference throughput on mi300x" in r for r in plan.verdict("mi300x").reasons)
    assert plan.verdict("trn2").refused_by == ["family"]


def test_an_accelerators_own_entry_wins_over_its_family():
    step = _step(runs_on={"tpu": 0.5, "tpu-v5e": 2.0})
    plan = _plan(step, _mixed())
    assert [p.name for p in plan.ranked] == ["tpu-v5e"]
    assert plan.verdict("tpu-v5e").expected_cost_usd == pytest.approx(8 * 10 / 2.0 * 2.0)


def test_code_that_needs_porting_never_lands_there_and_the_evidence_prices_the_port():
    step = _step(runs_on={"nvidia": 1.0, "trainium": {"throughput": 1.2, "needs_porting": True, "porting_usd": 500}})
    plan = _plan(step, _mixed())
    assert [p.name for p in plan.ranked] == ["h100"]
    verdict = plan.verdict("trn2")
    assert verdict.refused_by == ["porting"]
    # trn2 holds whole 16-chip nodes? No: a single-node step holds what it asks, 8 chips at $1.50 for 10/1.2 h.
    here = 8 * 10 / 1.2 * 1.5
    assert f"${here:,.2f}" in verdict.reasons[0] and f"${here + 500:,.2f}" in verdict.reasons[0]
    assert f"${8 * 10 * 4.0:,.2f}" in verdict.reasons[0]  # against the cheapest pool it runs on now


def test_a_tpu_slice_is_held_whole():
    step = _step(gpus=4, runs_on={"tpu": 1.0})  # half of an 8-chip slice
    plan = _plan(step, _mixed())
    verdict = plan.verdict("tpu-v5e")
    assert verdict.feasible and verdict.expected_cost_usd == pytest.approx(8 * 10 * 2.0)
    assert any("provisioned whole: holds and pays for 8 chips (uses 4)" in r for r in verdict.reasons)


def test_a_job_of_many_steps_puts_none_where_its_code_cannot_run():
    rng = np.random.default_rng(3)
    steps = []
    for k in range(60):
        runs_on = [None, {"nvidia": 1.0, "tpu": 1.3}, {"amd": 1.0}, {"nvidia": 1.0, "trainium": 0.8, "amd": 0.9}][k % 4]
        steps.append(_step(name=f"s{k}", gpus=int(rng.choice([4, 8])), expected_hours=float(rng.uniform(1, 4)),
                           start=T0 + dt.timedelta(hours=float(rng.uniform(0, 72))), runs_on=runs_on))
    plan = plan_job("mixed", steps, _mixed(), epoch=T0)
    pools = _mixed().pools
    by_name = {s.name: s for s in steps}
    placed = [(row["step"], row["pool"]) for row in plan.rows()]
    assert len(placed) == len(steps)
    for step, pool in placed:
        assert by_name[step].support_on(pools[pool].accelerator) is not None, (step, pool)
    assert {pools[p].family for _, p in placed} >= {"nvidia", "amd", "tpu"}  # the mixed catalog is used


# --- gangs and fast domains -------------------------------------------------------------------------


def _nvl72(**fields) -> Catalog:
    rack = _pool("gb200-nvl72", "gb200", 6.0, gpus_per_node=4, nodes=72, nodes_per_domain=18, topology={"domain": "nvlink"}, **fields)
    return Catalog({rack.name: rack}, files=["racks"])


def _gang(**fields) -> StepSpec:
    return _step(gpus=96, nodes=24, ranks_per_node=4, tightly_coupled=True, **fields)


def test_a_96_gpu_gang_on_72_gpu_racks_is_refused_unless_it_may_span_and_the_refusal_names_the_shape():
    plan = _plan(_gang(), _nvl72())
    assert plan.ranked == []
    verdict = plan.verdict("gb200-nvl72")
    assert verdict.refused_by == ["interconnect"]
    assert verdict.reasons == [
        "tightly coupled: needs 24 nodes × 4 = 96 GPUs in one NVLink domain; the pool's NVLink domains hold 18 nodes × 4 = 72. "
        "With `span_domains: true` it would be split over 2 NVLink domains, the slower links costed"
    ]


def test_a_96_gpu_gang_that_may_span_is_split_over_two_racks_and_pays_for_the_slower_links():
    gang = _gang(span_domains=True, allreduce_gb=140.0, compute_seconds_per_step=2.0)
    plan = _plan(gang, _nvl72())
    assert [p.name for p in plan.ranked] == ["gb200-nvl72"]
    # By hand: 12 nodes × 4 GPUs in each of 2 racks; NVLink 1800 GB/s, 50 GB/s per GPU between racks.
    one = 2 * 95 / 96 * 140 / 1800
    split = 2 * 47 / 48 * 140 / 1800 + 2 * 1 / 2 * 140 / (48 * 50)
    slowdown = (2.0 + split) / (2.0 + one)
    assert slowdown > 1.0
    assert plan.verdict("gb200-nvl72").expected_cost_usd == pytest.approx(96 * 10 * slowdown * 6.0)
    assert any("split over 2 NVLink domains" in r and "all-reduce model" in r for r in plan.verdict("gb200-nvl72").reasons)


def test_a_gang_that_fits_one_rack_is_not_split_nor_slowed():
    gang = _step(gpus=72, nodes=18, ranks_per_node=4, tightly_coupled=True, span_domains=True, allreduce_gb=140.0, compute_seconds_per_step=2.0)
    a = assess([gang], list(_nvl72().pools.values()), PlanContext(epoch=T0))
    assert a.feasible[0, 0] and not a.splits
    assert a.gpu_hours[0, 0] == pytest.approx(72 * 10)


def test_the_all_reduce_model_by_hand():
    assert allreduce_seconds(100, [8], 900, 50) == pytest.approx(2 * 7 / 8 * 100 / 900)
    # 4 domains of 2 GPUs: the ring inside each, then each GPU's half across 4 domains.
    assert allreduce_seconds(100, [2, 2, 2, 2], 900, 50) == pytest.approx(2 * 1 / 2 * 100 / 900 + 2 * 3 / 4 * 100 / (2 * 50))
    # The smallest group sets the pace of the cross-domain phase.
    assert allreduce_seconds(100, [6, 2], 900, 50) == allreduce_seconds(100, [2, 2], 900, 50)
    s = split_cost(devices=96, per_domain=72, gb=140, compute_seconds=2.0, inside_gb_per_s=1800, cross_gb_per_s=50)
    assert s.domains == 2 and s.slowdown > 1 and math.isclose(s.step_seconds_one, 2.0 + s.allreduce_one)


# --- catalogs and job files that cannot be used say why -----------------------------------------------


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"accelerator": "tpu-v5p", "gpus_per_node": 4, "nodes": 8}, "a TPU pool sells whole slices"),
        ({"accelerator": "tpu-v5p", "gpus_per_node": 4, "nodes": 5, "topology": {"domain": "tpu_slice", "slice": "2x2x2"}},
         "`nodes` (5) is not a whole number of 2x2x2 slices of 2 hosts each"),
        ({"accelerator": "tpu-v5p", "gpus_per_node": 4, "nodes": 8, "topology": {"domain": "tpu_slice", "slice": "4by4"}},
         "is not a TPU topology"),
        ({"accelerator": "h100-80gb", "topology": {"domain": "nvlink", "slice": "2x2"}}, "set `topology.domain: tpu_slice`"),
        ({"accelerator": "tpu-v5p", "gpus_per_node": 4, "nodes": 8, "nodes_per_domain": 4,
          "topology": {"domain": "tpu_slice", "slice": "2x2x2"}}, "`nodes_per_domain` disagrees with `slice: 2x2x2`"),
    ],
)
def test_a_pool_of_the_wrong_shape_is_refused_with_the_fix(tmp_path: Path, fields: dict, said: str):
    pool = {"provider": "gcp", "region": "r", "backend": "local", "purchasing": "spot", "gpus_per_node": 8, "nodes": 4,
            "price_per_gpu_hour": 1.0, **fields}
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": {"odd": pool}}))
    with pytest.raises(PoolCatalogError) as caught:
        load_catalog(path)
    assert said in str(caught.value) and "odd" in str(caught.value)


def test_a_step_that_may_span_must_say_what_it_all_reduces_and_runs_on_names_real_things():
    with pytest.raises(ValidationError, match="needs `allreduce_gb` and `compute_seconds_per_step`"):
        _gang(span_domains=True)
    with pytest.raises(ValidationError, match="neither an accelerator family"):
        _step(runs_on={"cuda": 1.0})
    with pytest.raises(ValidationError, match="`runs_on` is empty"):
        _step(runs_on={})


def test_a_job_file_declares_runs_on_and_one_no_pool_can_run_is_refused_before_planning(tmp_path: Path):
    catalog = tmp_path / "pools.yaml"
    catalog.write_text(yaml.safe_dump({"pools": {
        "tpu": {"provider": "gcp", "region": "r", "backend": "local", "purchasing": "spot", "accelerator": "tpu-v5e",
                "gpus_per_node": 4, "nodes": 4, "topology": {"domain": "tpu_slice", "slice": "2x2"}, "price_per_gpu_hour": 1.2},
        "h100": {"provider": "aws", "region": "r", "backend": "local", "purchasing": "on_demand", "accelerator": "h100-80gb",
                 "gpus_per_node": 8, "nodes": 2, "price_per_gpu_hour": 4.0},
    }}))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"job": "j", "tenant": "t", "start": "2026-12-07T00:00:00Z", "steps": {
        "jax": {"gpus": 4, "expected_hours": 2, "runs_on": {"tpu": 1.5}},
        "torch": {"gpus": 4, "expected_hours": 2},
    }}))
    rows = {r["step"]: r["pool"] for r in plan_job_file(job, [catalog]).rows()}
    assert rows == {"jax": "tpu", "torch": "h100"}
    job.write_text(yaml.safe_dump({"job": "j", "tenant": "t", "start": "2026-12-07T00:00:00Z", "steps": {
        "neuron": {"gpus": 4, "expected_hours": 2, "runs_on": {"trainium": 1.0}},
    }}))
    with pytest.raises(JobFileError, match="step `neuron`, field `runs_on`: its code runs on trainium, and no pool sells one"):
        plan_job_file(job, [catalog])


# --- throughput measured by the step's own runs ---------------------------------------------------


def test_throughput_measured_on_two_accelerators_replaces_the_declared_one_and_the_plan_says_so(tmp_path: Path):
    from control_plane.compute import pace
    from workload_runtime.storage import Storage

    storage = Storage.at(str(tmp_path))
    catalog = _mixed()
    step = _step(runs_on={"nvidia": 1.0, "amd": 0.9})
    pace.record(storage, step, catalog.pools["mi300x"], 3.0)
    assert pace.measured(storage, step) == step  # one accelerator alone compares with nothing
    for seconds in (2.0, 2.2, 1.8):
        pace.record(storage, step, catalog.pools["h100"], seconds)
    pace.record(storage, step, catalog.pools["h100"], None)  # an attempt that reported no pace adds nothing
    mine = pace.measured(storage, step)
    # The anchor (h100: three runs, median 2.0 s) keeps its declared 1.0; AMD ran 3.0 s: ×0.667, not the declared 0.9.
    assert mine.support_on("h100-80gb").throughput == 1.0
    assert mine.support_on("mi300x").throughput == pytest.approx(2.0 / 3.0, abs=1e-4)
    assert mine.support_on("mi300x").source.startswith("measured: 3 s/step on mi300x (1 run(s)) against 2 s/step on h100-80gb")
    plan = _plan(mine, catalog)
    assert [p.name for p in plan.ranked][:2] == ["mi300x", "h100"]  # $2.5 / 0.667 = $3.75 per unit, still below $4
    assert any("measured: 3 s/step" in r for r in plan.verdict("mi300x").reasons)
    # Measurements never open a family its code does not run on.
    pace.record(storage, step, catalog.pools["trn2"], 0.5)
    assert pace.measured(storage, step).support_on("trn2") is None


def test_the_docs_examples_are_what_the_plan_says():
    docs = " ".join((Path(__file__).parents[1] / "docs" / "accelerators.md").read_text().split())
    porting = _plan(_step(runs_on={"nvidia": 1.0, "tpu": {"throughput": 1.3, "needs_porting": True, "porting_usd": 20000}}), _mixed())
    faster = _plan(_step(runs_on={"nvidia": 1.0, "tpu": 1.3}), _mixed())
    split = _plan(_gang(span_domains=True, allreduce_gb=140.0, compute_seconds_per_step=2.0), _nvl72())
    said = [porting.verdict("tpu-v5e").reasons[0], faster.verdict("tpu-v5e").reasons[1].split(" (cost per")[0],
            split.verdict("gb200-nvl72").reasons[1], _plan(_gang(), _nvl72()).verdict("gb200-nvl72").reasons[0]]
    for sentence in said:
        assert sentence in docs, sentence


def test_pools_list_shows_each_pools_accelerator_family_and_fast_domain(tmp_path: Path):
    from typer.testing import CliRunner

    from sinewgrid.cli import app

    catalog = tmp_path / "pools.yaml"
    catalog.write_text(yaml.safe_dump({"pools": {
        name: {**p.model_dump(mode="json", exclude={"name"}, exclude_defaults=True), "backend": "local"} for name, p in _mixed().pools.items()
    }}))
    result = CliRunner().invoke(app, ["pools", "list", "--pools", str(catalog)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "tpu-v5e (tpu)" in text and "TPU slice 2x4: 1 × 8, whole" in text
    assert "trn2 (trainium)" in text and "UltraServer: 4 × 16" in text and "1280 / 50" in text
    assert "mi300x (amd)" in text


def test_the_cost_models_split_gangs_agree_with_the_all_reduce_model_one_by_one():
    rng = np.random.default_rng(11)
    pools = [_pool(f"rack{k}", "gb200", 6.0, gpus_per_node=4, nodes=72, nodes_per_domain=d, topology={"domain": "nvlink", "cross_domain_gb_per_s": x})
             for k, (d, x) in enumerate([(18, 50.0), (8, 25.0), (9, 100.0)])]
    steps = [_step(name=f"g{k}", gpus=4 * n, nodes=n, ranks_per_node=4, tightly_coupled=True, span_domains=True,
                   allreduce_gb=float(rng.uniform(1, 200)), compute_seconds_per_step=float(rng.uniform(0.2, 5)), runs_on={"nvidia": float(t)})
             for k, (n, t) in enumerate(zip(rng.integers(10, 60, 12), rng.uniform(0.5, 2.0, 12)))]
    a = assess(steps, pools, PlanContext(epoch=T0))
    assert len(a.splits) > 20
    for (i, j) in [tuple(p) for p in a.splits.pairs]:
        step, pool = steps[i], pools[j]
        domains = math.ceil(step.nodes / pool.domain_nodes)
        groups = [(step.nodes // domains + (1 if k < step.nodes % domains else 0)) * 4 for k in range(domains)]
        theta = step.runs_on["nvidia"].throughput
        expected = split_cost(devices=step.gpus, per_domain=pool.domain_gpus, gb=step.allreduce_gb, compute_seconds=step.compute_seconds_per_step / theta,
                              inside_gb_per_s=1800.0, cross_gb_per_s=pool.topology.cross_domain_gb_per_s, groups=groups)
        got = a.splits[(i, j)]
        assert got.domains == expected.domains
        assert got.slowdown == pytest.approx(expected.slowdown, rel=1e-9)
        assert a.gpu_hours[i, j] == pytest.approx(step.nodes * 4 * step.expected_hours / theta * expected.slowdown)


def test_admission_counts_what_placement_counts_whole_tpu_slices_and_whole_nodes():
    from control_plane.queues.requests import held_gpus

    catalog = _mixed()
    steps = [_step(gpus=4, runs_on={"tpu": 1.0}), _step(gpus=12, nodes=2, runs_on={"tpu": 1.0}), _step(gpus=16, nodes=2, ranks_per_node=8)]
    for pool in catalog.pools.values():
        a = assess(steps, [pool], PlanContext(epoch=T0))
        for i, step in enumerate(steps):
            assert held_gpus(step, pool) == a.held_gpus[i, 0], (pool.name, step)
