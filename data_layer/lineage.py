"""Lineage: every result records what it was made from, down to the drops that fed it.

Each dataset version, training run, evaluation and proposal writes one small JSON record
under `<root>/lineage/<id>.json` naming its inputs by id. Walking the inputs gives the
whole chain, for example::

    robotics/sim_evaluation/3c9a0e-mujoco            (evaluation)
    └── robotics/policy/3c9a0e                       (model: checkpoint step-00001500, code 4eb05ce)
        ├── robotics/teleop@teleop-session-001       (dataset: DVC md5 …, registry rev …)
        │   └── drop/teleop/teleop-session-001       (raw drop, as the operator sent it)
        └── robotics/rollouts@2026-11-20_cartpole-…  (dataset)

Ids are the names people already use: a dataset version's registry ref (`cell/omics@<v>`),
a run's checkpoint lineage (`cell/foundation_model/<run>`), a raw drop (`drop/<kind>/<id>`).
`sinewgrid lineage THING` prints the chain for an id, a unique part of one, or a URI.
Records are plain JSON in the storage root, so they travel with the data to any cloud.
"""

from __future__ import annotations

import datetime as dt
import posixpath
from dataclasses import asdict, dataclass, field
from typing import Any

from control_plane.settings import code_version
from workload_runtime.storage import glob_uris, read_json, write_json_atomic


class LineageNotFound(LookupError):
    """No lineage record matches what was asked for."""


@dataclass(frozen=True)
class Node:
    """One thing in the lineage graph and the ids of what it was made from."""

    id: str
    kind: str  # drop | dataset | model | evaluation | proposal
    title: str
    inputs: list[str] = field(default_factory=list)
    uri: str = ""
    code_version: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""

    def describe(self) -> str:
        """One line: id, kind and the facts a reader checks first."""
        shown = ", ".join(f"{k} {v}" for k, v in self.facts.items() if v not in (None, "", [], {}))
        code = f", code {self.code_version[:12]}" if self.code_version else ""
        return f"{self.id} ({self.kind}{code}{', ' + shown if shown else ''})"


@dataclass
class Tree:
    node: Node
    children: list[Tree]
    missing: list[str]  # inputs whose records are gone (named, never silently dropped)
    repeated: bool = False  # already shown above (a diamond in the graph)


class LineageStore:
    """The lineage records under one storage root."""

    def __init__(self, root: str):
        self.root = root.rstrip("/")
        self.base = posixpath.join(self.root, "lineage")

    def _uri(self, node_id: str) -> str:
        if not node_id or node_id.startswith("/") or ".." in node_id.split("/"):
            raise ValueError(f"lineage id {node_id!r} is not a relative name like 'cell/omics@<version>'")
        return posixpath.join(self.base, f"{node_id}.json")

    def record(self, node_id: str, kind: str, title: str, *, inputs: list[str] | None = None, uri: str = "", facts: dict[str, Any] | None = None) -> Node:
        """Write (or rewrite) the record of `node_id`, stamped with the code version that made it."""
        node = Node(
            id=node_id,
            kind=kind,
            title=title,
            inputs=list(dict.fromkeys(inputs or [])),
            uri=uri,
            code_version=code_version(),
            facts={k: getattr(v, "value", v) for k, v in (facts or {}).items()},
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )
        write_json_atomic(self._uri(node_id), asdict(node))
        return node

    def get(self, node_id: str) -> Node:
        uri = self._uri(node_id)
        try:
            return Node(**read_json(uri))
        except FileNotFoundError:
            raise LineageNotFound(f"no lineage record for {node_id!r} (looked for {uri})") from None

    def ids(self) -> list[str]:
        prefix = self.base + "/"
        found = []
        for uri in glob_uris(posixpath.join(self.base, "**", "*.json")):
            rel = uri[uri.find(prefix) + len(prefix):] if prefix in uri else uri.split("/lineage/", 1)[-1]
            found.append(rel.removesuffix(".json"))
        return sorted(found)

    def resolve(self, thing: str) -> Node:
        """A record by its id, a unique part of an id, or a URI it was made at (checkpoint, dataset)."""
        thing = thing.strip().rstrip("/")
        ids = self.ids()
        if thing in ids:
            return self.get(thing)
        by_uri = [self.get(i) for i in ids]
        at_uri = [n for n in by_uri if n.uri and (thing == n.uri.rstrip("/") or thing.startswith(n.uri.rstrip("/") + "/") or n.uri.startswith(thing + "/"))]
        if len(at_uri) == 1:
            return at_uri[0]
        partial = [i for i in ids if thing in i]
        if len(partial) == 1:
            return self.get(partial[0])
        if partial or len(at_uri) > 1:
            choices = partial or [n.id for n in at_uri]
            raise LineageNotFound(f"{thing!r} matches {len(choices)} records; say which: " + ", ".join(choices[:12]))
        hint = ", ".join(i for i in ids if "/" in i and not i.startswith("drop/"))[:600] or "none yet: materialize a dataset or train a model first"
        raise LineageNotFound(f"nothing in {self.base} matches {thing!r}. Known: {hint}")

    def tree(self, node_id: str) -> Tree:
        """The whole chain below `node_id`; each node read and expanded once."""
        read: dict[str, Node | None] = {}

        def get(input_id: str) -> Node | None:
            if input_id not in read:
                try:
                    read[input_id] = self.get(input_id)
                except LineageNotFound:
                    read[input_id] = None
            return read[input_id]

        seen: set[str] = set()

        def build(node: Node) -> Tree:
            if node.id in seen:
                return Tree(node, [], [], repeated=True)
            seen.add(node.id)
            children, missing = [], []
            for input_id in node.inputs:
                if (child := get(input_id)) is None:
                    missing.append(input_id)
                else:
                    children.append(build(child))
            return Tree(node, children, missing)

        return build(self.get(node_id))

    def upstream(self, node_id: str, kind: str | None = None) -> list[Node]:
        """Every ancestor of `node_id` (optionally only one kind, e.g. every raw drop), in walk order."""
        found: dict[str, Node] = {}

        def walk(tree: Tree) -> None:
            for child in tree.children:
                if child.node.id not in found and (kind is None or child.node.kind == kind):
                    found[child.node.id] = child.node
                walk(child)

        walk(self.tree(node_id))
        return list(found.values())

    def markdown(self, node_id: str) -> str:
        """The chain as a nested Markdown list, for Dagster metadata (code versions shown where they change)."""
        lines: list[str] = []

        def emit(tree: Tree, depth: int, parent_code: str) -> None:
            pad = "  " * depth
            suffix = " (shown above)" if tree.repeated else ""
            facts = _facts(tree.node, show_code=tree.node.code_version != parent_code)
            lines.append(f"{pad}- **{tree.node.id}**{suffix}: {tree.node.title}" + (f" — {facts}" if facts and not tree.repeated else ""))
            for child in tree.children:
                emit(child, depth + 1, tree.node.code_version)
            for gone in tree.missing:
                lines.append(f"{pad}  - {gone} (record missing)")

        emit(self.tree(node_id), 0, "")
        return "\n".join(lines)


def _facts(node: Node, show_code: bool = True) -> str:
    shown = [f"{k}: {v}" for k, v in node.facts.items() if v not in (None, "", [], {})]
    if node.code_version and show_code:
        shown.append(f"code {node.code_version[:12]}")
    return "; ".join(shown)
