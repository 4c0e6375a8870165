"""Team quotas enforced by Slurm itself, on the suite's real cluster (testbed/slurm_cluster.py keeps
accounts: slurmdbd, associations enforced, multifactor priority): the quotas catalog becomes an
account per team and a QOS per priority class; the jobs of a pool with `accounts: teams` carry
their team's account and their class's QOS, and their usage lands on that account in `sshare`; a
tenant of no team and a class Slurm cannot take are refused by name, before anything is submitted.

The teams and classes here are this module's own (`fs-...`): the cluster is the session's."""

from __future__ import annotations

import json
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from control_plane.catalog.backends import SlurmSettings
from control_plane.catalog.pools import Pool
from control_plane.catalog.quotas import load_quotas
from control_plane.compute.backends.base import JobState
from control_plane.compute.backends.engine import Launch
from control_plane.compute.backends import slurm_accounts
from control_plane.compute.backends.slurm import SlurmBackend
from control_plane.compute.backends.slurm_accounts import SlurmAccountsError, account_and_qos, apply, fair_share, plan
from control_plane.compute.backends.slurm_batch import render_batch_script
from control_plane.settings import REPO_ROOT
from testbed.counting_step import counting_spec
from testbed.slurm_cluster import SlurmCluster
from workload_runtime.workload import EXTRAS_ENV

POOL = "slurm-teams"
QUOTAS = """\
teams:
  fs-cell: {members: [fs-lab]}
  fs-robotics: {members: [fs-robot], weight: 2.5}
cohorts:
  fs-fleet: {teams: [fs-cell, fs-robotics]}
quotas:
  slurm-teams:
    fs-cell: {gpus: 1}
    fs-robotics: {gpus: 1, borrowing_limit: 1}
priority_classes: {fs-deadline: 1000, fs-sweep: 100}
default_priority: fs-sweep
"""
ASSOCIATIONS = ["sacctmgr", "-n", "-P", "show", "assoc", "where", "account=fs-cell,fs-robotics", "format=Account,User,Fairshare,GrpTRES,QOS,DefaultQOS"]


