"""The lines the architecture draws, computed from the code's own imports (tests/import_graph.py):
nothing here is a hand-kept list of files.

- A workload (every module a step names as its `entry_point`, and the qualification probe)
  and everything it imports use `dagster_pipes`, never `dagster`; no backend, no placement,
  no resource; nothing of the other lane.
- `workload_runtime/` (the workload side) imports nothing of the project outside itself.
- The platform's rooms stack, and no arrow runs back up: `workload_runtime/` at the bottom, then
  `control_plane/`, `data_layer/`, `model_gateway/`, and the Dagster resources
  (`shared_resources/`) on top; none of them imports a lane, a sensor, the command line, the
  drills, a code location or the test bed.
- No lane imports the other; `drills/` imports no code location; `benchmarks/` imports no test.
- No two modules import each other, directly or through others, not even only for a type checker.
- No product module is longer than about 400 lines.
- No product module imports a private module of Dagster (`dagster._...`).
"""

from __future__ import annotations

import ast

import pytest

from control_plane.compute.health import PROBE_ENTRY_POINT
from tests import import_graph as graph

LANES = ("cell_lane", "robotics_lane")
# What a workload may not reach: Dagster itself and the orchestration side of the platform.
ORCHESTRATION = ("control_plane", "data_layer", "model_gateway", "shared_resources")


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
            "robotics_lane.workloads.train_policy", "workload_runtime.probe", "testbed.counting_workload"} <= points
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
        assert module.split(".")[0] not in ORCHESTRATION, f"{entry_point} reaches orchestration code: {graph.why(entry_point, module)}"
        own_lane = entry_point.split(".")[0]
        for lane in LANES:
            if lane != own_lane:
                assert not module.startswith(lane), f"{entry_point} reaches the other lane: {graph.why(entry_point, module)}"


def test_the_runtime_stays_on_its_side():
    runtime = [m for m in graph.modules() if m.startswith("workload_runtime")]
    assert runtime
    for module in runtime:
        for reached in graph.closure(module):
            assert reached == "workload_runtime" or reached.startswith("workload_runtime."), (
                f"the workload runtime reaches {reached}: {graph.why(module, reached)}"
            )
        outside = graph.external_imports(module)
        assert "dagster" not in outside, f"{module} imports dagster (the runtime has dagster_pipes only)"


