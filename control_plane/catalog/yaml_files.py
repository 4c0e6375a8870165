"""Reading the platform's YAML files (pool catalogs, job files) strictly.

Plain YAML keeps the last of two equal keys in one mapping and says nothing, so a catalog
with two pools of the same name would quietly lose one. `UniqueKeyLoader` refuses that,
naming the entry and both lines; `read_yaml_mapping` turns every way a file can be
unusable (missing, a folder, not UTF-8, empty, not YAML, not a mapping, a repeated key)
into one error naming the file, what is wrong and what the file must hold; and
`validation_problems` says what pydantic refused in one, as every catalog and job file says it:
the file, the entry, the field, what is wrong and how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

# A repeated key directly under one of these sections is a repeated entry of that kind.
ENTRY_KINDS = {"pools": "pool", "steps": "step", "datasets": "dataset", "tenants": "tenant", "providers": "provider", "budgets": "budget"}


class RepeatedKeyError(yaml.YAMLError):
    """One or more mappings in a YAML document hold the same key twice."""

    def __init__(self, repeats: list[tuple[tuple[str, ...], str, int, int]]) -> None:
        self.repeats = repeats  # (where: the keys above the mapping, key, first line, second line)
        super().__init__("; ".join(describe_repeat(*r) for r in repeats))


def describe_repeat(where: tuple[str, ...], key: str, first: int, second: int) -> str:
    lines = f"lines {first} and {second}"
    if len(where) == 1 and where[0] in ENTRY_KINDS:
        kind = ENTRY_KINDS[where[0]]
        return (f"{kind} `{key}` is defined twice ({lines}); YAML would silently keep only the second. "
                f"Give each {kind} its own name, or delete one of them.")
    under = f"under `{'.'.join(where)}`" if where else "at the top level"
    return f"key `{key}` appears twice {under} ({lines}); YAML would silently keep only the second. Keep one of them."


def _repeats(node: yaml.Node, where: tuple[str, ...], visited: set[int]) -> Iterator[tuple[tuple[str, ...], str, int, int]]:
    if id(node) in visited:  # an alias to a node already walked
        return
    visited.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                yield from _repeats(value, where, visited)
                continue
            line = key.start_mark.line + 1
            if key.value in first_line:
                yield where, key.value, first_line[key.value], line
            first_line.setdefault(key.value, line)
            yield from _repeats(value, (*where, key.value), visited)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _repeats(item, (*where, f"[{i}]"), visited)


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key repeated within one mapping (RepeatedKeyError)."""

    def construct_document(self, node: yaml.Node) -> Any:
        repeats = list(_repeats(node, (), set()))
        if repeats:
            raise RepeatedKeyError(repeats)
        return super().construct_document(node)


def load_yaml(text: str) -> Any:
    """Like yaml.safe_load, but a key repeated in one mapping raises RepeatedKeyError."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def read_yaml_mapping(path: Path, error: type[Exception], what: str, holds: str) -> dict:
    """A YAML file that must hold a mapping. Raises `error` naming the file, what is wrong,
    and (`holds`) what such a file must contain."""
    if not path.exists():
        raise error(f"{path}: no such {what}. {holds}")
    if path.is_dir():
        raise error(f"{path}: is a folder, not a {what}. {holds}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); save the {what} as UTF-8 YAML. {holds}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror or exc}).") from None
    try:
        doc = load_yaml(text)
    except RepeatedKeyError as exc:
        raise error("\n  ".join(f"{path}: {describe_repeat(*r)}" for r in exc.repeats)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{path}: not valid YAML{at}: {problem}. {holds}") from None
    if doc is None:
        raise error(f"{path}: the {what} is empty. {holds}")
    if not isinstance(doc, dict):
        held = {list: "a list", str: "plain text", int: "a number", float: "a number", bool: "true/false"}.get(type(doc), type(doc).__name__)
        raise error(f"{path}: the {what} holds {held}, not a mapping of names to values. {holds}")
    return doc


def validation_problems(
    exc: ValidationError,
    where: str | Path,
    entry: str = "",
    *,
    fixes: Mapping[str, str] | None = None,
    known: Iterable[str] | None = None,
    under: str = "",
    most: int | None = None,
) -> list[str]:
    """Pydantic's errors for one file (or one entry of it) as lines a person can act on, each
    `<where>: <entry>, field `<path>`: <what is wrong>; <how to fix it> (got <value>)`.

    `where` is the file (or whatever else the data came from); `entry` names the entry that was
    validated (``pool `p1` ``, ```egress:` section``), and where a whole file was validated
    at once, an error under a section of entries (`steps: {name: ...}`) names that entry itself.
    An error of the entry as a whole (a check across fields) says its own message with no field.
    `fixes` adds a hint by field path (the allowed values, the unit); `known`, the entry's fields,
    said when it holds one it does not know; `under`, the field the validated value sits in (its path is
    said in full); `most` keeps only the first errors.
    """
    lines = []
    for err in exc.errors()[:most]:
        loc = [str(part) for part in err["loc"]]
        at = entry
        if not at and len(loc) >= 2 and loc[0] in ENTRY_KINDS:
            at, loc = f"{ENTRY_KINDS[loc[0]]} `{loc[1]}`", loc[2:]
        field = ".".join([under, *loc] if under else loc)
        what = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and known is not None and len(loc) == 1 and not under:
            what = f"unknown field; known: {', '.join(known)}"
        fix = (fixes or {}).get(field)
        value = err.get("input")
        got = "" if err["type"] in _NO_VALUE or isinstance(value, dict | list) else f" (got {value!r})"
        said = f"{what}{f'; {fix}' if fix else ''}{got}"
        named = ", ".join(part for part in (at, f"field `{field}`" if field else "") if part)
        lines.append(f"{where}: {named}: {said}" if named else f"{where}: {said}")
    return lines


# Errors whose input is no help to quote: a missing field has none, a check's message says it,
# an unknown field's value is beside the point.
_NO_VALUE = {"missing", "value_error", "extra_forbidden", "assertion_error"}
