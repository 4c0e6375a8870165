"""The Dagster resources every code location is given: `storage`, `compute` (the step loop over
the control plane) and `models` (the model gateway). They sit above `control_plane/`,
`data_layer/`, `model_gateway/` and `workload_runtime/`, and are the only way a lane reaches
the control plane's compute loop (docs/architecture.md).

Rule: nothing in this package imports a lane (tests/test_boundaries.py).
"""

from shared_resources.migration_history import share_migration_histories

share_migration_histories()
