"""The one place the platform reads its environment.

Every `SINEWGRID_*` variable (and the few of other tools the platform honours) is a typed
field of `PlatformSettings`, read by pydantic-settings when `settings()` is called, so a
test or a command that changes a variable sees the change at the next call. Workloads do
not read this module: what they need travels in their Pipes extras
(`workload_runtime.inputs`), and the workload runtime reads its own few variables.

| variable | field | default |
|---|---|---|
| `SINEWGRID_HOME` | `home` | `.sinewgrid/` in the checkout |
| `SINEWGRID_POOLS` | `pools` | the packaged catalog (`control_plane/catalog/pools.yaml`) |
| `SINEWGRID_LEDGER_URL` | `ledger_url` | SQLite under a local storage root |
| `SINEWGRID_REGISTRY_GIT` | `registry_git` | a git repository under the storage root |
| `SINEWGRID_STORAGE_REGION` / `_PROVIDER` | `storage_region` / `storage_provider` | read off the storage root |
| `SINEWGRID_CODE_VERSION` | `code_version` | `git rev-parse HEAD` of the checkout |
| `SINEWGRID_LOG_LEVEL` | `log_level` | `ERROR` for runs started from the command line |
| `SINEWGRID_SLOTS_DIR` | `slots_dir` | `sinewgrid-slots/` in the temporary folder |
| `SINEWGRID_DRILL_DIR` | `drill_dir` | `drills/` under a local storage root |
| `SINEWGRID_TENANTS` | `tenants` | the packaged tenants catalog (`control_plane/catalog/tenants.yaml`) |
| `SINEWGRID_KEYS_DIR` | `keys_dir` | `~/.config/sinewgrid/keys`: the embedded default's tenant key files |
| `<PREFIX>_AWS_ACCESS_KEY_ID` … | `tenant_credentials(prefix)` | a tenant's storage credentials (its catalog entry names the prefix) |
| `SINEWGRID_WARM_START` | `warm_start` | on: local pools fork workloads from a warm interpreter |
| `SINEWGRID_MODELS` | `models` | the packaged model catalog (`control_plane/catalog/models.yaml`): providers, models, prices |
| `SINEWGRID_BUDGETS` | `budgets` | the packaged budgets (`control_plane/catalog/budgets.yaml`): tokens and GPU hours per project and tenant |
| `SINEWGRID_QUEUE_POLL_SECONDS` | `queue_poll_seconds` | 5: how often a step waiting in a pool's queue asks admission again |
| `SINEWGRID_QUEUE_MOVE_MIN_HOURS` | `queue_move_min_hours` | 1: a step moves onto committed capacity of its plan that came free while more than this much of its expected run is left (0: never) |
| `SINEWGRID_QUOTAS` | `quotas` | the packaged quotas (`control_plane/catalog/quotas.yaml`): each team's GPUs per pool, cohorts, priority classes |
| `SINEWGRID_ALERT_WEBHOOK` | `alert_webhook` | none: budget warnings show in the UI only |
| `SINEWGRID_DROP_QUEUES` | `drop_queues` | none: the landing sensors list their zones (`kind=<SQS queue URL>,…`: S3 event notifications, `control_plane/intake/drop_events.py`) |
| `SINEWGRID_NIGHTLY_CRON` | `nightly_cron` | `0 2 * * *`: when the night's schedules fire (UTC), the Robotics sweeps |
| `<PREFIX>_API_KEY` | `provider_api_key(env)` | a model provider's API key (its catalog entry names the variable) |
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from workload_runtime.allowed_env import workload_environment

# The checkout (or installed tree) the code runs from: workloads start here, `deploy/` is here.
REPO_ROOT = Path(__file__).resolve().parent.parent


class PlatformSettings(BaseSettings):
    """The platform's environment, typed. Empty strings mean "not set"."""

    model_config = SettingsConfigDict(env_prefix="SINEWGRID_", extra="ignore", frozen=True)

    home: str = Field("", description="The storage root: a folder or `s3://bucket/prefix`.")
    pools: str = Field("", description="The pool catalog (a YAML file or a folder of them).")
    ledger_url: str = Field("", description="The attempt ledger's database URL (SQLAlchemy).")
    registry_git: str = Field("", description="The data registry's git repository (any git URL).")
    storage_region: str = Field("", description="The region datasets record for data gravity.")
    storage_provider: str = Field("", description="The provider datasets record.")
    code_version: str = Field("", description="The code version lineage records carry.")
    log_level: str = Field("", description="Dagster log level for runs started from the command line.")
    slots_dir: str = Field("", description="Where local pools keep their slot locks.")
    drill_dir: str = Field("", description="A local folder for the failure drills' files.")
    tenants: str = Field("", description="The tenants catalog (YAML); default: the packaged one.")
    keys_dir: str = Field("", description="Where local tenant keys live; default ~/.config/sinewgrid/keys (never under the storage root).")
    models: str = Field("", description="The model catalog (YAML): providers, models, prices; default: the packaged one.")
    budgets: str = Field("", description="The budgets (YAML) over tokens and GPU hours; default: the packaged one.")
    queue_poll_seconds: float = Field(5.0, gt=0, description="How often a step waiting in a pool's queue asks admission again.")
    queue_move_min_hours: float = Field(
        1.0, ge=0, description="A step on on-demand or spot capacity moves to committed capacity of its plan that came free while more than this many hours of its expected run are left; 0: never moves."
    )
    quotas: str = Field("", description="The quotas (YAML): each team's GPUs per pool, cohorts, priority classes; default: the packaged one.")
    alert_webhook: str = Field("", description="Where budget warnings are POSTed (JSON); empty: the UI only.")
    drop_queues: str = Field("", description="`kind=<SQS queue URL>,…`: the queues the bucket's events of new drops go to; empty: the sensors list.")
    nightly_cron: str = Field("0 2 * * *", description="When nightly schedules fire (a cron string, UTC): the Robotics sweeps. Move it to the hours your spot capacity is cheapest.")
    warm_start: bool = Field(True, description="Local pools fork each workload from an interpreter that has imported its libraries (`0`: start each cold).")
    dagster_home: str = Field("", validation_alias="DAGSTER_HOME")
    aws_region: str = Field("", validation_alias=AliasChoices("AWS_DEFAULT_REGION", "AWS_REGION"))
    cache_home: str = Field("", validation_alias="XDG_CACHE_HOME")
    slurm_conf: str = Field("", validation_alias="SLURM_CONF")
    kubernetes_service_host: str = Field("", validation_alias="KUBERNETES_SERVICE_HOST")
    postgres_bin: str = Field("", validation_alias="POSTGRES_BIN", description="PostgreSQL's server binaries, for the test engines.")

    @property
    def storage_root(self) -> str:
        return self.home or str(REPO_ROOT / ".sinewgrid")

    @property
    def user_cache(self) -> Path:
        """This user's cache folder (`$XDG_CACHE_HOME` or `~/.cache`)."""
        return Path(self.cache_home) if self.cache_home else Path.home() / ".cache"

    @property
    def slots_folder(self) -> Path:
        return Path(self.slots_dir) if self.slots_dir else Path(tempfile.gettempdir()) / "sinewgrid-slots"

    @property
    def in_kubernetes(self) -> bool:
        """Running inside a Kubernetes pod (the API server's address is injected)."""
        return bool(self.kubernetes_service_host)


