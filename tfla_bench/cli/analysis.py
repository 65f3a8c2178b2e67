"""CLI commands `compare`, `plot` and `report`: a run beside the paper's numbers, its figures, one HTML page.

Each takes a run directory (`runs/<spec>-<timestamp>/`). `--published NAME` picks the
published data set (a `figure` value of `results/published/*.csv`); by default the one named in
the run's env.json, and `--published none` turns the comparison off. A run whose rows were measured
on several GPUs (a sweep over a mixed partition) is refused unless `--gpu NAME` picks one: rows of
different GPUs are never set side by side or averaged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from tfla_bench.cli.options import name_option
from tfla_bench.cli.paths import output_dir, output_file, output_files, path_option, replacing, writes
from tfla_bench.errors import UserError
from tfla_bench.run import rundir
from tfla_bench.run.console import TABLE_WIDTH, make_console, print_frame

if TYPE_CHECKING:
    from tfla_bench.analyse.compare import Comparison, Run

RunDirArgument = Annotated[
    Path,
    typer.Argument(
        metavar="RUN_DIR",
        help="A run directory with results.csv and env.json (runs/SPEC-TIMESTAMP).",
        show_default=False,
        parser=path_option("RUN_DIR"),
    ),
]
PublishedOption = Annotated[
    str | None,
    typer.Option(
        "--published",
        help="Published data set (its `figure` name); default: the run's env.json; 'none': off.",
        parser=name_option("--published"),
    ),
]
NormalizeOption = Annotated[
    str,
    typer.Option("--normalize", help="none, or roofline: also divide runtimes by each GPU's roofline bound."),
]
JsonOption = Annotated[
    Path | None,
    typer.Option(
        "--json", parser=path_option("--json"), help="Also write the whole comparison as JSON here."
    ),
]
CsvOption = Annotated[
    Path | None,
    typer.Option(
        "--csv",
        parser=path_option("--csv"),
        help="Write every row (matched, run_only, published_only) here; default RUN_DIR/compare.csv.",
    ),
]
AllOption = Annotated[
    bool, typer.Option("--all", help="Print every matched row, not only those that stand out.")
]
FiguresOutOption = Annotated[
    Path | None,
    typer.Option("--out", parser=path_option("--out"), help="Output folder; default RUN_DIR/figures."),
]
ReportOutOption = Annotated[
    Path | None,
    typer.Option("--out", parser=path_option("--out"), help="The HTML file; default RUN_DIR/report.html."),
]
GpuOption = Annotated[
    str | None,
    typer.Option("--gpu", help="The rows of this GPU, for a run that mixes GPUs (its name as in the rows)."),
]


def _console() -> Console:
    return make_console(width=TABLE_WIDTH)


def _inputs(run_dir: Path) -> tuple[Path, ...]:
    """The run's files that an output must never replace."""
    return (run_dir / rundir.RESULTS, run_dir / rundir.ENV)


def _require_published(name: str | None, given: str | None) -> str:
    from tfla_bench.analyse.published import list_published

    if name is None:
        known = ", ".join(sorted(list_published()))
        why = (
            "--published none leaves compare nothing to compare with"
            if given is not None
            else "the run's env.json names no published data set"
        )
        raise UserError(f"{why}; pass --published NAME (known: {known})")
    return name


