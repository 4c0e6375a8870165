"""Figure 13b: a step on a Slurm pool in the workload image (`srun --container`) against the same
step bare, and a cold start (the image unpacked on the node first) against a warm one.

- **Per attempt**: the checkpointed counting workload (six steps: almost nothing but start-up)
  submitted through the Slurm backend to the suite's throwaway cluster, as a batch job that
  starts it in a container of the workload image's bundle (Slurm's `oci.conf`, rootless runc),
  against the same step as the batch job's own process (`.venv`'s interpreter). Each is timed
  from `sbatch` to the job's end as the backend sees it (its status poll, every 0.2 s here), so
  both include Slurm's scheduling; alternating, one job a repeat.
- **Cold start**: a Slurm pool's "pull" is unpacking the image into a bundle on the node (or on
  shared storage), once per image: here `podman export` of the image into a fresh folder, then
  the step; against the step with the bundle already there (the warm case above). A site keeps
  bundles of the images its steps name ready (deploy/slurm/README.md), as it pre-pulls for Pyxis.

Needs the images (`make images`) and the Slurm packages (`make slurm-packages`). Run:
``python -m benchmarks.slurm_images``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

from benchmarks import REPEATS, time_group
from benchmarks.images import ImagesResult, comparison_table  # the same figures: in the image, bare, cold

REPO = Path(__file__).resolve().parent.parent
IMAGES_JSON = REPO / "build" / "images" / "images.json"
CONTAINERS_CONF = REPO / "build" / "containers" / "containers.conf"
STEPS = {"steps": 6, "seed": 1}
COLD_REPEATS = 2  # each unpacks the whole image: ~15 s here
POLL_SECONDS = 0.2
SKIP_HELP = "skipped: build the images first with `make images`"


def run(repeats: int = REPEATS) -> ImagesResult:
    import yaml

    from control_plane.catalog.pools import load_pools
    from control_plane.compute.backends.engine import Launch
    from control_plane.compute.backends.slurm import SlurmBackend
    from testbed.counting_step import counting_spec
    from testbed.oci_bundle import Bind, image_bundle
    from testbed.slurm_cluster import SlurmCluster
    from workload_runtime.workload import EXTRAS_ENV

    try:
        workload = next(i for i in json.loads(IMAGES_JSON.read_text()) if i["name"] == "workload")
    except (OSError, ValueError, StopIteration):
        return ImagesResult(skipped=SKIP_HELP)
    podman_env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
    folder = Path(tempfile.mkdtemp(prefix="sinewgrid-bench-slurm-images-"))
    folder.chmod(0o755)  # munged runs as its own user and must reach its socket through here
    work = folder / "work"  # Pipes files, outputs and checkpoints: bound into the container at the same path
    work.mkdir()
    try:
        with SlurmCluster(folder / "cluster") as cluster:
            bundle = image_bundle(workload["tag"], folder / "bundle", uid=0, gid=0, binds=[Bind(str(work), writable=True)], env=podman_env)
            settings = {"partition": "gpu", "env": cluster.env, "time_limit": "00:10:00", "shared_dir": str(work)}
            pool = {"provider": "bench", "region": "local", "backend": "slurm", "backend_settings": settings, "purchasing": "on_demand",
                    "accelerator": "local", "gpus_per_node": 2, "price_per_gpu_hour": 1.0}  # fmt: skip
            catalog = folder / "pools.yaml"
            catalog.write_text(yaml.safe_dump({"pools": {"bare": pool, "image": {**pool, "runtimes": {"default": {"container": str(bundle)}}}}}))
            pools, backend, spec = load_pools(catalog), SlurmBackend(), counting_spec(config=STEPS)

            def step(pool_name: str) -> None:
                name = f"bench-{pool_name}-{time.monotonic_ns()}"
                (work / name).mkdir()
                extras = {"config": STEPS, "checkpoint_uri": str(work / name / "checkpoints"), "checkpoint_every_steps": 2}
                launch = Launch(name=name, command=backend.command(pools[pool_name], spec), env={EXTRAS_ENV: json.dumps(extras)},
                                workdir=str(REPO), output_path=str(work / name / "output.log"))  # fmt: skip
                handle = backend.submit(pools[pool_name], spec, launch)
                while not (status := backend.status(handle)).state.ended:
                    time.sleep(POLL_SECONDS)
                if status.exit_code != 0 or '"final_step": 6' not in (log := backend.collect(handle).decode(errors="replace")):
                    raise RuntimeError(f"the {pool_name} step ended {status.state.value} ({status.exit_code}):\n{log[-2000:]}")

            in_image, bare = time_group([lambda: step("image"), lambda: step("bare")], repeats=repeats)

            def unpack_then_step() -> None:
                image_bundle(workload["tag"], bundle, uid=0, gid=0, binds=[Bind(str(work), writable=True)], env=podman_env)
                step("image")

            (cold,) = time_group([unpack_then_step], repeats=min(repeats, COLD_REPEATS), before_each=lambda: shutil.rmtree(bundle))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return ImagesResult(image=workload["tag"], size_bytes=workload["size_bytes"], in_image=in_image, bare=bare, cold=cold)


def table(result: ImagesResult, repeats: int) -> Table:
    return comparison_table(
        result,
        title="13b. A step on a Slurm pool in the workload image (srun --container): per attempt against bare, and with the bundle unpacked first",
        caption=(
            f"Median of {repeats} repeats (bundle unpacked first: {min(repeats, COLD_REPEATS)}), one job each, alternating (time.perf_counter), "
            "from sbatch to the end as the Slurm backend sees it (status every 0.2 s). The step: the counting workload, six checkpointed "
            "steps. In image = srun --container of the image's OCI bundle (oci.conf, rootless runc); bare = the batch job runs .venv's "
            "python. Unpacked first = podman export of the image into a new bundle, then the step."
        ),
        rows=(("Slurm step in the image (bundle on the node)", "bare batch job"), ("Slurm step, image unpacked first ({size})", "bundle on the node")),
    )


def main(repeats: int = REPEATS) -> None:
    from rich.console import Console

    Console(width=160).print(table(run(repeats), repeats))


if __name__ == "__main__":
    sys.exit(main())
