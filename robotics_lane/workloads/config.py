"""The Robotics workloads' configs: one model each, read by the workload and shown in the launchpad.

`PolicySettings` is what a robotics engineer may change for behaviour cloning (the policy
asset's launchpad config is built on it); `TrainPolicyConfig` adds the datasets the asset
chose. `RolloutConfig` is one shard of a sweep or an evaluation, built by the assets. No
Dagster here: workloads import this module, in the main runtime and in Isaac Lab's.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from robotics_lane.scenes.files import SceneFiles
from robotics_lane.sim.camera import check_cameras
from workload_runtime.setting_ranges import RangedSettings

Positive = Annotated[int, Field(ge=1)]


class PolicySettings(RangedSettings):
    """Behaviour cloning of the policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: Positive = Field(1500, description="Optimiser steps.")
    hidden: Positive = Field(64, description="Width of the policy network's hidden layers.")
    learning_rate: Annotated[float, Field(gt=0)] = Field(3e-3, description="Adam learning rate.")
    seed: int = Field(0, description="Seeds the batches: the same seed gives the same policy.")


class TrainPolicyConfig(PolicySettings):
    """What the training workload runs: the settings and the LeRobot v3 datasets to learn from."""

    datasets: list[str] = Field(min_length=1, description="LeRobot v3 dataset folders (teleop sessions, rollouts, relabelled failures).")
    batch_size: Positive = 256
    successful_only: bool = Field(True, description="Learn only from episodes that reached their goal.")
    threads: Positive = 1

    @classmethod
    def of(cls, settings: PolicySettings, **decided: object) -> TrainPolicyConfig:
        return cls(**settings.model_dump(include=set(PolicySettings.model_fields)), **decided)


class RolloutConfig(BaseModel):
    """One shard of rollouts: a policy run in simulation for a list of seeds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = Field(description="The simulator: `mujoco` or `isaaclab`.")
    seeds: list[int] = Field(min_length=1)
    output_uri: str = Field(description="Where episodes and trial records are committed (see rollout_output.py).")
    task: dict[str, Any] = Field(default_factory=dict, description="The task (`TaskSpec` fields).")
    randomize: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="Domain randomisation: a [low, high] range per task parameter, drawn per episode from its seed "
        "(see `robotics_lane.sim.randomization`). MuJoCo only: each draw is its own simulator.",
    )
    policy: dict[str, Any] = Field(default_factory=lambda: {"kind": "scripted"}, description="`scripted` (with `operator_noise`) or `checkpoint` (with `uri`).")
    task_label: str = "balance the pole"
    scene: SceneFiles | None = Field(
        None, description="The registered scene version to load (`robotics/scenes@…`, read from the store and verified). "
        "Unset: the catalog's scene for the backend as it is now, unregistered (hand runs and drills only).",
    )
    num_envs: Annotated[int, Field(ge=1, le=65_536)] | None = Field(
        None,
        description="Environments stepped together in one process. Unset: the backend's default for the "
        "device it runs on (MuJoCo 64; Isaac Lab 256 on a CPU, 4096 on a GPU), never more than the episodes left to run.",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda|cuda:[0-9]+)$",
        description="Where Isaac Lab simulates: `auto` (the node's GPU when it has one, else the CPU), `cpu`, `cuda` or `cuda:<index>`. MuJoCo runs on the CPU only.",
    )
    cameras: list[str] = Field(
        default_factory=list,
        description="Cameras rendered offscreen into every episode, e.g. `[\"front\"]` (stored as `observation.images.<name>` videos). "
        "Empty: state-only episodes.",
    )

    @model_validator(mode="after")
    def _device_fits_backend(self) -> RolloutConfig:
        if self.backend == "mujoco" and self.device not in ("auto", "cpu"):
            raise ValueError(f"device {self.device!r}: the MuJoCo backend runs on the CPU only; set device to 'cpu' or 'auto'")
        check_cameras(self.cameras, where="RolloutConfig.cameras")
        if self.randomize and self.backend != "mujoco":
            raise ValueError(
                f"randomize: per-episode randomisation builds one simulator per draw, which the {self.backend!r} backend "
                "cannot do in one process; randomise on the 'mujoco' backend, or drop `randomize` for fixed task params"
            )
        if self.randomize:
            from robotics_lane.sim.randomization import check_ranges

            check_ranges(self.task.get("name", "cartpole"), self.randomize)
        return self
