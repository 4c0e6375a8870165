"""The policy a rollout acts with, over all its envs at once (a ``BatchPolicy``).

``{"kind": "scripted", "operator_noise": 0.15}`` is the scripted balancing controller with
operator noise seeded per episode (``ScriptedOperator``, the batch form of ``NoisyOperator``);
with ``"adapt_to_task": true`` it is a privileged expert that knows the task's actuator gain
(``BalancingController.adapted_to``), as a randomised sweep's expert must be;
``{"kind": "checkpoint", "uri": ...}`` is a trained ``MLPPolicy`` from its newest valid
checkpoint, one forward pass for every env per step (torch is imported only for this one).

Workload side: never Dagster.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from robotics_lane.sim.base import TaskSpec
from robotics_lane.sim.batch_rollout import BatchPolicy


class MLPBatchPolicy:
    """A trained MLP policy acting on every env in one forward pass."""

    def __init__(self, model: Any) -> None:
        import torch

        self._torch = torch
        self.model = model.eval()

    def start(self, envs: np.ndarray, seeds: np.ndarray) -> None:
        """No per-episode state: the policy is deterministic."""

    def __call__(self, observations: np.ndarray, steps: np.ndarray) -> np.ndarray:
        with self._torch.no_grad():
            return self.model(
                self._torch.as_tensor(observations, dtype=self._torch.float32)
            ).numpy()


def load_batch_policy(
    spec: dict[str, Any], num_envs: int, max_steps: int, task: TaskSpec | None = None
) -> BatchPolicy:
    """Build the policy a rollout config asks for, for ``num_envs`` envs of ``task``."""
    kind = spec.get("kind")
    if kind == "scripted":
        from robotics_lane.sim.controllers import BalancingController, ScriptedOperator

        controller = BalancingController()
        return ScriptedOperator(
            controller.adapted_to(task or TaskSpec()) if spec.get("adapt_to_task") else controller,
            float(spec.get("operator_noise", 0.0)),
            num_envs,
            max_steps,
        )
    if kind == "checkpoint":
        from robotics_lane.mlp_policy import MLPPolicy
        from workload_runtime.checkpoints import CheckpointStore

        checkpoint = CheckpointStore(spec["uri"]).latest_valid()
        if checkpoint is None:
            raise SystemExit(
                f"no valid policy checkpoint under {spec['uri']}; materialize robotics/policy first"
            )
        model = MLPPolicy(hidden=int(checkpoint.meta.get("hidden", 64)))
        model.load_state_dict(checkpoint.tensors["policy"])
        return MLPBatchPolicy(model)
    raise SystemExit(
        f"unknown policy kind {kind!r} in the rollout config's `policy`: use 'scripted' or 'checkpoint'"
    )
