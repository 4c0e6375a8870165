"""Job files: the sample calendars expand and plan; bad input names file, entry and field."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from shared_resources.placement.job_files import JobFileError, check_against_catalog, load_job, with_job_limits
from shared_resources.catalog.pools import load_catalog

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


def test_job_limits_narrow_the_catalog_tenant_limits():
    job = load_job(REPO / "deploy" / "jobs" / "cell.yaml")
    catalog = with_job_limits(job, load_catalog(REPO / "deploy" / "pools"))
    assert catalog.tenants["cell"].providers == ["aws", "gcp", "azure", "oci"]


@pytest.mark.parametrize("name", ["cell", "robotics"])
def test_sample_jobs_plan_against_the_cloud_catalogs(name):
    from shared_resources.placement.planner import plan_job

    path = REPO / "deploy" / "jobs" / f"{name}.yaml"
    job = load_job(path)
    catalog = with_job_limits(job, load_catalog(REPO / "deploy" / "pools"))
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
