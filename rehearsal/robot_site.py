"""The robot site: the teleop rig that records sessions and the robot cell that answers evaluation
requests (robotics_lane/standins/), writing into the platform's root with the site's own IAM user
(rehearsal/account.py: the Robotics landing zones to write, the platform's root to read), as the
machines of a robotics company would."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import s3fs

from control_plane.settings import environment
from rehearsal.stack import Stack
from workload_runtime.storage import Storage


@contextlib.contextmanager
def robot_site(stack: Stack) -> Iterator[Storage]:
    """The platform's storage root as the robot site sees it: its credentials only, for the block."""
    site = stack.account.robot_site
    s3fs.S3FileSystem.clear_instance_cache()  # a filesystem made earlier holds the control plane's keys
    try:
        with environment({"AWS_ACCESS_KEY_ID": site.access_key_id, "AWS_SECRET_ACCESS_KEY": site.secret_access_key}):
            yield Storage.at(stack.env["SINEWGRID_HOME"])
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
