"""A drill's fault lands on its own run, never on another gang running on the same machine.

The suite runs several gangs at once (a drill's, a Kubernetes test's, a Slurm test's): a drill
that looked for "rank 1 of the pretraining workload" on the whole machine once killed another
test's rank (whose attempt then read as a lost node) and left its own held forever.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from drills.faults import rank_process
from drills.scenarios import GANG_ENTRY_POINT

SLEEP = "import sys, time; print('up', flush=True); time.sleep(60)"


@pytest.fixture
def two_gangs() -> Iterator[dict[tuple[str, int], subprocess.Popen]]:
    """Two gangs of two ranks each, as a cluster starts them: the entry point on the command
    line, the rank and the gang's meeting point in the environment."""
    ranks = {}
    try:
        for port in ("29501", "29502"):
            for rank in (0, 1):
                env = {"PATH": "/usr/bin:/bin", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "2", "SINEWGRID_NODE": f"node-{port}-{rank}"}
                process = subprocess.Popen([sys.executable, "-c", SLEEP, "-m", GANG_ENTRY_POINT], env=env, stdout=subprocess.PIPE, start_new_session=True)
                ranks[(port, rank)] = process
        for process in ranks.values():
            assert process.stdout.readline() == b"up\n"  # its environment is readable once it runs
        yield ranks
    finally:
        for process in ranks.values():
            process.kill()
            process.wait()


def test_a_rank_is_found_in_the_held_ranks_gang_only(two_gangs):
    for port in ("29502", "29501"):
        held = two_gangs[(port, 0)].pid
        process, node = rank_process(1, GANG_ENTRY_POINT, peer=held)
        assert (process.pid, node) == (two_gangs[(port, 1)].pid, f"node-{port}-1")


def test_a_held_process_outside_any_gang_is_refused_with_the_reason(two_gangs):
    lone = subprocess.Popen([sys.executable, "-c", SLEEP], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE)
    try:
        assert lone.stdout.readline() == b"up\n"
        with pytest.raises(RuntimeError, match="has no MASTER_ADDR and MASTER_PORT"):
            rank_process(1, GANG_ENTRY_POINT, peer=lone.pid)
    finally:
        lone.kill()
        lone.wait()
