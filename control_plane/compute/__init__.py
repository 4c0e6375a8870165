"""Compute: the `compute` resource that runs a step on the pool placement picks, one attempt at a
time, with recovery policies, cool-downs, pool health and the attempt monitor; `backends/` runs
the attempts."""
