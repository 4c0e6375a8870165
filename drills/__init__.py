"""Failure drills: inject real faults into real runs and measure how the platform recovers.

`sinewgrid drill` runs the scenarios in `scenarios.py` (preemption with and without notice,
a torn checkpoint, the loss of a pool, a straggler, an unhealthy node) against the lanes'
own workloads on the local pool and on a Slurm cluster, and a preemption trace over a longer
run; `report.py` publishes what happened (docs/drills.md, JSON, plots).
"""
