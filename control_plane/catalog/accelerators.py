"""The accelerators a pool may sell and a step may ask for, by one name each."""

from __future__ import annotations

# Accelerators a pool may sell and a step may ask for. `local` is this machine, whatever it has.
# A name outside this list is almost always a typo; add a new part here when a provider sells it.
KNOWN_ACCELERATORS = frozenset(
    {
        "local", "cpu",
        "t4", "l4", "a10g", "l40s", "a100-40gb", "a100-80gb", "h100-80gb", "h100-94gb",
        "h200-141gb", "gh200", "b200", "gb200", "b300", "mi250x", "mi300x", "mi325x", "tpu-v5e", "tpu-v5p",
    }
)


def check_accelerator(name: str) -> str:
    if name not in KNOWN_ACCELERATORS:
        raise ValueError(
            f"unknown accelerator `{name}`; known: {', '.join(sorted(KNOWN_ACCELERATORS))} "
            "(new hardware: add its name to KNOWN_ACCELERATORS in control_plane/catalog/accelerators.py)"
        )
    return name
