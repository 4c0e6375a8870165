"""The Dagster UI on the demo's instance shows what a newcomer looks for.

`dagster-webserver` serves the project's workspace (workspace.yaml, what `make ui` opens) on
the instance `sinewgrid demo` left (tests/fixtures/demo.py), and Debian's Chromium, driven by
Playwright, opens (with no first-visit dialog over them): both lanes' asset graphs, the bad assay drop's failed checks and quarantine
table, the `held_out_rmse` plot of the fine-tuned model and the robotics nightly schedule.
Every page is kept as a screenshot under test-artifacts/ui/ (docs/testing.md, "What `make test` installs and starts").
With `SINEWGRID_UI_TOUR=1` (`make ui-tour`) the pages docs/ui-tour.md shows are written again into
docs/ui-tour/, half size and in 256 colours, for the tour to be committed with them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect, sync_playwright

from robotics_lane.defs.partitions import sweep_partition_keys
from robotics_lane.sweeps import SWEEPS
from testbed.webserver import WORKSPACE, dagster_webserver
from tests.fixtures.demo import DemoRun

pytestmark = pytest.mark.ui

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "test-artifacts" / "ui"
TOUR = REPO / "docs" / "ui-tour"  # the pictures of docs/ui-tour.md, written under `make ui-tour`
TOUR_PICTURES = {
    "asset-graph-cell", "asset-graph-robotics", "failed-check-plate_schema-metadata", "quarantine-partition",
    "quarantine-table", "quarantine-run", "rounds-lab-a", "nightly-schedule-runs",
}
# Debian's Chromium (mk/ui.mk installs it); Playwright's own browser download is never used.
CHROMIUM = Path(os.environ.get("SINEWGRID_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Generous: the UI loads three code locations' data over GraphQL on a busy two-core machine.
UI_TIMEOUT_MS = 90_000
BAD_DROP = "seed-plate-bad-export"  # the demo's deliberately broken assay export
BAD_PARTITION = f"lab-a%2F{BAD_DROP}"  # lab-a's drop: the partition `<lab>/<drop_id>`, URL-encoded
RUN_LINK = re.compile(r"^run [0-9a-f]{8}$")  # a run in the Runs list: its icon and short id


def lane_assets(location: str) -> dict[str, str]:
    """{asset name: group} of one code location, from the module workspace.yaml loads for it."""
    entries = [e["python_module"] for e in yaml.safe_load(WORKSPACE.read_text())["load_from"]]
    module = next(e["module_name"] for e in entries if e["location_name"] == location)
    graph = importlib.import_module(module).defs.resolve_asset_graph()
    return {key.path[-1]: graph.get(key).group_name for key in graph.get_all_asset_keys()}


# The texts of the innermost elements under the matched ones: a graph node's title, counts, labels.
LEAF_TEXTS = "els => els.flatMap(e => [...e.querySelectorAll('*')].filter(x => !x.children.length).map(x => x.textContent.trim()))"


def shown_as(name: str, label: str) -> bool:
    """True when a graph node's `label` is `name`, whole or shortened around an ellipsis
    ("real_r…_evaluation"), as a zoomed-out graph draws long names."""
    if label == name:
        return True
    head, ellipsis, tail = label.partition("…")
    return bool(ellipsis) and len(head) + len(tail) < len(name) and name.startswith(head) and name.endswith(tail)


@contextlib.contextmanager
def screenshot(page, name: str) -> Iterator[None]:
    """Keep the page as test-artifacts/ui/NAME.png when the block ends, passed or failed."""
    try:
        yield
    finally:
        # Best effort, for a picture with the asset statuses in: the UI's last queries answered.
        with contextlib.suppress(PlaywrightTimeoutError):
            page.wait_for_load_state("networkidle", timeout=10_000)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True, animations="disabled")
        if name in TOUR_PICTURES and os.environ.get("SINEWGRID_UI_TOUR") == "1":
            _tour_picture(SCREENSHOTS / f"{name}.png", TOUR / f"{name}.png")


def _tour_picture(source: Path, target: Path) -> None:
    """A screenshot small enough to commit: half its size, 256 colours (~50 kB)."""
    from PIL import Image

    with Image.open(source) as image:
        small = image.convert("RGB").resize((image.width // 2, image.height // 2), Image.Resampling.LANCZOS)
    target.parent.mkdir(parents=True, exist_ok=True)
    small.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)


# Session-scoped, like the demo it serves: in a shuffled order (`make test-random`) another
# module's test may run between two of these, and a module fixture would start it all again.
@pytest.fixture(scope="session")
def dagster_ui(demo_run: DemoRun) -> Iterator[str]:
    """The base URL of a webserver on the demo's instance (stopped, with its code servers, after the session)."""
    demo_run.require_success()
    with dagster_webserver(demo_run.dagster_home, demo_run.home) as url:
        print(f"Dagster UI on the demo's instance at {url}; screenshots in {SCREENSHOTS}")
        yield url


