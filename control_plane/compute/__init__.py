"""Compute: how one step runs, one attempt at a time: qualifying a pool, the attempt's inputs,
launching and booking it (`attempts.py`), recovery policies, cool-downs, pool health and the
attempt monitor; `backends/` runs the attempts. The `compute` Dagster resource that drives this
loop is `shared_resources/compute.py`."""
