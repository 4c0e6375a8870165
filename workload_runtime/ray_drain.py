"""Drain one node of the Ray cluster this runs on, as Ray's autoscaler does before it removes one.

    python -m workload_runtime.ray_drain NODE REASON

NODE is the name a gang gives it (`ray-<the first 12 hex digits of its node id>`). A drained
node takes no new task, actor or placement group, so the next gang lands on the cluster's
other nodes. Ray's own call (`ray drain-node`, reason PREEMPTION, no deadline) does the work;
only the cluster's GCS takes it, so the Ray backend runs this as a small Ray job.

Exit codes: 0 drained; 3 the node is gone already (its raylet died: nothing to drain);
1 Ray refused (the message says why).
"""

from __future__ import annotations

import subprocess
import sys

import ray


def main(argv: list[str] | None = None) -> int:
    node, reason = (argv if argv is not None else sys.argv[1:])[:2]
    prefix = node.removeprefix("ray-")
    ray.init(address="auto", log_to_driver=False)
    alive = [n["NodeID"] for n in ray.nodes() if n["NodeID"].startswith(prefix) and n["Alive"]]
    ray.shutdown()
    if not alive:
        print(f"sinewgrid: Ray node {node} is gone already: nothing to drain", flush=True)
        return 3
    drained = subprocess.run(
        [sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address", "auto", "--node-id", alive[0],
         "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", reason[:200]],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    print((drained.stdout + drained.stderr).strip() or f"sinewgrid: drained Ray node {alive[0]}", flush=True)
    return 0 if drained.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
