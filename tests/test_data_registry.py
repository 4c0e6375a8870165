"""The DVC data registry: real git, real DVC, a real S3 API server (moto) on loopback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from data_layer.registry.names import (
    DatasetChanged,
    RegistryError,
    RegistryUnreachable,
    VersionNotFound,
    parse_ref,
    storage_location,
)
from data_layer.registry.registry import DataRegistry
from testbed.ports import free_port

VENV_BIN = Path(sys.executable).parent


# Helpers ---------------------------------------------------------------------------
def tree(folder: Path) -> dict[str, bytes]:
    """Every file under a folder, by relative path, with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def omics_folder(parent: Path, seed: int = 0) -> Path:
    """A curated omics version as the cell lane writes it: an AnnData zarr store plus a manifest."""
    import anndata as ad

    from cell_lane.omics import write_dataset

    rng = np.random.default_rng(seed)
    adata = ad.AnnData(
        X=rng.random((6, 4), dtype=np.float32),
        obs=pd.DataFrame({"label": list("abcabc")}, index=[f"cell{i}" for i in range(6)]),
        var=pd.DataFrame(index=[f"gene{i}" for i in range(4)]),
    )
    folder = parent / f"omics-{seed}"
    folder.mkdir(parents=True)
    write_dataset(adata, str(folder / "dataset.zarr"))
    (folder / "manifest.json").write_text(json.dumps({"version": f"v{seed}"}))
    return folder


