"""The data registry's git repository: the local mirror every read and registration works in,
kept in step with upstream (a git server, or a git bundle on the object store).

Also the small git plumbing the registry shares: running git without prompts, an exclusive
file lock, and the commit identity.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from control_plane.settings import child_env, settings
from data_layer.registry.names import ENV_GIT, RegistryError, join_uri, unreachable
from workload_runtime.storage import fs_for

BRANCH = "main"


class PublishRejected(Exception):
    """Someone else published first: sync and build the commit again."""


# Git and locks --------------------------------------------------------------------
def run_git(*args: str, cwd: str | Path | None = None, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`git ARGS` with no prompts and C messages; RegistryError on failure when `check`."""
    env = child_env({"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"})
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise RegistryError(f"git {' '.join(args)} failed in {cwd or os.getcwd()}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock: serialises threads and processes on this machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def user_name() -> str:
    """This machine's user name ("sinewgrid" for a container user with none)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user with no name
        return "sinewgrid"


def commit_identity() -> list[str]:
    """The `-c user.name=... -c user.email=...` arguments registry commits are made with."""
    user = user_name()
    return ["-c", f"user.name={user} (sinewgrid)", "-c", f"user.email={user}@{socket.gethostname()}"]


def _is_git_url(spec: str) -> bool:
    return "://" in spec or bool(re.match(r"^[\w.-]+@[\w.-]+:", spec))


def _cache_home() -> Path:
    return settings().user_cache / "sinewgrid" / "registry"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# The mirror -----------------------------------------------------------------------
class GitMirror:
    """The bare git repository the registry reads and pushes to, and how it reaches upstream.

    `mode` is "local" (the repository itself: nothing upstream), "git" (a cache of a git
    server at `git_url`) or "bundle" (a cache of the bundle at `bundle_uri` on the object store).
    """

    def __init__(self, path: Path, git_url: str, *, mode: str, bundle_uri: str | None = None, create: bool = False) -> None:
        self.path = path
        self.git_url = git_url
        self.mode = mode
        self.bundle_uri = bundle_uri
        self.create = create
        self.register_lock = path.with_name(path.name + ".register.lock")
        self._sync_lock = path.with_name(path.name + ".sync.lock")

    @classmethod
    def choose(cls, root: str, local_root_path: str | None, git_spec: str | None) -> GitMirror:
        """The mirror of storage root `root` (`local_root_path` is its path when it is local), or of `git_spec`."""
        if git_spec and _is_git_url(git_spec):
            return cls(_cache_home() / _short_hash(git_spec) / "datasets.git", git_spec, mode="git")
        if git_spec:
            path = Path(git_spec).expanduser().resolve()
            return cls(path, str(path), mode="local")
        if local_root_path is not None:
            path = Path(local_root_path) / "registry" / "datasets.git"
            return cls(path, str(path), mode="local", create=True)
        path = _cache_home() / _short_hash(root) / "datasets.git"
        return cls(path, str(path), mode="bundle", bundle_uri=join_uri(root, "registry", "datasets.bundle"), create=True)

    # Reading ------------------------------------------------------------------------
    def rev(self, ref: str) -> str | None:
        """The commit `ref` names, or None."""
        if not (self.path / "HEAD").exists():
            return None
        proc = run_git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=self.path, check=False)
        return proc.stdout.strip() or None

    def tag_refs(self) -> list[tuple[str, str, int]]:
        """(tag, commit, commit time) of every tag that names a dataset version."""
        if not (self.path / "HEAD").exists():
            return []
        out = run_git("for-each-ref", "--format=%(refname:strip=2)%09%(objectname)%09%(*objectname)%09%(committerdate:unix)%09%(*committerdate:unix)",
                      "refs/tags", cwd=self.path).stdout
        refs = []
        for line in out.splitlines():
            name, obj, peeled, when, peeled_when = (line.split("\t") + [""] * 5)[:5]
            if name.count("/") == 2:
                refs.append((name, peeled or obj, int(peeled_when or when or 0)))
        return refs

    def tagged_dvcfiles(self, tags: list[str]) -> list[tuple[str, str, str]]:
        """(tag, commit, text of `<tag>.dvc` at that commit) for these tags (missing ones skipped), in one git call."""
        known = {name: commit for name, commit, _ in self.tag_refs()}
        wanted = [t for t in tags if t in known]
        if not wanted:
            return []
        batch = "".join(f"{known[t]}:{t}.dvc\n" for t in wanted)
        raw = subprocess.run(["git", "cat-file", "--batch"], cwd=self.path, input=batch.encode(), capture_output=True, check=True).stdout
        found, pos = [], 0
        for tag in wanted:
            end = raw.index(b"\n", pos)
            header = raw[pos:end].decode().split()
            pos = end + 1
            if len(header) < 3 or header[1] == "missing":
                continue
            size = int(header[2])
            found.append((tag, known[tag], raw[pos:pos + size].decode()))
            pos += size + 1
        return found

    # Writing locally ----------------------------------------------------------------
    def init(self) -> None:
        """Create the bare repository if there is none yet."""
        if not (self.path / "HEAD").exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            run_git("init", "--bare", "--quiet", f"--initial-branch={BRANCH}", str(self.path))
            self._fingerprint_file.unlink(missing_ok=True)

    def rollback(self, old_main: str | None, tag: str | None, old_tag_rev: str | None = None) -> None:
        """Undo a local commit whose publication failed: the mirror stays what upstream has."""
        if tag and old_tag_rev:
            run_git("update-ref", f"refs/tags/{tag}", old_tag_rev, cwd=self.path)
        elif tag:
            run_git("tag", "-d", tag, cwd=self.path, check=False)
        if old_main:
            run_git("update-ref", f"refs/heads/{BRANCH}", old_main, cwd=self.path)
        else:
            run_git("update-ref", "-d", f"refs/heads/{BRANCH}", cwd=self.path, check=False)

    # Upstream: a git server, or the bundle on the object store -----------------------------
    def sync_down(self) -> None:
        """Make the local mirror exactly what upstream holds (nothing to do for a local repository).

        Upstream is the truth: refs it no longer has are pruned, and a cache whose bundle is gone
        (a wiped or recreated root) is emptied rather than trusted.
        """
        if self.mode == "local":
            if not self.create and not (self.path / "HEAD").exists():
                raise unreachable("git repository", self.git_url, "no git repository there; create it with `git init --bare` or fix " + ENV_GIT)
            return
        with file_lock(self._sync_lock):
            if self.mode == "git":
                self.init()
                self._fetch(self.git_url, what="git repository")
                return
            fingerprint = self._bundle_fingerprint()
            if fingerprint is None:
                if self._saved_fingerprint() is not None or self._has_refs():
                    shutil.rmtree(self.path, ignore_errors=True)  # our cache of a registry that no longer exists
                    self._fingerprint_file.unlink(missing_ok=True)
                self.init()
                return
            if fingerprint == self._saved_fingerprint() and (self.path / "HEAD").exists():
                return
            self.init()
            fs, path = fs_for(self.bundle_uri)
            local = self.path.with_name(f"datasets.bundle.{uuid.uuid4().hex[:8]}")
            try:
                try:
                    fs.get_file(path, str(local))
                except Exception as exc:  # noqa: BLE001
                    raise unreachable("git bundle", self.bundle_uri, exc) from exc
                self._fetch(str(local), what="git bundle")
            finally:
                local.unlink(missing_ok=True)
            self._fingerprint_file.write_text(fingerprint)

    def publish(self, refs: list[str], moved: tuple[str, ...] = ()) -> None:
        """Send the mirror's new refs upstream; PublishRejected when someone else published first.
        `moved`: refs among them that may replace what upstream has (a tag moved by `republish`)."""
        if self.mode == "local":
            return
        with file_lock(self._sync_lock):
            if self.mode == "git":
                specs = [f"{'+' if r in moved else ''}{r}:{r}" for r in refs]
                proc = run_git("push", "--quiet", "--atomic", "--porcelain", self.git_url, *specs, cwd=self.path, check=False)
                if proc.returncode == 0:
                    return
                text = proc.stdout + proc.stderr
                if "[rejected]" in text or "non-fast-forward" in text or "fetch first" in text or "already exists" in text:
                    raise PublishRejected(text)
                raise unreachable("git repository", self.git_url, proc.stderr.strip())
            if self._bundle_fingerprint() != self._saved_fingerprint():
                raise PublishRejected("the bundle changed since it was read")
            fs, path = fs_for(self.bundle_uri)
            local = self.path.with_name(f"datasets.bundle.{uuid.uuid4().hex[:8]}")
            try:
                run_git("bundle", "create", "--quiet", str(local), "--all", cwd=self.path)
                try:
                    fs.put_file(str(local), path)
                except Exception as exc:  # noqa: BLE001
                    raise unreachable("git bundle", self.bundle_uri, exc) from exc
            finally:
                local.unlink(missing_ok=True)
            self._fingerprint_file.write_text(self._bundle_fingerprint() or "")

    def _has_refs(self) -> bool:
        if not (self.path / "HEAD").exists():
            return False
        return bool(run_git("for-each-ref", "--count=1", cwd=self.path).stdout.strip())

    def _fetch(self, source: str, *, what: str) -> None:
        proc = run_git("fetch", "--quiet", "--prune", "--update-head-ok", source, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*",
                       cwd=self.path, check=False)
        if proc.returncode == 0:
            return
        if what == "git bundle":
            raise RegistryError(
                f"the git bundle {self.bundle_uri} cannot be read ({proc.stderr.strip()}): restore it from the object "
                "store's versioning or a backup."
            )
        raise unreachable(what, self.git_url, proc.stderr.strip())

    @property
    def _fingerprint_file(self) -> Path:
        return self.path.with_name("bundle.fingerprint")

    def _saved_fingerprint(self) -> str | None:
        try:
            return self._fingerprint_file.read_text() or None
        except FileNotFoundError:
            return None

    def _bundle_fingerprint(self) -> str | None:
        """What identifies the bundle object now (ETag, size, time), or None if there is none yet."""
        fs, path = fs_for(self.bundle_uri)
        try:
            fs.invalidate_cache(path)
            info = fs.info(path)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001
            raise unreachable("git bundle", self.bundle_uri, exc) from exc
        keys = ("ETag", "etag", "md5Hash", "size", "LastModified", "mtime", "generation")
        return json.dumps({k: info.get(k) for k in keys if info.get(k) is not None}, sort_keys=True, default=str)
