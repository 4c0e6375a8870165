"""The workload side: what runs on a GPU pool beside the workload (the helper every workload uses,
its inputs and messages, checkpoints, storage, the qualification probe). Imports `dagster_pipes`,
never `dagster`, and nothing of the project outside this package: it travels to the GPU node
(a Slurm job, a pod, a Ray worker, Isaac Lab's own Python), where the control plane is not."""