def compare(
    run_dir: RunDirArgument,
    published: PublishedOption = None,
    normalize: NormalizeOption = "none",
    json_out: JsonOption = None,
    csv_out: CsvOption = None,
    gpu: GpuOption = None,
    every_row: AllOption = False,
) -> None:
    """Compare a run with the paper's published numbers: a summary per kernel and mode, then the rows
    that stand out; every row goes to RUN_DIR/compare.csv."""
    rundir.require_results(run_dir)
    # pandas takes half a second to import: loaded once the run is found.
    from tfla_bench.analyse.compare import (
        MATTERS_BAND,
        NORMALIZE_CHOICES,
        compare_run,
        comparison_frame,
        comparison_json,
        comparison_summary,
        comparison_tables,
        load_run,
        resolve_published_name,
        rows_that_matter,
    )
    from tfla_bench.analyse.published import PUBLISHED_MEMORY_NOTE

    if normalize not in NORMALIZE_CHOICES:
        raise UserError(f"--normalize must be one of {', '.join(NORMALIZE_CHOICES)}, got {normalize!r}")
    csv_flag = "--csv" if csv_out is not None else "compare.csv"
    csv_out = csv_out or run_dir / rundir.for_gpu(rundir.COMPARE, gpu)
    output_files(((json_out, "--json"), (csv_out, csv_flag)), keep=_inputs(run_dir))
    run = load_run(run_dir, gpu)
    name = _require_published(resolve_published_name(run, published), published)
    comparison = compare_run(run, name, normalize)
    console = _console()
    _print_heading(console, run, comparison)
    print_frame(console, comparison_summary(comparison), "summary: runtime ratio run / published")
    shown = comparison if every_row else rows_that_matter(comparison)
    what = "every row" if every_row else f"rows that stand out (--all: all {len(comparison.matched)})"
    for mode, table in comparison_tables(shown).items():
        print_frame(console, table, f"{mode}: {what}")
    if not every_row and shown.matched.empty:
        console.print(
            f"every matched row lies within {MATTERS_BAND:.0%} of its kernel's median ratio "
            "(--all prints them)"
        )
    _print_unmatched(console, comparison)
    console.print(f"note: {PUBLISHED_MEMORY_NOTE}", style="dim")
    if json_out is not None:
        replaced = replacing(json_out)
        with writes(str(json_out)):
            json_out.parent.mkdir(parents=True, exist_ok=True)
            rundir.write_atomic(json_out, json.dumps(comparison_json(comparison), indent=1))
        console.print(f"wrote {json_out}{replaced}")
    replaced = replacing(csv_out)
    with writes(str(csv_out)):
        csv_out.parent.mkdir(parents=True, exist_ok=True)
        rundir.write_atomic(csv_out, comparison_frame(comparison).to_csv(index=False))
    console.print(f"wrote {csv_out}{replaced}: every row, matched or not")


def _print_heading(console: Console, run: Run, comparison: Comparison) -> None:
    console.print(f"run: {run.run_dir} ({run.spec}) on [bold]{comparison.measured_gpu}[/]")
    console.print(f"published: {comparison.published_name} on [bold]{comparison.published_gpu}[/]")
    console.print("ratio = run / published (< 1: the run is faster / leaner)")
    if comparison.normalize == "roofline":
        ours, theirs = comparison.measured_accelerator, comparison.published_accelerator
        console.print(
            "normalized = runtime / roofline bound max(FLOPs/peak, bytes/bandwidth) of each side's GPU "
            f"({ours.display_name} vs {theirs.display_name})"
        )


def _print_unmatched(console: Console, comparison: Comparison) -> None:
    """The rows of either side without a counterpart, counted per kernel and reason."""
    from tfla_bench.analyse.compare import published_only_summary

    if not comparison.measured_only.empty:
        run_only = (
            comparison.measured_only.groupby(["kernel", "mode", "status", "reason"])
            .size()
            .reset_index(name="rows")
        )
        print_frame(console, run_only, "run rows without a published counterpart")
    if not comparison.published_only.empty:
        print_frame(console, published_only_summary(comparison), "published rows without a run row")


def plot(
    run_dir: RunDirArgument,
    published: PublishedOption = None,
    out: FiguresOutOption = None,
    gpu: GpuOption = None,
) -> None:
    """Write the run's paper-style figures (runtime and memory vs seq_len, chunk trade-off, head dim)."""
    rundir.require_results(run_dir)
    # matplotlib takes a second to import: loaded once the run is found.
    from tfla_bench.plots.catalog import plot_run

    default = run_dir / rundir.for_gpu(rundir.FIGURES, gpu)
    out = output_dir(out or default, "--out" if out else "figures folder")
    with writes(f"the figures in {out}", folder=out):
        paths = plot_run(run_dir, out, published, gpu)
    console = _console()
    if not paths:
        console.print("no figure: the run sweeps neither seq_len, head dim nor chunk size")
    for path in paths:
        console.print(f"wrote {path}")


def report(
    run_dir: RunDirArgument,
    published: PublishedOption = None,
    out: ReportOutOption = None,
    gpu: GpuOption = None,
) -> None:
    """Write one self-contained HTML page with the run's environment, tables and figures."""
    rundir.require_results(run_dir)
    # matplotlib takes a second to import: loaded once the run is found.
    from tfla_bench.analyse.report import write_report

    default = run_dir / rundir.for_gpu(rundir.REPORT, gpu)
    out = output_file(out or default, "--out" if out else "report", keep=_inputs(run_dir))
    if out.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--out {out}: the report is one HTML page; give a file name ending in .html")
    replaced = replacing(out)
    with writes(f"the report {out}", folder=out.parent):
        path = write_report(run_dir, published, out, gpu)
    _console().print(f"wrote {path}{replaced}")


def register(app: typer.Typer) -> None:
    """Add `compare`, `plot` and `report` to the main app."""
    app.command("compare")(compare)
    app.command("plot")(plot)
    app.command("report")(report)
