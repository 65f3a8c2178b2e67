"""CLI command `status`: the jobs of a sweep submitted through a job scheduler, and their rows merged.

    tfla-bench status results/runs/fig5_consttoken-20261122-090000

It asks the scheduler for the state of every job that has not ended, merges the rows the jobs wrote
into `results.csv` (unless a sweep that follows the jobs holds the run's lock; it merges them
itself), and prints one row per job and the rows by status (`tfla_bench.run.cluster`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from tfla_bench.cli.paths import path_option
from tfla_bench.errors import UserError
from tfla_bench.run import cluster, rundir
from tfla_bench.run.console import jobs_table, make_console, styled_status

RunDirArgument = Annotated[
    Path,
    typer.Argument(
        metavar="RUN_DIR",
        help="A run directory of a sweep with --executor.",
        show_default=False,
        parser=path_option("RUN_DIR"),
    ),
]


def status(run_dir: RunDirArgument) -> None:
    """Show the jobs of a run submitted with --executor slurm or local and merge the rows they wrote."""
    if not run_dir.is_dir():
        what = "a file, not a run directory" if run_dir.exists() else "no such run directory"
        raise UserError(f"{run_dir}: {what}")
    console = make_console()
    record, shard_rows, merged = cluster.status(run_dir, console)
    console.print(jobs_table(record, shard_rows))
    rows = rundir.read_results(run_dir / rundir.RESULTS).rows
    counts = Counter(row.status for row in rows)
    by_status = ", ".join(f"{styled_status(name)} {count}" for name, count in sorted(counts.items()))
    where = f"{'merged into' if merged else 'in'} {run_dir / rundir.RESULTS}"
    console.print(f"{len(rows)} row(s) {where}" + (f": {by_status}" if rows else ""))
    active = sum(not job.ended for _, job in record.jobs())
    if active:
        console.print(f"{active} job(s) not ended yet")
    elif left := cluster.unmeasured(run_dir):
        console.print(
            f"{left} case(s) without a row (or with an interrupted one) run again with "
            f"tfla-bench sweep --resume {run_dir}"
        )


def register(app: typer.Typer) -> None:
    """Add `status` to the main app."""
    app.command("status")(status)
