"""Print the benchmark figures and write them to ``benchmarks/results/latest.json``.

Usage (from the repository root)::

    make bench
    .venv/bin/python -m benchmarks.run [--repeats N] [--output PATH]

Each figure is printed next to its baseline, measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks import MIN_REPEAT_SECONDS, REPEATS

RESULTS_FILE = Path(__file__).resolve().parent / "results" / "latest.json"
PACKAGES = ("numpy", "pandas", "pyarrow", "pandera", "zarr", "anndata", "scanpy")


def machine_facts() -> dict[str, Any]:
    try:
        usable_cpus: int | None = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable_cpus = None
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus,
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "packages": versions,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _times(value: float) -> str:
    return f"{value:,.1f}×"


def _machine_table(facts: dict[str, Any]) -> Table:
    table = Table(title="Machine", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    cpus = f"{facts['cpu_count']}"
    if facts["usable_cpus"] is not None and facts["usable_cpus"] != facts["cpu_count"]:
        cpus += f" ({facts['usable_cpus']} usable by this process)"
    table.add_row("CPUs", cpus)
    table.add_row("System", f"{facts['system']} {facts['machine']}")
    table.add_row("Python", f"{facts['python']} ({facts['python_implementation']})")
    table.add_row(
        "Packages",
        ", ".join(f"{name} {version or 'not installed'}" for name, version in facts["packages"].items()),
    )
    return table


def _validation_table(results: list, repeats: int) -> Table:
    table = Table(
        title="1. Plate validation throughput: check_plate_file vs pandas.read_csv (same CSV bytes)",
        caption=(
            f"Median of {repeats} repeats (time.perf_counter); a repeat averages n calls, "
            f"n chosen so it lasts ≥ {MIN_REPEAT_SECONDS * 1e3:.0f} ms. Ratio = validator time ÷ "
            "read time: how many plain reads one validation costs."
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Case")
    table.add_column("Wells", justify="right")
    table.add_column("CSV KB", justify="right")
    table.add_column("Validator ms", justify="right")
    table.add_column("Validator wells/s", justify="right", style="bold")
    table.add_column("pandas ms", justify="right")
    table.add_column("pandas wells/s", justify="right")
    table.add_column("Ratio", justify="right", style="bold")
    table.add_column("n calls (val/pd)", justify="right")
    for r in results:
        table.add_row(
            r.case.name,
            f"{r.case.wells:,}",
            f"{len(r.case.data) / 1000:,.1f}",
            _ms(r.validator.median),
            _rate(r.validator_wells_per_s),
            _ms(r.pandas_read.median),
            _rate(r.pandas_wells_per_s),
            _times(r.cost_multiple),
            f"{r.validator.calls_per_repeat}/{r.pandas_read.calls_per_repeat}",
        )
    return table


def _omics_table(results: list, repeats: int, load_s: float) -> Table:
    same = all(r.layout["same_chunks_and_codecs"] for r in results)
    table = Table(
        title=(
            "2. Omics write throughput: write_dataset (AnnData, zarr v3) vs zarr.create_array "
            "(X only)"
        ),
        caption=(
            f"Median of {repeats} repeats, one write each into a fresh temporary folder "
            "(time.perf_counter). MB/s = X bytes (10^6) ÷ seconds for both; the writer also "
            "writes the 'scaled' layer (as big as X), obs, var and metadata. Ratio = writer time ÷ "
            f"zarr time. X chunks/codecs identical in both: {'yes' if same else 'NO'}. "
            f"Reference data loaded once in {load_s:.1f} s, outside the timings."
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Case")
    table.add_column("X shape", justify="right")
    table.add_column("X MB", justify="right")
    table.add_column("Writer ms", justify="right")
    table.add_column("Writer MB/s", justify="right", style="bold")
    table.add_column("zarr ms", justify="right")
    table.add_column("zarr MB/s", justify="right")
    table.add_column("Ratio", justify="right", style="bold")
    for r in results:
        n_obs, n_vars = r.case.adata.shape
        table.add_row(
            r.case.name,
            f"{n_obs:,}×{n_vars:,}",
            f"{r.case.matrix_bytes / 1e6:,.2f}",
            _ms(r.writer.median),
            _rate(r.writer_mb_per_s),
            _ms(r.zarr_write.median),
            _rate(r.zarr_mb_per_s),
            _times(r.cost_multiple),
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"timed repeats per figure (default {REPEATS})")
    parser.add_argument("--output", type=Path, default=RESULTS_FILE, help=f"JSON file to write (default {RESULTS_FILE})")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)  # piped or logged: rich would squeeze the tables to 80 columns
    started = time.perf_counter()
    facts = machine_facts()
    console.print(_machine_table(facts))

    from benchmarks import omics_write, validation

    with console.status("Measuring plate validation…"):
        validation_results = validation.run(repeats=args.repeats)
    console.print(_validation_table(validation_results, args.repeats))

    with console.status("Measuring omics writes…"):
        omics_results, load_s = omics_write.run(repeats=args.repeats)
    console.print(_omics_table(omics_results, args.repeats, load_s))

    total_s = time.perf_counter() - started
    report = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.run", *(argv if argv is not None else sys.argv[1:])]),
        "machine": facts,
        "method": {
            "clock": "time.perf_counter",
            "statistic": "median",
            "repeats": args.repeats,
            "warm_up_calls": 1,
            "order": "subject and baseline alternate, repeat by repeat",
            "validation_min_repeat_seconds": MIN_REPEAT_SECONDS,
            "omics": "one write per repeat, each into a fresh temporary folder",
            "mb": 1_000_000,
        },
        "figures": {
            "validation_throughput_wells_per_s": [r.to_dict() for r in validation_results],
            "omics_write_throughput_mb_per_s": {
                "reference_load_s": load_s,
                "cases": [r.to_dict() for r in omics_results],
            },
        },
        "total_run_s": total_s,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(args.output.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(args.output)
    shown = args.output
    try:
        shown = args.output.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    console.print(f"Figures written to {shown}  (whole run {total_s:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
