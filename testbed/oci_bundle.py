"""OCI bundles for Slurm's own containers (`srun --container=BUNDLE`, the cluster's `oci.conf`).

A bundle is a folder holding `config.json` (the OCI runtime spec) and a root filesystem. Slurm
hands it to runc for each step, after writing the step's command, environment and output files
into a copy of `config.json`. Two kinds are made here:

- `image_bundle`: an image unpacked (`podman export`), with the image's own environment and
  working directory: what a site does once per image and node (or on shared storage) before
  steps can start in it; the rehearsal's Slurm pool runs the workload image this way.
- `host_bundle`: a container of this machine's own files (its /usr and the Python the suite
  runs, read-only) for the tests of the Slurm backend's containers, which need no image.

The container runs rootless (runc in a user namespace, as the job's user): uid 0 inside is the
job's user outside, so what the step writes to a bound folder belongs to that user. The root
filesystem is read-only; `/tmp` is a fresh tmpfs per step, and HOME points there unless the
image sets one.

Needs `runc` (`runc spec` writes the base of `config.json`) and, for an image, `podman`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Bind:
    """A host folder seen at the same path inside the container."""

    path: str
    writable: bool = False


def write_config(folder: Path, *, uid: int, gid: int, env: Mapping[str, str], cwd: str = "/", binds: Iterable[Bind] = ()) -> Path:
    """`folder/config.json` for a rootless container of `folder/rootfs` run by `uid`:`gid`."""
    with tempfile.TemporaryDirectory() as spec_folder:  # runc's own rootless template, then ours on top
        subprocess.run(["runc", "spec", "--rootless", "--bundle", spec_folder], check=True, capture_output=True)
        config = json.loads((Path(spec_folder) / "config.json").read_text())
    env = {"HOME": "/tmp", **env}
    process = config["process"]
    process.update(terminal=False, cwd=cwd, user={"uid": 0, "gid": 0}, env=[f"{k}={v}" for k, v in env.items()])
    process.pop("rlimits", None)  # the sandbox and many nodes refuse to raise RLIMIT_NOFILE; inherit the job's
    config["root"] = {"path": "rootfs", "readonly": True}
    config["linux"]["uidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
    config["linux"]["gidMappings"] = [{"containerID": 0, "hostID": gid, "size": 1}]
    config["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]})
    for bind in binds:
        config["mounts"].append({"destination": bind.path, "type": "bind", "source": bind.path, "options": ["rbind", "rw" if bind.writable else "ro"]})
        (folder / "rootfs" / bind.path.lstrip("/")).mkdir(parents=True, exist_ok=True)  # its mount point, made while we may
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=1))
    folder.chmod(0o755)
    return path


def host_bundle(folder: Path, *, uid: int = 0, gid: int = 0, binds: Iterable[Bind] = ()) -> Path:
    """A bundle of this machine's own system and the interpreter the suite runs (read-only), with
    `binds` added; the root filesystem is otherwise empty."""
    rootfs = folder / "rootfs"
    rootfs.mkdir(parents=True, exist_ok=True)
    system = [Bind("/usr"), Bind("/etc")]
    for top in ("bin", "lib", "lib64", "sbin"):
        host = Path("/") / top
        if host.is_symlink() and not (rootfs / top).is_symlink():
            (rootfs / top).symlink_to(os.readlink(host))  # merged /usr: the links, not the folders
        elif host.is_dir() and not host.is_symlink():
            system.append(Bind(str(host)))
    python = [Bind(p) for p in {os.path.realpath(sys.base_prefix), sys.prefix, str(REPO)} if not p.startswith(("/usr/", "/etc/"))]
    write_config(folder, uid=uid, gid=gid, env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, binds=[*system, *python, *binds])
    return folder


def image_bundle(image: str, folder: Path, *, uid: int, gid: int, binds: Iterable[Bind] = (), env: Mapping[str, str] | None = None) -> Path:
    """`image` (a podman image) unpacked into `folder/rootfs`, with its environment and working
    directory in `folder/config.json`; `binds` added. Returns `folder`."""
    podman = shutil.which("podman")
    if podman is None:
        raise RuntimeError("making a bundle of an image needs podman (`make images` installs it)")
    inspected = json.loads(subprocess.run([podman, "image", "inspect", image], check=True, capture_output=True, text=True, env=env).stdout)[0]
    settings = inspected.get("Config") or {}
    image_env = dict(item.split("=", 1) for item in settings.get("Env") or [])
    rootfs = folder / "rootfs"
    rootfs.mkdir(parents=True, exist_ok=True)
    container = subprocess.run([podman, "create", image, "true"], check=True, capture_output=True, text=True, env=env).stdout.strip()
    try:
        with subprocess.Popen([podman, "export", container], stdout=subprocess.PIPE, env=env) as exported:
            subprocess.run(["tar", "-x", "-C", str(rootfs)], stdin=exported.stdout, check=True)
        if exported.returncode != 0:
            raise RuntimeError(f"`podman export` of {image} exited {exported.returncode}")
    finally:
        subprocess.run([podman, "rm", "--force", container], capture_output=True, env=env)
    write_config(folder, uid=uid, gid=gid, env=image_env, cwd=settings.get("WorkingDir") or "/", binds=binds)
    return folder
