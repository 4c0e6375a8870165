"""The rack-placement simulation (benchmarks/topology_sim.py, figure 16) keeps the rules it
measures: topology-aware placement never splits a gang that fits one rack, where blind placement
splits some, even against their spec; a gang bigger than a rack is split over the fewest racks
only if it may span, else the planner refuses it with a reason that names the shape; the step
time is the all-reduce model's (links.py), checked by hand and against the planner's own costing
of a split; a later gang never delays the oldest waiting one (EASY backfill); and the same
stream of gangs is the same useful work under every policy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import topology_fleet as fig
from benchmarks.topology_sim import POLICIES, Gang, Simulation, best_fit_rack, place, spread
from control_plane.placement.cost_model import PlanContext, assess
from control_plane.placement.ranking import plan_placement


def _gang(id: str, arrival: float, nodes: int, *, span: bool = False, gb: float = 0.0, compute: float = 3600.0, steps: int = 1) -> Gang:
    return Gang(id, arrival, nodes, 4, span, gb, compute, steps)


@pytest.fixture(scope="module")
def small_week() -> dict:
    """A tiny version of the figure: 60 gangs, one load, one seed."""
    return fig.run(count=60, loads={"heavy": 1.0}, seeds=1)


def test_aware_never_splits_a_gang_that_fits_a_rack_and_blind_splits_some_against_their_spec(small_week):
    rows = {r["policy"]: r for r in small_week["policies"]}
    assert rows["aware"]["split_against_spec"] == rows["aware-nowait"]["split_against_spec"] == 0
    assert rows["aware"]["by_size"]["≤ 8 nodes"]["split_share"] == rows["aware"]["by_size"]["9–18 nodes"]["split_share"] == 0
    assert rows["blind"]["split_against_spec"] > 0 and rows["blind"]["split_share"] > rows["aware"]["split_share"]
    assert rows["aware"]["by_size"]["19–36 nodes"]["split_share"] == 1.0  # bigger than a rack: split in every policy


def test_the_same_stream_is_the_same_useful_work_under_every_policy_and_splits_only_add_to_it(small_week):
    rows = small_week["policies"]
    assert [r["policy"] for r in rows] == list(POLICIES)
    useful = rows[0]["useful_gpu_h"]
    assert useful == pytest.approx(1.0 * small_week["fleet"]["gpus"] * fig.WEEK, rel=0.01)  # the offered load, steps rounded
    for r in rows:
        assert r["useful_gpu_h"] == pytest.approx(useful)
        assert r["held_gpu_h"] >= r["useful_gpu_h"] and r["cost_usd"] == pytest.approx(r["held_gpu_h"] * fig.PRICE)
        assert r["gangs"] + r["refused"] == 60 and r["slowdown_mean"] >= 1.0


def test_aware_puts_every_gang_of_a_week_in_one_rack_or_over_the_fewest_racks():
    """Every gang of a seeded week, as each policy started it: aware puts each that fits a rack in
    one rack and each bigger one over exactly the fewest racks, as evenly as it could."""
    pool = fig.fleet()
    drawn = fig.draw(np.random.default_rng(fig.SEED), 60)
    stream = fig.gangs(drawn, fig.planned(drawn, pool), pool, 1.0)
    inside, cross = pool.link_gb_per_s
    sims = {p: Simulation(p, fig.RACKS, fig.NODES_PER_RACK, inside, cross, [fig._fresh(g) for g in stream]).run() for p in POLICIES}
    for gang in sims["aware"].gangs.values():
        if gang.refused is not None:
            continue
        assert sum(gang.racks) == gang.nodes
        assert len(gang.racks) == math.ceil(gang.nodes / fig.NODES_PER_RACK), (gang.id, gang.racks)
    blind = [g for g in sims["blind"].gangs.values() if g.refused is None]
    assert any(len(g.racks) > 1 and g.nodes <= fig.NODES_PER_RACK and not g.span for g in blind)


def test_a_gang_bigger_than_a_rack_is_split_only_if_it_may_span():
    pool = fig.fleet()
    spans = fig.Drawn(arrival=0.0, nodes=24, span=True, params_b=70.0, tokens=4096, hours=2.0)
    must_not = fig.Drawn(arrival=0.0, nodes=24, span=False, params_b=70.0, tokens=4096, hours=2.0)
    refusals = fig.planned([spans, must_not], pool)
    assert refusals[0] is None
    assert refusals[1] is not None and "24 nodes × 4 = 96 GPUs in one NVLink domain" in refusals[1] and "span_domains: true" in refusals[1]
    # On an empty fleet, aware splits the one that may span over two racks, evenly.
    free = np.ones((fig.RACKS, fig.NODES_PER_RACK), dtype=bool)
    nodes = place("aware", free, fig.gangs([spans], [None], pool, 0.01)[0])
    assert nodes is not None and sorted(np.bincount(nodes // fig.NODES_PER_RACK).tolist())[-2:] == [12, 12]
    # Handed to the scheduler unplanned, the one that may not span never starts under aware, and
    # holds back nobody (it gets no reservation); blind would put it over racks regardless.
    unplanned = [_gang("must-not", 0.0, 24), _gang("later", 1.0, 2)]
    sim = Simulation("aware", 2, 18, 1800.0, 50.0, unplanned).run()
    assert sim.gangs["must-not"].start is None and sim.waiting == [sim.gangs["must-not"]]
    assert sim.gangs["later"].start == pytest.approx(1.0)
    assert Simulation("blind", 2, 18, 1800.0, 50.0, [_gang("must-not", 0.0, 24)]).run().gangs["must-not"].racks == (18, 6)


def test_the_step_time_is_the_all_reduce_models_by_hand():
    # Two racks of 3 nodes × 4 GPUs. A 2-node gang first, then a 3-node one: blind gives the second
    # nodes 2, 3, 4 (1 node in rack 0, 2 in rack 1: groups of 4 and 8 GPUs); aware puts the first in
    # rack 0 (best fit, first on a tie) and the second whole in rack 1.
    stream = [_gang("a", 0.0, 2, gb=36.0, compute=1.0, steps=3600), _gang("b", 0.1, 3, gb=36.0, compute=1.0, steps=3600)]
    blind = Simulation("blind", 2, 3, 1800.0, 50.0, [fig._fresh(g) for g in stream]).run().gangs["b"]
    aware = Simulation("aware", 2, 3, 1800.0, 50.0, [fig._fresh(g) for g in stream]).run().gangs["b"]
    one = 1.0 + 2 * 11 / 12 * 36 / 1800  # 12 GPUs in one rack
    split = 1.0 + 2 * 3 / 4 * 36 / 1800 + 2 * 1 / 2 * 36 / (4 * 50)  # inside the 4-GPU group, then across 2 racks at 4 × 50 GB/s
    assert blind.racks == (1, 2) and blind.split.step_seconds == pytest.approx(split) and blind.split.step_seconds_one == pytest.approx(one)
    assert blind.finish - blind.start == pytest.approx(3600 * split / 3600)
    assert blind.held_gpu_hours == pytest.approx(12 * split) and blind.useful_gpu_hours == pytest.approx(12 * one)
    assert aware.racks == (3,) and aware.split.step_seconds == pytest.approx(one) and aware.split.slowdown == 1.0


def test_an_even_split_costs_what_the_planner_costs():
    """A 30-node gang that may span, aware on an empty fleet: 15 + 15 nodes, the step time the
    planner's cost model gives the same step on the same pool (split_gangs, even over 2 racks)."""
    pool = fig.fleet()
    drawn = fig.Drawn(arrival=0.0, nodes=30, span=True, params_b=40.0, tokens=8192, hours=5.0)
    gang = fig.gangs([drawn], [None], pool, 0.01)[0]
    inside, cross = pool.link_gb_per_s
    sim = Simulation("aware", fig.RACKS, fig.NODES_PER_RACK, inside, cross, [gang]).run()
    assert gang.racks == (15, 15)
    planned = assess([fig.spec(0, drawn)], [pool], PlanContext(epoch=fig.T0)).splits[(0, 0)]
    assert gang.split.step_seconds == pytest.approx(planned.step_seconds) and gang.split.slowdown == pytest.approx(planned.slowdown)
    assert sim.gangs[gang.id].finish == pytest.approx(gang.steps * planned.step_seconds / 3600)
    assert plan_placement(fig.spec(0, drawn), {pool.name: pool}, at=fig.T0).verdict(pool.name).feasible


