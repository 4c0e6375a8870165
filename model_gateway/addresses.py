"""Where each provider of the model catalog answers.

A real provider names its `base_url`. A provider with a `standin:` block (the embedded
catalog's two, for the demo and the tests) is served by a stand-in on loopback, which lives
outside the product in `testbed/model_providers/`: the gateway loads its starter by name, and
only when the catalog names a stand-in, as a backend kind is loaded
(`control_plane/catalog/backends.py`). A production catalog names none, so the gateway there
never touches the test bed.
"""

from __future__ import annotations

import importlib

from control_plane.catalog.models import ModelCatalog
from model_gateway.tasks import Task

STANDIN_HUB = "testbed.model_providers.hub"


def addresses(catalog: ModelCatalog, storage_root: str, tasks: list[Task]) -> dict[str, str]:
    """Each provider's base URL; stand-ins are started (once per process) and taught `tasks`."""
    providers = list(catalog.providers.values())
    hub = importlib.import_module(STANDIN_HUB) if any(p.is_standin for p in providers) else None
    return {p.name: hub.standin(p, storage_root, tasks).base_url if hub and p.is_standin else p.base_url for p in providers}
