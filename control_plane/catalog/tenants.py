"""The tenants catalog: who owns data on the platform, where it lives, whose key seals it.

A tenant is a customer (a lab, a robotics team): its own storage prefix or bucket, its own
credentials for that storage, its own key (a local key file on the embedded default, a key in
the customer's KMS in production), the regions its work may use and the agreement its data
comes with. The packaged catalog (`control_plane/catalog/tenants.yaml`) holds two Cell-lane
labs; `SINEWGRID_TENANTS` points at another file. A step whose tenant is not in the catalog runs
as the platform itself: its own credentials, no customer key (the Robotics lane in the demo).
See docs/tenancy.md.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from control_plane.catalog.pools import TenantLimits
from control_plane.catalog.yaml_files import read_yaml_mapping, validation_problems
from control_plane.settings import settings
from workload_runtime.tenant_access import KeySpec

DEFAULT_TENANTS = Path(__file__).with_name("tenants.yaml")
TENANTS_HOLDS = (
    "A tenants catalog is a YAML mapping with one section, `tenants:`, naming each tenant with its `lane`, "
    "`storage`, `key`, `credentials`, `regions` and `agreement` (see docs/tenancy.md)."
)
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,39}$")


class TenantCatalogError(ValueError):
    """A tenants catalog that cannot be used; the message names the file, the tenant and the fix."""


class UnknownTenant(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class CredentialsSpec(BaseModel):
    """Where the control plane finds the tenant's storage credentials: environment variables
    `<env>_AWS_ACCESS_KEY_ID`, `<env>_AWS_SECRET_ACCESS_KEY` (and `<env>_AWS_SESSION_TOKEN`), put
    there by whoever deploys it (a Kubernetes secret, a vault). Never written in this file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str = Field(..., description="The prefix of the variables that hold the tenant's access key.")

    @field_validator("env")
    @classmethod
    def _upper(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", v):
            raise ValueError("use an upper-case prefix such as LAB_A (the variables are LAB_A_AWS_ACCESS_KEY_ID, ...)")
        return v


class Agreement(BaseModel):
    """What the data's owner agreed to. Carried by every dataset version made from its data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shared_models: bool = Field(False, description="May this data train a model that also learns from other tenants' data?")
    outside_models: list[str] = Field(default_factory=list, description="Outside model providers the data may be sent to (none by default).")
    regions: list[str] | None = Field(None, description="Regions that may hold or process the data (None: any).")


class Tenant(BaseModel):
    """One tenant of the platform."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    title: str = ""
    lane: str = Field(..., description="The lane whose assets serve this tenant (`cell`, `robotics`).")
    storage: str = Field("", description="Its prefix under the storage root (default `tenants/<name>`), or a URI of its own (`s3://bucket/prefix`).")
    key: KeySpec | None = Field(default_factory=KeySpec, description="Its key; null: its data is not encrypted (say why in `title`).")
    credentials: CredentialsSpec | None = None
    providers: list[str] | None = None
    regions: list[str] | None = None
    agreement: Agreement = Field(default_factory=Agreement)

    @field_validator("storage")
    @classmethod
    def _one_place(cls, v: str) -> str:
        """Written one way only: no `..`, `.` or empty segment that could name another tenant's place."""
        if not v:
            return v
        uri = "://" in v
        if not uri and v.startswith("/"):
            raise ValueError(f"`{v}` is an absolute path: write a prefix under the platform's root, or a URI such as file:///data/lab-a")
        segments = (v.split("://", 1)[1] if uri else v).strip("/").split("/")
        if ".." in segments:
            raise ValueError(f"`{v}` has a `..` segment: write the prefix itself (a `..` can reach the platform's or another tenant's data)")
        if any(segment in ("", ".") for segment in segments):
            raise ValueError(f"`{v}` has an empty or `.` segment: write each folder once (e.g. tenants/lab-a), never the platform's root itself")
        return v.rstrip("/") if uri else v.strip("/")

    def root(self, platform_root: str) -> str:
        """The tenant's storage root: its own URI, or its prefix under the platform's root."""
        if "://" in self.storage:
            return self.storage.rstrip("/")
        return posixpath.join(platform_root.rstrip("/"), (self.storage or f"tenants/{self.name}").strip("/"))

    @property
    def limits(self) -> TenantLimits:
        """Where its work may run, for placement: its own providers and regions, narrowed by its agreement's."""
        regions = self.regions
        if self.agreement.regions is not None:
            regions = [r for r in (regions if regions is not None else self.agreement.regions) if r in self.agreement.regions]
        return TenantLimits(providers=self.providers, regions=regions)

    def key_file(self) -> Path:
        """The local key file (`key.kind: local`)."""
        if self.key is not None and self.key.file:
            return Path(self.key.file).expanduser()
        return keys_dir() / f"{self.name}.key"


def keys_dir() -> Path:
    """Where local key files live: `SINEWGRID_KEYS_DIR`, else `~/.config/sinewgrid/keys` (never under the storage root)."""
    configured = settings().keys_dir
    return Path(configured).expanduser() if configured else Path.home() / ".config" / "sinewgrid" / "keys"


class Tenants(dict[str, Tenant]):
    """The tenants by name, read from one catalog file."""

    file: str = ""

    def get_tenant(self, name: str) -> Tenant:
        if name not in self:
            raise UnknownTenant(
                f"tenant `{name}` is not in the tenants catalog {self.file} (it has: {', '.join(sorted(self)) or 'none'}). "
                "Add it under `tenants:` (docs/tenancy.md, 'Onboarding a tenant') or use one of those."
            )
        return self[name]

    def of_lane(self, lane: str) -> list[Tenant]:
        return [t for t in self.values() if t.lane == lane]


def tenants_file() -> Path:
    configured = settings().tenants
    return Path(configured) if configured else DEFAULT_TENANTS


def load_tenants(path: str | Path | None = None) -> Tenants:
    """Read and validate a tenants catalog (default: `SINEWGRID_TENANTS`, else the packaged one).
    Read again only when the file changed."""
    path = Path(path) if path else tenants_file()
    try:
        stamp = (str(path.resolve()), path.stat().st_mtime_ns)
    except OSError:
        return _read_tenants(path)
    if _CACHE.get("stamp") != stamp:
        _CACHE["tenants"], _CACHE["stamp"] = _read_tenants(path), stamp
    return _CACHE["tenants"]


_CACHE: dict = {}


def _read_tenants(path: Path) -> Tenants:
    doc = read_yaml_mapping(path, TenantCatalogError, "tenants catalog", TENANTS_HOLDS)
    problems = [f"{path}: unknown top-level section `{k}` (expected: tenants)" for k in doc if k != "tenants"]
    found = Tenants()
    found.file = str(path)
    entries = doc.get("tenants") or {}
    if not isinstance(entries, dict):
        problems.append(f"{path}: `tenants:` must map each tenant's name to its settings")
        entries = {}
    for name, entry in entries.items():
        if not _NAME.match(str(name)):
            problems.append(f"{path}: tenant name `{name}`: use 2-40 lower-case letters, digits and dashes, starting with a letter (it names a prefix and a partition)")
            continue
        try:
            found[name] = Tenant.model_validate({"name": name, **(entry or {})})
        except ValidationError as exc:
            problems += validation_problems(exc, path, f"tenant `{name}`", known=[f for f in Tenant.model_fields if f != "name"])
    problems += _overlaps(path, found)
    problems += _shared_keys(path, found)
    if problems:
        raise TenantCatalogError("invalid tenants catalog:\n  " + "\n  ".join(problems))
    return found


def _overlaps(path: Path, tenants: Tenants) -> list[str]:
    """Two tenants whose storage prefixes nest would share objects: refused."""
    roots = {name: t.root("<root>") + "/" for name, t in tenants.items()}
    said = []
    for a, ra in roots.items():
        for b, rb in roots.items():
            if a < b and (ra.startswith(rb) or rb.startswith(ra)):
                said.append(f"{path}: tenants `{a}` and `{b}` have nesting storage ({ra.rstrip('/')} / {rb.rstrip('/')}); give each its own prefix or bucket")
    return said


def _shared_keys(path: Path, tenants: Tenants) -> list[str]:
    """Two tenants with one key: each one's workloads could open the other's data. Refused."""
    holders: dict[str, list[str]] = {}
    for name, tenant in tenants.items():
        if tenant.key is None:
            continue
        key = f"file {tenant.key_file().resolve()}" if tenant.key.kind == "local" else f"KMS key {tenant.key.key_id}"
        holders.setdefault(key, []).append(name)
    return [
        f"{path}: tenants {', '.join(f'`{n}`' for n in names)} share the {key}; give each tenant a key of its own"
        for key, names in holders.items() if len(names) > 1
    ]  # fmt: skip


def storage_problems(tenants: Tenants, platform_root: str) -> list[str]:
    """What the catalog's roots do on this platform root, resolved (symlinks followed, `file://`
    and plain paths alike): two tenants in one place or one inside another, a tenant holding the
    platform's root, a key file or the keys folder under a storage root. Empty when none."""
    def place(root: str) -> str:
        if root.startswith("s3://"):
            return "s3://" + posixpath.normpath(root.removeprefix("s3://")).strip("/") + "/"
        local = Path(root.removeprefix("file://")).expanduser().resolve()
        return str(local).rstrip("/") + "/"

    platform = place(platform_root)
    roots = {name: place(t.root(platform_root)) for name, t in tenants.items()}
    said = []
    for a, ra in roots.items():
        if platform.startswith(ra):
            said.append(f"tenant `{a}`'s storage {ra.rstrip('/')} holds the platform's root {platform.rstrip('/')}: give it a prefix of its own")
        for b, rb in roots.items():
            if a < b and (ra.startswith(rb) or rb.startswith(ra)):
                said.append(f"tenants `{a}` and `{b}` resolve to nesting storage ({ra.rstrip('/')} / {rb.rstrip('/')}): give each its own prefix or bucket")
    keys = [("the keys folder", keys_dir())] + [(f"tenant `{n}`'s key file", t.key_file()) for n, t in tenants.items() if t.key is not None and t.key.kind == "local"]
    for what, where in keys:
        resolved = place(str(where))
        for whose, root in [*((f"tenant `{n}`'s", r) for n, r in roots.items()), ("the platform's", platform)]:  # the innermost first
            if resolved.startswith(root):
                said.append(f"{what} {where} is under {whose} storage root {root.rstrip('/')}: keys never live with the data they open (set SINEWGRID_KEYS_DIR or `key.file` elsewhere)")
                break
    return said


def check_storage(tenants: Tenants, platform_root: str) -> None:
    """`storage_problems`, raised as one `TenantCatalogError` naming the catalog file."""
    if problems := storage_problems(tenants, platform_root):
        raise TenantCatalogError(f"the tenants catalog {tenants.file} cannot be used on {platform_root}:\n  " + "\n  ".join(problems))
