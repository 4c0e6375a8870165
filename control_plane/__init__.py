"""The GPU control plane both lanes use, one room per capability (docs/architecture.md):

catalog/ (pools, tenants, accelerators, backend kinds, the step spec), placement/ (step ×
pools → a ranked plan with its evidence, and the planner), compute/ (attempts, recovery
policies, cool-downs, health, the monitor; backends/: local, Slurm, Ray, Kubernetes),
accounting/ (the ledger, its reports, budgets), intake/ (landing zones, quarantine), tenancy/
(a tenant's access and storage, data agreements); settings.py is the one reader of the
environment on this side.

Rule: it imports neither a lane nor the Dagster resources above it (`shared_resources/`), the
data layer or the model gateway; below it is only `workload_runtime/` (tests/test_boundaries.py).
"""