def lerobot_folder(parent: Path, episodes: int = 2) -> Path:
    """A LeRobot-like dataset: meta/info.json and a parquet chunk."""
    folder = parent / f"lerobot-{episodes}"
    (folder / "meta").mkdir(parents=True)
    (folder / "data" / "chunk-000").mkdir(parents=True)
    (folder / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v3.0", "total_episodes": episodes}))
    frames = pd.DataFrame({"episode_index": np.repeat(np.arange(episodes), 5), "action": np.linspace(0, 1, 5 * episodes)})
    frames.to_parquet(folder / "data" / "chunk-000" / "file-000.parquet")
    return folder


def commits(git_dir: str) -> int:
    out = subprocess.run(["git", "rev-list", "--count", "--all"], cwd=git_dir, capture_output=True, text=True, check=True)
    return int(out.stdout)


def plain_env() -> dict[str, str]:
    """The environment for plain `dvc` / python subprocesses: no Sinewgrid on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["DVC_NO_ANALYTICS"] = "1"
    return env


# Fixtures --------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SINEWGRID_REGISTRY_GIT", raising=False)
    monkeypatch.delenv("SINEWGRID_STORAGE_REGION", raising=False)
    monkeypatch.delenv("SINEWGRID_STORAGE_PROVIDER", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(tmp_path / "dvc-site-cache"))  # not /var/tmp/dvc, shared by everyone


@pytest.fixture
def registry(tmp_path: Path) -> DataRegistry:
    return DataRegistry.for_root(str(tmp_path / "root"))


# Round trips -----------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["omics", "lerobot"])
def test_round_trip_idempotent_and_changed_content_refused(shape, registry, tmp_path):
    source = omics_folder(tmp_path / "src") if shape == "omics" else lerobot_folder(tmp_path / "src")
    dataset = "cell/omics" if shape == "omics" else "robotics/teleop"

    registered = registry.register(dataset, "v1", str(source), meta={"drops": ["d1", "d2"]})
    assert (registered.dataset, registered.version, registered.tag, registered.path) == (dataset, "v1", f"{dataset}/v1", f"{dataset}/v1")
    assert registered.md5.endswith(".dir") and registered.files == len(tree(source))
    assert registered.bytes == sum(len(b) for b in tree(source).values())
    assert registered.meta == {"drops": ["d1", "d2"]} and registered.source_uri == str(source)
    assert (registered.provider, registered.region) == ("local", "local")
    assert registered.ref == f"{dataset}@v1"
    assert registry.find(dataset, "v1") == registered

    back = registry.get(dataset, "v1", str(tmp_path / "back"))
    assert back == registered
    assert tree(tmp_path / "back") == tree(source)

    before = commits(registry.git_url)
    assert registry.register(dataset, "v1", str(source)) == registered
    assert commits(registry.git_url) == before

    first_file = next(p for p in sorted(source.rglob("*")) if p.is_file())
    first_file.write_bytes(first_file.read_bytes() + b"changed")
    with pytest.raises(DatasetChanged) as err:
        registry.register(dataset, "v1", str(source))
    message = str(err.value)
    assert registered.md5 in message and registered.rev[:12] in message and str(source) in message
    assert "nothing was overwritten" in message and "new version" in message
    assert commits(registry.git_url) == before
    assert registry.find(dataset, "v1").md5 == registered.md5

    again = registry.register(dataset, "v2", str(source))
    assert again.md5 != registered.md5
    assert [v.version for v in registry.versions(dataset)] == ["v1", "v2"]


def test_dvc_file_carries_meta_and_metadata_is_plain(registry, tmp_path):
    import yaml

    registered = registry.register("robotics/rollouts", "2026-11-20_cartpole-mujoco-randomized", str(lerobot_folder(tmp_path)),
                                   meta={"sessions": ["s1"], "episodes": np.int64(2)})
    text = subprocess.run(["git", "show", f"{registered.tag}:{registered.path}.dvc"], cwd=registry.git_url,
                          capture_output=True, text=True, check=True).stdout
    doc = yaml.safe_load(text)
    assert doc["outs"][0]["md5"] == registered.md5
    assert doc["meta"]["source_uri"] == registered.source_uri and doc["meta"]["extra"] == {"sessions": ["s1"], "episodes": 2}
    assert {"provider", "region", "registered_at"} <= set(doc["meta"])
    metadata = registered.metadata()
    assert metadata["dvc_md5"] == registered.md5 and metadata["registry_rev"] == registered.rev
    assert metadata["registry_tag"] == registered.tag
    assert metadata["get_command"].startswith(f"dvc get {registry.git_url} {registered.path} --rev {registered.tag}")
    assert all(isinstance(v, (str, int)) for v in metadata.values())
    config = subprocess.run(["git", "show", "main:.dvc/config"], cwd=registry.git_url, capture_output=True, text=True, check=True).stdout
    assert registry.remote_url in config and "verify" in config


def test_plain_dvc_get_and_dvc_api_need_no_sinewgrid(registry, tmp_path):
    source = lerobot_folder(tmp_path / "src")
    registered = registry.register("robotics/teleop", "session-7", str(source))

    out = tmp_path / "plain"
    subprocess.run([str(VENV_BIN / "dvc"), "get", registered.git_url, registered.path, "--rev", registered.tag, "-o", str(out)],
                   check=True, capture_output=True, cwd=tmp_path, env=plain_env())
    assert tree(out) == tree(source)

    script = (
        "import sys, dvc.api\n"
        f"repo, rev, path = {registered.git_url!r}, {registered.tag!r}, {registered.path!r}\n"
        "with dvc.api.open(path + '/meta/info.json', repo=repo, rev=rev) as f: sys.stdout.write(f.read())\n"
        "url = dvc.api.get_url(path + '/data/chunk-000/file-000.parquet', repo=repo, rev=rev)\n"
        "assert open(url, 'rb').read() == open(sys.argv[1], 'rb').read(), url\n"
        "assert not any(m.startswith(('shared_resources', 'control_plane', 'workload_runtime')) for m in sys.modules), 'Sinewgrid was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(source / "data/chunk-000/file-000.parquet")],
                          capture_output=True, text=True, cwd=tmp_path, env=plain_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (source / "meta" / "info.json").read_text()


# Bad input -------------------------------------------------------------------------
def test_missing_version_lists_the_known_ones(registry, tmp_path):
    with pytest.raises(VersionNotFound, match="no versions"):
        registry.find("cell/omics", "v1")
    source = lerobot_folder(tmp_path)
    for version in ("2026-11-01", "2026-11-02", "2026-11-03"):
        registry.register("robotics/teleop", version, str(source))
    with pytest.raises(VersionNotFound) as err:
        registry.get("robotics/teleop", "2026-11-04", str(tmp_path / "dest"))
    message = str(err.value)
    assert "robotics/teleop@2026-11-04" in message and "2026-11-03" in message and "nearest" in message
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("bad", ["cell", "cell/omics/extra", "Cell Omics/x", "../x", "cell/"])
def test_bad_dataset_names_are_refused(registry, tmp_path, bad):
    with pytest.raises(RegistryError, match="not a valid name"):
        registry.register(bad, "v1", str(tmp_path))


@pytest.mark.parametrize("bad", ["", "-v1", "v1/2", "v 1", "a..b", "v1.lock", "v1.", "x.dvc"])
def test_bad_versions_are_refused(registry, tmp_path, bad):
    with pytest.raises(RegistryError, match="not a valid name"):
        registry.register("cell/omics", bad, str(tmp_path))


def test_parse_ref():
    assert parse_ref("cell/omics@abc123") == ("cell/omics", "abc123")
    for bad in ("cell/omics", "cell/omics@", "cell@v1", "cell/omics@a@b"):
        with pytest.raises(RegistryError):
            parse_ref(bad)


def test_source_that_is_missing_or_empty_is_refused(registry, tmp_path):
    with pytest.raises(RegistryError, match="nothing at|not a directory"):
        registry.register("cell/omics", "v1", str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RegistryError, match="no files"):
        registry.register("cell/omics", "v1", str(tmp_path / "empty"))
    with pytest.raises(VersionNotFound):
        registry.find("cell/omics", "v1")


def test_unreachable_git_repository(tmp_path, monkeypatch):
    source = lerobot_folder(tmp_path)
    for spec in (str(tmp_path / "missing.git"), f"file://{tmp_path}/missing-too.git"):
        monkeypatch.setenv("SINEWGRID_REGISTRY_GIT", spec)
        registry = DataRegistry.for_root(str(tmp_path / "root"))
        assert registry.git_url == spec
        with pytest.raises(RegistryUnreachable) as err:
            registry.find("cell/omics", "v1")
        assert spec in str(err.value) and "SINEWGRID_REGISTRY_GIT" in str(err.value)
        with pytest.raises(RegistryUnreachable):
            registry.register("robotics/teleop", "v1", str(source))


def test_unreachable_object_store(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # fail at once instead of botocore's ~10 s of retries
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    registry = DataRegistry.for_root("s3://nowhere/unreachable")
    with pytest.raises(RegistryUnreachable) as err:
        registry.find("cell/omics", "v1")
    assert "AWS_ENDPOINT_URL" in str(err.value) and "s3://nowhere/unreachable/registry" in str(err.value)
    with pytest.raises(RegistryUnreachable):
        registry.register("robotics/teleop", "v1", str(lerobot_folder(tmp_path)))


@pytest.mark.parametrize("altered", ["file", "manifest"])
def test_object_altered_in_the_remote_is_caught_on_get(registry, tmp_path, altered):
    import hashlib

    source = lerobot_folder(tmp_path / "src")
    registered = registry.register("robotics/teleop", "v1", str(source))
    digest = hashlib.md5((source / "meta" / "info.json").read_bytes()).hexdigest() if altered == "file" else registered.md5
    obj = Path(registry.remote_url) / "files" / "md5" / digest[:2] / digest[2:]
    assert obj.is_file()
    obj.chmod(0o644)
    if altered == "file":
        obj.write_bytes(b'{"tampered": true}')
    else:  # the manifest now claims another file list
        entries = json.loads(obj.read_bytes())
        obj.write_text(json.dumps(entries[:1]))

    dest = tmp_path / "out" / "teleop"
    with pytest.raises(DatasetChanged) as err:
        registry.get("robotics/teleop", "v1", str(dest))
    assert registered.md5 in str(err.value)
    assert ("meta/info.json" if altered == "file" else "manifest") in str(err.value)
    assert not dest.exists()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []  # no partial download left behind


def test_get_refuses_an_existing_destination(registry, tmp_path):
    registry.register("robotics/teleop", "v1", str(lerobot_folder(tmp_path / "src")))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep me")
    with pytest.raises(RegistryError, match="already exists"):
        registry.get("robotics/teleop", "v1", str(dest))
    assert tree(dest) == {"mine.txt": b"keep me"}


def test_a_moved_root_still_gets_but_registers_nothing_elsewhere(tmp_path):
    source = lerobot_folder(tmp_path / "src")
    DataRegistry.for_root(str(tmp_path / "root")).register("robotics/teleop", "v1", str(source))
    shutil.move(tmp_path / "root", tmp_path / "moved")
    moved = DataRegistry.for_root(str(tmp_path / "moved"))
    moved.get("robotics/teleop", "v1", str(tmp_path / "back"))
    assert tree(tmp_path / "back") == tree(source)
    with pytest.raises(RegistryError, match="dvc remote modify storage url") as err:
        moved.register("robotics/teleop", "v2", str(source))
    assert str(tmp_path / "root" / "registry" / "dvc-store") in str(err.value)
    assert [v.version for v in moved.versions()] == ["v1"]


# Concurrency -----------------------------------------------------------------------
def test_parallel_registrations_both_land(registry, tmp_path):
    sources = [lerobot_folder(tmp_path / f"src{i}", episodes=i + 1) for i in range(2)]
    results: dict[int, object] = {}

    def work(i: int) -> None:
        try:
            results[i] = registry.register("robotics/rollouts", f"run-{i}", str(sources[i]))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    tags = subprocess.run(["git", "tag", "--list"], cwd=registry.git_url, capture_output=True, text=True, check=True).stdout.split()
    assert sorted(tags) == ["robotics/rollouts/run-0", "robotics/rollouts/run-1"]
    assert {v.version for v in DataRegistry.for_root(str(tmp_path / "root")).versions()} == {"run-0", "run-1"}


def test_a_git_server_url_is_fetched_and_pushed(tmp_path, monkeypatch):
    server = tmp_path / "server.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(server)], check=True)
    monkeypatch.setenv("SINEWGRID_REGISTRY_GIT", f"file://{server}")
    source = lerobot_folder(tmp_path)
    first = DataRegistry.for_root(str(tmp_path / "root")).register("robotics/teleop", "v1", str(source))
    assert first.git_url == f"file://{server}"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other-machine-cache"))
    other = DataRegistry.for_root(str(tmp_path / "root"))
    assert other.find("robotics/teleop", "v1") == first
    other.register("robotics/teleop", "v2", str(lerobot_folder(tmp_path / "b", episodes=3)))
    tags = subprocess.run(["git", "tag", "--list"], cwd=server, capture_output=True, text=True, check=True).stdout.split()
    assert sorted(tags) == ["robotics/teleop/v1", "robotics/teleop/v2"]
    out = tmp_path / "plain"
    subprocess.run([str(VENV_BIN / "dvc"), "get", f"file://{server}", "robotics/teleop/v1", "--rev", "robotics/teleop/v1", "-o", str(out)],
                   check=True, capture_output=True, cwd=tmp_path, env=plain_env())
    assert tree(out) == tree(source)


# Where the storage is ----------------------------------------------------------------
def test_storage_location(tmp_path, monkeypatch, s3_root):
    assert storage_location(str(tmp_path)) == ("local", "local")
    assert storage_location(s3_root) == ("aws", "us-east-1")
    monkeypatch.setenv("SINEWGRID_STORAGE_REGION", "eu-west-3")
    monkeypatch.setenv("SINEWGRID_STORAGE_PROVIDER", "onprem")
    assert storage_location(str(tmp_path)) == ("onprem", "eu-west-3")
    monkeypatch.delenv("SINEWGRID_STORAGE_REGION")
    monkeypatch.delenv("SINEWGRID_STORAGE_PROVIDER")
    assert storage_location("gs://bucket/x")[0] == "gcp"
    assert storage_location("az://container/x")[0] == "azure"


# S3 ------------------------------------------------------------------------------------
def test_s3_round_trip_with_the_bundle_mirror(s3_root, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem()
    source = lerobot_folder(tmp_path / "local-src")
    source_uri = f"{s3_root}/curated/teleop/session-1"
    fs.put(str(source) + "/", source_uri, recursive=True)
    assert sorted(p.rsplit("session-1/", 1)[1] for p in fs.find(source_uri)) == sorted(tree(source))

    registry = DataRegistry.for_root(s3_root)
    assert registry.remote_url == f"{s3_root}/registry/dvc-store"
    registered = registry.register("robotics/teleop", "session-1", source_uri, meta={"sessions": ["session-1"]})
    assert (registered.provider, registered.region, registered.source_uri) == ("aws", "us-east-1", source_uri)
    assert fs.exists(f"{s3_root}/registry/datasets.bundle")
    assert not [p for p in fs.find(f"{s3_root}/registry/dvc-store") if p.endswith(".tmp")]  # no upload leftovers
    assert registry.register("robotics/teleop", "session-1", source_uri) == registered

    registry.get("robotics/teleop", "session-1", str(tmp_path / "back"))
    assert tree(tmp_path / "back") == tree(source)

    # Another machine (nothing cached): the bundle on the object store is enough.
    shutil.rmtree(tmp_path / "cache")
    fresh = DataRegistry.for_root(s3_root)
    assert fresh.find("robotics/teleop", "session-1") == registered
    fresh.get("robotics/teleop", "session-1", str(tmp_path / "again"))
    assert tree(tmp_path / "again") == tree(source)
    second_source = lerobot_folder(tmp_path / "b", episodes=3)
    second = fresh.register("robotics/teleop", "session-2", str(second_source))
    assert [v.version for v in DataRegistry.for_root(s3_root).versions()] == ["session-1", "session-2"]

    # Plain DVC, as docs/datasets.md says: fetch the bundle, clone it, dvc get (credentials from the environment).
    fs.get(f"{s3_root}/registry/datasets.bundle", str(tmp_path / "datasets.bundle"))
    subprocess.run(["git", "clone", "--quiet", str(tmp_path / "datasets.bundle"), str(tmp_path / "datasets")], check=True)
    out = tmp_path / "plain"
    subprocess.run([str(VENV_BIN / "dvc"), "get", str(tmp_path / "datasets"), second.path, "--rev", second.tag, "-o", str(out)],
                   check=True, capture_output=True, cwd=tmp_path, env=plain_env())
    assert tree(out) == tree(second_source)


def test_s3_two_machines_through_the_bundle_both_land(s3_root, tmp_path, monkeypatch):
    """A registration from another machine lands between this one's sync and its publish: this one retries on top."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    machine_a = DataRegistry.for_root(s3_root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    machine_b = DataRegistry.for_root(s3_root)
    sources = [lerobot_folder(tmp_path / f"src{i}", episodes=i + 1) for i in range(3)]
    machine_a.register("robotics/teleop", "s0", str(sources[0]))

    original = machine_b._ensure_initialised
    calls = []

    def another_machine_lands_first() -> None:
        original()
        if not calls:
            calls.append(machine_a.register("robotics/teleop", "s1", str(sources[1])))

    monkeypatch.setattr(machine_b, "_ensure_initialised", another_machine_lands_first)
    machine_b.register("robotics/teleop", "s2", str(sources[2]))

    assert calls, "the interleaved registration did not run"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-c"))
    assert [v.version for v in DataRegistry.for_root(s3_root).versions("robotics/teleop")] == ["s0", "s1", "s2"]
    assert machine_a.find("robotics/teleop", "s2").version == "s2"  # a cache that was behind catches up


def test_s3_a_stale_cache_is_not_trusted(s3_root, tmp_path):
    """The object store is the truth: after the root is wiped, a cached registry must not claim old versions."""
    import s3fs

    source = lerobot_folder(tmp_path / "src")
    DataRegistry.for_root(s3_root).register("robotics/teleop", "v1", str(source))
    fs = s3fs.S3FileSystem()
    fs.rm(s3_root, recursive=True)
    registry = DataRegistry.for_root(s3_root)
    with pytest.raises(VersionNotFound):
        registry.find("robotics/teleop", "v1")
    registry.register("robotics/teleop", "v1", str(source))
    registry.get("robotics/teleop", "v1", str(tmp_path / "back"))
    assert tree(tmp_path / "back") == tree(source)


def test_s3_get_to_an_s3_destination(s3_root, tmp_path):
    import s3fs

    source = omics_folder(tmp_path)
    registry = DataRegistry.for_root(s3_root)
    registry.register("cell/omics", "v1", str(source))
    dest = f"{s3_root}/restored/v1"
    registry.get("cell/omics", "v1", dest)
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    got = {p.split("/restored/v1/", 1)[1]: fs.cat_file(p) for p in fs.find(dest)}
    assert got == tree(source)
    with pytest.raises(RegistryError, match="already exists"):
        registry.get("cell/omics", "v1", dest)


def test_command_line_lists_gets_and_explains_errors(registry, tmp_path):
    from typer.testing import CliRunner

    from sinewgrid.cli import app

    source = lerobot_folder(tmp_path / "src")
    registry.register("robotics/teleop", "session-1", str(source))
    cli = CliRunner()
    listed = cli.invoke(app, ["data", "list", "--root", registry.root])
    assert listed.exit_code == 0 and "robotics/teleop" in listed.output and "session-1" in listed.output
    got = cli.invoke(app, ["data", "get", "robotics/teleop", "session-1", str(tmp_path / "back"), "--root", registry.root])
    assert got.exit_code == 0, got.output
    assert tree(tmp_path / "back") == tree(source)
    assert "dvc get" in got.output  # how to do the same without Sinewgrid
    again = cli.invoke(app, ["data", "get", "robotics/teleop", "session-1", str(tmp_path / "back"), "--root", registry.root])
    assert again.exit_code == 1 and "already exists" in again.output and "nothing was overwritten" in again.output
    missing = cli.invoke(app, ["data", "get", "robotics/teleop", "session-9", str(tmp_path / "other"), "--root", registry.root])
    assert missing.exit_code == 1 and "session-9" in missing.output and "session-1" in missing.output
    assert not (tmp_path / "other").exists()
