"""The platform both lanes use: storage, pools, placement, compute, checkpoints, ledger.

Rule: nothing in this package imports a lane. Modules that a workload imports
(`workload`, `checkpoints`, `storage`) import no Dagster internals either.
"""
