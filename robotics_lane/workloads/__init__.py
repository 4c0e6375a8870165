"""Robotics workloads: plain entry points that run on any pool (`python -m robotics_lane.workloads.<name>`).

They talk back only through Dagster Pipes and the object store (workload_runtime.workload).
The rollout workload also runs in the Isaac Lab runtime (Python 3.12), so it imports only what
that runtime has: numpy, torch, pyarrow, fsspec, safetensors, dagster-pipes.
"""
