"""The accelerators a pool may sell and a step may ask for: one name each, its family, and what
the backends and the planner need to know of it.

A **family** is what a step's code has to be written for: `nvidia` (CUDA), `amd` (ROCm/HIP),
`tpu` (XLA on Google TPUs), `trainium` (AWS Neuron), `cpu`, and `local` (this machine, whatever
it has). A step says which families its code runs on (`StepSpec.runs_on`); the planner never puts
it on another (docs/accelerators.md).

The numbers are the vendors' published figures per device, rounded; they are what the
all-reduce model (`control_plane/placement/links.py`) reads when a gang is split across fast
domains, and a pool may override them (`topology.link_gb_per_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = ("nvidia", "amd", "tpu", "trainium", "cpu", "local")
# What a step that says nothing about its accelerators is taken to run on: CUDA code (the
# field's default), this machine, and CPU pools.
DEFAULT_FAMILIES = ("nvidia", "local", "cpu")


@dataclass(frozen=True)
class Accelerator:
    """One kind of accelerator.

    `link_gb_per_s`: GB/s per device inside one fast domain (NVLink, Infinity Fabric, TPU ICI,
    NeuronLink), as the vendor states it. `device_resource`: the Kubernetes extended resource its
    device plugin advertises. `gke_tpu`: GKE's `cloud.google.com/gke-tpu-accelerator` value.
    `cores_per_device`: NeuronCores per Trainium chip (1 elsewhere).
    """

    name: str
    family: str
    memory_gb: float = 0.0
    link_gb_per_s: float = 0.0
    device_resource: str = ""
    gke_tpu: str = ""
    chips_per_host: int = 0  # TPU: chips one host (a node) holds in a multi-host slice
    cores_per_device: int = 1


def _nvidia(name: str, memory_gb: float, link: float) -> Accelerator:
    return Accelerator(name, "nvidia", memory_gb, link, "nvidia.com/gpu")


def _amd(name: str, memory_gb: float, link: float) -> Accelerator:
    return Accelerator(name, "amd", memory_gb, link, "amd.com/gpu")


def _tpu(name: str, memory_gb: float, link: float, gke: str, chips_per_host: int) -> Accelerator:
    return Accelerator(name, "tpu", memory_gb, link, "google.com/tpu", gke_tpu=gke, chips_per_host=chips_per_host)


def _trainium(name: str, memory_gb: float, link: float, cores: int) -> Accelerator:
    return Accelerator(name, "trainium", memory_gb, link, "aws.amazon.com/neuron", cores_per_device=cores)


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("local", "local"),
        Accelerator("cpu", "cpu"),
        # NVIDIA: NVLink per GPU (PCIe cards have none: 0, their peers talk over PCIe/the network).
        _nvidia("t4", 16, 0), _nvidia("l4", 24, 0), _nvidia("a10g", 24, 0), _nvidia("l40s", 48, 0),
        _nvidia("a100-40gb", 40, 600), _nvidia("a100-80gb", 80, 600),
        _nvidia("h100-80gb", 80, 900), _nvidia("h100-94gb", 94, 900), _nvidia("h200-141gb", 141, 900),
        _nvidia("gh200", 96, 900), _nvidia("b200", 180, 1800), _nvidia("gb200", 186, 1800),
        _nvidia("b300", 288, 1800),
        # AMD Instinct: Infinity Fabric peer-to-peer per GPU.
        _amd("mi250x", 128, 400), _amd("mi300x", 192, 896), _amd("mi325x", 256, 896), _amd("mi355x", 288, 1075),
        # Google TPU: ICI per chip (v4 2,400 Gbps; v5e 1,600; v5p 4,800; v6e 3,584), chips per host.
        _tpu("tpu-v4", 32, 300, "tpu-v4-podslice", 4), _tpu("tpu-v5e", 16, 200, "tpu-v5-lite-podslice", 4),
        _tpu("tpu-v5p", 95, 600, "tpu-v5p-slice", 4), _tpu("tpu-v6e", 32, 448, "tpu-v6e-slice", 4),
        # AWS Trainium: NeuronLink per chip, NeuronCores per chip.
        _trainium("trn1", 32, 384, 2), _trainium("trn2", 96, 1280, 8),
    )
}
KNOWN_ACCELERATORS = frozenset(ACCELERATORS)


def check_accelerator(name: str) -> str:
    if name not in ACCELERATORS:
        raise ValueError(
            f"unknown accelerator `{name}`; known: {', '.join(sorted(ACCELERATORS))} "
            "(new hardware: add it to ACCELERATORS in control_plane/catalog/accelerators.py)"
        )
    return name


def family_of(name: str) -> str:
    """The family of an accelerator name (`h100-80gb` → `nvidia`)."""
    return ACCELERATORS[check_accelerator(name)].family


def check_support_key(key: str) -> str:
    """A `runs_on` key: a family (`tpu`) or one accelerator (`tpu-v5p`)."""
    if key in FAMILIES or key in ACCELERATORS:
        return key
    raise ValueError(
        f"`runs_on` names `{key}`, which is neither an accelerator family ({', '.join(FAMILIES)}) nor a known "
        f"accelerator ({', '.join(sorted(ACCELERATORS))})"
    )
