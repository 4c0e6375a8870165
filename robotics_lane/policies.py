"""Policies that act in the simulator: the scripted stand-in operator and learnt MLP policies.

Workload side: imports torch and numpy, never Dagster.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from robotics_lane.sim.base import ACTION_NAMES, STATE_NAMES, Policy


class MLPPolicy(nn.Module):
    """Behaviour-cloned policy: cart-pole state → normalised cart force in [-1, 1]."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(len(STATE_NAMES), hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, len(ACTION_NAMES))
        )

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(state))

    def as_policy(self) -> Policy:
        self.eval()

        def act(observation: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return self(torch.as_tensor(observation, dtype=torch.float32).reshape(1, -1)).numpy()[0]

        return act


def load_policy(spec: dict[str, Any], seed: int) -> Policy:
    """Build the policy a rollout asks for.

    `{"kind": "scripted", "operator_noise": 0.0}` — the scripted balancing controller, with
    operator noise seeded per episode; `{"kind": "checkpoint", "uri": ...}` — a trained
    MLPPolicy from its checkpoint folder (newest valid checkpoint).
    """
    kind = spec.get("kind")
    if kind == "scripted":
        from robotics_lane.sim.controllers import BalancingController, NoisyOperator

        noise = float(spec.get("operator_noise", 0.0))
        controller = BalancingController()
        return NoisyOperator(controller, noise_std=noise, seed=seed) if noise > 0 else controller
    if kind == "checkpoint":
        from shared_resources.runtime.checkpoints import CheckpointStore

        checkpoint = CheckpointStore(spec["uri"]).latest_valid()
        if checkpoint is None:
            raise SystemExit(f"no valid policy checkpoint under {spec['uri']}; materialize robotics/policy first")
        model = MLPPolicy(hidden=int(checkpoint.meta.get("hidden", 64)))
        model.load_state_dict(checkpoint.tensors["policy"])
        return model.as_policy()
    raise SystemExit(f"unknown policy kind {kind!r}: use 'scripted' or 'checkpoint'")