def _pool(env: dict[str, str]) -> Pool:
    """A pool on the cluster's `gpu` partition whose jobs run under the teams' accounts."""
    return Pool(
        name=POOL, provider="test-slurm", region="local", backend="slurm",
        backend_settings={"partition": "gpu", "env": env, "time_limit": "00:10:00", "accounts": "teams"},
        purchasing="reserved", accelerator="local", gpus_per_node=2, price_per_gpu_hour=1.0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def quotas_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fairshare") / "quotas.yaml"
    path.write_text(QUOTAS)
    return path


@pytest.fixture(scope="module")
def applied(slurm_cluster: SlurmCluster, quotas_file: Path) -> list[list[str]]:
    """The module's quotas made on the cluster (for root, who submits here): the commands it took."""
    return apply(plan(load_quotas(quotas_file), POOL), slurm_cluster.env)


@pytest.fixture
def teams_quotas(monkeypatch: pytest.MonkeyPatch, quotas_file: Path) -> Path:
    monkeypatch.setenv("SINEWGRID_QUOTAS", str(quotas_file))
    return quotas_file


def test_the_quotas_become_accounts_and_qos(slurm, applied, quotas_file):
    assert applied, "nothing was made on a cluster that had none of the module's accounts"
    rows = {(r.account, r.user): r for r in fair_share(slurm.env)}
    # Shares are the weights (times 100: Slurm takes whole numbers); root submits under both teams.
    assert (rows[("fs-cell", "")].raw_shares, rows[("fs-robotics", "")].raw_shares) == (100, 250)
    assert {("fs-cell", "root"), ("fs-robotics", "root")} <= set(rows)
    associations = {tuple(line.split("|")[:2]): line.split("|")[2:] for line in slurm.client(ASSOCIATIONS).stdout.split()}
    # fs-robotics may borrow 1 past its nominal 1: capped at 2 GPUs; fs-cell, unlimited, is not capped.
    assert associations[("fs-robotics", "")] == ["250", "gres/gpu=2", "fs-deadline,fs-sweep", "fs-sweep"]
    assert associations[("fs-cell", "")] == ["100", "", "fs-deadline,fs-sweep", "fs-sweep"]
    assert associations[("fs-cell", "root")][2:] == ["fs-deadline,fs-sweep", "fs-sweep"]  # the user's job may use both classes
    qos = dict(line.split("|") for line in slurm.client(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,Priority"]).stdout.split())
    assert (qos["fs-deadline"], qos["fs-sweep"]) == ("1000", "100")

    # Applying again changes nothing; a changed weight changes that one account's shares, only.
    quotas = load_quotas(quotas_file)
    assert apply(plan(quotas, POOL), slurm.env) == []
    assert {tuple(line.split("|")[:2]): line.split("|")[2:] for line in slurm.client(ASSOCIATIONS).stdout.split()} == associations
    heavier = quotas.model_copy(update={"teams": {**quotas.teams, "fs-cell": quotas.teams["fs-cell"].model_copy(update={"weight": 3.0})}})
    try:
        changed = apply(plan(heavier, POOL), slurm.env)
        assert changed == [["sacctmgr", "-i", "modify", "account", "where", "name=fs-cell", "cluster=sinewgrid-test", "set", "Fairshare=300"]]
        # A new class: its QOS, allowed on each account; the users' associations follow their account's.
        more = heavier.model_copy(update={"priority_classes": {**quotas.priority_classes, "fs-extra": 50}})
        changed = apply(plan(more, POOL), slurm.env)
        assert changed[0] == ["sacctmgr", "-i", "add", "qos", "fs-extra", "Priority=50"] and len(changed) == 3, changed
        assert {line.split("|")[4] for line in slurm.client(ASSOCIATIONS).stdout.split()} == {"fs-deadline,fs-extra,fs-sweep"}
    finally:
        apply(plan(quotas, POOL), slurm.env)
    assert {tuple(line.split("|")[:2]): line.split("|")[2:] for line in slurm.client(ASSOCIATIONS).stdout.split()} == associations


def test_the_command_prints_or_applies_what_a_cluster_needs(slurm, applied, teams_quotas, monkeypatch, capsys, tmp_path):
    catalog = tmp_path / "pools.yaml"
    catalog.write_text(yaml.safe_dump({"pools": {POOL: _pool(slurm.env).model_dump(mode="json", exclude={"name"}, exclude_defaults=True)}}))
    monkeypatch.setenv("SINEWGRID_POOLS", str(catalog))
    slurm_accounts.main([POOL])
    printed = capsys.readouterr().out.splitlines()
    assert "sacctmgr -i add qos fs-deadline Priority=1000" in printed
    robotics = "Fairshare=250 QOS=fs-deadline,fs-sweep DefaultQOS=fs-sweep GrpTRES=gres/gpu=2 'Description=Sinewgrid team fs-robotics'"
    assert f"sacctmgr -i add account fs-robotics Cluster=sinewgrid-test {robotics}" in printed
    slurm_accounts.main([POOL, "--apply"])  # made already by the module's fixture
    assert capsys.readouterr().out.startswith("nothing to change\n")
    with pytest.raises(SystemExit, match="not Slurm pools of the pool catalog: nowhere"):
        slurm_accounts.main(["nowhere"])


def test_the_cluster_enforces_associations_and_qos(slurm, applied, tmp_path):
    """Slurm itself turns down what the accounts do not allow: an account root is not in, a QOS the
    account does not have. A job naming neither runs under the default account."""
    base = ["sbatch", "--parsable", f"--output={tmp_path / 'out.log'}", "--wrap=true"]
    unknown = slurm.client([*base, "--account=fs-nobody"], check=False)
    assert unknown.returncode != 0 and "Invalid account" in unknown.stderr, unknown.stderr
    not_allowed = slurm.client([*base, "--account=fs-cell", "--qos=normal"], check=False)
    assert not_allowed.returncode != 0 and "Invalid qos" in not_allowed.stderr, not_allowed.stderr
    job = slurm.client(base).stdout.strip()
    shown = _wait_for(lambda: "JobState=COMPLETED" in (s := slurm.client(["scontrol", "show", "job", "--oneliner", job]).stdout) and s, "the job to complete")
    assert " Account=sinewgrid " in shown and " QOS=normal " in shown, shown
    # Another Unix user joins the default account, as the rehearsal's service account does.
    slurm.add_users("nobody")
    assert "sinewgrid|nobody" in slurm.client(["sacctmgr", "-n", "-P", "show", "assoc", "where", "user=nobody", "format=Account,User"]).stdout


def test_steps_of_two_teams_carry_their_account_and_qos_and_their_usage_lands_there(slurm, applied, teams_quotas, tmp_path):
    backend = SlurmBackend()
    pool = _pool(slurm.env)
    steps = {
        "fs-cell": counting_spec("test.fs-cell", tenant="fs-lab", priority_class="fs-deadline"),
        "fs-robotics": counting_spec("test.fs-robotics", tenant="fs-robot"),  # the default class, fs-sweep
    }
    used_before = _usage(slurm)
    handles = {}
    for team, spec in steps.items():
        (tmp_path / team).mkdir()
        extras = {"config": {"steps": 20, "step_seconds": 0.1}, "checkpoint_uri": str(tmp_path / team / "ckpt"), "checkpoint_every_steps": 5}
        launch = Launch(
            name=f"{spec.name}-a1", command=backend.command(pool, spec), env={EXTRAS_ENV: json.dumps(extras), "SINEWGRID_POOL": POOL},
            workdir=str(REPO_ROOT), output_path=str(tmp_path / team / "output.log"),
        )  # fmt: skip
        handles[team] = backend.submit(pool, spec, launch)
    for team, handle in handles.items():
        ended = _wait_for(lambda h=handle: (s := backend.status(h)).state.ended and s, f"{team}'s job to end")
        assert ended.state is JobState.succeeded, (ended, backend.collect(handle).decode()[-2000:])
    # Slurm's own record of each job: its team's account, its class's QOS.
    wanted = sorted(f"{handles[team].job_id}|{team}|{spec.priority_class or 'fs-sweep'}|COMPLETED" for team, spec in steps.items())
    sacct = ["sacct", "-n", "-P", "-X", "-j", ",".join(h.job_id for h in handles.values()), "-o", "JobID,Account,QOS,State"]
    accounted = _wait_for(lambda: (rows := sorted(slurm.client(sacct).stdout.split())) == wanted and rows, "both jobs COMPLETED in sacct")
    assert accounted == wanted
    # The usage is each team's: sshare shows it on the account the job ran under.
    def grown() -> dict[str, int] | None:
        used = _usage(slurm)
        return used if all(used[team] > used_before[team] for team in steps) else None

    # Slurm adds a finished job's usage to its association (at its end, or by the priority plugin's next pass:
    # PriorityCalcPeriod, a minute here).
    used = _wait_for(grown, "the jobs' usage in sshare", timeout=150)
    assert all(used[team] > used_before[team] for team in steps), (used_before, used)


def test_a_tenant_of_no_team_is_refused_by_name(slurm, teams_quotas, tmp_path):
    backend = SlurmBackend()
    spec = counting_spec("test.fs-stranger", tenant="fs-stranger")
    launch = Launch(name="test.fs-stranger-a1", command=["true"], env={}, workdir=str(tmp_path), output_path=str(tmp_path / "output.log"))
    with pytest.raises(dg.Failure) as refused:
        backend.submit(_pool(slurm.env), spec, launch)
    message = refused.value.description
    assert "tenant `fs-stranger`" in message and f"pool {POOL}" in message and "`members`" in message and str(teams_quotas) in message, message
    listed = slurm.client(["squeue", "-h", "-t", "all", "-o", "%j"]).stdout.split()
    assert "test.fs-stranger-a1" not in listed  # nothing was submitted


def test_a_priority_class_slurm_cannot_take_is_refused_by_name(slurm, monkeypatch, tmp_path):
    bad = tmp_path / "quotas.yaml"
    bad.write_text(QUOTAS.replace("fs-deadline: 1000", "Deadline Work: 1000"))
    quotas = load_quotas(bad)  # the catalog takes any class name; Slurm does not
    with pytest.raises(SlurmAccountsError) as refused:
        plan(quotas, POOL)
    assert "priority class `Deadline Work`" in str(refused.value) and "lower-case" in str(refused.value) and str(bad) in str(refused.value)
    # A step naming it on a `teams` pool: refused before sbatch, naming the class and the pool.
    monkeypatch.setenv("SINEWGRID_QUOTAS", str(bad))
    spec = counting_spec("test.fs-badclass", tenant="fs-lab", priority_class="Deadline Work")
    launch = Launch(name="test.fs-badclass-a1", command=["true"], env={}, workdir=str(tmp_path), output_path=str(tmp_path / "output.log"))
    with pytest.raises(dg.Failure) as failed:
        SlurmBackend().submit(_pool(slurm.env), spec, launch)
    assert "priority class `Deadline Work`" in failed.value.description and f"pool {POOL}" in failed.value.description
    assert "test.fs-badclass-a1" not in slurm.client(["squeue", "-h", "-t", "all", "-o", "%j"]).stdout.split()


# Without a cluster ------------------------------------------------------------------------------
def test_a_step_runs_under_its_team_and_class(quotas_file):
    pool = _pool({})
    quotas = load_quotas(quotas_file)
    assert account_and_qos(counting_spec(tenant="fs-robot"), pool, quotas) == ("fs-robotics", "fs-sweep")
    assert account_and_qos(counting_spec(tenant="fs-lab", priority_class="fs-deadline"), pool, quotas) == ("fs-cell", "fs-deadline")
    with pytest.raises(SlurmAccountsError, match="no priority class `urgent`"):
        account_and_qos(counting_spec(tenant="fs-lab", priority_class="urgent"), pool, quotas)


def test_a_teams_pool_writes_the_team_and_class_into_the_batch_script(quotas_file, monkeypatch):
    with pytest.raises(ValueError, match="leave `account` and `qos` unset"):
        SlurmSettings(partition="gpu", accounts="teams", account="lab-42")
    assert SlurmSettings(partition="gpu").accounts == "static"
    monkeypatch.setenv("SINEWGRID_QUOTAS", str(quotas_file))
    pool = _pool({})
    launch = Launch(name="test.fs-a1", command=["python", "-m", "x"], env={}, workdir="/srv", output_path="/shared/out.log")
    script = render_batch_script(pool, counting_spec(tenant="fs-lab", priority_class="fs-deadline"), launch)
    assert "#SBATCH --account=fs-cell\n#SBATCH --qos=fs-deadline\n" in script


def _usage(cluster: SlurmCluster) -> dict[str, int]:
    """Each account's decayed usage, as sshare gives it."""
    return {row.account: row.raw_usage for row in fair_share(cluster.env) if not row.user}


def _wait_for(probe, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.5)
    pytest.fail(f"no {what} after {timeout:g}s")
