"""Cell workloads: plain entry points that run on any pool (`python -m cell_lane.workloads.<name>`).

They talk back only through Dagster Pipes and the object store (workload_runtime.workload).
"""
