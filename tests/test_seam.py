"""The seam between the platform and a workload: one typed model for what a workload receives
(`WorkloadInputs`), one set of typed Pipes messages for what it reports, one config model per
workload shared by the launchpad and the workload, and backends found by kind in one registry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from pydantic import ValidationError

from cell_lane.defs.assets.training import FinetuneLaunchpad, PretrainLaunchpad
from cell_lane.workloads.config import FinetuneSettings, PretrainConfig, PretrainSettings
from control_plane.catalog.backends import BACKENDS
from control_plane.catalog.pools import PoolCatalogError, load_pools
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends import backend_for
from control_plane.compute.backends.base import Backend
from control_plane.settings import REPO_ROOT, child_env, settings
from robotics_lane.defs.assets.policy import PolicyLaunchpad
from robotics_lane.workloads.config import PolicySettings, TrainPolicyConfig
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.inputs import DEFAULT_CHECKPOINT_EVERY_STEPS, DEFAULT_TELEMETRY_SECONDS, Failpoint, WorkloadInputs, WorkloadInputsError
from workload_runtime.messages import CheckpointSaved, Preemption, Progress, Qualified, Resumed, Telemetry, parse_messages

# What the platform sends ---------------------------------------------------------------------


def test_inputs_travel_as_plain_json_and_come_back_equal():
    inputs = WorkloadInputs(
        config={"steps": 3}, checkpoint_uri="/tmp/ck", checkpoint_every_steps=7, checkpoint_interval_seconds=12.5, attempt=2,
        pool="p", storage_root="/tmp/home", failpoint=Failpoint(kind="torn-checkpoint", at_step=4, marker="/tmp/m"),
    )
    extras = json.loads(json.dumps(inputs.to_extras()))
    assert WorkloadInputs.from_extras(extras) == inputs
    assert "log_uri" not in extras  # unset fields are left out, not sent as null


def test_the_cadence_defaults_live_in_one_place():
    spec = StepSpec(name="s", entry_point="m", tenant="t")
    blank = WorkloadInputs()
    assert spec.checkpoint_every_steps == blank.checkpoint_every_steps == DEFAULT_CHECKPOINT_EVERY_STEPS
    assert spec.telemetry_seconds == blank.telemetry_seconds == DEFAULT_TELEMETRY_SECONDS


def test_bad_inputs_name_each_field():
    with pytest.raises(WorkloadInputsError) as caught:
        WorkloadInputs.from_extras({"checkpoint_every_steps": 0, "failpoint": {"kind": "torn-checkpoint", "at_step": "soon", "marker": "m"}, "colour": 1}, where="x.json")
    message = str(caught.value)
    assert "x.json" in message and "`checkpoint_every_steps`" in message and "`failpoint.at_step`" in message and "`colour`" in message


def test_the_failpoint_travels_in_the_inputs_not_the_environment(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("SINEWGRID_FAILPOINT", f"torn-checkpoint:0:{tmp_path / 'env-marker'}")  # the old way: ignored now
    store = CheckpointStore(str(tmp_path / "ck"))
    store.save(5, {"model": {"w": torch.zeros(2)}})
    assert store.latest_valid().step == 5 and not (tmp_path / "env-marker").exists()


# What the workload reports ------------------------------------------------------------------


def test_every_message_kind_parses_back():
    sent = [
        Resumed(step=3, at=1.0),
        CheckpointSaved(step=5, committed_seconds=1.5, checkpoint_seconds=0.1, uri="/ck/step-5", at=2.0),
        CheckpointSaved(step=6, committed_seconds=1.6, seed=42),  # a workload's own field rides along
        Progress(step=5, loss=0.25),
        Telemetry(step=5, step_seconds=0.01),
        Preemption(step=5),
        Qualified(checks={"runtime": "Python 3.11"}, node="n1"),
    ]
    received = parse_messages([json.loads(json.dumps(m.payload())) for m in sent])
    assert received == sent
    assert received[2].model_extra == {"seed": 42} and received[3].model_extra == {"loss": 0.25}


def test_what_is_not_a_platform_message_is_skipped():
    raw = ["text", {"no": "event"}, {"event": "from-a-newer-workload", "step": 1}, {"event": "telemetry", "step": "x", "step_seconds": 1}, {"event": "resumed", "step": 2}]
    assert parse_messages(raw) == [Resumed(step=2)]


# One config model per workload ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("launchpad", "settings_model", "how_it_runs"),
    [
        (PretrainLaunchpad, PretrainSettings, {"checkpoint_every_steps"}),
        (FinetuneLaunchpad, FinetuneSettings, {"checkpoint_every_steps"}),
        (PolicyLaunchpad, PolicySettings, {"checkpoint_every_steps", "nodes", "ranks_per_node"}),  # a gang's shape too
    ],
)
def test_the_launchpad_is_the_workload_settings_plus_how_the_step_runs(launchpad, settings_model, how_it_runs):
    """What the workload trains with, plus how the platform runs it (cadence, gang shape): those
    never reach the workload's config, so the same settings train the same model on any shape."""
    assert issubclass(launchpad, settings_model)
    assert set(launchpad.model_fields) - set(settings_model.model_fields) == how_it_runs


