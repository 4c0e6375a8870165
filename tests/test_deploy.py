"""The production instance config is valid Dagster instance configuration."""

from pathlib import Path

from dagster._core.instance.config import dagster_instance_config

REPO = Path(__file__).resolve().parent.parent


def test_production_instance_config_validates():
    config, _ = dagster_instance_config(str(REPO / "deploy"))
    assert "postgres" in config["storage"]
    assert config["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    assert config["telemetry"]["enabled"] is False


def test_cloud_pool_examples_validate_and_place():
    from shared_resources.placement import plan_placement
    from shared_resources.pools import Capacity, load_pools
    from shared_resources.step_spec import StepSpec

    files = sorted((REPO / "deploy" / "pools").glob("*.yaml"))
    assert {f.stem for f in files} == {"aws", "gcp", "azure", "oci", "gpu-cloud"}
    everything = {}
    for path in files:
        text = path.read_text()
        assert "ILLUSTRATIVE" in text and "NOT QUOTES" in text, f"{path.name} must mark its prices as illustrative"
        everything.update(load_pools(path))
    sweep = StepSpec(name="s", entry_point="x", tenant="robotics", capacity=Capacity.burst, runtime="isaaclab", checkpoint_seconds=10)
    ranked = [p.name for p in plan_placement(sweep, everything).ranked]
    assert ranked[:2] == ["gcp-gke-g2-spot", "aws-eks-g6e-spot"]  # cheapest spot with an Isaac Lab image first
    training = StepSpec(name="t", entry_point="x", tenant="robotics", gpus=16, nodes=2, tightly_coupled=True)
    plan = plan_placement(training, everything)
    assert all(p.backend.value == "slurm" for p in plan.ranked)  # only pools with one fabric for 16 GPUs
    refused = {v.pool for v in plan.verdicts if not v.feasible}
    assert "aws-eks-g6e-spot" in refused and "gpucloud-ray-l40s-spot" in refused