@pytest.fixture(scope="module")
def browser():
    """Chromium for this module only: while Playwright's sync API is open it marks the worker's asyncio loop as
    running, so any later test on the same worker that calls `asyncio.run` (LiteLLM's batch client does) would fail."""
    if not CHROMIUM.exists():
        pytest.fail(f"The UI test drives Debian's Chromium at {CHROMIUM}, which is missing. Install it: `make ui-packages` (as root).")
    expect.set_options(timeout=UI_TIMEOUT_MS)
    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, dagster_ui: str):
    """A fresh browser tab on the UI. Dagster's first-visit "Join the community" dialog must never
    cover it (the instance turns it off, sinewgrid/instance.py): if it shows, it is skipped so the
    test goes on, and the test fails at its end."""
    context = browser.new_context(base_url=dagster_ui, viewport={"width": 1600, "height": 1000})
    context.set_default_timeout(UI_TIMEOUT_MS)
    tab = context.new_page()
    prompts: list[str] = []

    def skip(dialog) -> None:
        prompts.append(tab.url)
        dialog.get_by_role("button", name="Skip").click()

    tab.add_locator_handler(tab.get_by_role("dialog").filter(has_text="Join the Dagster community"), skip)
    try:
        yield tab
    finally:
        context.close()
    assert not prompts, f"Dagster's first-visit dialog covered {prompts}: the embedded instance must set `nux: enabled: false`"


LOCATIONS = [entry["python_module"]["location_name"] for entry in yaml.safe_load(WORKSPACE.read_text())["load_from"]]


