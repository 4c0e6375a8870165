"""Backends launch one attempt of a step on a pool and report how it ended."""

from shared_resources.backends.base import AttemptOutcome, AttemptResult, StepBackend
from shared_resources.backends.local import LocalBackend

__all__ = ["AttemptOutcome", "AttemptResult", "StepBackend", "LocalBackend", "backend_for"]


def backend_for(kind: str) -> StepBackend:
    if kind == "local":
        return LocalBackend()
    raise NotImplementedError(
        f"backend `{kind}` is not available in this release; pools on this machine must use `backend: local`."
    )
