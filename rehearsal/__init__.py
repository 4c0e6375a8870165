"""The production rehearsal (`make rehearsal`): the control plane brought up in its production
shape on this machine and driven as a customer drives it (docs/deploy.md, "The rehearsal").

- `stack.py` starts it: PostgreSQL for the Dagster instance and the ledger; the storage root on
  the S3 API server with IAM and KMS enforced, each lab holding only its own credentials and key;
  one code server per location, `dagster-daemon` and `dagster-webserver`, configured from
  deploy/dagster.yaml with only what cannot run here replaced.
- `lab.py` is a lab system: it uploads a drop into its landing prefix with its own credentials.
- tests/rehearsal/ drives the loops through it and asserts what came out (runs, materializations,
  ledger rows).
"""
