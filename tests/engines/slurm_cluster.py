"""The throwaway Slurm cluster the tests start: it lives in `drills/slurm_cluster.py` (the
drills run against the same one); this module keeps the tests' imports working."""

from drills.slurm_cluster import *  # noqa: F401,F403
from drills.slurm_cluster import (  # noqa: F401
    DAEMONS,
    GPUS,
    NODE,
    PARTITIONS,
    SLURM_CONF,
    SlurmCluster,
    SlurmClusterError,
    free_port,
)

__all__ = ["DAEMONS", "GPUS", "NODE", "PARTITIONS", "SLURM_CONF", "SlurmCluster", "SlurmClusterError", "free_port"]
