"""Real engines the tests start and stop (Slurm, Ray), a fake Kubernetes API, and a tiny
checkpointed workload every backend test runs."""
