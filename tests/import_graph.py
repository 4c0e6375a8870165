"""The project's import graph, read from the source (no module is imported).

Every `import` and `from ... import` of every product module counts, wherever it stands (a
lazy import inside a function still ties two modules), except those under
`if TYPE_CHECKING:`. `from package import name` counts as an import of `package.name` when
that is a module of the project.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCT_PACKAGES = ("workload_runtime", "control_plane", "data_layer", "model_gateway", "shared_resources", "cell_lane", "robotics_lane", "sensors", "platform_location", "drills", "sinewgrid", "testbed", "rehearsal", "benchmarks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every product module by dotted name."""
    found = {}
    for package in PRODUCT_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            found[module_name(path)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST, type_only: bool = False) -> Iterable[ast.Import | ast.ImportFrom]:
    """The imports that run (with `type_only`, those under `if TYPE_CHECKING:` too)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node) and not type_only:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


@cache
def imports_of(module: str, type_only: bool = False) -> frozenset[str]:
    """What `module` imports: dotted names, project modules resolved to the module itself (with
    `type_only`, the imports only a type checker runs count too)."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path)), type_only):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        names.add(base)
        for alias in node.names:
            if f"{base}.{alias.name}" in modules():
                names.add(f"{base}.{alias.name}")
    return frozenset(names)


def project_imports(module: str, type_only: bool = False) -> set[str]:
    """The project modules `module` imports (a package import counts as its `__init__`)."""
    return {name for name in imports_of(module, type_only) if name in modules()}


def _parents(module: str) -> set[str]:
    """The packages Python runs before `module` (`a.b.c` runs `a` and `a.b` first)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))} & set(modules())


def closure(module: str) -> dict[str, str]:
    """Every project module that importing `module` runs (what it imports, their parent
    packages, and so on), each with the module that brings it in."""
    reached: dict[str, str] = {}
    todo = [module]
    while todo:
        current = todo.pop()
        for name in sorted(project_imports(current) | _parents(current)):
            if name not in reached and name != module:
                reached[name] = current
                todo.append(name)
    return reached


def external_imports(module: str) -> set[str]:
    """Top-level names of what `module` and everything it reaches import from outside the project."""
    tops = set()
    for name in [module, *closure(module)]:
        tops.update(n.split(".")[0] for n in imports_of(name) if n not in modules() and n.split(".")[0] not in PRODUCT_PACKAGES)
    return tops


def cycles(type_only: bool = False) -> list[list[str]]:
    """Groups of project modules that import each other, directly or not (Tarjan's SCC); with
    `type_only`, through imports only a type checker runs too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for succ in project_imports(node, type_only):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                group.append(item)
                if item == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(modules()):
        if module not in index:
            visit(module)
    return found


def why(module: str, target: str) -> str:
    """The chain of imports from `module` to `target`, for an error message."""
    reached = closure(module)
    chain = [target]
    while chain[-1] != module and chain[-1] in reached:
        chain.append(reached[chain[-1]])
    return " <- ".join(chain)
