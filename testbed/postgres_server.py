"""A real, throwaway PostgreSQL server in a temporary folder, for tests.

`PostgresServer().start()` runs `initdb` into its own data folder, starts the server with
`pg_ctl` on a free loopback port (its socket in the same folder, nothing shared with a
system PostgreSQL), creates a database and gives its SQLAlchemy URL; `stop()` stops the
server and removes the folder. Trust authentication on loopback only: a test server.

PostgreSQL refuses to run as root, so under root the server runs as the `postgres` system
user (the Debian package creates it). Needs PostgreSQL's server binaries
(`make -f mk/engines.mk postgres-packages`); `POSTGRES_BIN` points at another `bin/` folder.
Run by hand: `python -m testbed.postgres_server` starts one, prints its URL and stops
it on Enter.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from control_plane.settings import settings
from testbed import leftovers
from testbed.ports import free_port

DATABASE = "sinewgrid_test"
PREFIX = "sinewgrid-pg-"
START_ATTEMPTS = 3


def postgres_bin() -> Path:
    """The newest PostgreSQL server `bin/` folder on this machine."""
    if configured := settings().postgres_bin:
        return Path(configured)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError(
        "The PostgreSQL tests need PostgreSQL's server binaries (initdb, pg_ctl), and none were found in "
        "/usr/lib/postgresql/*/bin or on PATH. Install them with `make -f mk/engines.mk postgres-packages` "
        "(as root: apt-get install -y postgresql), or set POSTGRES_BIN to their folder."
    )



class PostgresServer:
    """One PostgreSQL server and one database, alive between `start()` and `stop()`."""

    def __init__(self, root: Path | None = None):
        self.bin = postgres_bin()
        leftovers.sweep(PREFIX)  # servers a killed earlier run left behind
        self.root = Path(root or tempfile.mkdtemp(prefix=PREFIX))
        self.data = self.root / "data"
        self.port = free_port()
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        kwargs = {"user": self._user.pw_uid, "group": self._user.pw_gid} if self._user else {}
        done = subprocess.run(
            [str(self.bin / tool), *args], capture_output=True, text=True, cwd=self.root, timeout=120, **kwargs
        )
        if done.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}\n{log}")
        return done

    def start(self) -> PostgresServer:
        if self._user:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        leftovers.claim(self.root)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync")
        for attempt in range(1, START_ATTEMPTS + 1):
            options = self._options()
            try:
                self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "-t", "60", "start")
                break
            except RuntimeError as error:
                # Another process took the chosen port before the server bound it: a new port.
                if "Address already in use" not in str(error) or attempt == START_ATTEMPTS:
                    raise
                self.port = free_port()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", DATABASE)
        return self

    def enable_tls(self) -> None:
        """Give the running server a self-signed certificate and turn `ssl` on (a reload, no restart),
        as managed PostgreSQL serves TLS: a client with `sslmode: require` then connects unchanged."""
        tls = self.root / "tls"
        tls.mkdir()
        cert, key = tls / "server.crt", tls / "server.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-days", "2", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True, timeout=60,
        )
        # PostgreSQL reads the key only if the server's own user owns it and nobody else can read it.
        owner = self.data.stat()
        for path in (tls, cert, key):
            os.chown(path, owner.st_uid, owner.st_gid)
        key.chmod(0o600)
        engine = sa.create_engine(self.url, isolation_level="AUTOCOMMIT")  # ALTER SYSTEM refuses a transaction
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(f"ALTER SYSTEM SET ssl_cert_file = '{cert}'"))
                conn.execute(sa.text(f"ALTER SYSTEM SET ssl_key_file = '{key}'"))
                conn.execute(sa.text("ALTER SYSTEM SET ssl = on"))
                conn.execute(sa.text("SELECT pg_reload_conf()"))
        finally:
            engine.dispose()
        _wait_for_tls(self.url)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server (fast: every open connection is cut), wait `down_s`, start it again on the
        same port, data and settings, as a managed database's failover or maintenance restart does."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        time.sleep(down_s)
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", self._options(), "-w", "-t", "60", "start")

    def _options(self) -> str:
        return f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"

    def create_database(self, name: str) -> str:
        """A further empty database on this server (one per test keeps tests apart); its URL."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def stop(self) -> None:
        """Stop the server and remove its folder; a server `pg_ctl` cannot stop is killed."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (RuntimeError, OSError, subprocess.SubprocessError):
            pass  # whatever still runs from this folder is stopped below
        finally:
            leftovers.stop_processes(leftovers.processes_using(self.root))
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_for_tls(url: str, attempts: int = 50) -> None:
    """Until a `sslmode=require` connection is encrypted (the reload is asynchronous)."""
    last: Exception | None = None
    for _ in range(attempts):
        engine = sa.create_engine(url, connect_args={"sslmode": "require"})
        try:
            with engine.connect() as conn:
                if conn.execute(sa.text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).scalar():
                    return
        except sa.exc.OperationalError as error:  # "server does not support SSL" until the reload lands
            last = error
        finally:
            engine.dispose()
        time.sleep(0.1)
    raise RuntimeError(f"the test PostgreSQL server did not start serving TLS: {last}")


if __name__ == "__main__":
    with PostgresServer() as server:
        input(f"PostgreSQL is up: {server.url}\nPress Enter to stop it. ")
