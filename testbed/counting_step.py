"""Run the counting workload through the `compute` resource, as an asset would.

(No `from __future__ import annotations` here: Dagster reads the asset's annotations.)
"""


from pathlib import Path
from typing import Any

import dagster as dg

from control_plane.catalog.step_spec import StepSpec
from shared_resources.compute import ComputeResource
from workload_runtime.inputs import Failpoint


def counting_spec(name: str = "test.counting", **overrides: Any) -> StepSpec:
    config = {"steps": 20, "seed": 7, "step_seconds": 0.0, **overrides.pop("config", {})}
    fields = {
        "name": name,
        "entry_point": "testbed.counting_workload",
        "tenant": "test",
        "gpus": 1,
        "checkpoint_every_steps": 5,
        "imports": ["numpy"],  # all the counting workload needs
        "config": config,
        **overrides,
    }
    return StepSpec(**fields)


def held(marker: Path, at_step: int = 5) -> Failpoint:
    """The `hold` failpoint: once, after step `at_step` (and its checkpoint), the run creates
    `marker` and waits until it is interrupted, so a test's fault cannot miss it
    (workload_runtime/failpoints.py)."""
    return Failpoint(kind="hold", at_step=at_step, marker=str(marker))


def counting_asset(spec: StepSpec, lineage: str = "counting") -> dg.AssetsDefinition:
    @dg.asset(name="counting", description="The counting workload, run on whichever pool placement picks.")
    def counting(context: dg.AssetExecutionContext, compute: ComputeResource) -> dg.MaterializeResult:
        step = compute.run(context, spec, lineage=lineage)
        return dg.MaterializeResult(metadata=step.metadata())

    return counting


def materialize_counting(
    home: Path,
    pools_file: Path,
    spec: StepSpec,
    *,
    instance: dg.DagsterInstance | None = None,
    lineage: str = "counting",
    log_level: str = "DEBUG",
) -> dg.ExecuteInProcessResult:
    """Materialize the counting asset once; raises on failure like any test of an asset."""
    return dg.materialize(
        [counting_asset(spec, lineage)],
        resources={"compute": ComputeResource(storage_root=str(home), pools_file=str(pools_file))},
        instance=instance,
        raise_on_error=True,
        run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
    )


def result_metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    (mat,) = result.asset_materializations_for_node("counting")
    return {k: v.value for k, v in mat.metadata.items()}
