"""Quotas and admission (issue 33's core): the quotas catalog is validated by name, and a pool's
queue admits, lets borrow, reclaims and preempts as Kueue's ClusterQueues in a cohort do."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from control_plane.catalog.pools import load_pools
from control_plane.catalog.quotas import DEFAULT_QUOTAS as QUOTAS_FILE, QuotaCatalogError, Quotas, load_quotas
from control_plane.queues.admission import PoolQueue, Request

PRIORITY = {"deadline": 1000, "training": 500, "sweep": 100}


def _quotas(tmp_path: Path, doc: dict) -> Quotas:
    path = tmp_path / "quotas.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_quotas(path)


def _fleet(tmp_path: Path, **pool: dict) -> Quotas:
    """Teams a, b (one cohort) and loner (none), sharing pool `p` of 10 GPUs."""
    return _quotas(tmp_path, {
        "teams": {"a": {"members": ["lane-a"]}, "b": {"members": ["lane-b"], "weight": 2}, "loner": {"members": ["lane-c"]}},
        "cohorts": {"fleet": {"teams": ["a", "b"]}},
        "quotas": {"p": {"a": {"gpus": 4}, "b": {"gpus": 4}, "loner": {"gpus": 0}, **pool}},
        "priority_classes": PRIORITY, "default_priority": "training",
    })  # fmt: skip


def _queue(quotas: Quotas, *running: Request) -> PoolQueue:
    queue = PoolQueue("p", 10, quotas)
    for r in running:
        queue.admit(r, queue.decide(r))
    return queue


def test_the_packaged_quotas_hold_against_the_packaged_pools():
    quotas = load_quotas()
    capacity = {p.name: p.gpus_per_node * p.nodes for p in load_pools().values()}
    assert quotas.problems_with(capacity) == []
    assert quotas.team_of("lab-a", "cell") == "cell" and quotas.team_of("robotics", "robotics") == "robotics"
    assert quotas.priority(None) == quotas.priority("training") and quotas.priority("deadline") > quotas.priority("sweep")


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"teams": {"a": {"members": ["x"]}}, "cohorts": {"c": {"teams": ["a", "ghost"]}}}, "cohort `c` names team `ghost`, which `teams:` does not define"),
        ({"teams": {"a": {"members": ["x"]}, "b": {"members": ["x"]}}}, "`x` is a member of both team `a` and team `b`"),
        ({"teams": {"a": {"members": ["x"]}}, "quotas": {"p": {"ghost": {"gpus": 1}}}}, "pool `p` gives a quota to team `ghost`"),
        ({"teams": {"a": {"members": ["x"]}}, "quotas": {"p": {"a": {"gpus": 2, "lending_limit": 3}}}}, "`lending_limit` 3 is more than its 2 GPUs"),
        ({"teams": {"a": {"members": ["x"]}}, "quotas": {"p": {"a": {"gpus": -1}}}}, "a whole number of GPUs, 0 or more"),
        ({"teams": {"a": {"members": ["x"]}}, "default_priority": "urgent"}, "`default_priority: urgent` is not one of `priority_classes`"),
        ({"teams": {"a": {"members": ["x"]}}, "queues": {}}, "unknown top-level section `queues`"),
        ({"teams": {"a": {"members": ["x"]}}, "cohorts": {"c1": {"teams": ["a"]}, "c2": {"teams": ["a"]}}}, "team `a` is in cohort `c1` and cohort `c2`"),
    ],
    ids=["cohort-of-unknown-team", "member-of-two-teams", "quota-of-unknown-team", "lends-more-than-it-has", "negative-gpus",
         "unknown-default-priority", "unknown-section", "team-in-two-cohorts"],  # fmt: skip
)
def test_a_bad_quotas_file_is_refused_by_name(tmp_path, doc, said):
    with pytest.raises(QuotaCatalogError) as refused:
        _quotas(tmp_path, doc)
    assert str(tmp_path / "quotas.yaml") in str(refused.value) and said in str(refused.value), refused.value


def test_quotas_that_do_not_fit_the_pool_catalog_are_named(tmp_path):
    quotas = _fleet(tmp_path)
    assert quotas.problems_with({"p": 10}) == []
    said = quotas.problems_with({"p": 6, "q": 4})
    assert any("nominal quotas on pool `p` add up to 8 GPUs, more than its 6" in s for s in said), said
    assert _quotas(tmp_path, {"teams": {"a": {"members": ["x"]}}, "quotas": {"gone": {"a": {"gpus": 1}}}}).problems_with({"p": 1}) == [
        f"{tmp_path / 'quotas.yaml'}: quotas for pool `gone`, which the pool catalog does not have (its pools: p)"
    ]


def test_within_its_quota_a_team_starts_and_past_it_borrows_from_its_cohort(tmp_path):
    queue = _queue(_fleet(tmp_path))
    within = queue.decide(Request("a1", "a", 4))
    assert within.admitted and within.borrowed == 0 and not within.preempt
    borrowing = queue.decide(Request("a1", "a", 6))  # b's 4 idle and 2 unassigned: lendable
    assert borrowing.admitted and borrowing.borrowed == 2, borrowing
    # A team in no cohort never borrows, however idle the pool.
    loner = queue.decide(Request("c1", "loner", 1))
    assert not loner.admitted and "in no cohort to borrow from" in loner.reason


def test_borrowing_stops_at_the_limits(tmp_path):
    limited = _queue(_fleet(tmp_path, a={"gpus": 4, "borrowing_limit": 1}))
    refused = limited.decide(Request("a1", "a", 6))
    assert not refused.admitted and "past its borrowing limit of 1" in refused.reason
    assert limited.decide(Request("a1", "a", 5)).admitted
    # b lends only 1 of its 4 idle GPUs: with the 2 unassigned, a may borrow 3, not 4.
    keeps_back = _queue(_fleet(tmp_path, b={"gpus": 4, "lending_limit": 1}))
    assert keeps_back.decide(Request("a1", "a", 7)).admitted
    short = keeps_back.decide(Request("a1", "a", 8))
    assert not short.admitted and "its cohort has 7 free to lend" in short.reason, short.reason


def test_an_owner_reclaims_what_it_lent_preempting_borrowers_lowest_priority_newest_first(tmp_path):
    queue = _queue(
        _fleet(tmp_path),
        Request("a-train", "a", 4, PRIORITY["training"], arrived=1),
        Request("a-sweep-1", "a", 2, PRIORITY["sweep"], arrived=2),
        Request("a-sweep-2", "a", 2, PRIORITY["sweep"], arrived=3),  # a: 8 of its 4, borrowing 4
        Request("b-small", "b", 2, PRIORITY["sweep"], arrived=4),
    )
    assert queue.free == 0 and queue.borrowed("a") == 4
    reclaim = queue.decide(Request("b-burst", "b", 2, PRIORITY["sweep"], arrived=5))  # within b's nominal
    assert reclaim.admitted and reclaim.preempt == ("a-sweep-2",), reclaim  # the newest of the lowest priority
    queue.admit(Request("b-burst", "b", 2, PRIORITY["sweep"], arrived=5), reclaim)
    assert queue.used("a") == 6 and queue.used("b") == 4 and queue.free == 0
    # b is at its quota: more from b would be borrowing, which never preempts another team; of the
    # same priority as its own work, it waits.
    waits = queue.decide(Request("b-more", "b", 1, PRIORITY["sweep"], arrived=6))
    assert not waits.admitted and "its cohort has 0 free to lend" in waits.reason


def test_reclaiming_takes_only_from_teams_that_borrow(tmp_path):
    quotas = _quotas(tmp_path, {
        "teams": {t: {"members": [t]} for t in ("a", "b", "d")},
        "cohorts": {"fleet": {"teams": ["a", "b", "d"]}},
        "quotas": {"p": {"a": {"gpus": 4}, "b": {"gpus": 3}, "d": {"gpus": 3}}},
        "priority_classes": PRIORITY, "default_priority": "training",
    })  # fmt: skip
    queue = _queue(
        quotas,
        Request("a-sweep", "a", 4, PRIORITY["sweep"], arrived=1),  # a at its quota, lowest priority: not a borrower
        Request("d-1", "d", 3, PRIORITY["training"], arrived=2),
        Request("d-2", "d", 2, PRIORITY["training"], arrived=3),  # d borrows 2 of b's idle quota
        Request("b-1", "b", 1, arrived=4),
    )
    assert queue.free == 0 and queue.borrowed("d") == 2 and queue.borrowed("a") == 0
    reclaim = queue.decide(Request("b-2", "b", 2, arrived=5))
    assert reclaim.admitted and reclaim.preempt == ("d-2",), reclaim


def test_a_team_preempts_its_own_lower_priority_work_for_a_deadline(tmp_path):
    queue = _queue(_fleet(tmp_path), Request("a-sweep", "a", 4, PRIORITY["sweep"], arrived=1), Request("b-1", "b", 4, arrived=2),
                   Request("c", "a", 2, PRIORITY["sweep"], arrived=3))  # fmt: skip
    assert queue.free == 0
    deadline = queue.decide(Request("a-eval", "a", 4, PRIORITY["deadline"], arrived=4))
    assert deadline.admitted and set(deadline.preempt) <= {"a-sweep", "c"} and deadline.preempt, deadline
    same_class = queue.decide(Request("a-sweep-2", "a", 1, PRIORITY["sweep"], arrived=5))
    assert not same_class.admitted  # equal priority never preempts


def test_a_gang_larger_than_the_pool_never_fits_and_says_so(tmp_path):
    decision = _queue(_fleet(tmp_path)).decide(Request("gang", "a", 16))
    assert not decision.admitted and "needs 16 GPUs at once; pool p has 10 in all: it never fits here" == decision.reason


def test_waiting_work_is_served_by_fair_share_across_teams_then_priority_then_arrival(tmp_path):
    from control_plane.queues.admission import order

    queue = _queue(_fleet(tmp_path), Request("a-run", "a", 4, arrived=0), Request("b-run", "b", 2, arrived=0))
    waiting = [
        Request("a-next", "a", 1, PRIORITY["training"], arrived=1),
        Request("b-next", "b", 1, PRIORITY["training"], arrived=2),  # b: 2 of 4 at weight 2, far below a's 4 of 4
        Request("a-deadline", "a", 1, PRIORITY["deadline"], arrived=3),
        Request("b-later", "b", 1, PRIORITY["training"], arrived=4),
    ]
    # b is further below its fair share, so its work goes first; a's deadline comes before a's training.
    assert [r.id for r in order(waiting, [queue])] == ["b-next", "b-later", "a-deadline", "a-next"]


def test_the_queues_now_hold_the_jobs_in_flight_by_team(tmp_path):
    from control_plane.catalog.pools import Pool
    from control_plane.queues.usage import UNASSIGNED, queues_now

    quotas = _fleet(tmp_path)
    pool = Pool(name="p", provider="test", region="local", backend="local", purchasing="reserved", accelerator="local", gpus_per_node=8, nodes=1, price_per_gpu_hour=1.0)  # fmt: skip

    def record(job: str, tenant: str | None, gpus: int, where: str = "p") -> dict:
        return {"handle": {"backend": "slurm", "pool": where, "job_id": job, "submitted_at": 1.0}, "owner": {"gpus": gpus, **({"tenant": tenant} if tenant else {})}}

    queues = queues_now([record("1", "lane-a", 3), record("2", "lane-b", 2), record("3", None, 1), record("4", "lane-a", 2, where="gone")], {"p": pool}, quotas)
    queue = queues["p"]
    assert (queue.capacity, queue.used("a"), queue.used("b"), queue.used(UNASSIGNED), queue.free) == (8, 3, 2, 1, 2)
    assert queue.decide(Request("next", "a", 2)).admitted and not queue.decide(Request("big", "a", 3)).admitted


def test_sinewgrid_queue_shows_who_holds_each_pools_gpus_and_what_waits(home, tmp_path, monkeypatch):
    import time

    from typer.testing import CliRunner

    from control_plane.compute.backends.base import JobHandle
    from control_plane.compute.inflight import InFlight
    from sinewgrid.cli import app
    from workload_runtime.storage import Storage

    from control_plane.queues.admission import Request
    from control_plane.queues.gate import Waiting, WaitingRecords

    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS_FILE.read_text().replace("quotas: {}", "quotas: {cell-steady: {cell: {gpus: 1}}}"))
    monkeypatch.setenv("SINEWGRID_QUOTAS", str(quotas))
    storage = Storage.at(str(home))
    InFlight(storage).add(JobHandle("local", "cell-steady", "7", time.time(), {}), run_id="r", step="s", gpus=1, tenant="lab-a", expected_end=time.time() + 3600)
    WaitingRecords(storage).put(Waiting(Request("w", "robotics", 1, 100, time.time()), "robotics.sim_rollouts", "r2", {"cell-steady": 1},
                                        {"cell-steady": "team robotics would borrow 1 GPUs on pool cell-steady; waits"}, time.time() - 120))  # fmt: skip
    shown = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["queue", "--pool", "cell-steady"])
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if "cell-steady" in line)
    assert [cell.strip() for cell in row.split("│")[1:-1]] == ["cell-steady", "1", "0", "cell", "1", "1", "0"]  # lab-a's job: team cell's
    waiting = next(line for line in shown.output.splitlines() if "robotics.sim_rollouts" in line)
    cells = [cell.strip() for cell in waiting.split("│")[1:-1]]
    assert cells[:6] == ["cell-steady", "robotics.sim_rollouts", "robotics", "1", "sweep", "2 min"] and "would borrow" in cells[6], cells
    assert cells[7].endswith("UTC")  # when lab-a's job is expected to end
    unknown = CliRunner().invoke(app, ["queue", "--pool", "nope"])
    assert unknown.exit_code == 2 and "no pool `nope` in the pool catalog" in unknown.output
