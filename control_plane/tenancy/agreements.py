"""Data agreements: what the owner of each dataset version agreed to, and the rules that hold it.

Every dataset version made from a tenant's data records that tenant and its agreement in the
data registry (the `.dvc` file's meta: `tenant`, `agreement`) and in its lineage record, as they
were when it was published: changing a tenant's agreement in the tenants catalog changes the
versions published after, never the ones before. Three places ask these records:

- placement (`limits_for`): a step's pools must lie in every input's agreed regions;
- training (`check_shared_training`): a model that learns from more than one tenant's data
  needs every one of those tenants to allow shared models (a blocking asset check,
  `data_layer/agreement_checks.py`);
- lineage (`rests_on`): a model's record names the agreements it rests on
  (`data_layer/provenance.py`, `record_result`).

The model gateway asks the same records before it sends data to an outside model
(`model_gateway/policy.py`, docs/model-gateway.md).
No Dagster here: this module is plain data, read by the control plane and by the command line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from control_plane.catalog.pools import TenantLimits
from control_plane.catalog.tenants import Agreement

# The registry meta keys a dataset version carries its tenant and agreement under.
TENANT_KEY = "tenant"
AGREEMENT_KEY = "agreement"


class HasMeta(Protocol):
    """A registered dataset version (`DatasetVersion`): its ref and the meta it was registered with."""

    @property
    def ref(self) -> str: ...

    meta: dict


@dataclass(frozen=True)
class AgreedData:
    """One dataset version, the tenant whose data it is (None: the platform's own) and its agreement
    (None: it records none; treated as the strictest, `Agreement()`, where it matters)."""

    ref: str
    tenant: str | None = None
    agreement: Agreement | None = None

    @property
    def binding(self) -> Agreement:
        return self.agreement if self.agreement is not None else Agreement()

    def describe(self) -> str:
        """`lab-a (shared models: no · outside models: none · regions: any)`."""
        said = describe(self.agreement) if self.agreement is not None else "no agreement recorded"
        return f"{self.tenant or 'platform'} ({said})"


def describe(agreement: Agreement) -> str:
    """The agreement in one readable line: `shared models: no · outside models: none · regions: any`."""
    return " · ".join((
        f"shared models: {'yes' if agreement.shared_models else 'no'}",
        f"outside models: {', '.join(agreement.outside_models) or 'none'}",
        f"regions: {'any' if agreement.regions is None else ', '.join(agreement.regions) or 'none'}",
    ))


def version_meta(tenant: str | None, agreement: Agreement | None) -> dict[str, Any]:
    """What a dataset version records in the registry meta (nothing for the platform's own data)."""
    meta: dict[str, Any] = {}
    if tenant:
        meta[TENANT_KEY] = tenant
    if agreement is not None:
        meta[AGREEMENT_KEY] = agreement.model_dump()
    return meta


def agreed(ref: str, meta: Mapping[str, Any]) -> AgreedData:
    """The tenant and agreement a version's registry meta (or lineage facts) records."""
    tenant = meta.get(TENANT_KEY) or None
    raw = meta.get(AGREEMENT_KEY)
    agreement = Agreement.model_validate(raw) if isinstance(raw, Mapping) else None
    return AgreedData(ref=ref, tenant=str(tenant) if tenant else None, agreement=agreement)


def agreed_data(versions: Iterable[HasMeta | AgreedData]) -> list[AgreedData]:
    """Registered versions (or AgreedData already read) as AgreedData."""
    return [v if isinstance(v, AgreedData) else agreed(v.ref, v.meta or {}) for v in versions]


# Training on more than one tenant's data ----------------------------------------------------


@dataclass(frozen=True)
class AgreementVerdict:
    """May one model learn from these inputs together? `refusing`: the tenants whose agreement says no."""

    tenants: list[str]
    allowed: bool
    reason: str
    refusing: list[str] = field(default_factory=list)
    inputs: list[AgreedData] = field(default_factory=list)


def check_shared_training(versions: Iterable[HasMeta | AgreedData]) -> AgreementVerdict:
    """A model trained on data of more than one tenant is a shared model: every tenant's agreement must allow it.

    The platform's own data (no tenant) binds nothing. A version of a tenant that records no
    agreement counts as not allowing shared models.
    """
    inputs = agreed_data(versions)
    tenants = sorted({d.tenant for d in inputs if d.tenant})
    if len(tenants) <= 1:
        whose = f"one tenant's data only ({tenants[0]})" if tenants else "no tenant's data (the platform's own)"
        return AgreementVerdict(tenants, True, f"{whose}: a model of its own, no shared-model agreement needed", [], inputs)
    no = [d for d in inputs if d.tenant and not d.binding.shared_models]
    refusing = sorted({d.tenant for d in no if d.tenant})
    if not refusing:
        return AgreementVerdict(
            tenants, True, f"data of {len(tenants)} tenants ({', '.join(tenants)}); every input's agreement allows shared models", [], inputs
        )
    why = "; ".join(
        f"`{d.ref}` of {d.tenant}: " + ("its agreement does not allow shared models" if d.agreement is not None else "it records no agreement")
        for d in no
    )
    reason = (
        f"this model would learn from {len(tenants)} tenants' data ({', '.join(tenants)}), and {', '.join(refusing)} "
        f"{'has' if len(refusing) == 1 else 'have'} not agreed to shared models ({why}). Either train one model per tenant, "
        f"or, once {', '.join(refusing)} {'agrees' if len(refusing) == 1 else 'agree'} in writing, set `agreement.shared_models: true` "
        "for it in the tenants catalog and publish a new version of its data (a version keeps the agreement it was published with)."
    )
    return AgreementVerdict(tenants, False, reason, refusing, inputs)


# Where the data may be processed -----------------------------------------------------------


def limits_for(versions: Iterable[HasMeta | AgreedData]) -> TenantLimits | None:
    """The regions every input's agreement allows (their intersection), for `StepSpec.limits`.

    None when no input's agreement restricts regions. An empty list means the agreements share no
    region: placement then refuses every pool and says which agreements disagree.
    """
    restricting = [d for d in agreed_data(versions) if d.agreement is not None and d.agreement.regions is not None]
    if not restricting:
        return None
    regions = list(restricting[0].binding.regions or [])
    for d in restricting[1:]:
        regions = [r for r in regions if r in (d.binding.regions or [])]
    whose = ", ".join(f"{d.tenant or 'platform'} ({d.ref}: {', '.join(d.binding.regions or []) or 'no region'})" for d in restricting)
    return TenantLimits(regions=regions, reason=f"the data agreement of {whose}")


# What a model rests on ---------------------------------------------------------------------


RESTS_ON_SEPARATOR = "; "


def rests_on(parts: Iterable[str]) -> str:
    """A model's lineage fact, `lab-a (shared models: no · …); lab-b (…)`: each tenant's agreement once."""
    return RESTS_ON_SEPARATOR.join(dict.fromkeys(p for p in parts if p))