def test_best_fit_takes_the_fullest_rack_that_holds_the_gang_and_spread_the_fewest_racks():
    free = np.zeros((3, 6), dtype=bool)
    free[0, :5], free[1, :3], free[2, :6] = True, True, True  # 5, 3 and 6 free
    assert (best_fit_rack(free, 3) // 6 == 1).all() and (best_fit_rack(free, 4) // 6 == 0).all() and best_fit_rack(free, 7) is None
    nodes = spread(free, 9)
    assert np.bincount(nodes // 6, minlength=3).tolist() == [5, 0, 4]  # two racks: the emptiest, as even as they allow
    assert spread(free, 12, most_racks=2) is None and spread(free, 12) is not None and spread(free, 15) is None


def test_a_later_gang_never_delays_the_oldest_waiting_one():
    # One rack of 4 nodes. `a` holds 2 nodes for 10 h; `head` needs all 4 and waits; `short` (2
    # nodes, 5 h) ends before the head could start and goes first; `long` (2 nodes, 20 h) would
    # delay it and waits.
    stream = [_gang("a", 0.0, 2, steps=10), _gang("head", 1.0, 4, steps=1), _gang("short", 2.0, 2, steps=5), _gang("long", 3.0, 2, steps=20)]
    for policy in POLICIES:
        sim = Simulation(policy, 1, 4, 1800.0, 50.0, [fig._fresh(g) for g in stream]).run()
        g = sim.gangs
        assert g["short"].start == pytest.approx(2.0) and g["head"].start == pytest.approx(10.0), policy
        assert g["long"].start == pytest.approx(11.0), policy
