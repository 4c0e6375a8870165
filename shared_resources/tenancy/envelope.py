"""Moved to shared_resources.runtime.envelope (the workload runtime holds it)."""
from shared_resources.runtime.envelope import *  # noqa: F401,F403
