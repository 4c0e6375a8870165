"""Team quotas as a Slurm cluster's own: an account per team, a QOS per priority class, and the
multifactor priority's fair share between them (docs/queues_slurm.md).

The quotas catalog (control_plane/catalog/quotas.py) maps onto Slurm's accounting so:

- each **team** is an account (an association under `root`) with `Fairshare=` its weight times
  `SHARES_PER_WEIGHT` (Slurm takes whole shares: weight 1 is 100, 2.5 is 250). Its GPUs are
  capped (`GrpTRES=gres/gpu=N`) only where the file gives it a borrowing limit on every pool of
  the cluster: nominal quota plus borrowing limit, summed over those pools. Never at nominal:
  teams borrow;
- each **priority class** is a QOS with `Priority=` its value, allowed on every team's account;
  the default class is each account's `DefaultQOS`;
- the Unix users that submit (the platform's own) get an association under each team's account.

`plan` says what a cluster needs for the pools it serves; `apply` makes it against the cluster a
pool's `env` names (`SLURM_CONF`), reading what is there first and changing only what differs
(applying twice changes nothing); `fair_share` reads `sshare`. `account_and_qos` is what the Slurm
backend puts on a job of a pool with `accounts: teams` (`SlurmSettings`).
"""

from __future__ import annotations

import getpass
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from control_plane.catalog.pools import Pool
from control_plane.catalog.quotas import QuotaCatalogError, Quotas, load_quotas
from control_plane.catalog.step_spec import StepSpec
from control_plane.queues.requests import NoTeam, team_and_class
from control_plane.settings import child_env

SHARES_PER_WEIGHT = 100
# What Slurm takes as an account or QOS name and gives back unchanged: sacctmgr folds upper case
# to lower (a job asking for `--qos=Deadline` would then name another QOS than the catalog's), and
# commas, spaces and `=` split its arguments.
_SLURM_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
NAME_RULE = "lower-case letters, digits, `-`, `_` and `.`, starting with a letter, at most 64 characters"
SSHARE_FIELDS = "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare"


class SlurmAccountsError(RuntimeError):
    """A team or class Slurm cannot take, or a Slurm command that failed: what, where, the fix."""


@dataclass(frozen=True)
class TeamAccount:
    name: str
    fairshare: int
    max_gpus: int | None = None  # GrpTRES=gres/gpu=N; None: no cap


@dataclass(frozen=True)
class AccountsPlan:
    """The associations and QOS one cluster needs for the quotas of the pools it serves."""

    cluster_pools: tuple[str, ...]
    accounts: tuple[TeamAccount, ...]
    qos: Mapping[str, int]  # name -> Priority
    default_qos: str
    users: tuple[str, ...]

    def commands(self, cluster: str) -> list[list[str]]:
        """The `sacctmgr` commands that make all of it on a cluster that has none of it."""
        made = [["sacctmgr", "-i", "add", "qos", name, f"Priority={value}"] for name, value in self.qos.items()]
        for account in self.accounts:
            made.append(["sacctmgr", "-i", "add", "account", account.name, f"Cluster={cluster}", *self.settings(account), _description(account)])
            made += [["sacctmgr", "-i", "add", "user", user, f"Account={account.name}", f"Cluster={cluster}"] for user in self.users]
        return made

    def settings(self, account: TeamAccount) -> list[str]:
        """The account's `KEY=value` settings, as `sacctmgr add account` and `modify account` take them."""
        cap = f"GrpTRES=gres/gpu={account.max_gpus}" if account.max_gpus is not None else None
        return [f"Fairshare={account.fairshare}", f"QOS={','.join(sorted(self.qos))}", f"DefaultQOS={self.default_qos}", *([cap] if cap else [])]


@dataclass(frozen=True)
class FairShareRow:
    """One line of `sshare`: an account (`user` empty) or a user's association under it."""

    account: str
    user: str
    raw_shares: int | None  # None for the root account, or shares of `parent`
    norm_shares: float | None
    raw_usage: int  # decayed usage, in billing-weighted CPU-seconds (TRESBillingWeights)
    effective_usage: float | None
    fair_share: float | None  # the fair-share factor, 0..1 (1: far below its share); accounts have none under Fair Tree


def slurm_name(name: str, what: str, where: str, fix: str) -> str:
    """`name` when Slurm takes it as an account or QOS name unchanged; else why not and `fix`."""
    if not _SLURM_NAME.match(name):
        raise SlurmAccountsError(f"{where}: {what} `{name}` cannot be a Slurm name ({NAME_RULE}); {fix}")
    return name


