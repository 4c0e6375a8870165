"""The production instance config is valid Dagster instance configuration."""

from pathlib import Path

from dagster._core.instance.config import dagster_instance_config

REPO = Path(__file__).resolve().parent.parent


def test_production_instance_config_validates():
    config, _ = dagster_instance_config(str(REPO / "deploy"))
    assert "postgres" in config["storage"]
    assert config["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    assert config["telemetry"]["enabled"] is False
