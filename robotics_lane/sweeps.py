"""The nightly simulation sweeps: which simulator and scene, which task variations, how many episodes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SweepConfig:
    """One sweep: `episodes` seeded rollouts of the scripted expert, split into `shards`.

    Each shard steps `num_envs` environments together (unset: the backend's default for the
    device the shard lands on, see `robotics_lane.sim.factory.DEFAULT_NUM_ENVS`) on `device`
    (`auto`: the node's GPU for Isaac Lab when it has one, else the CPU). `cameras` are
    rendered into every episode (`robotics_lane.sim.camera.CAMERAS`; MuJoCo only). `scene` names
    the scene of `robotics_lane/scenes/catalog.py` it runs in (unset: the backend's); its version,
    the scene's content hash, is part of the sweep's partition key (`robotics_lane.defs.partitions`).
    """

    backend: str
    description: str
    task_params: dict[str, float] = field(default_factory=dict)
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


SWEEPS: dict[str, SweepConfig] = {
    "cartpole-isaaclab": SweepConfig(
        backend="isaaclab",
        runtime="isaaclab",
        scene="cartpole-isaaclab",
        description="Isaac Lab 3.0 Cartpole (Newton physics), nominal parameters; state only (Isaac Lab cameras are not wired in yet).",
        episodes=4,
        shards=1,
    ),
    "cartpole-mujoco-randomized": SweepConfig(
        backend="mujoco",
        scene="cartpole-mujoco",
        description="MuJoCo cart-pole with a heavier pole, weaker actuator and sensor noise (domain randomization), with a front camera.",
        task_params={"pole_mass_scale": 1.3, "actuator_gain": 0.9, "observation_noise": 0.01},
        cameras=("front",),
        episodes=8,
        shards=2,
    ),
}
