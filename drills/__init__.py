"""Failure drills: inject real faults into real runs and measure how the platform recovers.

`sinewgrid drill` (`campaign.py`) runs the scenarios of `runner.py` (preemption with and
without notice, a torn checkpoint, the loss of a pool, a straggler, an unhealthy node) against
the lanes' own workloads (`workloads.py`) on the local pool and on a Slurm cluster
(`testbed/slurm_cluster.py`), and a preemption trace over a longer run (`replay.py`);
`report.py` publishes what happened (docs/drills.md and JSON), with `report_markdown.py` and
`report_plots.py`.
"""
