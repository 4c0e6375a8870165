"""The capacity plan asset: the lanes' calendars planned together on the deploy catalogs."""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg

from control_plane.catalog.pools import load_catalog
from control_plane.settings import REPO_ROOT
from platform_location.defs.assets.capacity_plan import capacity_plan
from shared_resources.resources import platform_resources


def _moment(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M UTC")


def test_capacity_plan_places_both_calendars_within_every_pool_quota(home):
    result = dg.materialize([capacity_plan], resources=platform_resources(root=str(home)))
    (mat,) = result.asset_materializations_for_node("platform__capacity_plan")
    metadata = {k: v.value for k, v in mat.metadata.items()}
    assert {"plan_cell-december-week", "plan_robotics-december-week"} <= set(metadata)
    assert metadata["prices"] == "illustrative list prices, not quotes"
    assert (home / "reports" / "capacity" / "calendar.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    plan = json.loads((home / "reports" / "capacity" / "plan.json").read_text())
    steps = plan["steps"]
    assert {s["step"].split("/")[0] for s in steps} == {"cell-december-week", "robotics-december-week"}
    assert abs(sum(s["cost_usd"] for s in steps) - metadata["cost_usd"]) < 0.01
    assert all(s["gpus_held"] >= s["gpus"] for s in steps)
    # Planned together, the two lanes never hold more of a pool than its quota at any moment
    # (a gang holds whole nodes: `gpus_held`, at least the GPUs it asks for).
    pools = load_catalog(REPO_ROOT / "deploy" / "pools").pools
    for name in {s["pool"] for s in steps}:
        runs = [s for s in steps if s["pool"] == name]
        for moment in {_moment(s["start"]) for s in runs}:
            held = sum(s["gpus_held"] for s in runs if _moment(s["start"]) <= moment < _moment(s["end"]))
            assert held <= pools[name].total_gpus, f"{name} over quota at {moment}: {held} GPUs"


def test_a_calendar_that_cannot_be_planned_fails_with_the_reason(home, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "job: too-big\ntenant: cell\nstart: 2026-12-07T00:00:00Z\n"
        "steps:\n  giant: {gpus: 100000, expected_hours: 1}\n"
    )
    result = dg.materialize(
        [capacity_plan],
        resources=platform_resources(root=str(home)),
        run_config={"ops": {"platform__capacity_plan": {"config": {"job_files": [str(bad)]}}}},
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = failure.step_failure_data.error.message
    assert "cannot plan the calendar" in message and "giant" in message
