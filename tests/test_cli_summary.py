"""The demo's summary on a root where only part of the platform has run."""

import dagster as dg
from rich.console import Console

from sinewgrid.cli_summary import print_summary
from workload_runtime.storage import Storage


def test_a_root_without_lab_rounds_prints_no_empty_lab_table(tmp_path):
    """`sinewgrid demo --lane robotics` trains no lab's model: the table of lab rounds is left out, not printed empty."""
    console = Console(record=True, width=160)
    with dg.DagsterInstance.ephemeral() as instance:
        print_summary(console, Storage.at(str(tmp_path)), instance, {}, robotics_rows=True)
    out = console.export_text()
    assert "GPU steps: where they ran and what they cost" in out
    assert "The model of each lab" not in out
