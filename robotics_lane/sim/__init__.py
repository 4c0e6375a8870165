"""Simulators for the Robotics lane: one cart-pole interface, MuJoCo and Isaac Lab backends.

``make_simulator("mujoco" | "isaaclab", TaskSpec(...))`` returns a ``Simulator`` in the common
state layout (``STATE_NAMES``) with normalised actions (``ACTION_NAMES``). MuJoCo runs in the
main venv; Isaac Lab in its own Python 3.12 runtime (``make isaaclab-runtime``). This package
imports only numpy: no Dagster, and no backend until one is asked for.
"""

from robotics_lane.sim.base import (
    ACTION_NAMES,
    FAILURE_MODES,
    KNOWN_BACKENDS,
    KNOWN_TASKS,
    STATE_NAMES,
    Episode,
    Simulator,
    StepResult,
    TaskSpec,
    run_episode,
)
from robotics_lane.sim.controllers import BalancingController, NoisyOperator, zero_policy
from robotics_lane.sim.factory import make_simulator

__all__ = [
    "ACTION_NAMES",
    "FAILURE_MODES",
    "KNOWN_BACKENDS",
    "KNOWN_TASKS",
    "STATE_NAMES",
    "BalancingController",
    "Episode",
    "NoisyOperator",
    "Simulator",
    "StepResult",
    "TaskSpec",
    "make_simulator",
    "run_episode",
    "zero_policy",
]
