"""Job files: the sample calendars expand and plan; bad input names file, entry and field."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from control_plane.placement.job_files import JobFileError, check_against_catalog, load_job, plan_calendar, plan_job_file
from control_plane.catalog.pools import load_catalog

REPO = Path(__file__).resolve().parent.parent
GOOD = """\
job: j
tenant: cell
start: 2026-12-07T00:00:00Z
datasets:
  omics: {size_gb: 100, provider: aws, region: us-east-1}
steps:
  sweep: {gpus: 4, expected_hours: 2, datasets: [omics], start_hours: 22, repeat: {count: 3, every_hours: 24}}
"""


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_repeated_step_expands_on_its_calendar(tmp_path):
    specs = load_job(_write(tmp_path, GOOD)).step_specs()
    assert [s.name for s in specs] == ["sweep#1", "sweep#2", "sweep#3"]
    assert [s.start for s in specs] == [dt.datetime(2026, 12, d, 22, tzinfo=dt.UTC) for d in (7, 8, 9)]
    assert specs[0].datasets[0].size_gb == 100 and specs[0].tenant == "cell"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("gpus: 4", "gpus: -4"), "step `sweep`, field `gpus`: Input should be greater than or equal to 0 (got -4)"),
        (("gpus: 4", "gpus: 4, colour: red"), "step `sweep`, field `colour`: Extra inputs are not permitted"),
        (("size_gb: 100", "size_gb: -1"), "dataset `omics`, field `size_gb`"),
        (("datasets: [omics]", "datasets: [omics, atlas]"), "step `sweep`, field `datasets`: unknown dataset `atlas`"),
        (("gpus: 4", "gpus: 4, accelerators: [h100]"), "step `sweep`, field `accelerators`: unknown accelerator `h100`"),
        (("tenant: cell\n", ""), "field `tenant`: Field required"),
    ],
)
def test_bad_job_file_names_file_entry_and_field(tmp_path, change, expected):
    path = _write(tmp_path, GOOD.replace(*change))
    with pytest.raises(JobFileError) as error:
        load_job(path)
    assert str(path) in str(error.value)
    assert expected.replace("Value error, ", "") in str(error.value)


def test_impossible_request_is_refused_before_planning(tmp_path):
    path = _write(tmp_path, GOOD.replace("gpus: 4", "gpus: 1024"))
    catalog = load_catalog(REPO / "deploy" / "pools")
    with pytest.raises(JobFileError, match=r"step `sweep`, field `gpus`: asks for 1024 GPUs, more than any pool has \(largest: `gpucloud-sunk-h200-block` with 256\)"):
        check_against_catalog(load_job(path), catalog, path)


def test_job_limits_travel_with_every_step():
    job = load_job(REPO / "deploy" / "jobs" / "cell.yaml")
    assert {tuple(s.limits.providers) for s in job.step_specs()} == {("aws", "gcp", "azure", "oci")}


CATALOG = """
tenants:
  partner: {providers: [aws, gcp]}
pools:
  aws-pool: {provider: aws, region: us-east-1, backend: local, purchasing: on_demand, accelerator: h100-80gb, gpus_per_node: 8, price_per_gpu_hour: 1.0}
  gcp-pool: {provider: gcp, region: us-central1, backend: local, purchasing: on_demand, accelerator: h100-80gb, gpus_per_node: 8, price_per_gpu_hour: 3.0}
"""


def test_a_job_s_limits_bind_a_step_run_for_another_tenant(tmp_path):
    """The job's owner promised its data goes to gcp only: a step run for `partner` (whose own
    limits allow aws and gcp) stays on gcp though aws is cheaper; both limits apply."""
    (tmp_path / "pools.yaml").write_text(CATALOG)
    path = tmp_path / "job.yaml"
    path.write_text(
        "job: j\ntenant: cell\nstart: 2026-12-07T00:00:00Z\nlimits: {providers: [gcp]}\n"
        "steps:\n  own: {gpus: 8, expected_hours: 1}\n  shared: {gpus: 8, expected_hours: 1, tenant: partner, start_hours: 2}\n"
    )
    plan = plan_job_file(path, [tmp_path / "pools.yaml"])
    assert {r["step"]: r["pool"] for r in plan.rows()} == {"own": "gcp-pool", "shared": "gcp-pool"}
    refused = plan.placement(1).verdict("aws-pool")
    assert refused.reasons == ["the job's `limits:` do not allow aws us-east-1 (allowed providers: gcp; regions: any)"]


def test_one_job_s_limits_do_not_narrow_another_job_of_the_same_tenant(tmp_path):
    (tmp_path / "pools.yaml").write_text(CATALOG)
    strict, free = tmp_path / "strict.yaml", tmp_path / "free.yaml"
    strict.write_text("job: strict\ntenant: cell\nstart: 2026-12-07T00:00:00Z\nlimits: {providers: [gcp]}\n"
                      "steps:\n  a: {gpus: 8, expected_hours: 1}\n")
    free.write_text("job: free\ntenant: cell\nstart: 2026-12-07T00:00:00Z\nsteps:\n  b: {gpus: 8, expected_hours: 1, start_hours: 2}\n")
    plan = plan_calendar([strict, free], [tmp_path / "pools.yaml"])
    assert {r["step"]: r["pool"] for r in plan.rows()} == {"strict/a": "gcp-pool", "free/b": "aws-pool"}


@pytest.mark.parametrize("name", ["cell", "robotics"])
def test_sample_jobs_plan_against_the_cloud_catalogs(name):
    from control_plane.placement.planner import plan_job

    path = REPO / "deploy" / "jobs" / f"{name}.yaml"
    job = load_job(path)
    catalog = load_catalog(REPO / "deploy" / "pools")
    check_against_catalog(job, catalog, path)
    plan = plan_job(job.job, job.step_specs(), catalog, budget_usd=job.budget_usd)
    rows = plan.rows()
    assert len(rows) == len(job.step_specs())
    for i, row in enumerate(rows):
        chosen = plan.placement(i).verdict(row["pool"])
        # the evidence prices the step as the plan does: with what was left of each commitment then
        assert chosen.rank == 1 and chosen.expected_cost_usd == pytest.approx(row["cost_usd"])
    if name == "robotics":  # the nightly sweeps land on spot with a Young/Daly cadence
        sweeps = [r for r in rows if r["step"].startswith("rollout-sweep")]
        assert all(r["purchasing"] == "spot" and r["checkpoint_interval_seconds"] for r in sweeps)