def test_the_ui_asks_nothing_of_a_first_visitor(dagster_ui: str):
    """Dagster's UI asks the webserver whether to show its "Join the community" dialog: never, here."""
    request = urllib.request.Request(f"{dagster_ui}/graphql", data=json.dumps({"query": "{ shouldShowNux }"}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read()) == {"data": {"shouldShowNux": False}}


def test_every_code_location_loads(page):
    page.goto("/locations")
    with screenshot(page, "code-locations"):
        for location in LOCATIONS:
            expect(page.get_by_role("link", name=f"{location} {location}")).to_be_visible()
    for location in LOCATIONS:
        page.goto(f"/locations/{location}")
        with screenshot(page, f"code-location-{location}"):
            expect(page.get_by_role("row").filter(has_text="Status")).to_contain_text("Loaded")


@pytest.mark.parametrize("location", ["cell", "robotics"])
def test_each_lane_shows_its_asset_graph(page, location: str):
    assets = lane_assets(location)
    # The lineage graph of the lane, every group opened.
    page.goto(f"/asset-groups~code_location:{location}")
    with screenshot(page, f"asset-graph-{location}"):
        for group in set(assets.values()):
            expect(page.get_by_text(group, exact=True).first).to_be_visible()
        graph_settings = page.get_by_role("button").filter(has=page.get_by_role("img", name="settings", exact=True)).filter(has_not_text="Settings")
        graph_settings.click()
        page.get_by_role("menuitem", name="Expand all groups").click()
        page.keyboard.press("Escape")  # close the menu, so the screenshot shows the whole graph
        nodes = page.locator("foreignObject")  # every node of Dagster's graph is an HTML box inside the SVG
        missing = list(assets)
        for _ in range(UI_TIMEOUT_MS // 500):
            labels = set(nodes.evaluate_all(LEAF_TEXTS))
            missing = [name for name in assets if not any(shown_as(name, label) for label in labels)]
            if not missing:
                break
            page.wait_for_timeout(500)
        assert not missing, f"the {location} lane's asset graph lacks {missing}; its nodes read {sorted(labels)}"
    # The catalog of the lane: every asset by its full key, with its description.
    page.goto(f"/assets?asset-selection=code_location:{location}")
    with screenshot(page, f"asset-catalog-{location}"):
        for name in assets:
            expect(page.locator(f"a[href='/assets/{location}/{name}'], a[href^='/assets/{location}/{name}?']").first).to_be_visible()


def _is_red(locator) -> bool:
    red, green, blue = (int(c) for c in re.findall(r"\d+", locator.evaluate("e => getComputedStyle(e).color"))[:3])
    return red > 1.5 * green and red > 1.5 * blue


@pytest.mark.parametrize(("check", "rule"), [("plate_schema", "non_numeric_readout"), ("plate_layout_and_controls", "duplicate_well")])
def test_bad_drop_fails_its_plate_checks_in_red(page, check: str, rule: str):
    page.goto("/assets/cell/validated_assay?view=checks")
    with screenshot(page, f"failed-check-{check}"):
        page.get_by_text(check, exact=True).first.click()
        page.get_by_role("tab", name="Execution history").or_(page.get_by_text("Execution history", exact=True)).first.click()
        failed_rows = page.get_by_role("row").filter(has=page.get_by_text("Failed", exact=True))
        expect(failed_rows).to_have_count(2)  # each lab's bad drop (both labs' stand-ins drop one); every other drop passed
        failed = failed_rows.first
        status = failed.get_by_text("Failed", exact=True)
        assert _is_red(status), f"the failed {check} result is not shown in red: {status.evaluate('e => getComputedStyle(e).color')}"
    with screenshot(page, f"failed-check-{check}-metadata"):
        failed.get_by_role("button").last.click()  # its metadata: the first issue, file, row and well
        reasons = page.get_by_role("dialog")
        expect(reasons).to_contain_text(rule)
        expect(reasons).to_contain_text("SEED-BAD.csv")


def test_bad_drop_reads_failed_with_its_quarantine_table(page, demo_run: DemoRun):
    sent = sorted(p.parent.relative_to(demo_run.home / "tenants") for p in (demo_run.home / "tenants").glob("*/landing/assays/*/manifest.json"))
    assert len(sent) > 2, f"the demo's labs sent {len(sent)} drops"
    page.goto(f"/assets/cell/validated_assay?view=partitions&partition={BAD_PARTITION}")
    with screenshot(page, "quarantine-partition"):
        # Dagster's own state: the partition failed (no materialization), red in the partition list.
        expect(page.get_by_text("Failed (2)")).to_be_visible()  # each lab's bad drop; every other drop passed
        # One partition per drop a lab sent, `<lab>/<drop_id>`: none that no lab sent, so none missing.
        expect(page.get_by_text(f"{len(sent)} Partitions Selected")).to_be_visible()
        expect(page.get_by_text(f"Materialized ({len(sent) - 2})")).to_be_visible()
        expect(page.get_by_text("Missing (0)")).to_be_visible()
        expect(page.get_by_text("failed, and did not materialize this asset")).to_be_visible()
        expect(page.get_by_text("Materialized", exact=True)).to_have_count(0)
    # What went wrong and where the files are: the observation of the partition.
    page.get_by_role("button", name=re.compile(r"View all historical events")).click()
    events = page.get_by_role("dialog")
    events.get_by_role("row").filter(has_text="Observation").first.click()  # its metadata, unfolded
    with screenshot(page, "quarantine-table"):
        expect(events.get_by_text("quarantined", exact=True).first).to_be_visible()
        expect(events.get_by_text(f"quarantine/assays/{BAD_DROP}").first).to_be_visible()
        for header in ("file", "row", "well", "rule", "what to do"):
            expect(events.get_by_role("columnheader", name=header, exact=True)).to_be_visible()
        for rule, well in (("duplicate_well", "A05"), ("non_numeric_readout", "B09")):
            expect(events.get_by_role("row").filter(has_text=rule).filter(has_text=well).filter(has_text="SEED-BAD.csv").last).to_be_visible()
    page.keyboard.press("Escape")
    # The catalog a user scans: the asset's row counts the failed drops in red, and none missing.
    page.goto("/assets?asset-selection=code_location:cell")
    with screenshot(page, "quarantine-catalog"):
        link = page.locator("a[href='/assets/cell/validated_assay']").first
        row = link.locator("xpath=ancestor::*[contains(normalize-space(.), ' partitions')][1]")
        expect(row).to_contain_text(f"{len(sent)} partitions")

        def count(icon: str):  # the number beside one of the row's partition-state icons
            return row.get_by_role("img", name=icon, exact=True).first.locator("xpath=..")

        expect(count("partition_failure")).to_have_text("2")
        expect(count("partition_missing")).to_have_text("0")
    # The one run that ingested it failed: its blocking checks stopped it.
    page.goto(f"/runs?q%5B0%5D=tag%3Adagster%2Fpartition%3D{BAD_PARTITION}")
    with screenshot(page, "quarantine-run"):
        expect(page.get_by_role("link", name=RUN_LINK)).to_have_count(1)
        expect(page.get_by_role("link", name="assay_ingest", exact=True)).to_be_visible()
        expect(page.get_by_text("Failure", exact=True)).to_be_visible()


def test_finetuned_model_plots_held_out_rmse(page):
    page.goto("/assets/cell/finetuned_model")
    with screenshot(page, "held-out-rmse-overview"):
        expect(page.get_by_text("held_out_rmse").first).to_be_visible()  # the description explains it
        page.get_by_role("button", name=re.compile(r"\bPlots$")).click()  # beside "Table", above the metadata
        # The plot's card: the nearest box around the metric's title that holds a chart.
        card = page.locator("xpath=//span[normalize-space(.)='held_out_rmse']/ancestor::div[.//canvas][1]")
        expect(card).to_be_visible()
        card.scroll_into_view_if_needed()
        chart = card.locator("canvas").first
        expect(chart).to_be_visible()
        # A drawn chart, not an empty canvas: its axes, labels and line leave coloured pixels.
        drawn = 0
        for _ in range(UI_TIMEOUT_MS // 500):
            drawn = chart.evaluate(
                """c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
                         for (let i = 3; i < d.length; i += 4) { if (d[i] > 0) n++; } return n; }"""
            )
            if drawn > 1000:
                break
            page.wait_for_timeout(500)
        assert drawn > 1000, f"the held_out_rmse plot's canvas is (nearly) empty: {drawn} drawn pixels"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        card.screenshot(path=str(SCREENSHOTS / "held-out-rmse-plot.png"))


def test_finetuned_model_charts_each_labs_rounds(page, demo_run: DemoRun):
    with dg.DagsterInstance.from_config(str(demo_run.dagster_home)) as instance:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["cell", "finetuned_model"]), asset_partitions=["lab-a"]), limit=20, ascending=True
        ).records
        rounds = [(r.asset_materialization.metadata["finetune_id"].value, r.asset_materialization.metadata["held_out_rmse"].value) for r in records]
    assert len(rounds) > 1, f"the demo fine-tuned lab-a's model {len(rounds)} time(s)"
    page.goto("/assets/cell/finetuned_model?view=partitions&partition=lab-a")
    with screenshot(page, "rounds-lab-a"):
        row = page.get_by_role("row").filter(has=page.get_by_text("rounds", exact=True))
        expect(row).to_be_visible()
        row.get_by_text("[Show Markdown]").click()  # a markdown value opens in a dialog
        dialog = page.get_by_role("dialog")
        chart = dialog.get_by_role("img", name="lab-a rounds")
        expect(chart).to_be_visible()
        assert chart.evaluate("i => i.complete ? i.naturalWidth : 0") > 400, "the rounds chart did not load"
        # Its series, in the table under it: lab-a's rounds only, oldest first, each with its error.
        text = dialog.inner_text()
        for number, (finetune_id, rmse) in enumerate(rounds, start=1):
            shown = re.search(rf"^\s*{number}\s+{finetune_id}\S*\s+([0-9.]+)\s", text, re.M)
            assert shown, f"round {number} ({finetune_id}) is not in the chart's table:\n{text}"
            assert float(shown.group(1)) == pytest.approx(rmse, abs=1e-4), f"round {number}: the table shows held_out_rmse {shown.group(1)}, the model recorded {rmse}"
        assert not re.search(rf"^\s*{len(rounds) + 1}\s", text, re.M), "the chart has more rounds than lab-a's fine-tunes"


