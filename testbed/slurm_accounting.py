"""The throwaway Slurm cluster's accounting: a MariaDB server and `slurmdbd`, in the cluster's folder.

testbed/slurm_cluster.py starts them before `slurmctld`, so the controller finds its associations
at once:

1. `mariadb-install-db` makes the database's data folder (`<cluster>/db/data`), and `mariadbd`
   serves it as root (`user=root` in its own option file, `<cluster>/etc/my.cnf`), on a free
   loopback port and a socket in the same folder: nothing shared with a system MariaDB;
2. `slurmdbd` keeps the cluster's accounting in it (`slurmdbd.conf` beside `slurm.conf`, mode
   600, as slurmdbd demands), on a port of its own;
3. once slurmdbd answers, `register` adds the cluster, the default account `sinewgrid` and the
   users that submit to it, each with `sinewgrid` as its default account: under
   `AccountingStorageEnforce=associations` a job of a user with no association is turned down.

Accounts per team and a QOS per priority class are the control plane's to make
(control_plane/compute/backends/slurm_accounts.py, docs/queues_slurm.md). Needs the Debian
packages `slurmdbd mariadb-server` (`make -f mk/engines.mk slurm-packages`).
"""

from __future__ import annotations

import pwd
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from testbed.slurm_conf import MARIADB_CNF, SLURMDBD_ACCOUNTING, SLURMDBD_CONF

DEFAULT_ACCOUNT = "sinewgrid"  # the account of every job that names none (the tests' own)
# The commands the accounting needs (`make slurm-packages` installs them).
COMMANDS = ("mariadb-install-db", "mariadbd", "slurmdbd", "sacctmgr")
# Who submits to the test cluster: root (the tests, drills, benchmarks) and the images' user, uid
# 10001, that the rehearsal's runs submit as (rehearsal/slurm_pool.py adds it before the cluster
# starts). Each one this machine knows is registered.
SUBMITTER_UIDS = (0, 10001)


class AccountingStartError(RuntimeError):
    """The accounting database could not be made; the message has the command and its output."""


def submitters() -> tuple[str, ...]:
    """The names of the `SUBMITTER_UIDS` this machine knows."""
    names = []
    for uid in SUBMITTER_UIDS:
        try:
            names.append(pwd.getpwuid(uid).pw_name)
        except KeyError:
            continue
    return tuple(names)


def missing_commands() -> list[str]:
    """The accounting's commands not installed here (mariadbd lives in /usr/sbin, off some PATHs)."""
    return [c for c in COMMANDS if shutil.which(c) is None and shutil.which(c, path="/usr/sbin:/usr/bin") is None]


class ClusterAccounting:
    """One cluster's MariaDB and slurmdbd: `write_config`, `start` (through the cluster's own
    spawn and wait, so its stop stops them too), then `register`."""

    def __init__(self, root: Path, host: str, munge_socket: Path, users: Iterable[str]):
        self.root = root
        self.host = host
        self.munge_socket = munge_socket
        self.users = tuple(dict.fromkeys(users))
        self.db_port = self.dbd_port = 0
        self.option_file = root / "etc" / "my.cnf"
        self.data = root / "db" / "data"

    def write_config(self, db_port: int, dbd_port: int) -> str:
        """Write `my.cnf` and `slurmdbd.conf` for these ports; the lines `slurm.conf` needs."""
        self.db_port, self.dbd_port = db_port, dbd_port
        fields = {"root": self.root, "host": self.host, "munge_socket": self.munge_socket, "db_port": db_port, "dbd_port": dbd_port}
        self.option_file.write_text(MARIADB_CNF.format(**fields))
        conf = self.root / "etc" / "slurmdbd.conf"
        conf.write_text(SLURMDBD_CONF.format(**fields))
        conf.chmod(0o600)  # slurmdbd refuses a configuration others can read (it may hold a password)
        return SLURMDBD_ACCOUNTING.format(**fields)

    def start(self, spawn: Callable[[str, list[str]], None], wait: Callable[[Callable[[], bool], float, str], None], timeout: float) -> None:
        """The database (a fresh data folder), then slurmdbd; each waited for on its port."""
        shutil.rmtree(self.data, ignore_errors=True)  # an earlier attempt's
        self.data.mkdir(parents=True)
        made = subprocess.run(
            [_command("mariadb-install-db"), f"--defaults-file={self.option_file}", "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if made.returncode != 0:
            said = f"{made.stdout[-2000:]}{made.stderr[-2000:]}"
            raise AccountingStartError(f"`mariadb-install-db --defaults-file={self.option_file}` failed ({made.returncode}):\n{said}")
        spawn("mariadbd", [_command("mariadbd"), f"--defaults-file={self.option_file}"])
        wait(lambda: _listening(self.db_port), timeout, f"MariaDB listening on 127.0.0.1:{self.db_port}")
        spawn("slurmdbd", [_command("slurmdbd"), "-D"])  # reads slurmdbd.conf beside $SLURM_CONF
        wait(lambda: _listening(self.dbd_port), timeout, f"slurmdbd listening on 127.0.0.1:{self.dbd_port}")

    def register(self, sacctmgr: Callable[[list[str]], object], cluster_name: str) -> None:
        """The cluster, the default account and the users, so every job has an association: one
        `sacctmgr load` of a flat file (each sacctmgr call costs a few tenths of a second)."""
        lines = [
            f"Cluster - '{cluster_name}'",
            "Parent - 'root'",
            f"Account - '{DEFAULT_ACCOUNT}':Description='jobs that name no account':Organization='sinewgrid'",
            f"Parent - '{DEFAULT_ACCOUNT}'",
            *(f"User - '{user}':DefaultAccount='{DEFAULT_ACCOUNT}'" for user in self.users),
        ]
        flat = self.root / "etc" / "associations.cfg"
        flat.write_text("\n".join(lines) + "\n")
        sacctmgr(["sacctmgr", "-i", "load", f"file={flat}"])

    def logs(self) -> list[Path]:
        return [self.root / "log" / "mariadb.log", self.root / "log" / "slurmdbd.log"]


def _command(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin") or name


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0
