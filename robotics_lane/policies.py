"""The policies a rollout acts with: the scripted stand-in operator, or a learnt MLP policy
from its checkpoint (`mlp_policy.py`, imported, with torch, only for that one).

Workload side: never Dagster.
"""

from __future__ import annotations

from typing import Any

from robotics_lane.sim.base import Policy


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
        from robotics_lane.mlp_policy import MLPPolicy
        from workload_runtime.checkpoints import CheckpointStore

        checkpoint = CheckpointStore(spec["uri"]).latest_valid()
        if checkpoint is None:
            raise SystemExit(f"no valid policy checkpoint under {spec['uri']}; materialize robotics/policy first")
        model = MLPPolicy(hidden=int(checkpoint.meta.get("hidden", 64)))
        model.load_state_dict(checkpoint.tensors["policy"])
        return model.as_policy()
    raise SystemExit(f"unknown policy kind {kind!r}: use 'scripted' or 'checkpoint'")
