"""The rehearsal's own UI (the stack's `dagster-webserver`, on PostgreSQL) opened in Chromium with
the suite's Playwright set-up (tests/test_ui.py's browser and page, pointed at this webserver):
the runs the daemon started, the checks of lab-a's drop, and the ledger's report, materialized
from the UI itself, queued, launched by the daemon in a container of its own and read back.

It looks at what tests/rehearsal/test_cell_loop.py left (lab-a's `rehearsal-plate-001`), so it
runs after it, as `make rehearsal` orders them. Screenshots go to test-artifacts/ui/rehearsal-*.
"""

from __future__ import annotations

import re

import dagster as dg
import pytest
from playwright.sync_api import expect

from rehearsal.stack import Stack
from tests.rehearsal.conftest import failure_of, wait_for_run
from tests.test_ui import _is_red, browser, page, screenshot  # noqa: F401 (fixtures, used by name)

pytestmark = pytest.mark.rehearsal

DROP = "lab-a%2Frehearsal-plate-001"  # test_cell_loop's drop: its partition, URL-encoded
RUN_LINK = re.compile(r"^run [0-9a-f]{8}$")


@pytest.fixture(scope="session")
def dagster_ui(stack: Stack) -> str:
    """The rehearsal's webserver, where tests/test_ui.py's `page` opens its tabs."""
    return stack.webserver_url


def test_the_runs_page_lists_the_daemons_runs_of_the_drop(page, instance: dg.DagsterInstance):
    assert instance.get_runs(filters=dg.RunsFilter(tags={"dagster/partition": DROP.replace("%2F", "/")})), "test_cell_loop.py left no run of lab-a's drop"
    page.goto(f"/runs?q%5B0%5D=tag%3Adagster%2Fpartition%3D{DROP}")
    with screenshot(page, "rehearsal-drop-run"):
        expect(page.get_by_role("link", name=RUN_LINK)).to_have_count(1)  # one ingest of the drop, however often the daemon ticked
        expect(page.get_by_role("link", name="assay_ingest", exact=True)).to_be_visible()
        expect(page.get_by_text("Success", exact=True)).to_be_visible()
        expect(page.get_by_text("assay_drop_sensor").first).to_be_visible()  # launched by the daemon's sensor


def test_every_drops_checks_passed(page, instance: dg.DagsterInstance):
    """Every drop the rehearsal's labs sent passed its blocking checks; lab-a's first is materialized."""
    validated = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(["cell", "validated_assay"])), limit=100).records
    drops = {r.partition_key for r in validated}
    assert DROP.replace("%2F", "/") in drops, sorted(drops)
    page.goto("/assets/cell/validated_assay?view=checks")
    with screenshot(page, "rehearsal-drop-checks"):
        page.get_by_text("plate_schema", exact=True).first.click()
        page.get_by_role("tab", name="Execution history").or_(page.get_by_text("Execution history", exact=True)).first.click()
        passed = page.get_by_role("row").filter(has=page.get_by_text("Passed", exact=True))
        expect(passed).to_have_count(len(drops))  # one evaluation per drop, each passed
        assert not _is_red(passed.first.get_by_text("Passed", exact=True))
        expect(page.get_by_role("row").filter(has=page.get_by_text("Failed", exact=True))).to_have_count(0)
    page.goto(f"/assets/cell/validated_assay?view=partitions&partition={DROP}")
    with screenshot(page, "rehearsal-drop-partition"):
        expect(page.get_by_text(f"Materialized ({len(drops)})")).to_be_visible()  # every drop a lab sent, none failed
        expect(page.get_by_text("Failed (0)")).to_be_visible()


def test_the_ledger_report_materialized_from_the_ui(page, stack: Stack, instance: dg.DagsterInstance):
    """A platform engineer opens the ledger's report and materializes it: the run is queued, the
    daemon launches it (in a container of its own), and the page shows each lab's GPU time."""
    before = {r.run_id for r in instance.get_runs(limit=500)}
    page.goto("/assets/platform/ledger_summary")
    page.get_by_role("button", name=re.compile(r"\bMaterialize$")).first.click()  # its icon's name, then the label
    run = wait_for_run(instance, stack, lambda r: r.run_id not in before and r.job_name == "__ASSET_JOB", "the ledger report the UI asked for")
    assert run.status == dg.DagsterRunStatus.SUCCESS, f"{failure_of(instance, run)}\n{stack.logs()}"
    assert "dagster/sensor_name" not in run.tags  # a person's run, from the UI, not the daemon's sensors
    page.goto("/assets/platform/ledger_summary")
    with screenshot(page, "rehearsal-ledger"):
        row = page.get_by_role("row").filter(has=page.get_by_text("by_tenant", exact=True))
        expect(row.first).to_be_visible()
        row.first.get_by_text("[Show Markdown]").click()  # a markdown value opens in a dialog
        table = page.get_by_role("dialog").get_by_role("table")
        expect(table.get_by_role("columnheader", name="tenant", exact=True)).to_be_visible()
        for lab in ("lab-a", "lab-b"):  # each lab's GPU attempts, booked by the runs above
            expect(table.get_by_role("cell", name=lab, exact=True)).to_be_visible()