# What sits above the platform: none of the platform's rooms may import these.
ABOVE_THE_PLATFORM = ("cell_lane", "robotics_lane", "sensors", "sinewgrid", "drills", "platform_location", "testbed", "rehearsal", "benchmarks")
# The platform's rooms from the bottom up: each may import only the rooms below it.
PLATFORM = ("workload_runtime", "control_plane", "data_layer", "model_gateway", "shared_resources")
FORBIDDEN = {
    **{room: (*PLATFORM[i + 1 :], *ABOVE_THE_PLATFORM) for i, room in enumerate(PLATFORM)},
    "cell_lane": ("robotics_lane", "sinewgrid", "drills", "platform_location", "testbed", "rehearsal", "benchmarks"),
    "robotics_lane": ("cell_lane", "sinewgrid", "drills", "platform_location", "testbed", "rehearsal", "benchmarks"),
    "sensors": ("cell_lane", "robotics_lane", "sinewgrid", "drills", "platform_location", "testbed", "rehearsal", "benchmarks"),
    "drills": ("platform_location", "sinewgrid", "benchmarks"),
    "testbed": ("cell_lane", "robotics_lane", "sinewgrid", "drills", "platform_location", "benchmarks"),
    "platform_location": ("cell_lane", "robotics_lane", "sinewgrid", "rehearsal", "benchmarks"),
    # The production rehearsal drives the platform from outside, as a customer and a lab system do.
    "rehearsal": ("cell_lane", "robotics_lane", "sinewgrid", "drills", "platform_location", "benchmarks"),
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


def test_no_import_cycles_even_for_a_type_checker():
    assert graph.cycles(type_only=True) == [], (
        "modules that import each other under `if TYPE_CHECKING:` (type against a Protocol in a module both import)"
    )


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


# Who reads the environment: the orchestration side in settings.py (which also writes it and
# hands it on to children: it is that side's one module for it), the workload side in node_env.py.
SETTINGS = "control_plane.settings"
ENVIRONMENT_READERS = (SETTINGS, "workload_runtime.node_env")
# Who may write it, and why: each writes what a library or child reads from the environment alone.
ENVIRONMENT_WRITERS = {
    "workload_runtime.tenant_access": "sets the tenant's AWS_* credentials: boto and s3fs find them only there",
    "workload_runtime.forkserver": "gives a forked workload its launcher's environment in place of the server's",
    "workload_runtime.codecs": "sets SVT_LOG, which the AV1 encoder's C library reads",
}
# Who may hand the whole environment on to a child process (`{**os.environ, ...}`) without reading it.
ENVIRONMENT_HANDED_ON = {
    "workload_runtime.ray_gang": "a Ray actor starts its rank with its own environment plus the rendezvous "
    "variables; pickled by value, the actor cannot import node_env",
}
_WRITES = {"pop", "clear", "update", "setdefault", "__setitem__", "__delitem__"}


def environment_uses(tree: ast.AST) -> set[str]:
    """How a module uses `os.environ` / `os.getenv`: `read`, `write` or `handed on`."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & {"environ", "getenv", "getenvb", "environb"}:
            uses.add("read")
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"):
            continue
        if node.attr in ("getenv", "getenvb"):
            uses.add("read")
        elif node.attr in ("environ", "environb"):
            parent = parents.get(node)
            if isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store | ast.Del):
                uses.add("write")
            elif isinstance(parent, ast.Attribute) and parent.attr in _WRITES:
                uses.add("write")
            elif isinstance(parent, ast.Dict) and node in parent.values and parent.keys[parent.values.index(node)] is None:
                uses.add("handed on")
            else:
                uses.add("read")
    return uses


def test_environment_uses_are_told_apart():
    found = environment_uses(ast.parse(
        "import os\nos.environ['A'] = '1'\nos.environ.pop('B')\nchild = {**os.environ, 'C': '1'}\n"
    ))
    assert found == {"write", "handed on"}
    assert environment_uses(ast.parse("import os\nx = os.environ.get('A')")) == {"read"}
    assert environment_uses(ast.parse("import os\nx = 'A' in os.environ")) == {"read"}
    assert environment_uses(ast.parse("from os import getenv")) == {"read"}


def test_the_environment_is_read_in_settings_and_node_env_only():
    """`control_plane/settings.py` reads the platform's environment and
    `workload_runtime/node_env.py` the node's, for the workload side. Nothing else reads
    it; the few modules that write it, or hand it on to a child, are named above with why."""
    wrong = []
    for module, path in sorted(graph.modules().items()):
        if module.startswith("benchmarks") or module == SETTINGS:
            continue
        uses = environment_uses(ast.parse(path.read_text()))
        if "read" in uses and module not in ENVIRONMENT_READERS:
            wrong.append(f"{module} reads the environment: read it through control_plane.settings (orchestration) or workload_runtime.node_env (workload)")
        if "write" in uses and module not in ENVIRONMENT_WRITERS:
            wrong.append(f"{module} writes the environment: add it to ENVIRONMENT_WRITERS with the reason, or pass the value instead")
        if "handed on" in uses and module not in ENVIRONMENT_HANDED_ON:
            wrong.append(f"{module} hands the environment on to a child: add it to ENVIRONMENT_HANDED_ON with the reason")
    assert wrong == [], "\n".join(wrong)
    for module in [*ENVIRONMENT_READERS, *ENVIRONMENT_WRITERS, *ENVIRONMENT_HANDED_ON]:
        assert module in graph.modules(), f"{module} is named here but is no module of the project"
