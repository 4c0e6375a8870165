"""Backends launch one attempt of a step on a pool and report how it ended."""

import dagster as dg

from shared_resources.backends.base import AttemptOutcome, AttemptResult, StepBackend
from shared_resources.backends.local import LocalBackend

__all__ = ["AttemptOutcome", "AttemptResult", "StepBackend", "LocalBackend", "backend_for"]


def backend_for(kind: str) -> StepBackend:
    if kind == "local":
        return LocalBackend()
    raise dg.Failure(
        description=(
            f"Placement chose a `{kind}` pool, but only the `local` backend exists in this release. "
            "Point SINEWGRID_POOLS at a catalog of local pools (the packaged default), or leave "
            f"`{kind}` pools out of the catalog until their backend lands."
        )
    )
