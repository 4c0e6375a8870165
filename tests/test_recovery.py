"""Recovery policies: what happens after an attempt ends, chosen by name from the step or the pool.

The table of `control_plane/compute/recovery.py`, decision by decision; then both policies
on real runs of the counting workload, preempted without notice by a failpoint that fires at a
step (so the fault lands mid-run on any machine, however fast)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from control_plane.accounting.ledger import read_ledger
from control_plane.compute.causes import Cause
from control_plane.compute.cooldowns import SLOTS_ENV, Cooldowns
from control_plane.compute.health import Drains
from control_plane.compute.recovery import POLICIES, Action, Ending, Outcome, policy_named
from testbed.counting_step import counting_spec, materialize_counting, result_metadata
from workload_runtime.inputs import Failpoint
from workload_runtime.storage import Storage

# The decisions --------------------------------------------------------------------------------


def test_the_default_is_failover():
    assert policy_named(None).name == "failover" and set(POLICIES) == {"failover", "stay"}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_what_every_policy_agrees_on(name):
    policy = policy_named(name)
    assert policy.decide(Outcome(Ending.succeeded)).action is Action.done
    assert policy.decide(Outcome(Ending.failed, Cause.failed)).action is Action.give_up
    refused = policy.decide(Outcome(Ending.refused, Cause.refused))
    assert (refused.action, refused.exclude, refused.cool_down, refused.drain) == (Action.move, True, "refused: no capacity", None)
    disqualified = policy.decide(Outcome(Ending.disqualified, problem="partition down"))
    assert (disqualified.action, disqualified.drain) == (Action.move, "partition down")
    # A gang's probe named the node that failed: with a spare, only that node goes, the pool stays.
    sick = Outcome(Ending.disqualified, Cause.unhealthy_node, problem="health_check failed on n1", node="n1", spare_nodes=1)
    assert (policy.decide(sick).action, policy.decide(sick).replace_node, policy.decide(sick).drain) == (Action.retry, "n1", None)
    no_spare = policy.decide(Outcome(Ending.disqualified, Cause.unhealthy_node, problem="health_check failed on n1", node="n1"))
    assert (no_spare.action, no_spare.replace_node, no_spare.drain) == (Action.move, None, "health_check failed on n1")
    flags = [{"cause": "straggler", "detail": "steps 5× slower", "action": "replace", "at": 1.0}]
    straggler = policy.decide(Outcome(Ending.preempted, Cause.straggler, preemptions=1, max_preemptions=3, flags=flags))
    assert (straggler.action, straggler.drain, straggler.cool_down) == (Action.move, "straggler: steps 5× slower", None)
    over = policy.decide(Outcome(Ending.preempted, Cause.notice, preemptions=4, max_preemptions=3))
    assert over.action is Action.give_up


@pytest.mark.parametrize("cause", [Cause.notice, Cause.lost_node, Cause.reclaimed])
def test_failover_moves_and_stay_retries_after_a_plain_preemption(cause):
    outcome = Outcome(Ending.preempted, cause, preemptions=1, max_preemptions=3)
    moved = policy_named("failover").decide(outcome)
    stayed = policy_named("stay").decide(outcome)
    assert (moved.action, moved.cool_down) == (Action.move, "preempted")
    assert (stayed.action, stayed.cool_down, stayed.drain) == (Action.retry, None, None)


def test_an_unknown_policy_names_where_and_what_is_known():
    with pytest.raises(ValueError, match=r"step s, pool p: unknown recovery policy `eager`; known: failover, stay"):
        policy_named("eager", "step s, pool p")


# On real runs ---------------------------------------------------------------------------------

CATALOG = """
pools:
  cheap:
    provider: local
    region: local
    backend: local
    purchasing: spot
    accelerator: local
    gpus_per_node: 1
    price_per_gpu_hour: 1.0
    qualify: false
    cooldown_seconds: 600
    {recovery}
  dear:
    provider: local
    region: local
    backend: local
    purchasing: on_demand
    accelerator: local
    gpus_per_node: 1
    price_per_gpu_hour: 3.0
    qualify: false
"""


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(SLOTS_ENV, str(tmp_path / "slots"))
    return tmp_path / "home"


def _run(home: Path, tmp_path: Path, *, pool_recovery: str = "", step_recovery: str | None = None) -> tuple[list[tuple[str, str, str]], dict]:
    catalog = tmp_path / "pools.yaml"
    catalog.write_text(CATALOG.format(recovery=f"recovery: {pool_recovery}" if pool_recovery else ""))
    marker = tmp_path / "failpoint-fired.json"
    # SIGKILL at the first checkpoint from step 10 on: a preemption without notice, once.
    spec = counting_spec(
        config={"steps": 30}, failpoint=Failpoint(kind="torn-checkpoint", at_step=10, marker=str(marker)), recovery=step_recovery
    )
    result = materialize_counting(home, catalog, spec, instance=dg.DagsterInstance.ephemeral())
    ledger = read_ledger(Storage.at(str(home)))
    attempts = [(r.pool, r.outcome, r.cause) for r in ledger.sort_values("attempt").itertuples()]
    assert marker.exists()
    return attempts, result_metadata(result)


def test_failover_resumes_on_the_next_pool(home, tmp_path):
    attempts, meta = _run(home, tmp_path)
    assert attempts == [("cheap", "preempted", "lost-node"), ("dear", "succeeded", "")]
    assert meta["resumed_from"] == 5  # the last checkpoint before the kill (every 5 steps; the one at 10 was torn)
    assert Cooldowns(Storage.at(str(home))).active("cheap") is not None


def test_stay_on_the_pool_resumes_where_it_was(home, tmp_path):
    attempts, meta = _run(home, tmp_path, pool_recovery="stay")
    assert attempts == [("cheap", "preempted", "lost-node"), ("cheap", "succeeded", "")]
    assert meta["resumed_from"] == 5
    storage = Storage.at(str(home))
    assert Cooldowns(storage).active("cheap") is None and Drains(storage).active("cheap") is None


def test_the_step_overrides_the_pool(home, tmp_path):
    attempts, _ = _run(home, tmp_path, pool_recovery="stay", step_recovery="failover")
    assert [pool for pool, _, _ in attempts] == ["cheap", "dear"]


def test_an_unknown_policy_fails_the_step_before_anything_runs(home, tmp_path):
    with pytest.raises(dg.Failure, match="unknown recovery policy `sideways`"):
        _run(home, tmp_path, pool_recovery="sideways")
    assert not (tmp_path / "failpoint-fired.json").exists()
