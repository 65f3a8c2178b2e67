"""CLI command `diff`: run B beside run A, case by case, with a noise-aware verdict.

    tfla-bench diff results/runs/fig5_consttoken-A results/runs/fig5_consttoken-B --threshold 5
    tfla-bench diff RUN_A RUN_B --changed --threshold 5

It prints the summary per kernel and mode first (the geometric mean of B / A and the verdict counts),
then the rows that matter: the cases that changed beyond their noise, largest change first, and the
cases that could not be compared, with the reason. `--changed` prints only the cases that changed
(by more than `--threshold` when given), `--all` every case.

Exit codes: 0, or 1 when `--threshold PCT` is given and a case got slower (beyond its noise) by
more than PCT percent, or when an output cannot be written once writing began; 2 for a user mistake,
or when no case is in both runs.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from tfla_bench.cli.paths import output_files, path_option, replacing, writes
from tfla_bench.errors import UserError
from tfla_bench.run import rundir
from tfla_bench.run.console import make_console, print_frame

if TYPE_CHECKING:
    from tfla_bench.analyse.diff import RunDiff

RunArgument = Annotated[Path, typer.Argument(help="A run directory (results.csv, env.json).")]
# The largest --threshold: a case 1000 times slower is past any gate a user means.
MAX_THRESHOLD_PCT = 100_000.0


def diff(
    run_a: RunArgument,
    run_b: RunArgument,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            metavar="PCT",
            help="exit 1 when a case got slower, beyond its noise, by more than PCT percent",
        ),
    ] = None,
    changed: Annotated[
        bool, typer.Option("--changed", help="list only the cases that changed (beyond --threshold if given)")
    ] = False,
    every: Annotated[
        bool, typer.Option("--all", help="list every case, and the cases of one run only")
    ] = False,
    as_json: Annotated[
        Path | None,
        typer.Option("--json", parser=path_option("--json"), help="Also write the whole diff as JSON here."),
    ] = None,
    as_csv: Annotated[
        Path | None,
        typer.Option("--csv", parser=path_option("--csv"), help="Also write the matched rows as CSV here."),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", parser=path_option("--plot"), help="Draw B/A per case into this image file."),
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="Compare the rows of this GPU (runs that mix GPUs).")
    ] = None,
) -> None:
    """Compare run B with run A: the summary per kernel and mode, then the cases that changed beyond
    their noise and those that could not be compared (--all: every case)."""
    if threshold is not None and not (math.isfinite(threshold) and 0 < threshold <= MAX_THRESHOLD_PCT):
        raise UserError(
            f"--threshold: expected a finite number in (0, {MAX_THRESHOLD_PCT:g}] percent, got {threshold:g}"
        )
    if changed and every:
        raise UserError("give --changed or --all, not both")
    inputs = [run / name for run in (run_a, run_b) for name in (rundir.RESULTS, rundir.ENV)]
    output_files(((as_json, "--json"), (as_csv, "--csv"), (plot, "--plot")), keep=inputs)
    for run in (run_a, run_b):
        rundir.require_results(run)
    # pandas and matplotlib take a second to import: loaded once the flags and runs are checked.
    import matplotlib
    from matplotlib.backend_bases import FigureCanvasBase

    from tfla_bench.analyse.diff import diff_runs, ratio_figure

    known = set(FigureCanvasBase.get_supported_filetypes())
    if shutil.which(matplotlib.rcParams["pgf.texsystem"]) is None:
        known.discard("pgf")  # matplotlib's PGF output measures its text with a TeX system
    if plot is not None and plot.suffix.lstrip(".").lower() not in known:
        raise UserError(f"--plot {plot}: expected a file name ending in one of {', '.join(sorted(known))}")
    result = diff_runs(run_a, run_b, gpu)
    console = make_console()
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    print_frame(
        console, result.summary, f"geometric mean of B / A per kernel and mode (A {run_a}, B {run_b})"
    )
    _print_agreement(console, result)
    _print_rows(console, result, threshold, changed, every)
    title = f"B {run_b.name} / A {run_a.name}"
    for path, write in (
        (as_json, lambda p: rundir.write_atomic(p, json.dumps(result.to_json(), indent=2) + "\n")),
        (as_csv, lambda p: rundir.write_atomic(p, result.rows.to_csv(index=False))),
        (plot, lambda p: rundir.save_atomic(p, ratio_figure(result, title).savefig)),
    ):
        if path is not None:
            replaced = replacing(path)
            with writes(str(path)):
                path.parent.mkdir(parents=True, exist_ok=True)
                write(path)
            console.print(f"wrote {path}{replaced}")
    if threshold is not None:
        slower = result.slower_than(threshold)
        if len(slower):
            console.print(f"[red]{len(slower)} case(s) slower by more than {threshold:g}%[/]")
            raise typer.Exit(1)


def _print_rows(
    console: Console, result: RunDiff, threshold: float | None, changed: bool, every: bool
) -> None:
    """The cases `--all`, `--changed` or the default ask for, and a line for what is left out."""
    from tfla_bench.analyse.diff import display

    if every:
        print_frame(console, display(result.rows), "B / A per case")
        for name, frame in (("A", result.only_a), ("B", result.only_b)):
            if len(frame):
                print_frame(console, display(frame), f"cases in run {name} only")
        return
    if changed:
        rows = result.changed(threshold)
        beyond = f" by more than {threshold:g}%" if threshold is not None else ""
        title = f"{len(rows)} case(s) changed beyond their noise{beyond}"
    else:
        rows = result.mattering()
        title = f"{len(rows)} case(s) changed beyond their noise or not comparable"
    if len(rows):
        print_frame(console, display(rows), title)
    else:
        console.print(f"{title}")
    left = len(result.rows) - len(rows)
    only = {name: len(frame) for name, frame in (("A", result.only_a), ("B", result.only_b)) if len(frame)}
    if left or only:
        in_one = "".join(f", {count} case(s) in run {name} only" for name, count in only.items())
        console.print(f"not listed: {left} other case(s) in both runs{in_one} (--all lists them)")


def _print_agreement(console: Console, result: RunDiff) -> None:
    agree = result.agreement()
    if not agree["cases"]:
        return
    console.print(f"{agree['cases']} case(s) ok in both: {_agreement_line(agree)}")
    for devices, by_device in result.agreement_by_device().items():
        console.print(f"  {devices}: {by_device['cases']} case(s), {_agreement_line(by_device)}")
    unthrottled = result.agreement_unthrottled()
    if unthrottled is not None:
        slowed = agree["cases"] - unthrottled["cases"]
        console.print(
            f"  {slowed} case(s) measured under a power, thermal or hardware slowdown in A or B; "
            f"the other {unthrottled['cases']}: {_agreement_line(unthrottled)}"
        )


def _agreement_line(agree: dict) -> str:
    return (
        f"{agree['within_2pct']:.1%} within 2%, {agree['within_5pct']:.1%} within 5%, "
        f"largest |B/A - 1| {agree['max_deviation']:.1%}"
    )


def register(app: typer.Typer) -> None:
    """Add `diff` to the main app."""
    app.command("diff")(diff)
