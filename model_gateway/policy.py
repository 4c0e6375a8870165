"""The gateway's data policy: which providers may see the data in a prompt, and what may be logged.

Before any request leaves, the gateway reads the agreements of the data the prompt was made from
(the dataset versions in the lineage of the asset's inputs, each carrying its tenant and the
agreement it was published with: `control_plane/tenancy/agreements.py`):

- a provider inside the platform (`outside: false`: a model served on its own pools) may see any
  data;
- an outside provider may see a tenant's data only when that tenant's agreement lists it under
  `outside_models`; the platform's own data (no tenant) binds nothing;
- data whose agreement records nothing counts as "no outside models";
- the call's own tenant (`Who.tenant`) and the tenant whose root the data is read from count as
  well, with their agreements in the tenants catalog (`declared`): a tenant's call whose lineage
  inputs are empty is still that tenant's data, never the platform's.

The gateway's own request log (on the platform's disk, unsealed) never keeps a prompt that holds a
tenant's data, whoever answered it: a digest and the size stand in for it. The platform's own
data is logged as it was sent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from control_plane.catalog.models import Provider
from control_plane.tenancy.agreements import AgreedData


class DataPolicyRefused(RuntimeError):
    """No provider the data's agreements allow can do the task (the message says which and why)."""


@dataclass(frozen=True)
class DataPolicy:
    """The agreements of the data in one prompt."""

    data: list[AgreedData] = field(default_factory=list)

    @property
    def tenants(self) -> list[str]:
        return sorted({d.tenant for d in self.data if d.tenant})

    def refusing(self, provider: Provider) -> list[AgreedData]:
        """The inputs whose agreement does not let their data go to `provider`."""
        if not provider.outside:
            return []
        return [d for d in self.data if d.tenant and provider.name not in d.binding.outside_models]

    def allows(self, provider: Provider) -> bool:
        return not self.refusing(provider)

    def why_not(self, provider: Provider) -> str:
        """`lab-b's agreement (… outside models: none) does not list standin-openai`."""
        return "; ".join(
            f"`{d.ref}` of {d.tenant}: " + (f"its agreement lists outside models: {', '.join(d.binding.outside_models) or 'none'}" if d.agreement else "it records no agreement")
            for d in self.refusing(provider)
        )

    def describe(self) -> str:
        if not self.tenants:
            return "the platform's own data (no tenant's agreement binds it)"
        return "; ".join(dict.fromkeys(d.describe() for d in self.data if d.tenant))


def loggable(policy: DataPolicy, content: str) -> str:
    """What the gateway's request log may keep of a prompt."""
    if not policy.tenants:
        return content
    digest = hashlib.sha256(content.encode()).hexdigest()[:16]
    return f"[withheld: data of {', '.join(policy.tenants)}; {len(content)} characters, sha256 {digest}]"


def policy_for(storage, inputs: list[str]) -> DataPolicy:
    """The agreements of the data behind `inputs` (lineage ids: dataset versions, models,
    proposals): every dataset version upstream of them, with what the data registry recorded."""
    from data_layer.lineage import LineageNotFound, LineageStore
    from data_layer.provenance import agreements_of

    lineage, refs, named = LineageStore(storage.root), [], []
    for node_id in inputs:
        try:
            node = lineage.get(node_id)
        except (LineageNotFound, ValueError):
            raise DataPolicyRefused(
                f"the gateway cannot tell whose data `{node_id}` is: it has no lineage record under {storage.root}. "
                "Pass the lineage ids of the dataset versions or results the prompt is made from."
            ) from None
        chain = [node, *lineage.upstream(node_id)]
        refs += [n.id for n in chain if n.kind == "dataset"]
        named += [n for n in chain if n.kind != "dataset" and n.facts.get("tenant")]
    data = agreements_of(storage, refs) if refs else []
    # A result that names a tenant but rests on no registered version binds as strictly as it can.
    known = {d.tenant for d in data}
    data += [AgreedData(ref=n.id, tenant=str(n.facts["tenant"])) for n in named if n.facts["tenant"] not in known]
    return DataPolicy(data)


def declared(policy: DataPolicy, tenants: list[str]) -> DataPolicy:
    """`policy` with each tenant the call declares (its own, the one whose root it reads) bound by
    its agreement in the tenants catalog; a name not in the catalog is the platform's own work."""
    from control_plane.catalog.tenants import load_tenants

    catalog, known = load_tenants(), set(policy.tenants)
    extra = [
        AgreedData(ref=f"the call of {tenant}", tenant=tenant, agreement=catalog[tenant].agreement)
        for tenant in dict.fromkeys(tenants) if tenant and tenant in catalog and tenant not in known
    ]  # fmt: skip
    return DataPolicy([*policy.data, *extra]) if extra else policy
