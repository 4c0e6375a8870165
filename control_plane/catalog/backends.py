"""The backend kinds a pool may name: what each one's `backend_settings` may say, and where
its code lives.

`BACKENDS` is the registry: kind -> settings model + the backend class, by import path, loaded
the first time a pool of that kind runs a step (so a laptop needs none of the engines'
clients, and the catalog imports no backend code). Adding a backend is one module under
`control_plane/compute/backends/` and one entry here (docs/backends.md, "Adding a backend").

The settings are typed, so a catalog with a typo fails when it is loaded (naming the file,
pool and field), not when a step is submitted. Each backend reads its own model with
`settings_for(pool)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class BackendSettings(BaseModel):
    """What every backend's settings may say."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shared_dir: str | None = Field(
        default=None,
        description="A folder Dagster and the pool's nodes both mount, for Pipes files and job output "
        "(default: `state/pipes/` under a local storage root).",
    )


class LocalSettings(BackendSettings):
    pass


class SlurmSettings(BackendSettings):
    partition: str = Field(description="The Slurm partition this pool is.")
    account: str | None = Field(default=None, description="`--account` for every job (with `accounts: static`); unset: the user's default account.")
    qos: str | None = Field(default=None, description="`--qos` for every job (with `accounts: static`); unset: the association's default QOS.")
    accounts: Literal["static", "teams"] = Field(
        default="static",
        description="Whose account a job runs under. `static`: the pool's `account` and `qos` (or none) for every job. "
        "`teams`: the quotas catalog's, per step: `--account=<the step's team>` and `--qos=<its priority class, else the "
        "default class>`, so that Slurm's multifactor fair share and QOS priority enforce the team quotas on the cluster "
        "(the accounts and QOS are made with control_plane/compute/backends/slurm_accounts.py; docs/queues_slurm.md). "
        "A step of a tenant no team names is refused there, not submitted.",
    )
    time_limit: str = Field(default="24:00:00", description="`--time` for every job (Slurm's [D-]HH:MM:SS).")
    time_limit_notice_seconds: int = Field(
        default=300,
        ge=0,
        description="SIGTERM the workload this long before `--time` runs out, so it checkpoints and the step "
        "goes on in a new job (`--signal=B:TERM@N`; to the job's steps, `--signal=TERM@N`, for a step in a container); 0: no notice.",
    )
    gpu_flag: str = Field(default="gres", pattern="^(gres|gpus)$", description="Ask for GPUs with `--gres=gpu:N` or `--gpus=N`.")
    cpus_per_gpu: int | None = None
    extra_args: list[str] = Field(default_factory=list, description="More `sbatch` arguments, as given.")
    # Environment for the commands `sbatch`/`squeue`/`scontrol`/`sacct`/`scancel` (e.g. SLURM_CONF).
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_source_of_accounts(self) -> SlurmSettings:
        if self.accounts == "teams" and (self.account or self.qos):
            raise ValueError(
                "`accounts: teams` takes each job's account and QOS from the quotas catalog (its team, its priority "
                "class): leave `account` and `qos` unset, or use `accounts: static` to give them here"
            )
        return self


class RaySettings(BackendSettings):
    address: str = Field(description="The Ray dashboard / Jobs API address, e.g. `http://127.0.0.1:8265`.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Ray custom resources that pin jobs to this pool's nodes, e.g. `{pool_spot: 1}`."
    )
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Ray runtime environment for every job on this pool.")
    gpu_resource: str | None = Field(
        default="GPU",
        description="How a step's GPUs are asked for: `GPU` (Ray's own, `entrypoint_num_gpus`), another custom "
        "resource name, or null to ask for none (the pool's `resources` already stand for GPU nodes).",
    )


class KubernetesSettings(BackendSettings):
    namespace: str = "default"
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    service_account: str | None = None
    image_pull_secrets: list[str] = Field(default_factory=list)
    gpu_resource: str | None = Field(
        default=None,
        description="The extended resource a step's accelerators are requested as; unset: the accelerator's own "
        "(`nvidia.com/gpu`, `amd.com/gpu`, `google.com/tpu`, `aws.amazon.com/neuron`: control_plane/catalog/accelerators.py).",
    )
    efa_per_node: int | None = Field(
        default=None,
        ge=1,
        description="EFA interfaces each pod asks for (`vpc.amazonaws.com/efa`, the EKS EFA device plugin's resource) on "
        "EFA instances such as trn1/trn2 or p5; unset: none.",
    )
    env_from_secrets: list[str] = Field(default_factory=list, description="Secrets mounted as environment (object-store credentials).")
    labels: dict[str, str] = Field(default_factory=dict)
    kubeconfig: str | None = Field(default=None, description="Path to a kubeconfig; default: in-cluster config, then ~/.kube/config.")
    context: str | None = Field(default=None, description="The kubeconfig context to use (default: its current context).")
    poll_seconds: float = Field(default=5.0, gt=0, description="How often to ask the API server about a running pod.")
    queue: str | None = Field(
        default=None,
        description="A Kueue LocalQueue for gangs (`kueue.x-k8s.io/queue-name` on the JobSet): Kueue admits all of a "
        "gang's pods or none. Unset: no queue label (the cluster's scheduler places the pods). A pool with `kueue: true` "
        "names each team's LocalQueue instead.",
    )
    kueue: bool = Field(
        default=False,
        description="The cluster's Kueue enforces the team quotas (docs/queues_kubernetes.md): every pod and JobSet carries "
        "`kueue.x-k8s.io/queue-name: <its team>` (the LocalQueue `sinewgrid queue kueue` renders in `namespace`) and "
        "`kueue.x-k8s.io/priority-class: <its class>`, and a step of a tenant no team names is refused here.",
    )

    @model_validator(mode="after")
    def _one_way_to_queue(self) -> KubernetesSettings:
        if self.kueue and self.queue:
            raise ValueError(
                f"`queue: {self.queue}` and `kueue: true` both name the LocalQueue: keep `kueue: true` (each team's own "
                "LocalQueue, its quota enforced by Kueue) or `queue` (one LocalQueue for every gang), not both"
            )
        return self


@dataclass(frozen=True)
class BackendKind:
    """One kind of backend: the settings a pool of it may give, and its class (`module:Class`)."""

    settings: type[BackendSettings]
    implementation: str


BACKENDS: dict[str, BackendKind] = {
    "local": BackendKind(LocalSettings, "control_plane.compute.backends.local:LocalBackend"),
    "slurm": BackendKind(SlurmSettings, "control_plane.compute.backends.slurm:SlurmBackend"),
    "ray": BackendKind(RaySettings, "control_plane.compute.backends.ray:RayBackend"),
    "kubernetes": BackendKind(KubernetesSettings, "control_plane.compute.backends.kubernetes:KubernetesBackend"),
}


def backend_kind(kind: str) -> BackendKind:
    try:
        return BACKENDS[kind]
    except KeyError:
        raise ValueError(
            f"unknown backend `{kind}`; known: {', '.join(BACKENDS)} (a new backend is a module under "
            "control_plane/compute/backends/ and an entry in BACKENDS, control_plane/catalog/backends.py)"
        ) from None


def settings_for(pool: Any) -> Any:
    """The pool's `backend_settings`, parsed into its backend's model."""
    return backend_kind(pool.backend).settings(**pool.backend_settings)