def settings() -> PlatformSettings:
    """The environment as it is now."""
    return PlatformSettings()


def storage_root() -> str:
    """The storage root: `$SINEWGRID_HOME`, else `.sinewgrid/` in the checkout."""
    return settings().storage_root


def tenant_credentials(prefix: str) -> dict[str, str]:
    """A tenant's storage credentials from `<prefix>_AWS_ACCESS_KEY_ID`, `_SECRET_ACCESS_KEY`, `_SESSION_TOKEN`."""
    return {
        "access_key_id": os.environ.get(f"{prefix}_AWS_ACCESS_KEY_ID", ""),
        "secret_access_key": os.environ.get(f"{prefix}_AWS_SECRET_ACCESS_KEY", ""),
        "session_token": os.environ.get(f"{prefix}_AWS_SESSION_TOKEN", ""),
    }


def provider_api_key(variable: str) -> str:
    """A model provider's API key from the variable its catalog entry names ("" when unset)."""
    return os.environ.get(variable, "") if variable else ""


@contextlib.contextmanager
def environment(overrides: Mapping[str, str]) -> Iterator[None]:
    """Set variables for the duration of a block (a drill's own tenants), then put them back."""
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: this one's, with `extra` on top."""
    return {**os.environ, **(extra or {})}


def workload_env(*, platform_credentials: bool, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a workload starts with: the allowed variables of this one, never all of it
    (`workload_runtime/allowed_env.py`), the platform's storage credentials only when asked, then `extra`."""
    return workload_environment(os.environ, platform_credentials=platform_credentials, extra=extra)


def use_dagster_home(path: Path) -> None:
    """Point this process (and the processes it starts) at a Dagster instance folder."""
    os.environ["DAGSTER_HOME"] = str(path)


def offline_litellm() -> None:
    """LiteLLM fetches a model price map from the internet when imported unless told not to;
    the model catalog holds the prices the gateway uses. Call before importing it."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")  # nor its Anthropic beta-headers file
    os.environ.setdefault("LITELLM_TELEMETRY", "False")


def quiet_dagster() -> None:
    """No usage telemetry from command-line runs (the machine may be offline)."""
    os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The git revision of the code that runs now (`+dirty` when it has uncommitted changes).

    Container images carry no `.git`: they set `SINEWGRID_CODE_VERSION` at build time.
    """
    if configured := settings().code_version:
        return configured
    try:
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git checkout; set SINEWGRID_CODE_VERSION)"
    return rev + ("+dirty" if dirty else "")
