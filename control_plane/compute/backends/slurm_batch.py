"""The batch script one attempt becomes on a Slurm pool: `deploy/slurm/step.sbatch`, filled in.

A pool's runtime says where the step's code lives on the nodes (`runtimes.<runtime>` in the pool
catalog), in one of two ways:

- a path: the interpreter of a Python environment the nodes mount (a venv on the cluster's
  shared filesystem); the batch script `exec`s it;
- `{container: BUNDLE, python: PATH}`: an OCI bundle on the nodes, the workload image unpacked
  (`deploy/slurm/README.md`); the batch script starts the step in a container of it with
  Slurm's own `srun --container` (`oci.conf`), as Pyxis/enroot or Apptainer do on other
  clusters. `python` is the interpreter inside the image (default: where Sinewgrid's images
  put it). The container takes its PATH, HOME and library paths from the image, never from the
  host (`workload_runtime.allowed_env.LAUNCHER_OWN`); everything else the job holds is passed on.

Whose job it is: the pool's `account` and `qos`, or, on a pool with `accounts: teams`, the step's
team (`--account`) and priority class (`--qos`) from the quotas catalog, so Slurm's fair share
and QOS priority order the teams' jobs (`slurm_accounts.py`, docs/queues_slurm.md).

Where a gang may go: a tightly coupled one asks for at most as many leaf switches of the cluster's
`topology.conf` as the plan allows (`--switches=COUNT@WAIT`, `slurm_topology.py`).

Signals differ between the two. A bare step is the batch script's own process (`exec`): SIGTERM
goes to the batch step (`--signal=B:TERM@N`, `scancel --full`). A container's step is run by
`srun`, which on SIGTERM kills its step outright; so SIGTERM goes to the job's steps instead
(`--signal=TERM@N`, `scancel` without `--full`) and reaches the workload through the runtime.
Slurm then reports the step as terminated whatever its exit code; the workload's own Pipes
message (it checkpointed) says it was a preemption (`SlurmBackend.exit_code_hidden`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from pathlib import Path

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from control_plane.catalog.backends import SlurmSettings, settings_for
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import RENDEZVOUS_PORTS
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends.slurm_accounts import account_and_qos
from control_plane.compute.backends.slurm_topology import switches_option
from control_plane.settings import REPO_ROOT
from workload_runtime.allowed_env import for_container

BATCH_TEMPLATE = REPO_ROOT / "deploy" / "slurm" / "step.sbatch"
# The devices Slurm gave the job, as the batch script sees them; handed on to the container's step.
ALLOCATED_DEVICES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
IMAGE_PYTHON = "/opt/venv/bin/python"  # where deploy/docker's images install the workload's Python


class SlurmContainer(BaseModel):
    """A Slurm pool's runtime that is an image: `runtimes.<runtime>: {container: ..., python: ...}`."""

    model_config = ConfigDict(extra="forbid")

    container: str = Field(pattern="^/", description="The OCI bundle on the nodes (a folder with `config.json` and the image's root filesystem).")
    python: str = Field(default=IMAGE_PYTHON, pattern="^/", description="The interpreter inside the image.")


def container_of(pool: Pool, spec: StepSpec) -> SlurmContainer | None:
    """The container the pool runs `spec`'s runtime in; None for a bare interpreter path."""
    configured = pool.runtimes.get(spec.runtime, "")
    if not isinstance(configured, dict):
        return None
    try:
        return SlurmContainer(**configured)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
        raise dg.Failure(
            description=(
                f"pool {pool.name}: runtime `{spec.runtime}` is not a Slurm container ({problems}). Write it as "
                f"`runtimes: {{{spec.runtime}: {{container: /path/to/bundle, python: {IMAGE_PYTHON}}}}}` (an OCI bundle "
                "on the nodes, deploy/slurm/README.md) or as the path of an interpreter the nodes mount."
            )
        ) from None