def plan(quotas: Quotas, pools: str | Sequence[str], users: Iterable[str] | None = None) -> AccountsPlan:
    """The accounts and QOS for `pools` (the pools one cluster serves) under `quotas`, for `users`
    (default: the Unix user running this, who submits the jobs). Every name is checked first."""
    pools = (pools,) if isinstance(pools, str) else tuple(pools)
    where = quotas.file or "quotas"
    problems = []
    for kind, names, fix in (
        ("team", quotas.teams, "rename it under `teams:`"),
        ("priority class", quotas.priority_classes, "rename it under `priority_classes:` (and in the steps naming it)"),
    ):
        for name in names:
            try:
                slurm_name(name, kind, where, fix)
            except SlurmAccountsError as error:
                problems.append(str(error))
    if problems:
        raise SlurmAccountsError("the quotas cannot be Slurm accounts and QOS:\n  " + "\n  ".join(problems))
    accounts = []
    for name, team in quotas.teams.items():
        shares = [quotas.quota(pool, name) for pool in pools]
        capped = all(q.borrowing_limit is not None for q in shares)
        cap = sum(q.gpus + (q.borrowing_limit or 0) for q in shares) if capped else None
        accounts.append(TeamAccount(name, max(1, round(team.weight * SHARES_PER_WEIGHT)), cap))
    return AccountsPlan(pools, tuple(accounts), dict(quotas.priority_classes), quotas.default_priority, tuple(users or (getpass.getuser(),)))


def account_and_qos(spec: StepSpec, pool: Pool, quotas: Quotas | None = None) -> tuple[str, str]:
    """The `--account` (the step's team) and `--qos` (its priority class) of `spec` on `pool`;
    a step of no team, or a class the catalog lacks or Slurm cannot take, is refused by name."""
    where = f"pool {pool.name} runs each job under its team's Slurm account (`accounts: teams`)"
    try:
        quotas = quotas or load_quotas()
        try:
            team, wanted = team_and_class(spec, quotas)
        except NoTeam as exc:
            raise SlurmAccountsError(
                f"{where}, and {exc}: step {spec.name} is not submitted. Add `{spec.tenant}` to a team's `members` in "
                f"{quotas.file} (then apply the accounts: docs/queues_slurm.md), or run the step on a pool without `accounts: teams`."
            ) from None
        fix = f"rename it under `priority_classes:` and in step {spec.name}"
        return slurm_name(team, "team", quotas.file, "rename it under `teams:`"), slurm_name(wanted, "priority class", quotas.file, fix)
    except (SlurmAccountsError, QuotaCatalogError) as error:
        said = str(error)
        raise SlurmAccountsError(said if said.startswith(where) else f"{where}: {said}") from None


