"""How `make images` names and fills an image (deploy/docker/build.py), checked without podman.

Building the images takes minutes and runs under `make images`, which checks each image it builds
(the code locations load in the orchestration image, a workload runs in the workload image). Here,
the parts a wrong change would silently break: the tag is the digest of exactly what goes in, the
images install only from the wheelhouse, and the build context leaves the venvs out.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "deploy" / "docker"


@pytest.fixture(scope="module")
def build():
    spec = importlib.util.spec_from_file_location("image_build", DOCKER / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def context(tmp_path: Path, build, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A build context as the repository is one: a git checkout with a Dockerfile, a package and the lock."""
    (tmp_path / "deploy" / "docker").mkdir(parents=True)
    (tmp_path / "deploy" / "docker" / "app.Dockerfile").write_text("FROM base\nCOPY --from=uv /uv /uv\nCOPY pyproject.toml ./\nCOPY pkg ./pkg\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "core.py").write_text("x = 1\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'app'\n")
    (tmp_path / "notes.md").write_text("not copied\n")
    (tmp_path / ".gitignore").write_text("__pycache__/\nbuild/\n")
    lock = tmp_path / "build" / "wheelhouse" / "requirements.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("numpy==2.0.0\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.setattr(build, "REPO", tmp_path)
    monkeypatch.setattr(build, "LOCK", lock)
    return tmp_path


def test_the_tag_is_the_digest_of_what_goes_into_the_image(build, context: Path):
    assert build.copied_paths(context / "deploy" / "docker" / "app.Dockerfile") == ["pyproject.toml", "pkg"]
    first = build.inputs_digest("app", "sha256:base-1")
    assert re.fullmatch(r"[0-9a-f]{64}", first) and build.inputs_digest("app", "sha256:base-1") == first

    # What the image does not hold leaves the tag alone: a file it does not copy, bytecode git ignores.
    (context / "notes.md").write_text("edited\n")
    (context / "pkg" / "__pycache__").mkdir()
    (context / "pkg" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    assert build.inputs_digest("app", "sha256:base-1") == first

    # Each thing it holds changes the tag: its code (committed or not, new files too), the lock, the base.
    changed = set()
    (context / "pkg" / "core.py").write_text("x = 2\n")
    changed.add(build.inputs_digest("app", "sha256:base-1"))
    (context / "pkg" / "extra.py").write_text("y = 1\n")
    changed.add(build.inputs_digest("app", "sha256:base-1"))
    (context / "build" / "wheelhouse" / "requirements.lock").write_text("numpy==2.0.1\n")
    changed.add(build.inputs_digest("app", "sha256:base-1"))
    changed.add(build.inputs_digest("app", "sha256:base-2"))
    (context / "deploy" / "docker" / "app.Dockerfile").write_text("FROM base\nCOPY pyproject.toml ./\nCOPY pkg ./pkg\nUSER 10001\n")
    changed.add(build.inputs_digest("app", "sha256:base-2"))
    assert len(changed) == 5 and first not in changed


@pytest.mark.parametrize("name", ["orchestration", "workload"])
def test_images_install_only_from_the_wheelhouse_and_record_their_code_version(name: str):
    text = (DOCKER / f"{name}.Dockerfile").read_text()
    installs = re.findall(r"pip install ([^\n\\&]+)", text)
    assert installs, f"{name}.Dockerfile installs nothing with pip"
    for install in installs:
        if "download.pytorch.org" in install:
            assert name == "workload" and "${TORCH_CUDA}" in install  # the GPU flavour's CUDA build of torch, only
            continue
        assert "--no-index" in install, f"{name}.Dockerfile resolves packages while it builds: `pip install {install.strip()}`"
    # The lock is COPYed in before the install that reads it: the layer cache's key does not cover a
    # bind mount's content, so without the COPY a changed lock would reuse the old dependencies.
    copied = text.index("COPY build/wheelhouse/requirements.lock /opt/requirements.lock")
    assert "source=build/wheelhouse" in text and copied < text.index("-r /opt/requirements.lock")
    assert re.search(r"^ARG BASE_IMAGE=\S+", text, re.M), "the base must be a build argument: no registry is reachable here"
    assert re.search(r"^ENV SINEWGRID_CODE_VERSION=\$\{SINEWGRID_CODE_VERSION\}$", text, re.M)


def test_the_build_context_leaves_out_the_venvs_history_and_build_outputs_but_the_wheelhouse():
    rules = [line.strip() for line in (REPO / ".containerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert {".git", ".venv", ".venv-*", ".sinewgrid", "build/*", "!build/wheelhouse"} <= set(rules)
    assert rules.index("!build/wheelhouse") > rules.index("build/*"), "the wheelhouse must be let back in after build/ is left out"
