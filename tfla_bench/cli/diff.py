"""CLI command `diff`: run B beside run A, case by case, with a noise-aware verdict.

    tfla-bench diff results/runs/fig5_consttoken-A results/runs/fig5_consttoken-B --threshold 5

Exit codes: 0, or 1 when `--threshold PCT` is given and a case got slower (beyond its noise) by
more than PCT percent; 2 for a user mistake, or when no case is in both runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tfla_bench.analyse.diff import diff_runs, display, ratio_figure
from tfla_bench.cli.paths import output_file
from tfla_bench.errors import UserError
from tfla_bench.run import rundir
from tfla_bench.run.console import make_console, print_frame

RunArgument = Annotated[Path, typer.Argument(help="A run directory (results.csv, env.json).")]


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
    as_json: Annotated[
        Path | None, typer.Option("--json", help="Also write the whole diff as JSON here.")
    ] = None,
    as_csv: Annotated[
        Path | None, typer.Option("--csv", help="Also write the matched rows as CSV here.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw B/A per case into this image file.")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="Compare the rows of this GPU (runs that mix GPUs).")
    ] = None,
) -> None:
    """Compare run B with run A: B/A per case, faster/slower/same beyond the runs' noise, geometric means."""
    if threshold is not None and threshold < 0:
        raise UserError(f"--threshold: expected a percentage >= 0, got {threshold:g}")
    inputs = [run / name for run in (run_a, run_b) for name in (rundir.RESULTS, rundir.ENV)]
    for path, flag in ((as_json, "--json"), (as_csv, "--csv"), (plot, "--plot")):
        if path is not None:
            output_file(path, flag, keep=inputs)
    result = diff_runs(run_a, run_b, gpu)
    console = make_console()
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    print_frame(console, display(result.rows), f"B / A per case (A {run_a}, B {run_b})")
    print_frame(console, result.summary, "geometric mean of B / A per kernel and mode")
    for name, frame in (("A", result.only_a), ("B", result.only_b)):
        if len(frame):
            print_frame(console, display(frame), f"cases in run {name} only")
    agree = result.agreement()
    if agree["cases"]:
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
    for path, write in (
        (as_json, lambda p: p.write_text(json.dumps(result.to_json(), indent=2) + "\n")),
        (as_csv, lambda p: result.rows.to_csv(p, index=False)),
        (plot, lambda p: ratio_figure(result, f"B {run_b.name} / A {run_a.name}").savefig(p)),
    ):
        if path is not None:
            try:
                write(path)
            except (OSError, ValueError) as exc:
                raise UserError(f"cannot write {path}: {exc}") from None
            console.print(f"wrote {path}")
    if threshold is not None:
        slower = result.slower_than(threshold)
        if len(slower):
            console.print(f"[red]{len(slower)} case(s) slower by more than {threshold:g}%[/]")
            raise typer.Exit(1)


def _agreement_line(agree: dict) -> str:
    return (
        f"{agree['within_2pct']:.1%} within 2%, {agree['within_5pct']:.1%} within 5%, "
        f"largest |B/A - 1| {agree['max_deviation']:.1%}"
    )


def register(app: typer.Typer) -> None:
    """Add `diff` to the main app."""
    app.command("diff")(diff)
