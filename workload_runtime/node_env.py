"""What the workload side reads from its process environment: every variable, in one place.

The orchestrator's settings (`control_plane/settings.py`) do not travel to the node, so a
workload reads the node's own environment, and only here: `node_env()` gives a frozen
`NodeEnv` read at that moment (the forkserver replaces a forked child's environment, and tests
set variables, so nothing is cached). The modules that use a variable still say what it means
and refuse a bad value with their own message (`node_cache.py` the cache's size, `gang.py` a
rank's place); this module only reads.

Standard library only: it runs in Isaac Lab's own Python too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

# How a workload started by hand (or a gang's other ranks) finds its inputs.
EXTRAS_ENV = "SINEWGRID_WORKLOAD_EXTRAS"
# The node cache (`workload_runtime/node_cache.py`): its folder, its size bound, whether local paths go through it.
NODE_CACHE_DIR_ENV = "SINEWGRID_NODE_CACHE_DIR"
NODE_CACHE_MAX_GB_ENV = "SINEWGRID_NODE_CACHE_MAX_GB"
NODE_CACHE_LOCAL_ENV = "SINEWGRID_NODE_CACHE_LOCAL"
# The folder of each of the node's caches (`workload_runtime/node.py`), when its variable is set.
CACHE_FOLDER_ENV = {"data": NODE_CACHE_DIR_ENV, "scenes": "SINEWGRID_SCENE_CACHE", "isaaclab": "SINEWGRID_ASSET_CACHE"}
# Set by deploy/docker's images: the image's own code version.
IMAGE_ENV = "SINEWGRID_CODE_VERSION"
# What torchrun, srun and the platform's launchers set for one rank of a gang (`workload_runtime/gang.py`).
GANG_VARIABLES = (
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID",
    "SLURMD_NODENAME", "SINEWGRID_NODE",
)  # fmt: skip


@dataclass(frozen=True)
class NodeEnv:
    """The node's environment as the workload side uses it."""

    extras_json: str = ""  # $SINEWGRID_WORKLOAD_EXTRAS: the inputs as JSON, when no --extras file is given
    gang: Mapping[str, str] = field(default_factory=dict)  # the GANG_VARIABLES that are set
    cache_folders: Mapping[str, str] = field(default_factory=dict)  # cache name -> folder its variable sets
    user_cache: str = ""  # $XDG_CACHE_HOME, else ~/.cache
    node_cache_max_gb: str = ""  # as written; node_cache.py says what a bad value means
    node_cache_local: bool = False
    aws_default_region: str = ""  # boto's default region, for a tenant's KMS that names none
    omp_num_threads: str = "1"  # handed on to a gang's ranks (one thread each unless set)
    # $SINEWGRID_CODE_VERSION as an image of deploy/docker sets it (`workload@sha256:...`): the image
    # this workload runs in. A launcher never hands it on (allowed_env.py), so a bare process has none.
    image: str = ""

    @property
    def in_gang(self) -> bool:
        """Whether a launcher started this process as one of several ranks (`gang.member_from_env`
        then says which); a Slurm batch step of one task is not a gang."""
        return self.gang.get("WORLD_SIZE", "1") != "1" or self.gang.get("SLURM_NTASKS", "1") != "1"


def node_env(environ: Mapping[str, str] | None = None) -> NodeEnv:
    """The workload side's variables, read now from `environ` (default: this process's)."""
    env = os.environ if environ is None else environ
    return NodeEnv(
        extras_json=env.get(EXTRAS_ENV, ""),
        gang={name: env[name] for name in GANG_VARIABLES if name in env},
        cache_folders={name: env.get(variable, "") for name, variable in CACHE_FOLDER_ENV.items()},
        user_cache=env.get("XDG_CACHE_HOME", ""),
        node_cache_max_gb=env.get(NODE_CACHE_MAX_GB_ENV, "").strip(),
        node_cache_local=env.get(NODE_CACHE_LOCAL_ENV, "") in {"1", "true", "yes"},
        aws_default_region=env.get("AWS_DEFAULT_REGION", ""),
        omp_num_threads=env.get("OMP_NUM_THREADS", "1"),
        image=env.get(IMAGE_ENV, ""),
    )


def process_environment() -> dict[str, str]:
    """This process's whole environment, for `allowed_env` to filter before it starts a workload
    (and for a test workload to report the names it started with): nothing reads a value from it."""
    return dict(os.environ)
