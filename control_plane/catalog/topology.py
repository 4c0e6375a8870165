"""A pool's shape: what one fast interconnect domain is, how big, and how fast its links are.

A **domain** is the set of nodes whose accelerators talk over the fast links: an NVLink rack
(GB200 NVL72: 18 nodes × 4 GPUs), a TPU slice (its ICI torus, `4x4x4` = 64 chips on 16 hosts),
a Trainium UltraServer (4 trn2 nodes over NeuronLink), a placement group or one leaf switch of an
InfiniBand fabric. Its size is the pool's `nodes_per_domain` (or `interconnect_domain_gpus`; a TPU
slice's follows from `slice`). Between domains the accelerators talk over the slower network
(`cross_domain_gb_per_s`, per device): a gang split across domains pays for it in step time, which
the planner works out from the all-reduce model (`control_plane/placement/links.py`).
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

# InfiniBand NDR / EFA-class networks give each accelerator about 400 Gb/s = 50 GB/s.
DEFAULT_CROSS_DOMAIN_GB_PER_S = 50.0


class DomainKind(StrEnum):
    """What one fast domain of a pool is: the words the plan and its refusals use."""

    nvlink = "nvlink"  # an NVLink domain: a rack such as GB200 NVL72, or one HGX node's NVSwitch
    tpu_slice = "tpu_slice"  # a TPU slice: ICI inside, data-centre network (DCN) between slices
    ultraserver = "ultraserver"  # a Trainium2 UltraServer: NeuronLink across its nodes
    placement_group = "placement_group"  # a cluster placement group / capacity block
    switch = "switch"  # one leaf switch of an InfiniBand or RoCE fabric (Slurm's topology.conf)
    fabric = "fabric"  # a fabric with no finer shape declared

    @property
    def noun(self) -> str:
        return {
            "nvlink": "NVLink domain", "tpu_slice": "TPU slice", "ultraserver": "UltraServer",
            "placement_group": "placement group", "switch": "switch", "fabric": "interconnect domain",
        }[self.value]


class Topology(BaseModel):
    """The `topology:` of a pool in the catalog (docs/accelerators.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    domain: DomainKind = Field(DomainKind.fabric, description="What one fast domain is (nvlink, tpu_slice, ultraserver, placement_group, switch, fabric).")
    slice: str | None = Field(
        None,
        description="A TPU slice's shape, chips along each axis (`2x2x1`, `4x4x4`, `2x4`). Steps hold whole slices only.",
    )
    link_gb_per_s: Annotated[float, Field(gt=0)] | None = Field(
        None, description="GB/s per accelerator inside one domain; default: the accelerator's published figure."
    )
    cross_domain_gb_per_s: Annotated[float, Field(gt=0)] = Field(
        DEFAULT_CROSS_DOMAIN_GB_PER_S, description="GB/s per accelerator between domains (InfiniBand, EFA, TPU DCN)."
    )
    domain_label: str | None = Field(
        None,
        description="The node label whose value names a node's domain (Kubernetes), e.g. `cloud.google.com/gce-topology-block`: "
        "Kueue's topology-aware scheduling keeps a gang inside one value of it.",
    )

    @field_validator("slice")
    @classmethod
    def _shape(cls, shape: str | None) -> str | None:
        if shape is None:
            return None
        parts = shape.lower().split("x")
        if not 2 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"`slice: {shape}` is not a TPU topology: write chips along each axis, e.g. `2x2x1`, `4x4x4` or `2x4`")
        return "x".join(parts)

    @property
    def slice_chips(self) -> int | None:
        return math.prod(int(p) for p in self.slice.split("x")) if self.slice else None

    @property
    def whole_domains(self) -> bool:
        """Whether a step holds whole domains only (a TPU slice is provisioned and billed whole)."""
        return self.domain is DomainKind.tpu_slice


def domain_problems(
    *, accelerator_family: str, topology: Topology | None, gpus_per_node: int, nodes: int,
    nodes_per_domain: int | None, interconnect_domain_gpus: int | None,
) -> list[str]:
    """What is wrong with a pool's shape, each with its fix (empty: nothing)."""
    problems = []
    if accelerator_family == "tpu" and (topology is None or topology.slice is None):
        problems.append(
            "a TPU pool sells whole slices: give `topology: {domain: tpu_slice, slice: <shape>}` (e.g. `slice: 4x4x4`, "
            "`gpus_per_node` then being the chips per host)"
        )
    if topology is None or topology.slice is None:
        return problems
    if topology.domain is not DomainKind.tpu_slice:
        problems.append(f"`topology.slice` is a TPU slice's shape: set `topology.domain: tpu_slice` (not {topology.domain.value})")
    chips = topology.slice_chips or 0
    if not gpus_per_node or chips % gpus_per_node:
        problems.append(
            f"a {topology.slice} slice holds {chips} chips, not a whole number of hosts of {gpus_per_node} chips "
            "(`gpus_per_node` is the chips per host: 4 for v4, v5p and multi-host v5e/v6e slices)"
        )
        return problems
    hosts = max(chips // gpus_per_node, 1)
    if nodes % hosts:
        problems.append(f"`nodes` ({nodes}) is not a whole number of {topology.slice} slices of {hosts} hosts each")
    for said, name in ((nodes_per_domain, "nodes_per_domain"), (interconnect_domain_gpus and interconnect_domain_gpus // gpus_per_node, "interconnect_domain_gpus")):
        if said is not None and said != hosts:
            problems.append(f"`{name}` disagrees with `slice: {topology.slice}` ({hosts} hosts of {gpus_per_node} chips): leave it out")
    return problems
