"""Lineage records: resolving a thing, walking back to the drops, and what a reader sees."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from control_plane.settings import code_version
from data_layer.lineage import LineageNotFound, LineageStore
from sinewgrid.cli import app


@pytest.fixture
def graph(home) -> LineageStore:
    store = LineageStore(str(home))
    store.record("drop/assays/p1", "drop", "raw drop", uri=str(home / "raw/assays/p1"), facts={"lab": "A"})
    store.record("drop/assays/p2", "drop", "raw drop", inputs=["cell/next_plate_proposal/plate-0"])
    store.record("cell/assays@p1", "dataset", "validated", inputs=["drop/assays/p1"])
    store.record("cell/assays@p2", "dataset", "validated", inputs=["drop/assays/p2"])
    store.record("cell/omics@v1", "dataset", "omics", inputs=["cell/assays@p1", "cell/assays@p2"], facts={"dvc_md5": "abc"})
    store.record("cell/foundation_model/r1", "model", "foundation", inputs=["cell/omics@v1"], uri=str(home / "checkpoints/cell/foundation_model/r1/step-00000400"))
    store.record("cell/finetuned_model/r2", "model", "finetuned", inputs=["cell/foundation_model/r1", "cell/omics@v1"], facts={"held_out_rmse": 0.2})
    return store


def test_walks_back_from_a_model_to_every_drop(graph):
    drops = graph.upstream("cell/finetuned_model/r2", kind="drop")
    assert [d.id for d in drops] == ["drop/assays/p1", "drop/assays/p2"]
    tree = graph.tree("cell/finetuned_model/r2")
    # the omics version appears twice (via the foundation and directly): expanded once
    assert [c.repeated for c in tree.children] == [False, True]
    assert tree.children[0].node.code_version == code_version() != ""
    # a drop that answers a proposal whose record is gone is named, not dropped silently
    p2 = tree.children[0].children[0].children[1].children[0]
    assert p2.node.id == "drop/assays/p2" and p2.missing == ["cell/next_plate_proposal/plate-0"]


def test_resolve_by_id_part_and_uri(graph, home):
    assert graph.resolve("cell/omics@v1").id == "cell/omics@v1"
    assert graph.resolve("finetuned").id == "cell/finetuned_model/r2"
    assert graph.resolve(str(home / "checkpoints/cell/foundation_model/r1/step-00000400")).id == "cell/foundation_model/r1"
    with pytest.raises(LineageNotFound, match="matches 2 records"):
        graph.resolve("cell/assays@p")
    with pytest.raises(LineageNotFound, match="nothing in .* matches 'nope'"):
        graph.resolve("nope")
    with pytest.raises(ValueError, match="not a relative name"):
        graph.record("../escape", "drop", "x")


def test_markdown_and_cli_show_the_chain(graph, home):
    md = graph.markdown("cell/finetuned_model/r2")
    assert md.splitlines()[0].startswith("- **cell/finetuned_model/r2**")
    assert "(shown above)" in md and "dvc_md5: abc" in md and "(record missing)" in md
    out = CliRunner().invoke(app, ["lineage", "finetuned", "--root", str(home)])
    assert out.exit_code == 0, out.output
    for node in ("cell/finetuned_model/r2", "cell/foundation_model/r1", "cell/omics@v1", "drop/assays/p1", "drop/assays/p2"):
        assert node in out.output
    missing = CliRunner().invoke(app, ["lineage", "nothing-like-this", "--root", str(home)])
    assert missing.exit_code == 1 and "nothing in" in missing.output
