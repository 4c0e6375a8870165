"""Every relative link in the README and the docs leads somewhere.

Reads README.md, docs/**/*.md, deploy/**/*.md and benchmarks/README.md, finds each Markdown
link or image `[text](target)` outside code, and checks that a relative target exists (relative
to the linking file's folder) and, for an anchor into a Markdown file, that the file has a
heading with that slug (GitHub's rules). http(s) and mailto links are not followed. Pure file
reading: no engine, no network.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parent.parent


def _pages() -> list[Path]:
    pages = [REPO / "README.md", REPO / "benchmarks" / "README.md"]
    pages += sorted((REPO / "docs").rglob("*.md"))
    pages += sorted((REPO / "deploy").rglob("*.md"))
    return [p for p in pages if p.is_file()]


FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:.+?)\1")
# [text](target) and ![alt](target); the text may hold one level of brackets (a badge, `[x]`).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SKIP = ("http://", "https://", "mailto:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with inline code blanked out."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("", line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lowercased, punctuation but `-` and `_` dropped, spaces → `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "")
    text = re.sub(r"(\*{1,3})(.+?)\1", r"\2", text)  # emphasis
    text = re.sub(r"(?<!\w)_{1,3}(.+?)_{1,3}(?!\w)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 … for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        for match in LINK.finditer(line):
            target = match.group(1).strip("<>")
            if not target.lower().startswith(SKIP):
                found.append((number, target))
    return found


def broken(page: Path) -> list[str]:
    problems = []
    for number, target in links(page):
        path_part, _, anchor = target.partition("#")
        where = page if not path_part else (page.parent / unquote(path_part))
        label = f"{page.relative_to(REPO)}:{number}: ({target})"
        if not where.exists():
            problems.append(f"{label} → {path_part} does not exist")
            continue
        if anchor and where.is_file() and where.suffix == ".md" and unquote(anchor).lower() not in anchors(where.resolve()):
            problems.append(f"{label} → {where.name} has no heading #{anchor}")
    return problems


PAGES = _pages()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_pages_are_read() -> None:
    """The test looks where it should: the README, the docs, deploy and the benchmarks."""
    names = {str(p.relative_to(REPO)) for p in PAGES}
    assert {"README.md", "benchmarks/README.md", "deploy/README.md", "docs/architecture.md"} <= names
    assert any(links(REPO / "README.md")), "the README links into docs/"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Why real success rises from one policy version to the next", "why-real-success-rises-from-one-policy-version-to-the-next"),
        ("Warm starts on a local pool", "warm-starts-on-a-local-pool"),
        ("Gangs: domains and spares", "gangs-domains-and-spares"),
        ("`sinewgrid plan`, step by step", "sinewgrid-plan-step-by-step"),
        ("What ran for real (and what did not)", "what-ran-for-real-and-what-did-not"),
        ("cell_lane/ and **robotics**", "cell_lane-and-robotics"),
        ("Pools → placement", "pools--placement"),
    ],
)
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_link_and_a_missing_heading_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "there.md").write_text("# A heading\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading) [ok](there.md#twice-1) [ok](#local)\n"
        "## Local\n"
        "[gone](missing.md) ![gone](img/none.png) [bad](there.md#nowhere) [web](https://example.com/x)\n"
        "`[code](not-a-link.md)`\n"
        "```\n[fenced](not-a-link.md)\n```\n"
    )
    problems = broken(page)
    assert len(problems) == 3, problems
    assert "missing.md does not exist" in problems[0]
    assert "img/none.png does not exist" in problems[1]
    assert "has no heading #nowhere" in problems[2]
