"""The node-local cache (workload_runtime/node_cache.py) against a real S3 API server.

Reads from the object store are counted by the server itself: `object_reads` parses moto's own
request log (testbed/s3_server.py), so "read once" here means the store answered one GET.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

from cell_lane.omics import join_labels, publish_dataset
from control_plane.settings import REPO_ROOT, child_env
from testbed.s3_server import object_reads
from tests.helpers import TRAINING_IMPORTS, WorkloadProcess
from workload_runtime.checkpoints import CheckpointStore
from workload_runtime.inputs import Failpoint
from workload_runtime.node_cache import NodeCache, NodeCacheError
from workload_runtime.storage import fs_for
from workload_runtime.workload import PREEMPTED_EXIT_CODE


def _key(uri: str) -> str:
    return uri.removeprefix("s3://")


def _put_folder(uri: str, files: dict[str, bytes]) -> None:
    fs, path = fs_for(uri)
    for rel, data in files.items():
        fs.pipe_file(f"{path}/{rel}", data)


FILES = {"a.bin": os.urandom(3000), "sub/b.bin": os.urandom(5000), "sub/deeper/c.bin": b"c" * 700}


def test_a_folder_is_read_from_the_store_once_then_from_the_node(s3_root, s3_endpoint, tmp_path):
    uri = f"{s3_root}/data/set"
    _put_folder(uri, FILES)
    cache = NodeCache(tmp_path / "cache", 10**9)

    first = cache.fetch(uri)
    assert (first.cache_bytes, first.store_bytes) == (0, sum(map(len, FILES.values())))
    for rel, data in FILES.items():
        assert (Path(first.path) / rel).read_bytes() == data
    assert Counter(object_reads(s3_endpoint, _key(uri))) == {f"{_key(uri)}/{rel}": 1 for rel in FILES}

    second = cache.fetch(uri)
    assert (second.cache_bytes, second.store_bytes) == (sum(map(len, FILES.values())), 0)
    assert second.path == first.path
    assert len(object_reads(s3_endpoint, _key(uri))) == len(FILES)  # nothing more read


def test_a_file_changed_on_the_store_is_fetched_again_and_only_it(s3_root, s3_endpoint, tmp_path):
    uri = f"{s3_root}/data/set"
    _put_folder(uri, FILES)
    cache = NodeCache(tmp_path / "cache", 10**9)
    cache.fetch(uri)
    _put_folder(uri, {"sub/b.bin": b"new content"})

    again = cache.fetch(uri)
    assert (Path(again.path) / "sub/b.bin").read_bytes() == b"new content"
    assert again.store_bytes == len(b"new content")
    assert Counter(object_reads(s3_endpoint, _key(uri)))[f"{_key(uri)}/sub/b.bin"] == 2
    assert Counter(object_reads(s3_endpoint, _key(uri)))[f"{_key(uri)}/a.bin"] == 1


def test_a_corrupt_cached_file_is_not_used_but_fetched_again(s3_root, s3_endpoint, tmp_path):
    uri = f"{s3_root}/data/set"
    _put_folder(uri, FILES)
    warnings: list[str] = []
    cache = NodeCache(tmp_path / "cache", 10**9, warn=warnings.append)
    local = Path(cache.fetch(uri).path) / "a.bin"
    os.chmod(local, 0o644)
    local.write_bytes(b"x" * len(FILES["a.bin"]))  # same size, other bytes: only the hash tells

    again = cache.fetch(uri)
    assert (Path(again.path) / "a.bin").read_bytes() == FILES["a.bin"]
    assert again.store_bytes == len(FILES["a.bin"])
    assert any("no longer matches its sha256" in w for w in warnings)


def test_the_cache_keeps_to_its_bound_dropping_the_least_recently_used(s3_root, tmp_path):
    cache = NodeCache(tmp_path / "cache", 10_000)
    for name in ("one", "two", "three"):
        _put_folder(f"{s3_root}/{name}", {"x.bin": os.urandom(4000)})
    cache.fetch(f"{s3_root}/one")
    cache.fetch(f"{s3_root}/two")
    cache.fetch(f"{s3_root}/one")  # used again: now "two" is the least recently used
    cache.fetch(f"{s3_root}/three")
    assert cache.used_bytes() <= 10_000
    assert cache.fetch(f"{s3_root}/one").store_bytes == 0  # kept
    assert cache.fetch(f"{s3_root}/two").store_bytes == 4000  # was dropped


def test_a_folder_larger_than_the_cache_is_read_from_the_store_with_a_warning(s3_root, tmp_path):
    uri = f"{s3_root}/big"
    _put_folder(uri, {"x.bin": os.urandom(5000)})
    warnings: list[str] = []
    fetched = NodeCache(tmp_path / "cache", 1000, warn=warnings.append).fetch(uri)
    assert fetched.path == uri and fetched.store_bytes == 5000
    assert "SINEWGRID_NODE_CACHE_MAX_GB" in warnings[0]


def test_settings_are_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("SINEWGRID_NODE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("SINEWGRID_NODE_CACHE_MAX_GB", "lots")
    with pytest.raises(NodeCacheError, match="SINEWGRID_NODE_CACHE_MAX_GB='lots' is not a number"):
        NodeCache.from_env()
    monkeypatch.setenv("SINEWGRID_NODE_CACHE_MAX_GB", "0")
    assert NodeCache.from_env() is None
    monkeypatch.setenv("SINEWGRID_NODE_CACHE_MAX_GB", "2")
    assert NodeCache.from_env().max_bytes == 2 * 10**9


def test_a_local_path_is_read_where_it_is(tmp_path):
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "x.bin").write_bytes(b"12345")
    fetched = NodeCache(tmp_path / "cache", 10**6).fetch(str(tmp_path / "set"))
    assert fetched.path == str(tmp_path / "set") and fetched.store_bytes == 5


FETCH_AND_PRINT = "import sys; from workload_runtime.node_cache import NodeCache; print(NodeCache(sys.argv[1], 10**9).fetch(sys.argv[2]).store_bytes)"


def test_ranks_starting_together_on_one_node_download_once(s3_root, s3_endpoint, tmp_path):
    uri = f"{s3_root}/data/set"
    _put_folder(uri, FILES)
    ranks = [
        subprocess.Popen([sys.executable, "-c", FETCH_AND_PRINT, str(tmp_path / "cache"), uri], cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    read = sorted(int(out.strip().splitlines()[-1]) for out, _ in outputs)
    assert read == [0, sum(map(len, FILES.values()))]  # one rank fetched, the other found it
    assert Counter(object_reads(s3_endpoint, _key(uri))) == {f"{_key(uri)}/{rel}": 1 for rel in FILES}


def test_a_checkpoint_written_on_this_node_is_read_back_from_it(s3_root, s3_endpoint, tmp_path):
    cache = NodeCache(tmp_path / "cache", 10**9)
    store = CheckpointStore(f"{s3_root}/checkpoints/run", cache=cache)
    store.save(10, {"model": {"w": torch.arange(8.0)}})
    elsewhere = CheckpointStore(f"{s3_root}/checkpoints/run")  # another node: no cache
    assert torch.equal(elsewhere.latest_valid().tensors["model"]["w"], torch.arange(8.0))
    reads_before = len(object_reads(s3_endpoint, _key(store.uri) + "/step-00000010/model"))

    loaded = CheckpointStore(f"{s3_root}/checkpoints/run", cache=cache).latest_valid()
    assert torch.equal(loaded.tensors["model"]["w"], torch.arange(8.0))
    assert len(object_reads(s3_endpoint, _key(store.uri) + "/step-00000010/model")) == reads_before


# --- a resumed pretraining attempt on the same node ------------------------------------------------

PRETRAIN = "cell_lane.workloads.pretrain"


def test_a_resume_on_the_same_node_reads_its_dataset_and_checkpoint_from_the_cache(s3_root, s3_endpoint, tmp_path, reference_expression):
    dataset_uri, _ = publish_dataset(join_labels(reference_expression, pd.DataFrame()), f"{s3_root}/curated/omics")
    marker = tmp_path / "held.json"
    extras = tmp_path / "extras.json"
    extras.write_text(
        json.dumps(
            {
                "config": {"dataset_uri": dataset_uri, "steps": 60, "seed": 3},
                "checkpoint_uri": f"{s3_root}/checkpoints/pretrain",
                "checkpoint_every_steps": 20,
                "failpoint": Failpoint(kind="hold", at_step=30, marker=str(marker)).model_dump(),
            }
        )
    )
    first = WorkloadProcess(PRETRAIN, extras, "first", imports=[*TRAINING_IMPORTS, "anndata"])
    first.wait_until_held(marker)
    first.process.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == PREEMPTED_EXIT_CODE, first.tail()
    dataset_reads = object_reads(s3_endpoint, _key(dataset_uri))
    assert dataset_reads, "the first attempt read its dataset from the store"

    resumed = WorkloadProcess(PRETRAIN, extras, "resumed", imports=[*TRAINING_IMPORTS, "anndata"])
    assert resumed.wait(timeout=300) == 0, resumed.tail()
    assert "resuming from" in resumed.log.read_text()
    # The dataset: every file read from the store once, by the first attempt only.
    assert Counter(object_reads(s3_endpoint, _key(dataset_uri))) == Counter(dataset_reads)
    assert max(Counter(dataset_reads).values()) == 1
    # The checkpoint it resumed from (step 30, written by the first attempt on this node): no tensor file read.
    assert not [r for r in object_reads(s3_endpoint, _key(f"{s3_root}/checkpoints/pretrain")) if r.endswith(".safetensors")]
    assert "MB from the node cache" in resumed.log.read_text()
