"""The smallest gang step: every rank meets the others, they agree once, rank 0 publishes a
final checkpoint. What a gang costs to start and finish, with no training in it (the gang launch
benchmark times it through the platform and by hand)."""

from __future__ import annotations

import numpy as np

from workload_runtime.workload import WorkloadRun


def main() -> None:
    with WorkloadRun(framework="numpy") as run:
        run.start_work()
        ranks = run.gang.world_size if run.gang else 1
        if run.gang:
            run.gang.agree(preempt=False, checkpoint_due=False)
        run.finish(0, {"gang": {"ranks": np.array([ranks])}}, metadata={"ranks": ranks})


if __name__ == "__main__":
    main()
