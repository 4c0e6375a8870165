"""A gang on Ray: the entrypoint of the Ray job that runs one gang attempt.

    python -m workload_runtime.ray_gang --nodes 2 --ranks 2 --strategy STRICT_SPREAD -- python -m ENTRY

It reserves a **placement group** of one bundle per node (`CPU`: ranks, `GPU`: ranks when the
step has GPUs), all of them or none (`pg.ready()`), then starts one actor per rank in its node's
bundle. Each actor runs the workload as a child process with the rendezvous variables torchrun
would set (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` = rank 0's node, `MASTER_PORT`),
so the workload is the same module as on every backend. `STRICT_SPREAD` puts each bundle on a
node of its own (a gang across nodes); `PACK` puts them together where they fit.

It watches the ranks: when one ends badly, or its actor dies with its node, the others get
SIGTERM, then SIGKILL; a lost node is printed as `sinewgrid: lost node NODE` (the Ray backend
reads it back). SIGTERM from `stop_job` goes to every rank (they checkpoint and exit 75).
Exit code: 0 when every rank succeeded, 75 when they checkpointed and stopped, else the first
bad rank's code.

Runs on the Ray cluster, beside the workload (as the forkserver runs beside local workloads):
imports ray, never Dagster.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workload_runtime.node_env import node_env

PREEMPTED_EXIT_CODE = 75
GRACE_SECONDS = 30.0


@ray.remote(num_cpus=1)
class Rank:
    """One rank: where it runs, and its workload process."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def where(self) -> tuple[str, str]:
        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(self, command: list[str], env: dict[str, str]) -> int:
        # The rank's process gets this actor's environment as it is, plus its rendezvous variables:
        # handed on, not read (and an actor cannot import the project: ray pickled it by value).
        self.process = subprocess.Popen(command, env={**os.environ, **env})
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll() if self.process else None

    def signal(self, signum: int) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--ranks", type=int, required=True, help="ranks per node")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per rank")
    parser.add_argument("--strategy", default="STRICT_SPREAD", choices=["STRICT_SPREAD", "SPREAD", "PACK", "STRICT_PACK"])
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for every node of the gang")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    ray.init(address="auto", log_to_driver=False)
    bundle = {"CPU": args.ranks, **({"GPU": args.ranks * args.gpus} if args.gpus else {})}
    group = placement_group([dict(bundle) for _ in range(args.nodes)], strategy=args.strategy)
    ready, _ = ray.wait([group.ready()], timeout=args.wait)
    if not ready:
        remove_placement_group(group)
        print(f"sinewgrid: the gang could not get {args.nodes} node(s) of {bundle} ({args.strategy}) within {args.wait:g}s", flush=True)
        return 1

    ranks = []
    for node in range(args.nodes):
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=node)
        ranks += [Rank.options(scheduling_strategy=strategy, num_gpus=args.gpus).remote() for _ in range(args.ranks)]
    where = ray.get([r.where.remote() for r in ranks])
    nodes = [node_id[:12] for _, node_id in where]
    master_addr, master_port = where[0][0], ray.get(ranks[0].free_port.remote())
    world = len(ranks)
    print(f"sinewgrid: a gang of {world} ranks on {len(set(nodes))} Ray node(s): {', '.join(dict.fromkeys(nodes))}; rank 0 listens on {master_addr}:{master_port}", flush=True)
    for rank, actor in enumerate(ranks):
        env = {
            "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % args.ranks), "LOCAL_WORLD_SIZE": str(args.ranks),
            "GROUP_RANK": str(rank // args.ranks), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            "SINEWGRID_NODE": f"ray-{nodes[rank]}", "OMP_NUM_THREADS": node_env().omp_num_threads,
        }  # fmt: skip
        ray.get(actor.start.remote(command, env))

    stopping: list[float] = []

    def forward(signum, frame) -> None:  # stop_job: every rank checkpoints and exits 75
        for actor in ranks:
            actor.signal.remote(signal.SIGTERM)
        stopping.append(time.monotonic())

    signal.signal(signal.SIGTERM, forward)
    codes: list[int | None] = [None] * world
    first_bad: int | None = None
    while any(c is None for c in codes):
        for rank, actor in enumerate(ranks):
            if codes[rank] is not None:
                continue
            try:
                codes[rank] = ray.get(actor.poll.remote(), timeout=30)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                codes[rank] = -signal.SIGKILL
                print(f"sinewgrid: lost node ray-{nodes[rank]} (rank {rank}'s actor is gone)", flush=True)
            if codes[rank] not in (None, 0) and first_bad is None:
                first_bad = rank
                if codes[rank] != PREEMPTED_EXIT_CODE:
                    forward(signal.SIGTERM, None)
        if stopping and time.monotonic() - stopping[0] > GRACE_SECONDS:
            for actor in ranks:
                actor.signal.remote(signal.SIGKILL)
        time.sleep(0.2)
    remove_placement_group(group)
    if first_bad is None:
        return 0
    if all(c in (0, PREEMPTED_EXIT_CODE) for c in codes):
        return PREEMPTED_EXIT_CODE
    code = codes[first_bad] or 1
    return code if code > 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
