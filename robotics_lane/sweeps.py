"""The nightly simulation sweeps: which simulator and scene, which task variations, how many episodes."""

from __future__ import annotations

from dataclasses import dataclass, field

from robotics_lane.scenes.files import SceneFiles
from robotics_lane.workloads.config import RolloutConfig

TASK_LABEL = "balance the pole"


@dataclass(frozen=True)
class SweepConfig:
    """One sweep: `episodes` seeded rollouts of the scripted expert, split into `shards`.

    `task_params` fixes task parameters for every episode; `randomize` draws them per episode
    from [low, high] ranges (domain randomisation, MuJoCo only), and the expert, privileged,
    knows each episode's actuator gain (`BalancingController.adapted_to`).

    Each shard steps `num_envs` environments together (unset: the backend's default for the
    device the shard lands on, see `robotics_lane.sim.factory.DEFAULT_NUM_ENVS`) on `device`
    (`auto`: the node's GPU for Isaac Lab when it has one, else the CPU). `cameras` are
    rendered into every episode (`robotics_lane.sim.camera.CAMERAS`; MuJoCo and Isaac Lab). `scene`
    names the scene of `robotics_lane/scenes/catalog.py` it runs in (unset: the backend's), at its
    current version, or pins one version, `<scene>-<hash8>` (a registered one); the version is
    part of the sweep's partition key (`robotics_lane.defs.partitions`).
    """

    backend: str
    description: str
    task_params: dict[str, float] = field(default_factory=dict)
    randomize: dict[str, tuple[float, float]] = field(default_factory=dict)
    episodes: int = 8
    shards: int = 2
    max_steps: int = 200
    operator_noise: float = 0.15
    runtime: str = "default"
    num_envs: int | None = None
    device: str = "auto"
    cameras: tuple[str, ...] = ()
    scene: str | None = None

    def seeds(self, night: str) -> list[int]:
        """Seeds differ per night (so each night adds new data) and are fixed for a night."""
        base = int(night.replace("-", "")) % 100_000 * 100
        return [base + i for i in range(self.episodes)]

    def task(self) -> dict:
        return {"name": "cartpole", "max_steps": self.max_steps, "params": dict(self.task_params)}

    def rollout_config(self, seeds: list[int], output_uri: str, scene: SceneFiles | None = None) -> RolloutConfig:
        """One shard's rollout config: the scripted expert, privileged (it knows each episode's
        actuator gain), with operator noise, in the registered `scene` version, rendering `cameras`."""
        return RolloutConfig(
            backend=self.backend, seeds=seeds, output_uri=output_uri, task=self.task(), randomize=dict(self.randomize),
            policy={"kind": "scripted", "operator_noise": self.operator_noise, "adapt_to_task": True},
            task_label=TASK_LABEL, num_envs=self.num_envs, device=self.device, cameras=list(self.cameras), scene=scene,
        )


# Per-episode ranges around the nominal model: what a robotics engineer would vary without
# having measured the real robot (its actuator turns out weaker still: see docs/robotics-lane.md).
DOMAIN_RANDOMIZATION: dict[str, tuple[float, float]] = {
    "pole_mass_scale": (0.7, 1.5),
    "actuator_gain": (0.4, 1.2),
    "observation_noise": (0.0, 0.05),
    "start_disturbance_scale": (1.0, 10.0),
}

SWEEPS: dict[str, SweepConfig] = {
    "cartpole-isaaclab": SweepConfig(
        backend="isaaclab",
        runtime="isaaclab",
        scene="cartpole-isaaclab",
        description="Isaac Lab 3.0 Cartpole (Newton physics), nominal parameters; with a front camera (Newton's Warp ray tracer).",
        cameras=("front",),
        episodes=4,
        shards=1,
    ),
    "cartpole-mujoco-randomized": SweepConfig(
        backend="mujoco",
        scene="cartpole-mujoco",
        description="MuJoCo cart-pole, domain-randomised per episode: pole mass, actuator gain, sensor noise and how far from upright it starts; with a front camera.",
        randomize=DOMAIN_RANDOMIZATION,
        cameras=("front",),
        episodes=16,
        shards=2,
    ),
}
