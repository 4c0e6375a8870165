"""The fleet simulation (benchmarks/queue_sim.py) keeps the rules it measures: no pool ever
holds more than it has, a team taking back its quota preempts a borrower that resumes from its
checkpoint and still finishes all its work, strict quotas never borrow, FIFO never lets a later
job start first; and figure 15's own fleet and quotas are valid catalogs."""

from __future__ import annotations

import pytest

from benchmarks.queue_sim import Interruption, Job, Simulation
from control_plane.catalog.quotas import Quotas
from control_plane.queues.admission import Request

QUOTAS = Quotas.model_validate({
    "teams": {"a": {"members": ["a"]}, "b": {"members": ["b"]}},
    "cohorts": {"all": {"teams": ["a", "b"]}},
    "quotas": {"p": {"a": {"gpus": 8}, "b": {"gpus": 8}}, "q": {"a": {"gpus": 4}, "b": {"gpus": 4}}},
    "priority_classes": {"high": 10, "low": 1}, "default_priority": "low",
})  # fmt: skip


def _job(id: str, team: str, arrival: float, hours: float, gpus: int = 8, pools=("p",), priority: int = 1) -> Job:
    return Job(id, team, "test", "low", priority, arrival, hours, tuple(pools), {p: gpus for p in pools}, checkpoint_hours=0.25, checkpoint_write_hours=0.01)


class Watched(Simulation):
    """Checks after every start that no pool holds more GPUs than it has, and after every pass
    that no waiting job could have started (no GPU left idle that waiting work could use)."""

    def _pass(self):
        super()._pass()
        if self.policy == "fifo":
            return
        for group in self._groups.values():
            for job in list(group)[:1]:
                for pool in job.ranked:
                    decision = self.queues[pool].decide(Request(job.id, job.team, job.held[pool], job.priority, job.arrival))
                    assert not decision.admitted, f"{job.id} waits while {pool} admits it at {self.now}: {decision.reason}"

    def _start(self, job, pool):
        super()._start(job, pool)
        for name, queue in self.queues.items():
            assert sum(self.jobs[i].held[name] for i in queue.running) <= queue.capacity, f"{name} over capacity at {self.now}"


def test_a_team_taking_back_its_quota_preempts_the_borrower_which_resumes_and_finishes():
    jobs = [_job("b-borrows", "b", 0.0, 4.0, gpus=16), _job("a-returns", "a", 1.0, 1.0)]
    sim = Watched("queues", {"p": 16}, QUOTAS, jobs, [], horizon=20).run()
    borrower, owner = sim.jobs["b-borrows"], sim.jobs["a-returns"]
    assert owner.first_start == pytest.approx(1.0)  # at once: its quota, taken back
    assert borrower.preemptions == 1 and borrower.finished is not None and borrower.done == pytest.approx(4.0)
    assert sim.ledger.lost["reclaimed"] > 0  # the checkpoint written on notice is booked to its cause
    assert borrower.finished > owner.finished  # it waited for the GPUs, then resumed


def test_strict_quotas_never_borrow_and_fifo_never_overtakes():
    jobs = [_job("a1", "a", 0.0, 2.0), _job("a2", "a", 0.1, 2.0), _job("b1", "b", 0.2, 2.0, gpus=4)]
    strict = Watched("strict", {"p": 16}, QUOTAS, jobs, [], horizon=20).run()
    assert strict.jobs["a2"].first_start == pytest.approx(2.0)  # b's idle 8 GPUs are not lent
    fifo_jobs = [_job("big", "a", 0.0, 2.0, gpus=16), _job("blocked", "b", 0.5, 1.0, gpus=16), _job("small", "a", 0.6, 1.0, gpus=2)]
    fifo = Watched("fifo", {"p": 16}, QUOTAS, fifo_jobs, [], horizon=20).run()
    assert fifo.jobs["small"].first_start >= fifo.jobs["blocked"].first_start == pytest.approx(2.0)


def test_a_spot_interruption_without_time_to_checkpoint_costs_the_work_since_the_last_one():
    job = _job("spot", "a", 0.0, 3.0, pools=("q",), gpus=4)
    trace = [Interruption(at=1.1, pool="q", gpus=8, hours=0.5, notice_hours=0.0)]
    sim = Watched("queues", {"q": 8}, QUOTAS, [job], trace, horizon=20).run()
    assert sim.jobs["spot"].preemptions == 1 and sim.jobs["spot"].first_start == 0.0
    assert sim.ledger.lost["spot"] == pytest.approx(4 * 0.1)  # 1.1 h run, checkpoints every 0.25 h: 0.1 h redone
    assert sim.jobs["spot"].finished == pytest.approx(1.6 + 5 / 60 + (3.0 - 1.0))  # back at 1.6, restart, the rest


def test_figure_15s_fleet_and_quotas_are_valid_catalogs():
    from benchmarks.queue_fleet import fleet, plans, quotas

    pools, q = fleet(), quotas()
    assert not q.problems_with({name: p.gpus_per_node * p.nodes for name, p in pools.items()})
    assert sum(p.gpus_per_node * p.nodes for p in pools.values()) == 2240 and len(pools) == 12
    ranked = plans(pools)
    assert ranked["pretraining"][0] and all(pools[p].accelerator == "h100-80gb" for p in ranked["pretraining"][0])


def test_work_on_a_costlier_pool_moves_to_committed_capacity_that_came_free():
    holder = _job("holder", "a", 0.0, 1.0, gpus=8, pools=("p",))
    later = _job("later", "b", 0.5, 4.0, gpus=8, pools=("p", "q"))  # p is full: it starts on q
    sim = Watched("queues", {"p": 8, "q": 8}, QUOTAS, [holder, later], [], horizon=20, committed={"p"}, move_min_hours=1.0).run()
    moved = sim.jobs["later"]
    assert moved.first_start == pytest.approx(0.5) and moved.preemptions == 1 and moved.finished is not None
    assert sim.ledger.held[("b", "q")] == pytest.approx(8 * (0.5 + 0.01))  # ran on q until p came free at 1.0, then its checkpoint
    assert sim.ledger.lost["moved"] == pytest.approx(8 * 0.01)
    stays = Watched("queues", {"p": 8, "q": 8}, QUOTAS, [_job("h", "a", 0.0, 1.0), _job("short", "b", 0.5, 1.2, pools=("p", "q"))], [], horizon=20,
                    committed={"p"}, move_min_hours=1.0).run()  # fmt: skip
    assert stays.jobs["short"].preemptions == 0  # 0.7 h left when p came free: not worth a checkpoint and a restart
