"""The rehearsal's Slurm pool: a real Slurm cluster whose steps run in containers of the workload image.

What a site with a Slurm cluster has, on this machine:
- the cluster (testbed/slurm_cluster.py: slurmctld, slurmd, munge, two fake GPUs) with Slurm's own
  OCI containers configured (`oci.conf`: rootless runc);
- the workload image unpacked as an OCI bundle (testbed/oci_bundle.py; a site does this once per
  image, as it pre-pulls for Pyxis or Apptainer), with the folders a step needs bound in;
- the platform's service account: the runs' containers submit as the images' user (uid 10001),
  which the cluster must know, as a site's LDAP knows its users. Added to this machine's
  /etc/passwd if missing (`sinewgrid`, no home, no shell), and left there;
- the pool catalog: the packaged one with `cell-steady`, the Cell lane's steady pretraining pool
  (a reserved H100 block in the catalog's story), mapped onto the cluster's `gpu` partition with
  the image as its runtime. Every other pool stays the local machine (the run's own container).

The cluster's folder and the shared folder live in the stack's folder, which every run's
container mounts at the same path: the Slurm client there reads the same `slurm.conf` and munge
socket as the nodes, and writes the Pipes files where the step reads them.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from control_plane.catalog.pools import DEFAULT_CATALOG
from control_plane.catalog.quotas import DEFAULT_QUOTAS
from rehearsal.services import IMAGE_USER_GID, StackError, podman_env
from testbed.oci_bundle import Bind, image_bundle
from testbed.slurm_cluster import SlurmCluster

SERVICE_ACCOUNT = "sinewgrid"
POOL = "cell-steady"  # the pool the cluster stands for
PARTITION = "gpu"


@dataclass
class SlurmPool:
    cluster: SlurmCluster
    bundle: Path
    shared_dir: Path

    def catalog(self) -> dict[str, Any]:
        """The packaged pool catalog with POOL on the cluster, its steps in the bundle."""
        catalog = yaml.safe_load(DEFAULT_CATALOG.read_text())
        catalog["pools"][POOL].update(
            description=f"{catalog['pools'][POOL]['description']} In the rehearsal: the Slurm cluster's `{PARTITION}` partition, each step in a container of the workload image.",
            backend="slurm",
            backend_settings={"partition": PARTITION, "shared_dir": str(self.shared_dir), "env": self.cluster.env, "time_limit": "01:00:00"},
            runtimes={"default": {"container": str(self.bundle)}},
        )
        return catalog

    def quotas(self) -> dict[str, Any]:
        """The packaged quotas with POOL queued: the Cell lane's, lent to Robotics when idle."""
        quotas = yaml.safe_load(DEFAULT_QUOTAS.read_text())
        quotas["quotas"] = {POOL: {"cell": {"gpus": 1}}}
        return quotas


def service_account() -> tuple[int, int]:
    """The uid and gid runs submit as (the images' user), made known to this machine if it is not."""
    uid = gid = IMAGE_USER_GID  # the runs' user and group: their jobs run as both, whatever passwd says
    try:
        pwd.getpwuid(uid)
        return uid, gid
    except KeyError:
        pass
    try:
        grp.getgrgid(gid)
    except KeyError:
        subprocess.run(["groupadd", "--gid", str(gid), SERVICE_ACCOUNT], check=True, capture_output=True)
    made = subprocess.run(
        ["useradd", "--system", "--uid", str(uid), "--gid", str(gid), "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_ACCOUNT],
        capture_output=True, text=True,
    )  # fmt: skip
    if made.returncode != 0:
        raise StackError(f"could not add the service account {SERVICE_ACCOUNT} (uid {uid}) the Slurm cluster needs: {made.stderr.strip()}")
    return uid, gid


@contextlib.contextmanager
def slurm_pool(folder: Path, image: str, binds: list[Path]) -> Iterator[SlurmPool]:
    """Start the cluster, unpack `image` as its bundle (with `binds` and the shared folder bound
    in), yield the pool; stop the cluster and remove the bundle on exit."""
    uid, gid = service_account()
    shared = folder / "slurm-shared"
    shutil.rmtree(shared, ignore_errors=True)  # an earlier rehearsal's attempts
    for made in (shared, *binds):
        made.mkdir(parents=True, exist_ok=True)
    os.chown(shared, uid, gid)
    bundle = folder / "bundles" / image.rsplit(":", 1)[-1]
    cluster = SlurmCluster(folder / "slurm")
    try:
        cluster.start()
        if not (bundle / "config.json").exists():
            image_bundle(image, bundle, uid=uid, gid=gid, binds=[Bind(str(shared), writable=True), *(Bind(str(b), writable=True) for b in binds)], env=podman_env())
        yield SlurmPool(cluster, bundle, shared)
    finally:
        cluster.stop()
        shutil.rmtree(bundle.parent, ignore_errors=True)
