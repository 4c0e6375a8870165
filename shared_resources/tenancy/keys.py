"""Moved to shared_resources.runtime.keys (the workload runtime holds it)."""
from shared_resources.runtime.keys import *  # noqa: F401,F403
