"""The tables ``python -m benchmarks.run`` prints: the machine, then one per figure.

Each ``*_table`` function turns one figure's results (from ``benchmarks.validation``,
``benchmarks.omics_write``, ``benchmarks.rollouts``, ``benchmarks.isaaclab_overhead``,
``benchmarks.episode_ingest``, ``benchmarks.dispatch``, ``benchmarks.planner`` and
``benchmarks.registry``) into a rich ``Table``, subject next to its baseline, with a caption
that says how it was measured. Figures 9, 10 and 11 (``benchmarks.sealing``, ``benchmarks.gateway``,
``benchmarks.camera_ingest``) build their tables in their own modules (``table``).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from benchmarks import MIN_REPEAT_SECONDS


def print_tables(tables: list[Table]) -> None:
    """A figure's tables on the terminal, wide enough for their columns (a module's `main`)."""
    from rich.console import Console

    console = Console(width=200)
    for table in tables:
        console.print(table)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _times(value: float) -> str:
    return f"{value:,.1f}×"


def machine_table(facts: dict[str, Any]) -> Table:
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


def validation_table(results: list, repeats: int) -> Table:
    table = Table(
        title="1. Plate validation throughput: check_plate_file vs pyarrow.csv.read_csv (same CSV bytes; pandas.read_csv for reference)",
        caption=(
            f"Median of {repeats} repeats (time.perf_counter); a repeat averages n calls, "
            f"n chosen so it lasts ≥ {MIN_REPEAT_SECONDS * 1e3:.0f} ms. × pyarrow = validator wells/s ÷ "
            "pyarrow wells/s (1.0 = validating costs nothing beyond parsing; the target is ≥ 0.5 at scale). "
            "'+ table' also takes the typed pandas table (result.table), as the ingest asset does. "
            "Single small files are dominated by fixed per-file costs."
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Case")
    table.add_column("Wells", justify="right")
    table.add_column("CSV KB", justify="right")
    table.add_column("Validator ms", justify="right")
    table.add_column("Validator wells/s", justify="right", style="bold")
    table.add_column("pyarrow ms", justify="right")
    table.add_column("pyarrow wells/s", justify="right")
    table.add_column("pandas wells/s", justify="right")
    table.add_column("× pyarrow", justify="right", style="bold")
    table.add_column("+ table ms", justify="right")
    table.add_column("+ table × pyarrow", justify="right")
    for r in results:
        table.add_row(
            r.case.name,
            f"{r.case.wells:,}",
            f"{len(r.case.data) / 1000:,.1f}",
            _ms(r.validator.median),
            _rate(r.validator_wells_per_s),
            _ms(r.arrow_read.median),
            _rate(r.arrow_wells_per_s),
            _rate(r.pandas_wells_per_s),
            f"{r.throughput_ratio:.2f}×",
            _ms(r.with_table.median),
            f"{r.with_table_ratio:.2f}×",
        )
    return table


def omics_table(results: list, repeats: int, load_s: float) -> Table:
    table = Table(
        title="2. Omics write throughput: write_dataset (AnnData, zarr v3, sparse X) vs zarr.create_array (X's 3 arrays)",
        caption=(
            f"Median of {repeats} repeats, one write each into a fresh temporary folder "
            "(time.perf_counter). MB/s = bytes of X's data, indices and indptr (10^6) ÷ seconds for both; "
            "the writer also writes obs, var, uns and metadata, and uses its own chunks and shards "
            "(zarr's defaults for the baseline). Speed = writer MB/s ÷ zarr MB/s (1.0 = as fast as "
            "plain zarr). Both read back equal before timing. "
            f"Reference data loaded once in {load_s:.1f} s, outside the timings."
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Case")
    table.add_column("X shape", justify="right")
    table.add_column("Non-zero", justify="right")
    table.add_column("X MB", justify="right")
    table.add_column("Writer ms", justify="right")
    table.add_column("Writer MB/s", justify="right", style="bold")
    table.add_column("zarr ms", justify="right")
    table.add_column("zarr MB/s", justify="right")
    table.add_column("Speed", justify="right", style="bold")
    table.add_column("Files (writer / zarr)", justify="right")
    for r in results:
        n_obs, n_vars = r.case.matrix.shape
        table.add_row(
            r.case.name,
            f"{n_obs:,}×{n_vars:,}",
            f"{r.case.matrix.nnz:,}",
            f"{r.case.matrix_bytes / 1e6:,.2f}",
            _ms(r.writer.median),
            _rate(r.writer_mb_per_s),
            _ms(r.zarr_write.median),
            _rate(r.zarr_mb_per_s),
            f"{r.speed_ratio:.2f}×",
            f"{r.layout['writer_stored']['files']:,} / {r.layout['baseline_stored']['files']:,}",
        )
    return table


def rollouts_table(results: list, repeats: int) -> Table:
    table = Table(
        title=(
            "3a. Rollout harness overhead, MuJoCo: make_vector_simulator + run_episodes vs raw "
            "env.step of the same gymnasium vector env (same seeds, same steps)"
        ),
        caption=(
            f"Median of {repeats} repeats, one call each (time.perf_counter), each into a fresh temporary "
            "folder; a call builds N envs (gymnasium.make_vec, sync) and runs every seed to 200 steps "
            "with BalancingController (raw: its gains on the (N, 4) raw observation in numpy, same action "
            "scaling, N seeds per reset). '+ commit' also commits each episode as the rollout workload does "
            "(commit_episode: LeRobot parquet file, then the atomic JSON trial record). Ratio = time ÷ raw "
            "time; commit ms/ep = (+ commit − harness) ÷ episodes."
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Case")
    table.add_column("Env steps", justify="right")
    table.add_column("Harness ms", justify="right")
    table.add_column("Harness steps/s", justify="right", style="bold")
    table.add_column("+ commit ms", justify="right")
    table.add_column("+ commit steps/s", justify="right", style="bold")
    table.add_column("Raw ms", justify="right")
    table.add_column("Raw steps/s", justify="right")
    table.add_column("Ratio harness", justify="right", style="bold")
    table.add_column("Ratio + commit", justify="right", style="bold")
    table.add_column("Commit ms/ep", justify="right")
    for r in results:
        table.add_row(
            r.case.name,
            f"{r.case.steps:,}",
            _ms(r.harness.median),
            _rate(r.steps_per_s(r.harness)),
            _ms(r.harness_commit.median),
            _rate(r.steps_per_s(r.harness_commit)),
            _ms(r.raw.median),
            _rate(r.steps_per_s(r.raw)),
            f"{r.harness_ratio:.2f}×",
            f"{r.commit_ratio:.2f}×",
            _ms(r.commit_ms_per_episode / 1e3),
        )
    return table


def isaaclab_table(result: Any, repeats: int) -> Table:
    title = (
        "3b. Rollout harness overhead, Isaac Lab: make_vector_simulator + run_episodes vs raw env.step "
        "of the same vectorised env (in .venv-isaaclab)"
    )
    if result.skipped is not None:
        table = Table(title=title, title_justify="left")
        table.add_column("Case")
        table.add_column("Result")
        table.add_row("Isaac-Cartpole-Direct", result.skipped)
        return table
    report = result.report
    packages = ", ".join(f"{name} {version}" for name, version in report["packages"].items() if version)
    table = Table(
        title=title,
        caption=(
            f"Median of {repeats} repeats, one call each (time.perf_counter, in the child); a call runs "
            f"{result.episodes} seeds, one per env, to {report['max_steps']} steps with BalancingController "
            f"on one already-started simulator of {result.num_envs} envs ({report['device']}); raw: env.reset, "
            "then its gains on obs['policy'] in torch (pole sign flipped as the adapter does), normalised "
            f"forces as a ({result.num_envs}, 1) tensor. Ratio = adapter time ÷ raw time; throughput = raw "
            f"time ÷ adapter time; × 115/s = adapter env-steps/s over the old one-env rollouts. Not in the "
            f"figure: start-up (make_vector_simulator) {report['start_up_s']:.1f} s, whole child process "
            f"{result.child_wall_s:.0f} s. Python {report['python']}; {packages}."
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Case")
    table.add_column("Env steps", justify="right")
    table.add_column("Adapter ms", justify="right")
    table.add_column("Adapter steps/s", justify="right", style="bold")
    table.add_column("Raw ms", justify="right")
    table.add_column("Raw steps/s", justify="right")
    table.add_column("Ratio", justify="right", style="bold")
    table.add_column("Throughput", justify="right", style="bold")
    table.add_column("× 115/s", justify="right", style="bold")
    table.add_column("ms/step (adapter/raw)", justify="right")
    table.add_row(
        f"{result.num_envs} envs × {report['max_steps']} steps",
        f"{result.steps:,}",
        _ms(result.adapter.median),
        _rate(result.steps_per_s(result.adapter)),
        _ms(result.raw.median),
        _rate(result.steps_per_s(result.raw)),
        f"{result.ratio:.2f}×",
        f"{result.throughput_ratio:.2f}×",
        f"{result.speedup_over_one_env:,.0f}×",
        f"{result.adapter.median / report['max_steps'] * 1e3:.2f}/{result.raw.median / report['max_steps'] * 1e3:.2f}",
    )
    return table


def ingest_table(results: list, repeats: int) -> Table:
    table = Table(
        title=(
            "4. Episode ingest throughput: validate_dataset (teleop asset) and read_dataset (training) vs "
            "pyarrow.parquet.read_table (same LeRobot v3 files)"
        ),
        caption=(
            f"Median of {repeats} repeats (time.perf_counter); a repeat averages n calls, n chosen so it "
            f"lasts ≥ {MIN_REPEAT_SECONDS * 1e3:.0f} ms. pyarrow reads the data file, the episodes table and "
            "the task table. × pyarrow = frames/s ÷ pyarrow frames/s (target ≥ 0.5). 'Both' validates, then "
            "reads: two reads of the same files."
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Case")
    table.add_column("Frames", justify="right")
    table.add_column("Parquet KB", justify="right")
    table.add_column("pyarrow ms", justify="right")
    table.add_column("Validate ms", justify="right")
    table.add_column("Validate × pyarrow", justify="right", style="bold")
    table.add_column("Read ms", justify="right")
    table.add_column("Read × pyarrow", justify="right", style="bold")
    table.add_column("Both × pyarrow", justify="right")
    for r in results:
        table.add_row(
            r.case.name,
            f"{r.case.frames:,}",
            f"{r.case.file_bytes / 1000:,.1f}",
            _ms(r.plain_read.median),
            _ms(r.validate.median),
            f"{r.throughput_ratio(r.validate):.2f}×",
            _ms(r.read.median),
            f"{r.throughput_ratio(r.read):.2f}×",
            f"{r.throughput_ratio(r.both):.2f}×",
        )
    return table


def dispatch_table(results: list, repeats: int) -> Table:
    table = Table(
        title="5. Dispatch overhead per backend: an empty step through the platform vs the engine's own empty job",
        caption=(
            f"Median of {repeats} repeats, one call each (time.perf_counter), after one warm-up of each; columns "
            "alternate repeat by repeat. Platform = dg.materialize of an asset whose body is compute.run(...) "
            "of the counting workload with zero steps: placement, submit, the workload's start (interpreter, "
            "torch, Pipes), its final checkpoint, the result back through Pipes, the materialization. The "
            "Slurm cluster (single node) and the Ray head (loopback) are the tests' own, started for this "
            "figure. Overhead = platform − bare engine. The 'not qualified yet' row is the same step when "
            "the pool's qualification pass has expired, so the probe job runs first: its negative overhead "
            "is what qualification adds to a pool's first step in each qualify_ttl_seconds."
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("Backend")
    table.add_column("Platform s", justify="right", style="bold")
    table.add_column("Baseline")
    table.add_column("Baseline s", justify="right")
    table.add_column("Overhead s", justify="right", style="bold")
    for r in results:
        if r.skipped:
            table.add_row(r.backend, "—", r.skipped, "—", "—")
            continue
        for i, label in enumerate(r.baselines):
            table.add_row(
                r.backend if i == 0 else "",
                f"{r.platform:.2f}" if i == 0 else "",
                label,
                f"{r.baseline(label):.2f}",
                f"{r.platform - r.baseline(label):+.2f}",
            )
    return table


def gang_tables(results: dict, repeats: int) -> tuple[Table, Table]:
    launch = Table(
        title="8a. Gang launch: a gang step through the platform vs the same ranks started by hand",
        caption=(
            f"Median of {repeats} repeats after one warm-up each, alternating. The gang workload "
            "(testbed/gang_workload.py) only meets, agrees once and writes a final checkpoint. Platform = "
            "dg.materialize of compute.run: placement, the launcher (one torchrun per node locally; sbatch + srun "
            "on Slurm, a Ray job running ray_gang.py on Ray), Pipes, the result. By hand: two torchrun agents "
            "(static rendezvous); srun from the submit host across the nodes of the 4-node test cluster (one "
            "network namespace per node); a Ray job whose driver creates the placement group and runs a task per "
            "rank, on a 2-node Ray cluster on this machine."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column, justify in (("Backend", "left"), ("Platform s", "right"), ("By hand", "left"), ("By hand s", "right"), ("Overhead s", "right")):
        launch.add_column(column, justify=justify)  # type: ignore[arg-type]
    for r in results["launch"]:
        if r.skipped:
            launch.add_row(r.backend, "—", r.skipped, "—", "—")
            continue
        for i, label in enumerate(r.baselines):
            launch.add_row(r.backend if i == 0 else "", f"{r.platform:.2f}" if i == 0 else "", label, f"{r.baseline(label):.2f}", f"{r.platform - r.baseline(label):+.2f}")
    resume = Table(
        title="8b. Resume after a node loss: from SIGKILL of one node's ranks to the relaunched gang's first step",
        caption=(
            "One run each: the pretraining as a gang, held at step 30 (checkpoints every 20), one node's ranks "
            "killed. Detect = the kill to the platform seeing the attempt end; relaunch = to the new gang running "
            "(on the pool's spare node); resume = to the workload reporting its first step back (interpreters, "
            "torch, the dataset, the sharded checkpoint)."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column in ("Backend", "Kill → first step s", "Detect s", "Relaunch s", "Resume s", "Resumed from step"):
        resume.add_column(column, justify="left" if column == "Backend" else "right")
    for r in results["resume"]:
        resume.add_row(r["backend"], f"{r['kill_to_first_step_s']:.2f}", f"{r['detect_s']:.2f}", f"{r['relaunch_s']:.2f}", f"{r['resume_s']:.2f}", str(r["resumed_step"]))
    return launch, resume


def registry_tables(results: list, repeats: int, setup_s: float) -> tuple[Table, Table]:
    method = (
        f"Median of {repeats} repeats, one call each (time.perf_counter); register, re-register, md5, get and "
        "copytree alternate; destinations are fresh temporary folders on the same file system (page cache, no "
        "fsync), made and removed outside the timed region. MB/s = the folder's bytes (10^6) ÷ seconds. "
    )
    register = Table(
        title="7a. Data registry, registering: DataRegistry.register vs shutil.copytree (same folder, local root)",
        caption=(
            method + "Register: a new version each repeat, the DVC remote emptied after each (outside the timing), so "
            "every file is hashed and copied (checked). Re-register: the same content under its registered version "
            "(hash + git look-up, nothing copied), beside hashlib.md5 of every file. Ratio = register ÷ copytree time; "
            "re-reg ÷ md5 = re-register ÷ md5 time (its ratio to copytree is in the JSON). "
            f"Data made in {setup_s:.1f} s, outside the timings."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column, style in (("Case", None), ("Files", None), ("MB", None), ("Register ms", None), ("Register MB/s", "bold"),
                          ("copytree ms", None), ("copytree MB/s", None), ("Ratio", "bold"), ("Re-register ms", None),
                          ("md5 ms", None), ("Ratio re-reg ÷ md5", "bold")):
        register.add_column(column, justify="left" if column == "Case" else "right", style=style)
    for r in results:
        register.add_row(
            r.case.name, f"{r.case.files:,}", f"{r.case.mb:,.1f}",
            _ms(r.timings["register"].median), _rate(r.mb_per_s("register")),
            _ms(r.timings["copytree"].median), _rate(r.mb_per_s("copytree")), _times(r.ratio("register")),
            _ms(r.timings["re_register"].median), _ms(r.timings["md5_every_file"].median),
            _times(r.ratio("re_register", "md5_every_file")),
        )
    get = Table(
        title="7b. Data registry, getting a version back: DataRegistry.get vs shutil.copytree of the source folder",
        caption=(
            method + "Get: download from the DVC remote into a hidden sibling, check every file's md5 against the "
            "registration, rename into place (the same run as 7a; checked once to return the identical folder). "
            "Ratio = get time ÷ copytree time."
        ),
        title_justify="left",
        caption_justify="left",
    )
    for column, style in (("Case", None), ("Files", None), ("MB", None), ("Get ms", None), ("Get MB/s", "bold"),
                          ("copytree ms", None), ("copytree MB/s", None), ("Ratio", "bold")):
        get.add_column(column, justify="left" if column == "Case" else "right", style=style)
    for r in results:
        get.add_row(
            r.case.name, f"{r.case.files:,}", f"{r.case.mb:,.1f}",
            _ms(r.timings["get"].median), _rate(r.mb_per_s("get")),
            _ms(r.timings["copytree"].median), _rate(r.mb_per_s("copytree")), _times(r.ratio("get")),
        )
    return register, get
