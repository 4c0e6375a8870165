"""Workloads the tests run through the compute resource (entry points: `tests.workloads.<name>`)."""
