"""Moved to shared_resources.runtime.tenant_access (the workload runtime holds it)."""
from shared_resources.runtime.tenant_access import *  # noqa: F401,F403
from shared_resources.runtime.tenant_access import _KEYRINGS  # noqa: F401
