"""The production rehearsal (`make rehearsal`): the control plane brought up in its production
shape on this machine and driven as a customer drives it (docs/deploy.md, "The rehearsal").

- `stack.py` starts it: PostgreSQL for the Dagster instance and the ledger; one code server per
  location, `dagster-daemon` and `dagster-webserver`, configured from deploy/dagster.yaml with
  only what cannot run here replaced.
- `account.py` is the cloud account on the S3 API server: buckets, IAM users, KMS keys and the
  queues new drops are announced on, each lab holding only its own credentials and key.
- `slurm_pool.py` is the Cell lane's steady pool as a Slurm cluster whose steps run in containers
  of the workload image (`srun --container`), and the service account the runs submit as.
- `services.py` starts each service as a process or in a container of the orchestration image,
  and serves podman's Docker API for the runs' own containers.
- `lab.py` is a lab system: it uploads a drop into its landing prefix with its own credentials;
  `robot_site.py` is the robot site (teleop rig, robot cell), with its own.
- tests/rehearsal/ drives the loops through it and asserts what came out (runs, materializations,
  ledger rows, the UI).
"""