# Against a cluster -----------------------------------------------------------------------------
def apply(accounts: AccountsPlan, env: Mapping[str, str]) -> list[list[str]]:
    """Make `accounts` on the cluster `env` reaches (its `SLURM_CONF`): the QOS, each team's
    account, each user's association under it. Only what differs from what is there is changed;
    the commands that changed something are returned (none when it was all there already)."""
    cluster = cluster_name(env)
    ran: list[list[str]] = []

    def change(*args: str) -> None:
        ran.append(["sacctmgr", "-i", *args])
        _run(ran[-1], env)

    have_qos = dict(line.split("|")[:2] for line in _rows(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,Priority"], env))
    for name, value in accounts.qos.items():
        if name not in have_qos:
            change("add", "qos", name, f"Priority={value}")
        elif have_qos[name] != str(value):
            change("modify", "qos", "where", f"name={name}", "set", f"Priority={value}")
    shown = _rows(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"cluster={cluster}", "format=Account,User,Fairshare,GrpTRES,QOS,DefaultQOS"], env)
    have = {}
    for account_name, user, shares, cap, qos, default_qos in (row.split("|")[:6] for row in shown):
        gpus = ",".join(limit for limit in cap.split(",") if limit.startswith("gres/gpu="))  # a site's other limits are its own
        have[(account_name, user)] = {"Fairshare": shares, "GrpTRES": gpus, "QOS": ",".join(sorted(filter(None, qos.split(",")))), "DefaultQOS": default_qos}
    for account in accounts.accounts:
        wanted = dict(setting.split("=", 1) for setting in accounts.settings(account))
        wanted.setdefault("GrpTRES", "")
        current = have.get((account.name, ""))
        differing = {k: v for k, v in wanted.items() if current is not None and current.get(k) != v}
        if current is None:
            change("add", "account", account.name, f"Cluster={cluster}", *accounts.settings(account), _description(account))
        elif differing:
            if differing.get("GrpTRES") == "":
                differing["GrpTRES"] = "gres/gpu=-1"  # lift the cap
            change("modify", "account", "where", f"name={account.name}", f"cluster={cluster}", "set", *(f"{k}={v}" for k, v in differing.items()))
        inherited = current is None or {"QOS", "DefaultQOS"} & set(differing)  # the users' associations follow the account's
        for user in accounts.users:
            if (account.name, user) not in have:
                change("add", "user", user, f"Account={account.name}", f"Cluster={cluster}")
            elif not inherited and (have[(account.name, user)]["QOS"], have[(account.name, user)]["DefaultQOS"]) != (wanted["QOS"], wanted["DefaultQOS"]):
                where = ["where", f"name={user}", f"account={account.name}", f"cluster={cluster}"]
                change("modify", "user", *where, "set", f"QOS={wanted['QOS']}", f"DefaultQOS={wanted['DefaultQOS']}")
    return ran


def fair_share(env: Mapping[str, str]) -> list[FairShareRow]:
    """Every association's shares and usage, as `sshare -a` gives them (the tree's order)."""
    found = []
    for line in _rows(["sshare", "-P", "-n", "-a", "-o", SSHARE_FIELDS], env):
        account, user, raw, norm, usage, effective, factor = (line.split("|") + [""] * 7)[:7]
        found.append(
            FairShareRow(account.strip(), user, int(raw) if raw.isdigit() else None, _number(norm), int(usage or 0), _number(effective), _number(factor))
        )
    return found


def cluster_name(env: Mapping[str, str]) -> str:
    """The cluster `env` reaches, as slurm.conf names it (`ClusterName`)."""
    for line in _rows(["scontrol", "show", "config"], env):
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    raise SlurmAccountsError(f"`scontrol show config` names no ClusterName{_conf(env)}; give the cluster one in slurm.conf")


def _description(account: TeamAccount) -> str:
    return f"Description=Sinewgrid team {account.name}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _rows(args: list[str], env: Mapping[str, str]) -> list[str]:
    return [line for line in _run(args, env).splitlines() if line.strip()]


def _run(args: list[str], env: Mapping[str, str]) -> str:
    command = shlex.join(args)
    try:
        done = subprocess.run(args, env=child_env(env), capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmAccountsError(
            f"`{args[0]}` is not installed here: Slurm's accounts are kept with the Slurm client commands (`make slurm-packages`, or the site's client)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmAccountsError(f"`{command}` did not answer in 60 s{_conf(env)}; check slurmdbd and slurmctld") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"
        raise SlurmAccountsError(
            f"`{command}` failed{_conf(env)}: {said}. Accounts, QOS and fair share need slurmdbd "
            "(`AccountingStorageType=accounting_storage/slurmdbd` in slurm.conf, slurmdbd answering at AccountingStorageHost:Port) "
            "and a Slurm administrator to change them (root, SlurmUser, or a user with `AdminLevel=Administrator`); docs/queues_slurm.md."
        )
    return done.stdout


def _conf(env: Mapping[str, str]) -> str:
    return f" (SLURM_CONF={env['SLURM_CONF']})" if env.get("SLURM_CONF") else ""


def main(argv: list[str] | None = None) -> None:
    """Print the `sacctmgr` commands that make the quotas catalog's accounts and QOS on the cluster
    of the named Slurm pools (one cluster's pools), or make them (`--apply`) and show `sshare`."""
    import argparse

    from control_plane.catalog.backends import settings_for
    from control_plane.catalog.pools import load_pools
    from control_plane.settings import settings

    parser = argparse.ArgumentParser(prog="python -m control_plane.compute.backends.slurm_accounts", description=main.__doc__)
    parser.add_argument("pools", nargs="+", help="the Slurm pools of the pool catalog that one cluster serves")
    parser.add_argument("--user", action="append", help="a Unix user that submits the jobs (default: this one); repeat for more")
    parser.add_argument("--apply", action="store_true", help="make what differs on the cluster, then print `sshare`")
    args = parser.parse_args(argv)
    catalog = load_pools(settings().pools or None)
    if unknown := [p for p in args.pools if p not in catalog or catalog[p].backend != "slurm"]:
        slurm_pools = ", ".join(p for p in catalog if catalog[p].backend == "slurm") or "none"
        raise SystemExit(f"not Slurm pools of the pool catalog: {', '.join(unknown)} (its Slurm pools: {slurm_pools})")
    env = settings_for(catalog[args.pools[0]]).env
    try:
        accounts = plan(load_quotas(), args.pools, args.user)
        if not args.apply:
            print("\n".join(shlex.join(command) for command in accounts.commands(cluster_name(env))))
            return
        print("\n".join(shlex.join(command) for command in apply(accounts, env)) or "nothing to change")
        print(_run(["sshare", "-a", "-o", SSHARE_FIELDS], env))
    except (SlurmAccountsError, QuotaCatalogError) as error:
        raise SystemExit(str(error)) from None


if __name__ == "__main__":
    main()
