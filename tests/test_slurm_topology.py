"""A gang's fast domain on a real Slurm: the multi-node test cluster (testbed/slurm_multinode.py)
has a `topology.conf` of two leaf switches (s0: sgn0 sgn1, s1: sgn2 sgn3) under a spine, and a
tightly coupled gang's job asks for one switch (`--switches`, control_plane/compute/backends/
slurm_topology.py). The jobs are submitted by the Slurm backend itself and hold their nodes with
`sleep`; what is checked is where Slurm put them, or that it kept one waiting. The `--switches`
each kind of step gets is checked without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.compute.backends.base import JobHandle, JobState
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends.slurm import SlurmBackend
from control_plane.compute.backends.slurm_batch import sbatch_options
from control_plane.compute.backends.slurm_topology import slurm_duration, topology_conf
from testbed.slurm_multinode import PARTITION, MultiNodeSlurmCluster
from tests.helpers import wait_for

SWITCHES = {"s0": ["sgn0", "sgn1"], "s1": ["sgn2", "sgn3"]}


@pytest.fixture(scope="module")
def cluster() -> Iterator[MultiNodeSlurmCluster]:
    with MultiNodeSlurmCluster(nodes=4) as started:
        yield started


def _pool(nodes_per_domain: int | None = 2, **fields) -> Pool:
    settings = {"partition": PARTITION, "time_limit": "00:10:00", **fields.pop("backend_settings", {})}
    return Pool(
        name="slurm-switches", provider="test-slurm", region="local", backend="slurm", backend_settings=settings,
        purchasing="reserved", accelerator="local", gpus_per_node=1, nodes=4, nodes_per_domain=nodes_per_domain,
        price_per_gpu_hour=1.0, qualify=False, **fields,
    )  # fmt: skip


def _gang(nodes: int = 2, tightly_coupled: bool = True, **fields) -> StepSpec:
    return StepSpec(name="test.gang", entry_point="m", tenant="t", gpus=0, nodes=nodes, ranks_per_node=1, tightly_coupled=tightly_coupled, **fields)


def _switches(options: list[str]) -> list[str]:
    return [o for o in options if o.startswith("--switches")]


# The sbatch arguments, no cluster ---------------------------------------------------------
LAUNCH = Launch(name="test.gang-a1", command=["sleep", "1"], env={}, workdir="/srv", output_path="/shared/out.log")
SPANNING = {"span_domains": True, "allreduce_gb": 1.0, "compute_seconds_per_step": 1.0}


@pytest.mark.parametrize(
    ("pool", "spec", "expected"),
    [
        pytest.param(_pool(2), _gang(2), ["--switches=1@11:00"], id="tight-gang-fits-one-switch"),
        pytest.param(_pool(2), _gang(4, **SPANNING), ["--switches=2@11:00"], id="spanning-gang-on-two-switches"),
        pytest.param(_pool(4, pending_deadline_seconds=3600), _gang(3), ["--switches=1@1:01:00"], id="wait-follows-the-pending-deadline"),
        pytest.param(_pool(2), _gang(2, tightly_coupled=False), [], id="loose-gang-none"),
        pytest.param(_pool(None), _gang(2), [], id="pool-without-domains-none"),
        pytest.param(_pool(2), _gang(1).model_copy(update={"ranks_per_node": 4}), [], id="one-node-gang-none"),
        pytest.param(_pool(2), StepSpec(name="x", entry_point="m", tenant="t", tightly_coupled=True), [], id="not-a-gang-none"),
    ],
)
def test_a_tightly_coupled_gang_asks_slurm_for_its_switches(pool, spec, expected):
    assert _switches(sbatch_options(pool, spec, LAUNCH)) == expected


def test_slurm_durations_and_the_topology_file():
    assert [slurm_duration(s) for s in (59.2, 660, 3660, 90000)] == ["1:00", "11:00", "1:01:00", "1-01:00:00"]
    assert topology_conf(["n0", "n1", "n2"], 2).splitlines()[2:] == ["SwitchName=s0 Nodes=n0,n1", "SwitchName=s1 Nodes=n2", "SwitchName=spine Switches=s0,s1"]
    assert topology_conf(["n0", "n1"], 2).splitlines()[2:] == ["SwitchName=s0 Nodes=n0,n1"]  # one leaf: no spine


# The real cluster -------------------------------------------------------------------------
def _job(cluster: MultiNodeSlurmCluster, job_id: str) -> dict[str, str]:
    text = cluster.client(["scontrol", "show", "job", "--oneliner", job_id]).stdout
    return dict(word.partition("=")[::2] for word in text.split() if "=" in word)


def _hosts(cluster: MultiNodeSlurmCluster, nodelist: str) -> set[str]:
    return set(cluster.client(["scontrol", "show", "hostnames", nodelist]).stdout.split()) if nodelist not in ("", "(null)") else set()


def _running_on(cluster: MultiNodeSlurmCluster, job_id: str) -> set[str]:
    job = _job(cluster, job_id)
    return _hosts(cluster, job["NodeList"]) if job["JobState"] == "RUNNING" else set()


def _hold(cluster: MultiNodeSlurmCluster, node: str) -> str:
    """A plain one-node job that keeps `node` busy (not the platform's: no `--switches`)."""
    job_id = cluster.client(["sbatch", "--parsable", f"--partition={PARTITION}", "-w", node, "--output=/dev/null", "--wrap", "exec sleep 600"]).stdout.strip()
    wait_for(f"job {job_id} holding {node}", lambda: _running_on(cluster, job_id) == {node})
    return job_id


@pytest.fixture
def quiet(cluster: MultiNodeSlurmCluster) -> Iterator[MultiNodeSlurmCluster]:
    """Every node idle before the test, every job cancelled after it."""

    def idle() -> bool:
        states = set(cluster.client(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%T"]).stdout.split())
        return states == {"idle"} and not cluster.client(["squeue", "-h", "-p", PARTITION]).stdout.strip()

    wait_for("every node idle", idle)
    try:
        yield cluster
    finally:
        cluster.reset()


def _submit(cluster: MultiNodeSlurmCluster, folder: Path, spec: StepSpec) -> tuple[SlurmBackend, JobHandle]:
    """The Slurm backend submits `spec` (its ranks sleep) as it submits a step's attempt."""
    folder.mkdir(parents=True, exist_ok=True)
    launch = Launch(name=f"{spec.name}-a1", command=["sleep", "600"], env={}, workdir=str(folder), output_path=str(folder / "output.log"))
    backend = SlurmBackend()
    return backend, backend.submit(_pool(2, backend_settings={"env": cluster.env}), spec, launch)


def test_the_cluster_knows_its_switches(cluster):
    assert cluster.switches == SWITCHES
    shown = cluster.client(["scontrol", "show", "topology"]).stdout
    switches = {}
    for line in shown.splitlines():
        fields = dict(word.partition("=")[::2] for word in line.split() if "=" in word)
        switches[fields["SwitchName"]] = (fields["Level"], _hosts(cluster, fields.get("Nodes", "")), fields.get("Switches", ""))
    assert switches == {
        "s0": ("0", {"sgn0", "sgn1"}, ""),
        "s1": ("0", {"sgn2", "sgn3"}, ""),
        "spine": ("1", {"sgn0", "sgn1", "sgn2", "sgn3"}, "s0,s1"),
    }, shown


def test_a_tightly_coupled_gang_lands_under_the_one_switch_with_room(quiet, tmp_path):
    """sgn0 is busy, so s0 has one free node: the gang of two lands on s1's two, whole."""
    cluster = quiet
    _hold(cluster, "sgn0")
    backend, handle = _submit(cluster, tmp_path, _gang(2))
    assert "#SBATCH --switches=1@11:00" in Path(handle.info["script"]).read_text()
    assert wait_for("the gang running", lambda: _running_on(cluster, handle.job_id)) == set(SWITCHES["s1"])
    assert _job(cluster, handle.job_id)["Switches"] == "1@00:11:00"  # the wait Slurm kept (max_switch_wait allows it)
    backend.cancel(handle)


def test_with_a_node_busy_under_each_switch_the_gang_waits_rather_than_span_them(quiet, tmp_path):
    """sgn0 and sgn2 are busy: sgn1 and sgn3 are free, two nodes but under two switches. The
    tightly coupled gang stays pending on them; a gang that is not tightly coupled (no
    `--switches`) then takes those very nodes and runs."""
    cluster = quiet
    _hold(cluster, "sgn0")
    _hold(cluster, "sgn2")
    backend, tight = _submit(cluster, tmp_path / "tight", _gang(2))
    # Slurm has looked at it (a reason other than None) with sgn1 and sgn3 free, and not started it.
    job = wait_for("Slurm to weigh the tight gang", lambda: ((j := _job(cluster, tight.job_id))["Reason"] != "None" or j["JobState"] != "PENDING") and j)
    assert (job["JobState"], job["Reason"], _hosts(cluster, job["NodeList"])) == ("PENDING", "Resources", set()), job
    assert backend.status(tight).state is JobState.pending
    _, loose = _submit(cluster, tmp_path / "loose", _gang(2, tightly_coupled=False))
    assert "--switches" not in Path(loose.info["script"]).read_text()
    assert wait_for("the loose gang running", lambda: _running_on(cluster, loose.job_id)) == {"sgn1", "sgn3"}  # across both switches
    job = _job(cluster, tight.job_id)
    assert (job["JobState"], _hosts(cluster, job["NodeList"])) == ("PENDING", set()), job
