"""Build the orchestration and workload images here with podman, check each, and say what was built.

Run by `make images` (as root; it installs podman, runc and mmdebstrap from Debian when missing):

1. **The base**: no registry is reachable from this machine, so `python:3.11-slim-bookworm` and
   `nvidia/cuda` cannot be pulled. The base is Debian bookworm with Python 3.11 from Debian's own
   packages, made with `mmdebstrap` and imported into podman. Elsewhere, `--base IMAGE` uses any
   image that has `python3.11` (e.g. the slim image itself).
2. **The wheelhouse** (`build/wheelhouse`): the wheels of exactly what `.venv` runs (`pip freeze`,
   the versions the suite passed with, torch's CPU build), and `requirements.lock` naming them.
   The images install from it with `--no-index`: nothing is resolved while an image builds.
3. **Each image**, from its Dockerfile in this folder, tagged `localhost/sinewgrid/<name>:<digest>`
   where the digest is the sha256 of everything that goes in: the base image's id, the Dockerfile,
   the lock and every file the Dockerfile copies. The same inputs give the same tag, so an image
   already built is not built again; any change to the code gives a new one. Inside the image
   `SINEWGRID_CODE_VERSION` is `<name>@sha256:<digest>`: the code version lineage records.
4. **A check in each**: the orchestration image loads both code locations as the code servers do;
   the workload image runs a checkpointed workload as a pool runs a step.

`build/images/images.json` lists what was built: tag, digest, podman's image id, size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
WHEELHOUSE = BUILD / "wheelhouse"
LOCK = WHEELHOUSE / "requirements.lock"
IMAGES = ("orchestration", "workload")
REPOSITORY = "localhost/sinewgrid"
DEBIAN_SUITE, DEBIAN_MIRROR = "bookworm", "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3.11", "python3.11-venv", "ca-certificates", "git", "libgomp1")
# podman on this machine: runc (crun refuses its hybrid cgroups), and no raising of ulimits (the sandbox forbids it).
CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'
TOOLS = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}


class BuildError(RuntimeError):
    """An image could not be built or failed its check; the message says which step and why."""


def run(*args: str, capture: bool = False, **kwargs) -> str:
    done = subprocess.run(args, text=True, capture_output=capture, **kwargs)
    if done.returncode != 0:
        detail = f"\n{done.stderr[-3000:]}" if capture else ""
        raise BuildError(f"`{' '.join(args[:6])}{' …' if len(args) > 6 else ''}` exited with {done.returncode}{detail}")
    return done.stdout if capture else ""


def ensure_tools() -> None:
    """podman, runc and mmdebstrap, installed from Debian when missing (needs root and apt-get)."""
    missing = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BuildError(f"`make images` needs {', '.join(missing)}; as root: apt-get install -y {' '.join(missing)}")
    print(f"Installing {' '.join(missing)} (Debian)", flush=True)
    run("apt-get", "update", "-qq")
    run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def podman_env() -> dict[str, str]:
    conf = BUILD / "containers" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def image_id(ref: str, env: dict[str, str]) -> str | None:
    done = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", ref], text=True, capture_output=True, env=env)
    return done.stdout.strip() if done.returncode == 0 else None


def debian_base(env: dict[str, str]) -> str:
    """Debian bookworm with Python 3.11, from Debian's packages; built once per package list."""
    digest = hashlib.sha256(" ".join((DEBIAN_SUITE, *BASE_PACKAGES)).encode()).hexdigest()[:12]
    ref = f"{REPOSITORY}/base:{DEBIAN_SUITE}-python3.11-{digest}"
    if image_id(ref, env):
        return ref
    print(f"Building the base image {ref} from Debian's packages (mmdebstrap, ~30 s)", flush=True)
    tarball = BUILD / "images" / "base.tar"
    tarball.parent.mkdir(parents=True, exist_ok=True)
    run("mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", DEBIAN_SUITE, str(tarball), DEBIAN_MIRROR)
    try:
        run("podman", "import", "--quiet", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3.11"]', str(tarball), ref, env=env, capture=True)
    finally:
        tarball.unlink(missing_ok=True)
    return ref


def fill_wheelhouse(python: Path) -> None:
    """build/wheelhouse: a wheel of every package `python`'s environment has (the project left out), and the lock."""
    if not python.exists():
        raise BuildError(f"{python} is missing: the images install what the project's venv runs; run `make venv` first")
    frozen = run(str(python), "-m", "pip", "freeze", "--all", "--exclude-editable", capture=True)
    lock = "".join(f"{line}\n" for line in frozen.splitlines() if line and not line.startswith(("#", "-e ")))
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    if LOCK.exists() and LOCK.read_text() == lock:
        return
    print(f"Filling {WHEELHOUSE.relative_to(REPO)} with {lock.count(chr(10))} wheels (pip wheel, from pip's cache or index)", flush=True)
    staged = WHEELHOUSE / "requirements.lock.new"
    staged.write_text(lock)
    run(str(python), "-m", "pip", "wheel", "-qq", "--no-deps", "-r", str(staged), "-w", str(WHEELHOUSE))
    staged.replace(LOCK)


def copied_paths(dockerfile: Path) -> list[str]:
    """The sources of the Dockerfile's COPY lines (from the build context, not another stage)."""
    paths = []
    for line in re.findall(r"^COPY\s+(.+)$", dockerfile.read_text(), re.M):
        if "--from=" not in line:
            paths.extend(w for w in line.split()[:-1] if not w.startswith("--"))
    return paths


def inputs_digest(name: str, base_id: str) -> str:
    """sha256 of what goes into the image: the base's id, the Dockerfile, the lock, each copied file."""
    dockerfile = REPO / "deploy" / "docker" / f"{name}.Dockerfile"
    digest = hashlib.sha256()
    for part in (base_id.encode(), dockerfile.read_bytes(), LOCK.read_bytes()):
        digest.update(hashlib.sha256(part).digest())
    listed = run("git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *copied_paths(dockerfile), capture=True)
    for rel in sorted(p for p in listed.split("\0") if p):
        path = REPO / rel
        if path.is_file():
            digest.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def build_image(name: str, base: str, env: dict[str, str]) -> dict:
    base_id = image_id(base, env)
    if base_id is None:
        raise BuildError(f"the base image {base} is not in podman's store (`podman pull` it or omit --base)")
    digest = inputs_digest(name, base_id)
    tag = f"{REPOSITORY}/{name}:{digest[:12]}"
    started = time.monotonic()
    if image_id(tag, env) is None:
        print(f"Building {tag}", flush=True)
        args = {"BASE_IMAGE": base, "SINEWGRID_CODE_VERSION": f"{name}@sha256:{digest}"}
        if name == "workload":
            args.update(PYTHON_FROM="base", TORCH_CUDA="")  # the CPU flavour: the base's Python, the wheelhouse's torch
        build_args = [a for key, value in args.items() for a in ("--build-arg", f"{key}={value}")]
        run("podman", "build", "--quiet", "--network", "host", "--timestamp", "0", "-f", f"deploy/docker/{name}.Dockerfile",
            *build_args, "-t", tag, ".", cwd=REPO, env=env)  # fmt: skip
    else:
        print(f"{tag} is already built (same inputs)", flush=True)
    built_s = time.monotonic() - started
    size = int(run("podman", "image", "inspect", "--format", "{{.Size}}", tag, capture=True, env=env).strip())
    return {"name": name, "tag": tag, "digest": f"sha256:{digest}", "image_id": image_id(tag, env), "size_bytes": size,
            "code_version": f"{name}@sha256:{digest}", "build_seconds": round(built_s, 1), "base": base}  # fmt: skip


def check_orchestration(tag: str, env: dict[str, str]) -> str:
    """The three code locations load in the image, as its code servers load them, with no network."""
    code = ("import os, cell_lane.definitions as c, robotics_lane.definitions as r, platform_location.definitions as p;"
            "print(*(len(list(m.defs.resolve_all_asset_keys())) for m in (c, r, p)), os.environ['SINEWGRID_CODE_VERSION'])")
    cell, robotics, platform, version = run("podman", "run", "--rm", "--network", "none", tag, "python", "-c", code, capture=True, env=env).split()
    if not version.startswith(f"orchestration@sha256:{tag.rsplit(':', 1)[1]}"):
        raise BuildError(f"{tag} carries SINEWGRID_CODE_VERSION={version}, not its own digest")
    return f"code locations load: cell {cell} assets, robotics {robotics}, platform {platform}"


def check_workload(tag: str, env: dict[str, str]) -> str:
    """A checkpointed workload runs in the image as a pool runs a step, to its last step."""
    extras = json.dumps({"config": {"steps": 6, "seed": 1}, "checkpoint_uri": "/tmp/checkpoints", "checkpoint_every_steps": 2})
    done = subprocess.run(["podman", "run", "--rm", "--network", "none", "-e", f"SINEWGRID_WORKLOAD_EXTRAS={extras}", tag,
                           "python", "-m", "testbed.counting_workload"], text=True, capture_output=True, env=env)  # fmt: skip
    if done.returncode != 0 or '"final_step": 6' not in done.stderr:
        raise BuildError(f"the counting workload failed in {tag} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return "a checkpointed workload ran to its last step"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="an image with python3.11 to build on (default: Debian bookworm made here with mmdebstrap)")
    parser.add_argument("--python", type=Path, default=REPO / ".venv" / "bin" / "python", help="the environment whose packages the images install")
    args = parser.parse_args(argv)
    try:
        ensure_tools()
        env = podman_env()
        base = args.base or debian_base(env)
        fill_wheelhouse(args.python)
        built = []
        for name in IMAGES:
            image = build_image(name, base, env)
            image["check"] = (check_orchestration if name == "orchestration" else check_workload)(image["tag"], env)
            built.append(image)
    except BuildError as exc:
        print(f"make images failed: {exc}", file=sys.stderr)
        return 1
    report = BUILD / "images" / "images.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(built, indent=2) + "\n")
    for image in built:
        print(f"{image['tag']}  {image['size_bytes'] / 1e9:.2f} GB  {image['check']}")
    print(f"(also in {report.relative_to(REPO)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
