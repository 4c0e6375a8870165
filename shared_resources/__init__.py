"""The platform both lanes use, one room per capability (docs/architecture.md):

runtime/ (the workload side), catalog/ (pools, step spec), placement/, compute/ (the compute
resource and its backends), accounting/ (the ledger), data/ (dataset versions, lineage,
checkpoints, runs), intake/ (landing zones, quarantine); settings.py reads the environment,
resources.py holds the Dagster resources.

Rule: nothing in this package imports a lane; `runtime/` imports nothing of the project
outside itself and never Dagster (tests/test_boundaries.py).
"""
