"""Backends launch one attempt of a step on a pool and report how it ended.

`local` runs the workload as a subprocess here; `slurm`, `ray` and `kubernetes` hand it to
that engine. Which class serves a kind is the registry in `control_plane/catalog/backends.py`;
a backend's module is imported only when a pool of its kind is used, so a laptop needs none
of the engines' clients.
"""

from __future__ import annotations

import functools
import importlib

from control_plane.catalog.backends import backend_kind
from control_plane.compute.backends.base import AttemptOutcome, AttemptResult, Backend, Refusal

__all__ = ["AttemptOutcome", "AttemptResult", "Backend", "Refusal", "backend_for"]


@functools.cache
def backend_class(kind: str) -> type[Backend]:
    module, _, name = backend_kind(kind).implementation.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"{module}:{name}, the backend registered for `{kind}`, is not a Backend subclass")
    return cls


def backend_for(kind: str) -> Backend:
    """A backend for a pool's `backend:` value."""
    return backend_class(kind)()
