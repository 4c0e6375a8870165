"""A tiny checkpointed workload for backend tests: `steps` steps of a deterministic
recurrence, a checkpoint every `checkpoint_every_steps`, SIGTERM -> checkpoint and exit 75.

The result (`digest`) depends only on `steps` and `seed`, so a run that was preempted and
resumed must report the same digest as an uninterrupted one. `step_seconds` slows each step
so a test can interrupt it mid-run; `fail_at_step` makes it crash (a user-code failure).
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from workload_runtime.node_env import process_environment
from workload_runtime.workload import WorkloadRun


class CountingConfig(BaseModel):
    """The counting workload's config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(20, ge=0)
    seed: int = 0
    step_seconds: float = Field(0.0, ge=0, description="Sleep this long in each step, so a test can interrupt a run mid-way.")
    fail_at_step: int | None = Field(None, description="Crash (a user-code failure) when this step starts.")
    report_environ: bool = Field(False, description="Report the names (never the values) of the variables this process started with.")


def environ_names() -> list[str]:
    """The names of the variables this process started with: its environment now and as the kernel
    holds it (/proc/self/environ: a process forked warm shows its forkserver's there)."""
    with open("/proc/self/environ", "rb") as environ:
        started = {entry.split(b"=", 1)[0].decode() for entry in environ.read().split(b"\0") if entry}
    return sorted(started | set(process_environment()))


def main() -> None:
    started_with = environ_names()  # before anything here sets a variable
    with WorkloadRun(framework="numpy") as run:  # no torch: the counter starts in a fraction of a second
        cfg = run.config_as(CountingConfig)
        steps, seed, step_seconds, fail_at = cfg.steps, cfg.seed, cfg.step_seconds, cfg.fail_at_step
        state = run.resume()
        if state is None:
            start, value = 0, np.array([float(seed)], dtype=np.float64)
        else:
            start, value = state.step, state.tensors["state"]["value"]
        run.info(f"counting from step {start} to {steps} on pool {run.inputs.pool or '?'}")
        for step in range(start, steps):
            if fail_at is not None and step == int(fail_at):
                raise RuntimeError(f"counting_workload: told to fail at step {step}")
            value = (value * 31 + step) % 1_000_003
            time.sleep(step_seconds)
            run.step_done(step + 1, lambda: {"state": {"value": value}})
        digest = hashlib.sha256(value.tobytes()).hexdigest()[:16]
        run.finish(
            steps,
            {"state": {"value": value}},
            metadata={
                "digest": digest, "resumed_from": start, "hostname_pool": run.inputs.pool,
                "pid": os.getpid(),  # 1: the first process of a container of its own
                **({"environ": ",".join(started_with)} if cfg.report_environ else {}),
            },  # fmt: skip
        )


if __name__ == "__main__":
    main()
