"""Hard-link installed distributions, with what they require, from one venv's site-packages into another's.

    python mk/link_packages.py SOURCE_SITE_PACKAGES TARGET_SITE_PACKAGES torch

The LeRobot runtime needs the same torch (and its CUDA libraries, ~4.5 GB) as the Isaac Lab
runtime: linked, they are on disk once, and pip in the target venv finds them installed. Each
venv still owns its own directory entries: pip replacing or removing a package in one leaves
the other whole. Nothing is linked where the target already holds the distribution, or where
the two folders lie on different file systems (then pip installs as usual: prints why).
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import Distribution, distributions
from pathlib import Path


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(found: dict[str, Distribution], names: list[str]) -> list[Distribution]:
    """The named distributions and, recursively, what they require, with the extras asked for
    (torch asks for its CUDA libraries as `cuda-toolkit[cublas,...]`), where the source holds them."""
    todo, extras, seen = [_key(n) for n in names], {}, set()
    while todo:
        key = todo.pop()
        if key in seen or key not in found:
            continue
        seen.add(key)
        for requirement in found[key].requires or []:
            asked = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", requirement)
            if asked and asked.group(1) not in extras.get(key, set()):
                continue
            name, wanted = re.match(r"([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", requirement).groups()
            extras.setdefault(_key(name), set()).update(e.strip() for e in (wanted or "").split(",") if e.strip())
            todo.append(_key(name))
    return [found[k] for k in sorted(seen)]


def main(source: Path, target: Path, names: list[str]) -> int:
    if os.stat(source).st_dev != os.stat(target).st_dev:
        print(f"link_packages: {source} and {target} are on different file systems; nothing linked")
        return 0
    found = {_key(d.metadata["Name"]): d for d in distributions(path=[str(source)])}
    present = {_key(d.metadata["Name"]) for d in distributions(path=[str(target)])}
    linked = 0
    for dist in _closure(found, names):
        if _key(dist.metadata["Name"]) in present:
            continue
        for file in dist.files or []:
            if file.parts[0] == "..":
                continue  # scripts in bin/
            src, dst = source / file, target / file
            if not src.is_file() or dst.exists():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dst)
            linked += src.stat().st_size
        print(f"link_packages: {dist.metadata['Name']} {dist.version}")
    print(f"link_packages: {linked / 1e9:.1f} GB linked from {source}, none copied")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]))
