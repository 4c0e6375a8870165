"""What the node a workload runs on offers it: a cache folder for files it makes at run time.

Workload side, standard library only. Where each cache goes is set on the node (the
orchestrator's settings do not travel there), read in `node_env.py`.
"""

from __future__ import annotations

from pathlib import Path

from workload_runtime.node_env import node_env


def cache_dir(name: str) -> Path:
    """The folder of the node's cache `name` (`data`, `scenes`, `isaaclab`): the one its variable
    names (`node_env.CACHE_FOLDER_ENV`) if set, else `<user cache>/sinewgrid/<name>`
    (`$XDG_CACHE_HOME` or `~/.cache`)."""
    env = node_env()
    if env.cache_folders.get(name):
        return Path(env.cache_folders[name])
    return Path(env.user_cache or Path.home() / ".cache") / "sinewgrid" / name