def _render(template: str, fields: dict[str, str]) -> str:
    def field(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fields:
            raise ValueError(f"{BATCH_TEMPLATE}: unknown field `{{{{ {name} }}}}`; the backend fills {sorted(fields)}")
        return fields[name]

    return re.sub(r"\{\{ (\w+) \}\}", field, template)


def sbatch_options(
    pool: Pool, spec: StepSpec, launch: Launch, settings: SlurmSettings | None = None, container: SlurmContainer | None = None
) -> list[str]:
    """The `#SBATCH` options for one attempt of `spec` on `pool`, in the order they are written."""
    settings = settings or settings_for(pool)
    options = [f"--job-name={launch.name}", f"--partition={settings.partition}"]
    # `accounts: teams`: the step's team and priority class (raises SlurmAccountsError for a tenant of no team).
    account, qos = account_and_qos(spec, pool) if settings.accounts == "teams" else (settings.account, settings.qos)
    if account:
        options.append(f"--account={account}")
    if qos:
        options.append(f"--qos={qos}")
    options += [f"--time={settings.time_limit}", f"--nodes={spec.nodes}"]
    if spec.gang:
        options.append(f"--ntasks-per-node={spec.ranks_per_node or 1}")
    # A tightly coupled gang stays inside the pool's fast domain (a leaf switch of the cluster's
    # topology.conf): without `--switches`, Slurm would rather start it across switches than wait,
    # at the slow links' speed the planner refused it (slurm_topology.py).
    switches = switches_option(pool, spec)
    if switches:
        options.append(switches)
    if spec.exclude_nodes:
        options.append(f"--exclude={','.join(spec.exclude_nodes)}")
    if spec.gpus:
        if settings.gpu_flag == "gpus":
            options.append(f"--gpus={spec.gpus}")
        else:  # --gres counts per node
            options.append(f"--gres=gpu:{-(-spec.gpus // spec.nodes)}")
        if settings.cpus_per_gpu:
            options.append(f"--cpus-per-gpu={settings.cpus_per_gpu}")
    options += [
        f"--output={launch.output_path}",
        "--open-mode=append",
        # A container's step starts in the image's own working directory; the batch script runs
        # on the node, where the launcher's checkout does not exist, so it starts in the attempt's
        # folder (the pool's `shared_dir`, which the nodes mount).
        f"--chdir={Path(launch.output_path).parent if container else launch.workdir}",
        "--requeue",
    ]
    if settings.time_limit_notice_seconds:
        to = "" if container else "B:"  # a container's srun would kill its step on SIGTERM: notify the steps
        options.append(f"--signal={to}TERM@{settings.time_limit_notice_seconds}")
    return options


# A gang's rendezvous: rank 0 runs on the allocation's first node (srun's block distribution)
# and listens on a port derived from the job id, as Slurm sites usually do.
GANG_RENDEZVOUS = f"""\
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR=$(scontrol show node -o "$first_node" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
export MASTER_PORT=$(({RENDEZVOUS_PORTS.start} + SLURM_JOB_ID % {len(RENDEZVOUS_PORTS)}))
echo "sinewgrid: a gang of $SLURM_NTASKS ranks on $SLURM_JOB_NODELIST; rank 0 listens on $MASTER_ADDR:$MASTER_PORT" >&2"""


def gang_command(spec: StepSpec, command: list[str]) -> list[str]:
    """`srun` for every rank of a gang: all tasks start together, and when one ends badly
    (a lost node, a crash) Slurm ends the others (`--kill-on-bad-exit`)."""
    return ["srun", "--kill-on-bad-exit=1", f"--ntasks-per-node={spec.ranks_per_node or 1}", *command]


def container_command(spec: StepSpec, command: list[str], container: SlurmContainer, job_env: Iterable[str]) -> list[str]:
    """`srun --container` for the step's one process (or every rank of a gang), with the job's
    variables but those the image owns (`--export` names them; Slurm adds its own `SLURM_*`)."""
    rendezvous = ("MASTER_ADDR", "MASTER_PORT") if spec.gang else ()  # exported by GANG_RENDEZVOUS
    exported = ",".join(for_container({*job_env, *ALLOCATED_DEVICES, *rendezvous})) or "NONE"
    shape = ["--kill-on-bad-exit=1", f"--ntasks-per-node={spec.ranks_per_node or 1}"] if spec.gang else ["--nodes=1", "--ntasks=1"]
    return ["srun", f"--container={container.container}", f"--export={exported}", *shape, *command]


def render_batch_script(
    pool: Pool, spec: StepSpec, launch: Launch, settings: SlurmSettings | None = None, job_env: Iterable[str] = ()
) -> str:
    """The batch script `sbatch` receives for one attempt. `job_env`: the names of the variables
    `sbatch` hands the job besides the script's own exports (a container is given both)."""
    container = container_of(pool, spec)
    options = sbatch_options(pool, spec, launch, settings, container)
    if container is not None:
        command = container_command(spec, launch.command, container, {*job_env, *launch.env})
    else:
        command = gang_command(spec, launch.command) if spec.gang else launch.command
    return _render(
        BATCH_TEMPLATE.read_text(),
        {
            "sbatch_options": "\n".join(f"#SBATCH {shlex.quote(option)}" for option in options),
            "environment": "\n".join(f"export {key}={shlex.quote(value)}" for key, value in sorted(launch.env.items())),
            "job_name": shlex.quote(launch.name),
            "gang": GANG_RENDEZVOUS if spec.gang else "# One process: not a gang (StepSpec.world_size is 1).",
            "command": shlex.join(command),
        },
    )


# How `srun` reports a task's end, e.g. `srun: error: sgn1: task 1: Killed`.
_TASK_ENDED = re.compile(r"^srun: error: (\S+): tasks? [\d,\-]+: (Killed|Terminated|Exited with exit code \d+)", re.MULTILINE)


def lost_node(log: str) -> str | None:
    """The node of a gang whose task was killed first (`srun: error: NODE: task N: Killed`): the
    node was lost, and `--kill-on-bad-exit` ended the other tasks after it (`Terminated`)."""
    first = _TASK_ENDED.search(log)
    return first.group(1) if first is not None and first.group(2) == "Killed" else None