def test_robotics_nightly_schedule(page):
    page.goto("/locations/robotics/schedules/nightly_sweep_schedule")
    with screenshot(page, "nightly-schedule"):
        expect(page.get_by_text("nightly_sweep_schedule").first).to_be_visible()
        def field(name: str):  # a row of the schedule's table, by its label
            return page.get_by_role("row", name=re.compile(rf"^{name}\b"))

        expect(field("Description")).to_contain_text("Every night at 02:00 UTC")
        expect(field("Schedule")).to_contain_text("0 2 * * *")
        expect(field("Target").get_by_role("link", name="nightly_sweep", exact=True)).to_be_visible()
        expect(field("Running").get_by_role("checkbox")).to_be_checked()  # on by default
    # The night's sweeps it launched in the demo, one per configuration. (The demo's ticker
    # evaluates schedules itself, so the page's tick history is empty; the runs carry its name.)
    page.goto("/runs?q%5B0%5D=tag%3Adagster%2Fschedule_name%3Dnightly_sweep_schedule")
    with screenshot(page, "nightly-schedule-runs"):
        expect(page.get_by_role("link", name=RUN_LINK)).to_have_count(len(SWEEPS))
        expect(page.get_by_text("Success", exact=True)).to_have_count(len(SWEEPS))
        for config in sweep_partition_keys():  # each sweep at its scene version
            expect(page.get_by_text(f"sinewgrid/sweep: {config}", exact=True)).to_be_visible()
