"""The lines the architecture draws, computed from the code's own imports (tests/import_graph.py):
nothing here is a hand-kept list of files.

- A workload (every module a step names as its `entry_point`, and the qualification probe)
  and everything it imports use `dagster_pipes`, never `dagster`; no backend, no placement,
  no resource; nothing of the other lane.
- `shared_resources/runtime/` (the workload side) imports nothing of the project outside itself.
- No lane imports the other; nothing under `shared_resources/` imports a lane, a sensor, the
  command line, the drills or a code location; `drills/` imports no code location;
  `benchmarks/` imports no test.
- No two modules import each other, directly or through others.
- No product module is longer than about 400 lines.
- No product module imports a private module of Dagster (`dagster._...`).
"""

from __future__ import annotations

import ast

import pytest

from shared_resources.compute.health import PROBE_ENTRY_POINT
from tests import import_graph as graph

LANES = ("cell_lane", "robotics_lane")
# What a workload may not reach: Dagster itself and the orchestration side of the platform.
ORCHESTRATION = (
    "shared_resources.resources",
    "shared_resources.settings",
    "shared_resources.compute",
    "shared_resources.placement",
    "shared_resources.accounting",
    "shared_resources.data",
    "shared_resources.catalog",
)


def entry_points() -> set[str]:
    """Every module a step spec of the product names as its workload (`entry_point="..."`), and
    the probe. (The benchmarks' planner figures plan made-up steps that never run.)"""
    found = {PROBE_ENTRY_POINT}
    for module, path in graph.modules().items():
        if module.startswith("benchmarks"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "entry_point" and isinstance(node.value, ast.Constant):
                found.add(str(node.value.value))
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "entry_point" and isinstance(value, ast.Constant):
                        found.add(str(value.value))
    return found


def test_the_entry_points_are_found():
    points = entry_points()
    assert {"cell_lane.workloads.pretrain", "cell_lane.workloads.finetune", "robotics_lane.workloads.rollouts",
            "robotics_lane.workloads.train_policy", "shared_resources.runtime.probe", "testbed.counting_workload"} <= points
    missing = sorted(p for p in points if p not in graph.modules())
    assert not missing, f"entry points that are not modules of the project: {missing}"


@pytest.mark.parametrize("entry_point", sorted(entry_points()))
def test_a_workload_talks_back_only_through_pipes(entry_point):
    reached = [entry_point, *graph.closure(entry_point)]
    outside = graph.external_imports(entry_point)
    assert "dagster" not in outside and not any(n.startswith("dagster_") and n != "dagster_pipes" for n in outside), (
        f"{entry_point} reaches Dagster itself: only dagster_pipes may travel with a workload"
    )
    for module in reached:
        assert not module.startswith(ORCHESTRATION), f"{entry_point} reaches orchestration code: {graph.why(entry_point, module)}"
        own_lane = entry_point.split(".")[0]
        for lane in LANES:
            if lane != own_lane:
                assert not module.startswith(lane), f"{entry_point} reaches the other lane: {graph.why(entry_point, module)}"


def test_the_runtime_stays_on_its_side():
    runtime = [m for m in graph.modules() if m.startswith("shared_resources.runtime")]
    assert runtime
    for module in runtime:
        for reached in graph.closure(module):
            assert reached in ("shared_resources", "shared_resources.runtime") or reached.startswith("shared_resources.runtime."), (
                f"the workload runtime reaches {reached}: {graph.why(module, reached)}"
            )
        outside = graph.external_imports(module)
        assert "dagster" not in outside, f"{module} imports dagster (the runtime has dagster_pipes only)"


FORBIDDEN = {
    "cell_lane": ("robotics_lane", "sinewgrid", "drills", "platform_location", "testbed", "benchmarks"),
    "robotics_lane": ("cell_lane", "sinewgrid", "drills", "platform_location", "testbed", "benchmarks"),
    "shared_resources": ("cell_lane", "robotics_lane", "sensors", "sinewgrid", "drills", "platform_location", "testbed", "benchmarks"),
    "sensors": ("cell_lane", "robotics_lane", "sinewgrid", "drills", "platform_location", "testbed", "benchmarks"),
    "drills": ("platform_location", "sinewgrid", "benchmarks"),
    "testbed": ("cell_lane", "robotics_lane", "sinewgrid", "drills", "platform_location", "benchmarks"),
    "platform_location": ("cell_lane", "robotics_lane", "sinewgrid", "benchmarks"),
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_boundaries(package):
    for module in (m for m in graph.modules() if m.split(".")[0] == package):
        for name in graph.imports_of(module):
            assert name.split(".")[0] not in FORBIDDEN[package], f"{module} imports {name}"


def test_benchmarks_import_no_tests():
    for module in (m for m in graph.modules() if m.startswith("benchmarks")):
        assert not any(name.split(".")[0] == "tests" for name in graph.imports_of(module)), f"{module} imports the tests"


def test_no_import_cycles():
    assert graph.cycles() == [], "modules that import each other (move what they share into a module both import)"


def test_the_product_uses_only_dagsters_public_api():
    """Dagster's `_`-prefixed modules change without notice between releases; what the product
    needs is public (`dagster.open_pipes_session`, `dg.AddDynamicPartitionsRequest`, ...)."""
    private = {
        module: sorted(name for name in graph.imports_of(module) if name.split(".")[0].startswith("dagster") and "._" in name)
        for module in graph.modules()
    }
    private = {module: names for module, names in private.items() if names}
    assert not private, f"import these from `dagster` (import dagster as dg) instead: {private}"


def test_no_module_is_a_warehouse():
    long = {m: n for m, p in graph.modules().items() if (n := len(p.read_text().splitlines())) > 420}
    assert not long, f"modules over ~400 lines (split them by what they hold): {long}"


def test_the_environment_is_read_in_settings_and_the_workload_runtime_only():
    """`shared_resources/settings.py` reads the platform's environment; the workload runtime reads
    the node's own few variables. Nothing else looks at `os.environ`."""
    allowed = ("shared_resources.settings", "shared_resources.runtime.")
    readers = sorted(
        module
        for module, path in graph.modules().items()
        if not module.startswith(("benchmarks", *allowed)) and ("os.environ" in path.read_text() or "os.getenv" in path.read_text())
    )
    assert readers == [], f"read the environment through shared_resources.settings instead: {readers}"
