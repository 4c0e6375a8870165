"""Small helpers that put cell values and row lists into messages."""

from __future__ import annotations

from collections.abc import Sequence


def quote(value: str | None, limit: int = 60) -> str:
    """A cell value as shown in a message: repr'd, cut at ``limit``; ``(empty)`` for none."""
    if value is None:
        return "(empty)"
    text = value if len(value) <= limit else value[: limit - 1] + "…"
    return repr(text)


def and_join(items: Sequence[str]) -> str:
    """``a, b and c``."""
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
