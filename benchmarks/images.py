"""Figure 13: what running a step in the workload image costs, per attempt and when the image is not on the node.

- **Per attempt**: one step (the checkpointed counting workload, six steps: almost nothing but
  start-up) run in the workload image with `podman run --rm`, against the same step as a bare
  process of `.venv`'s interpreter, as a local pool starts it cold. Alternating, one call a repeat.
  The difference is what a container adds to every attempt: podman creating and removing the
  container, runc, the image's filesystem.
- **Cold start**: the same step when the image is not in the node's store and must be loaded
  first, against one whose image is already there (the warm case above). No registry is
  reachable here: the image's archive on local disk (`podman save`, made once) stands in for the
  registry, so a cold start here is `podman load` (unpacking ~4 GB of layers) and then the step;
  a real pull adds the transfer over the network on top.

The images are those `make images` built (build/images/images.json); without them the figure
says so and is skipped. Run: ``python -m benchmarks.images``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from benchmarks import REPEATS, Timing, time_group

REPO = Path(__file__).resolve().parent.parent
IMAGES_JSON = REPO / "build" / "images" / "images.json"
ARCHIVE = REPO / "build" / "images" / "workload.oci.tar"
CONTAINERS_CONF = REPO / "build" / "containers" / "containers.conf"
EXTRAS = {"config": {"steps": 6, "seed": 1}, "checkpoint_uri": "/tmp/checkpoints", "checkpoint_every_steps": 2}
COLD_REPEATS = 2  # each cold repeat (and its warm-up) unpacks the whole image: about a minute here
SKIP_HELP = "skipped: build the images first with `make images`"


@dataclass
class ImagesResult:
    image: str = ""
    size_bytes: int = 0
    in_image: Timing | None = None
    bare: Timing | None = None
    cold: Timing | None = None
    skipped: str | None = None

    @property
    def overhead_s(self) -> float:
        return self.in_image.median - self.bare.median

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {"image": self.image, "size_bytes": self.size_bytes, "step_in_image": self.in_image.to_dict(), "step_bare": self.bare.to_dict(),
                "step_cold_image": self.cold.to_dict(), "overhead_per_attempt_s": self.overhead_s}  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def _check(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0 or '"final_step": 6' not in done.stderr:
        raise RuntimeError(f"`{' '.join(command[:4])} …` failed ({done.returncode}):\n{done.stderr[-2000:]}")


def run(repeats: int = REPEATS) -> ImagesResult:
    try:
        workload = next(i for i in json.loads(IMAGES_JSON.read_text()) if i["name"] == "workload")
    except (OSError, ValueError, StopIteration):
        return ImagesResult(skipped=SKIP_HELP)
    env, tag = _env(), workload["tag"]
    if subprocess.run(["podman", "image", "exists", tag], env=env).returncode != 0:
        return ImagesResult(skipped=f"{tag} is not in podman's store: {SKIP_HELP}")
    extras = json.dumps(EXTRAS)
    in_image = ["podman", "run", "--rm", "--network", "none", "-e", f"SINEWGRID_WORKLOAD_EXTRAS={extras}", tag, "python", "-m", "testbed.counting_workload"]
    bare = [sys.executable, "-m", "testbed.counting_workload"]
    checkpoints = REPO / "build" / "bench-checkpoints"  # removed before each call: every attempt starts at step 0, as in a new container
    bare_env = {**env, "SINEWGRID_WORKLOAD_EXTRAS": json.dumps({**EXTRAS, "checkpoint_uri": str(checkpoints)})}
    step_in_image, step_bare = time_group(
        [lambda: _check(in_image, env), lambda: _check(bare, bare_env)], repeats=repeats, before_each=lambda: shutil.rmtree(checkpoints, ignore_errors=True)
    )

    if not ARCHIVE.exists():  # the stand-in registry, made once
        subprocess.run(["podman", "save", "--quiet", "--format", "oci-archive", "-o", str(ARCHIVE), tag], env=env, check=True)

    def unload() -> None:
        subprocess.run(["podman", "rmi", "--force", tag], env=env, capture_output=True, check=True)

    def cold_step() -> None:
        subprocess.run(["podman", "load", "--quiet", "-i", str(ARCHIVE)], env=env, capture_output=True, check=True)
        _check(in_image, env)

    try:
        (cold,) = time_group([cold_step], repeats=min(repeats, COLD_REPEATS), before_each=unload)
    finally:
        if subprocess.run(["podman", "image", "exists", tag], env=env).returncode != 0:
            subprocess.run(["podman", "load", "--quiet", "-i", str(ARCHIVE)], env=env, capture_output=True, check=True)
    return ImagesResult(image=tag, size_bytes=workload["size_bytes"], in_image=step_in_image, bare=step_bare, cold=cold)


def table(result: ImagesResult, repeats: int) -> Table:
    return comparison_table(
        result,
        title="13. A step in the workload image: per attempt against a bare process, and cold (image not on the node) against warm",
        caption=(
            f"Median of {repeats} repeats (cold: {min(repeats, COLD_REPEATS)}), one call each, alternating (time.perf_counter). "
            "The step: the counting workload, six checkpointed steps. In image = podman run --rm, no network; bare = .venv's "
            "python -m, the same step. Cold = podman load of the image's archive from local disk (the stand-in for a registry "
            "pull, without the transfer), then the step."
        ),
        rows=(("step in the image (warm)", "bare process"), ("step, image loaded first ({size})", "image on the node")),
    )


def comparison_table(result: ImagesResult, *, title: str, caption: str, rows: tuple[tuple[str, str], tuple[str, str]]) -> Table:
    """The figure's two rows: (in the image, its bare baseline) and (cold, warm); `{size}` in a label is the image's."""
    out = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for column in ("Case", "Seconds", "Baseline", "Baseline s", "Difference s"):
        out.add_column(column, justify="left" if column in ("Case", "Baseline") else "right")
    if result.skipped is not None:
        out.add_row(result.skipped, "", "", "", "")
        return out
    size = f"{result.size_bytes / 1e9:.1f} GB"
    (warm, bare), (cold, on_node) = rows
    out.add_row(warm.format(size=size), f"{result.in_image.median:.2f}", bare, f"{result.bare.median:.2f}", f"{result.overhead_s:+.2f}")
    out.add_row(cold.format(size=size), f"{result.cold.median:.1f}", on_node, f"{result.in_image.median:.2f}",
                f"{result.cold.median - result.in_image.median:+.1f}")  # fmt: skip
    return out


def main(repeats: int = REPEATS) -> None:
    from rich.console import Console

    Console(width=160).print(table(run(repeats), repeats))


if __name__ == "__main__":
    main()
