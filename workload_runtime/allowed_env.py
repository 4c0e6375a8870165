"""A workload's environment is an allow-list: what the runtime and its libraries read, nothing else.

A launcher (the local backend, `sbatch`, a Ray job, a gang's agent) never hands a workload its own
whole environment: the control plane's holds every tenant's storage credentials
(`LAB_A_AWS_SECRET_ACCESS_KEY`, ...), its database URLs and its settings, none of which a
workload needs or may see. `workload_environment` keeps, from the launcher's environment, only

- the process basics (`PATH`, `HOME`, `LANG`, `LC_*`, `TMPDIR`, ...) and the interpreter's own
  (`PYTHONPATH`, `VIRTUAL_ENV`, ...);
- what numeric, accelerator, rendering and simulation libraries read as they load (`OMP_*`,
  `CUDA_*`, `NCCL_*`, `TORCH*`, `LD_*`, `MUJOCO_GL`, `WARP_*`, ...) and what a launcher sets for a
  rank or job (`SLURM_*`, `RAY_*`, `WORLD_SIZE`, `MASTER_ADDR`, ...: `node_env.GANG_VARIABLES`);
- the workload side's own variables (`node_env.py`: the node caches, `SINEWGRID_WORKLOAD_EXTRAS`);
- where the object store is (`AWS_ENDPOINT_URL*`, `AWS_REGION`, ...), never who may use it;
- the platform's own storage credentials (`PLATFORM_CREDENTIALS`) only for a step whose tenant
  holds none of its own (the platform's steps, a tenant on the platform's storage). A tenant with
  credentials gets its own through its inputs (`TenantAccess.apply`), not the environment;

then adds the launcher's explicit variables (the pool's configured `env`, the Pipes bootstrap, a
gang's rendezvous), which are the launcher's to choose. Anything else, such as another tenant's
variables, a secret someone exported in the control plane's shell, or `DAGSTER_HOME`, stays behind.

On Ray, whose job entrypoints and actors start from the raylet's environment rather than the
submitter's, the same list is applied on the node: `python -m workload_runtime.allowed_env
--keep NAME,... -- COMMAND` runs COMMAND with the allowed variables of its own environment plus
those named (the runtime env's `env_vars`). Standard library only: it runs in every runtime.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping

from workload_runtime.node_env import (
    CACHE_FOLDER_ENV,
    EXTRAS_ENV,
    GANG_VARIABLES,
    NODE_CACHE_LOCAL_ENV,
    NODE_CACHE_MAX_GB_ENV,
    process_environment,
)

ALLOWED_NAMES = frozenset(
    {
        # the process
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "HOSTNAME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "TEMP", "TMP",
        "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR",
        # the interpreter
        "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS",
        "PYTHONFAULTHANDLER", "PYTHONIOENCODING", "PYTHONUTF8", "VIRTUAL_ENV",
        # rendering (MuJoCo through EGL, Mesa's software rasterizer), video encoding, the Hugging Face hub
        "MUJOCO_GL", "PYOPENGL_PLATFORM", "LP_NUM_THREADS", "GALLIUM_DRIVER", "__EGL_VENDOR_LIBRARY_FILENAMES",
        "SVT_LOG", "HF_HOME", "HF_HUB_OFFLINE",
        # where the object store and KMS are, and how to call them (never who calls: PLATFORM_CREDENTIALS)
        "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_CA_BUNDLE", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE",
        "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_STS_REGIONAL_ENDPOINTS",
        # the workload side's own (node_env.py)
        EXTRAS_ENV, NODE_CACHE_MAX_GB_ENV, NODE_CACHE_LOCAL_ENV, *CACHE_FOLDER_ENV.values(), *GANG_VARIABLES,
    }
)  # fmt: skip
ALLOWED_PREFIXES = (
    "LC_", "LD_", "AWS_ENDPOINT_URL_",
    # read by numeric libraries and allocators as they load
    "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "NUMEXPR_", "NUMBA_", "MALLOC_", "ARROW_",
    # accelerators, collectives, launchers and simulators
    "CUDA_", "NVIDIA_", "NCCL_", "TORCH", "GLOO_", "HIP_", "ROCR_", "ROCM_", "NEURON_", "TPU_", "XLA_", "SLURM_", "WARP_", "MESA_",
    "RAY_",  # a Ray job's own (RAY_ADDRESS: a workload that uses Ray joins its cluster, not a new one)
)  # fmt: skip
# The platform's storage credentials, in AWS's variables: a workload gets them only when its tenant holds none.
PLATFORM_CREDENTIALS = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
)  # fmt: skip

# What describes the launcher's own machine and interpreter rather than the workload's: a workload
# that starts in a container of its image (a Slurm pool's `srun --container`) takes these from the
# image, never from the host that launched it, whose PATH or LD_LIBRARY_PATH would hide the image's.
LAUNCHER_OWN = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "HOSTNAME", "TMPDIR", "TEMP", "TMP", "XDG_RUNTIME_DIR",
        "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD",
    }
)  # fmt: skip


def for_container(env: Mapping[str, str]) -> list[str]:
    """The names of `env` a containerised workload receives from its launcher: all but `LAUNCHER_OWN`."""
    return sorted(name for name in env if name not in LAUNCHER_OWN)


def allowed(name: str) -> bool:
    """Whether a workload may inherit the variable `name` from its launcher."""
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def workload_environment(
    source: Mapping[str, str], *, platform_credentials: bool, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a workload starts with: the allowed variables of `source` (the launcher's
    environment), the platform's storage credentials when `platform_credentials`, then `extra`
    (the launcher's own explicit variables)."""
    env = {name: value for name, value in source.items() if allowed(name)}
    if platform_credentials:
        env.update({name: source[name] for name in PLATFORM_CREDENTIALS if name in source})
    env.update(extra or {})
    return env


def _names(text: str) -> list[str]:
    return [name for name in text.split(",") if name]


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m workload_runtime.allowed_env", description="Run COMMAND with a workload's allowed environment (of this one)."
    )
    parser.add_argument("--keep", default="", help="comma-separated names kept besides the allowed ones (the launcher's own)")
    parser.add_argument("--platform-credentials", action="store_true", help="keep the platform's storage credentials too")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    launcher = process_environment()
    keep = {name: launcher[name] for name in _names(args.keep) if name in launcher}
    env = workload_environment(launcher, platform_credentials=args.platform_credentials, extra=keep)
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
