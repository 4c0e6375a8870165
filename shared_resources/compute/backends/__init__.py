"""Backends launch one attempt of a step on a pool and report how it ended.

`local` runs the workload as a subprocess here; `slurm`, `ray` and `kubernetes` hand it to
that engine (imported only when a pool uses it, so a laptop needs none of their clients).
"""

from __future__ import annotations

from shared_resources.compute.backends.base import AttemptOutcome, AttemptResult, Refusal, StepBackend
from shared_resources.compute.backends.local import LocalBackend

__all__ = ["AttemptOutcome", "AttemptResult", "Refusal", "StepBackend", "LocalBackend", "backend_for"]


def backend_for(kind: str) -> StepBackend:
    """The backend for a pool's `backend:` value."""
    if kind == "local":
        return LocalBackend()
    if kind == "slurm":
        from shared_resources.compute.backends.slurm import SlurmBackend

        return SlurmBackend()
    if kind == "ray":
        from shared_resources.compute.backends.ray import RayBackend

        return RayBackend()
    if kind == "kubernetes":
        from shared_resources.compute.backends.kubernetes import KubernetesBackend

        return KubernetesBackend()
    raise ValueError(f"unknown backend {kind!r}: expected local, slurm, ray or kubernetes")