def test_the_workload_config_carries_the_launchpad_names_unchanged():
    launchpad = PretrainLaunchpad(steps=12, embedding_dim=8, learning_rate=0.01, checkpoint_every_steps=4)
    config = PretrainConfig.of(launchpad, dataset_uri="/data/omics.zarr")
    assert (config.steps, config.embedding_dim, config.learning_rate, config.dataset_uri) == (12, 8, 0.01, "/data/omics.zarr")
    spec = StepSpec(name="s", entry_point="m", tenant="t", config=config)
    assert PretrainConfig.model_validate(spec.config) == config
    assert TrainPolicyConfig.of(PolicyLaunchpad(hidden=16), datasets=["/d"]).hidden == 16


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [(PretrainLaunchpad, "steps", 0), (PretrainLaunchpad, "batch_size", 0), (PretrainLaunchpad, "mask_fraction", 1.5), (FinetuneLaunchpad, "folds", 1)],
)
def test_out_of_range_settings_are_refused_by_name(model, field, value):
    with pytest.raises(ValidationError) as caught:
        model(**{field: value})
    assert caught.value.errors()[0]["loc"] == (field,)


def test_a_workload_started_with_a_bad_config_says_which_field(tmp_path):
    extras = tmp_path / "extras.json"
    extras.write_text(json.dumps({"config": {"steps": -1, "colour": "red"}, "checkpoint_uri": str(tmp_path / "ck")}))
    done = subprocess.run([sys.executable, "-m", "testbed.counting_workload", "--extras", str(extras)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "CountingConfig" in done.stderr and "`steps`" in done.stderr and "`colour`" in done.stderr
    assert not (tmp_path / "ck").exists()  # nothing ran


# Backends by kind ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_every_registered_kind_resolves_to_its_backend(kind):
    backend = backend_for(kind)
    assert isinstance(backend, Backend) and backend.kind == kind


def test_an_unknown_backend_fails_the_catalog_naming_pool_and_kinds(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(
        "pools:\n  odd:\n    provider: local\n    region: local\n    backend: nomad\n    purchasing: spot\n"
        "    accelerator: local\n    gpus_per_node: 1\n    price_per_gpu_hour: 1.0\n"
    )
    with pytest.raises(PoolCatalogError) as caught:
        load_pools(path)
    message = str(caught.value)
    assert "odd" in message and "nomad" in message and all(kind in message for kind in BACKENDS)


# The environment ---------------------------------------------------------------------------------


def test_settings_read_the_environment_when_asked(monkeypatch, tmp_path):
    monkeypatch.setenv("SINEWGRID_HOME", str(tmp_path))
    monkeypatch.setenv("SINEWGRID_LEDGER_URL", "sqlite:///x.db")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    now = settings()
    assert (now.storage_root, now.ledger_url, now.aws_region) == (str(tmp_path), "sqlite:///x.db", "eu-west-1")
    monkeypatch.delenv("SINEWGRID_HOME")
    assert settings().storage_root == str(Path(REPO_ROOT) / ".sinewgrid")
    assert child_env({"X_ONLY_HERE": "1"})["X_ONLY_HERE"] == "1" and "PATH" in child_env()


def test_a_message_line_written_in_two_parts_is_read_once_whole():
    """Dagster's own file reader hands half a line to the JSON parser when the workload's write
    is split (seen on a busy machine: the step lost its result); ours waits for the newline."""
    import tempfile

    from dagster._utils import tail_file

    from control_plane.compute.backends.message_file import whole_lines

    def split_write(path: str):
        """A stop check that, the first time the reader finds the end of the file, writes the
        rest of the line; after that, it says stop."""
        calls = []

        def should_stop() -> bool:
            calls.append(1)
            if len(calls) == 1:
                with open(path, "a") as f:
                    f.write('1}\n')
                return False
            return True

        return should_stop

    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/messages.jsonl"
        with open(path, "w") as f:
            f.write('{"a": ')
        assert list(whole_lines(path, split_write(path))) == ['{"a": 1}\n']
        with open(path, "w") as f:
            f.write('{"a": ')
        # Dagster's `tail_file` gives the two halves apart: the first is not JSON.
        assert list(tail_file(path, split_write(path))) == ['{"a": ', '1}\n']


# A workload that writes one Pipes message in two parts, a second apart, into the messages file
# its bootstrap parameters name.
SPLIT_WRITER = """
import json, time
from dagster_pipes import PipesEnvVarParamsLoader
path = PipesEnvVarParamsLoader().load_messages_params()["path"]
line = json.dumps({"__dagster_pipes_version": "0.1", "method": "report_custom_message", "params": {"payload": "whole"}})
with open(path, "a") as stream:
    stream.write(line[:25]); stream.flush(); time.sleep(1.0)
    stream.write(line[25:] + "\\n"); stream.flush()
"""


def test_the_local_backend_reads_a_message_written_in_two_parts():
    """The local backend's subprocess client reads its messages file whole line by whole line:
    a message the workload writes in two parts arrives, once (Dagster's default reader stops at
    the first half, and every later message of the step is lost)."""
    from control_plane.compute.backends.local import LocalBackend

    received: list = []

    @dg.asset
    def split_message(context):  # no annotations: this module's are strings, and this asset is local
        code, done = LocalBackend().client.launch(context=context, command=[sys.executable, "-c", SPLIT_WRITER])
        received.extend([code, *done.get_custom_messages()])
        return dg.MaterializeResult()

    assert dg.materialize([split_message]).success
    assert received == [0, "whole"]
