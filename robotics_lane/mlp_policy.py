"""The learnt policy: a small MLP behaviour-cloned from the episodes (torch).

Workload side: imports torch and numpy, never Dagster. Kept apart from `policies.py`, so a
rollout of the scripted operator starts without torch.
"""

from __future__ import annotations

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
