"""Throwaway real engines on one machine, for the failure drills, the tests and the benchmarks.

A single-node Slurm cluster (`slurm_cluster`), a Ray head (`ray_head`), a PostgreSQL server
(`postgres_server`) and an S3 API server (`s3_server`), each started in its own temporary
folder on free loopback ports and stopped by its own markers, so none touches another on the
machine; and the counting workload (`counting_workload`, run through the `compute` resource by
`counting_step`), the smallest checkpointed workload a backend can run.
"""
