"""Domain randomisation: each episode of a sweep on its own draw of the task's parameters.

A sweep that randomises names a range per parameter, e.g. ``{"actuator_gain": (0.4, 1.2)}``;
every episode then runs on parameters drawn uniformly from those ranges, from its own seed. The
draw depends only on the seed (a random stream kept apart from the simulator's own use of the
seed), so an episode stays a function of its seed: a resumed or resharded sweep commits the same
episodes. The trial record of each episode keeps the parameters it ran on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from robotics_lane.sim.base import KNOWN_TASKS, TaskSpec

RANDOMIZATION_STREAM = 0x5EED  # keeps the draw apart from the simulator's reset, seeded with the same seed

Ranges = Mapping[str, Sequence[float]]


def check_ranges(task_name: str, ranges: Ranges) -> None:
    """Raise a ValueError naming each range that is not ``[low, high]`` of a parameter of the task."""
    known = KNOWN_TASKS.get(task_name)
    if known is None:
        raise ValueError(f"randomize: unknown task {task_name!r}; known tasks: {sorted(KNOWN_TASKS)}")
    for key, bounds in ranges.items():
        if key not in known:
            raise ValueError(f"randomize[{key!r}]: not a parameter of task {task_name!r}; known parameters: {sorted(known)}")
        if len(bounds) != 2 or not all(np.isfinite(b) for b in bounds) or bounds[0] > bounds[1]:
            raise ValueError(f"randomize[{key!r}] = {list(bounds)}: give [low, high] with low <= high, e.g. [0.4, 1.2]")


def randomized_task(task: TaskSpec, ranges: Ranges, seed: int) -> TaskSpec:
    """``task`` with each parameter in ``ranges`` drawn uniformly for the episode of ``seed``
    (parameters outside ``ranges`` keep their values). No ranges: ``task`` itself."""
    if not ranges:
        return task
    check_ranges(task.name, ranges)
    rng = np.random.default_rng([int(seed), RANDOMIZATION_STREAM])
    drawn = {key: round(float(rng.uniform(low, high)), 4) for key, (low, high) in sorted(ranges.items())}
    return TaskSpec(name=task.name, max_steps=task.max_steps, params={**task.params, **drawn})
