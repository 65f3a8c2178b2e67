"""CLI command `compare-gpus`: one sweep on two GPUs, its measured speed-up beside the roofline model's.

    tfla-bench compare-gpus results/runs/tfla_vs_peer_chunks-20261126-215953 \\
        results/runs/tfla_vs_peer_chunks-20261129-h200 --out /tmp/h100-vs-h200

It prints a summary first (each run's GPU and the roofs its prediction takes, with where they come
from; the cases shared and those without a prediction, counted per reason; per kernel and mode the
median measured and predicted speed-up), then one table per kernel, its cases by mode and sequence
length. It writes `compare-gpus.csv` (every case ok in both runs) and `compare-gpus.png` (measured
against predicted) into `--out`, by default `RUN_B/compare-gpus_vs_<RUN_A's folder name>` (the committed
runs keep `diff`'s outputs in run B too). `--json` prints one JSON object instead of the tables.

Exit codes: 0; 2 for a user mistake (a path that is not a run directory, a run that names no GPU,
no case ok in both runs, roofs that cannot be had); 1 when an output cannot be written once writing
began. Two runs on the same GPU are compared with a warning: the model then predicts 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tfla_bench.cli.model import JsonOption
from tfla_bench.cli.paths import output_dir, path_option, writes
from tfla_bench.run import rundir
from tfla_bench.run.console import TABLE_WIDTH, make_console, print_frame

if TYPE_CHECKING:
    from tfla_bench.analyse.crossgpu import GpuComparison

CSV_NAME = "compare-gpus.csv"
FIGURE_NAME = "compare-gpus.png"
RunArgument = Annotated[
    Path, typer.Argument(help="A run directory (results.csv, env.json).", show_default=False)
]


def default_out(run_a: Path, run_b: Path) -> Path:
    """Where the outputs go without `--out`: a folder in run B named after run A."""
    return run_b / f"compare-gpus_vs_{run_a.resolve().name}"


def compare_gpus_command(
    run_a: RunArgument,
    run_b: RunArgument,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            parser=path_option("--out"),
            help="Folder for compare-gpus.csv and .png; default: a folder in RUN_B named after RUN_A.",
        ),
    ] = None,
    as_json: JsonOption = False,
    roofs: Annotated[
        str,
        typer.Option(
            "--roofs",
            help="auto (each run's measured roofs, else its GPU's data sheet), measured or datasheet",
        ),
    ] = "auto",
    gpu_a: Annotated[
        str | None, typer.Option("--gpu-a", help="Run A's rows of this GPU (a run that mixes GPUs).")
    ] = None,
    gpu_b: Annotated[
        str | None, typer.Option("--gpu-b", help="Run B's rows of this GPU (a run that mixes GPUs).")
    ] = None,
) -> None:
    """Set run B beside run A on another GPU: the measured speed-up B / A per case against the roofline
    model's prediction; a summary, a table per kernel, compare-gpus.csv and compare-gpus.png."""
    for run in (run_a, run_b):
        rundir.require_results(run)
    # pandas and matplotlib take a second to import: loaded once the runs are found.
    from tfla_bench.analyse.crossgpu import compare_gpus

    comparison = compare_gpus(run_a, run_b, roofs, gpu_a, gpu_b)
    out = output_dir(out or default_out(run_a, run_b), "--out" if out else "the output folder")
    written = _write(comparison, out)
    if as_json:
        typer.echo(json.dumps({**comparison.to_json(), "written": [str(p) for p in written]}, indent=1))
        for warning in comparison.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        return
    _print(comparison)
    console = make_console()
    for path in written:
        console.print(f"wrote {path}")


def _write(comparison: GpuComparison, out: Path) -> list[Path]:
    """compare-gpus.csv, and compare-gpus.png when a case has a prediction."""
    from tfla_bench.plots.crossgpu import speedup_figure

    figure = speedup_figure(comparison)
    paths = [out / CSV_NAME, *([out / FIGURE_NAME] if figure is not None else [])]
    rundir.refuse_not_writable(paths, "--out")
    with writes(f"the comparison in {out}", folder=out):
        out.mkdir(parents=True, exist_ok=True)
        rundir.write_atomic(paths[0], comparison.rows.to_csv(index=False))
        if figure is not None:
            rundir.save_atomic(paths[1], lambda tmp: figure.savefig(tmp, format="png"))
    return paths


def _print(comparison: GpuComparison) -> None:
    """The summary first, then the warnings, then a table per kernel."""
    from tfla_bench.analyse.crossgpu import kernel_tables, summarize

    console = make_console(width=TABLE_WIDTH)
    console.print(f"A: {comparison.a.run_dir}\n   {comparison.a.describe()}")
    console.print(f"B: {comparison.b.run_dir}\n   {comparison.b.describe()}")
    console.print(
        "speed-up = runtime A / runtime B (above 1: B faster); predicted = t_A / t_B, "
        "t = max(FLOPs / peak, bytes / bandwidth) of the case on each GPU"
    )
    rows = comparison.rows
    predicted = int(rows["predicted_speedup"].notna().sum())
    console.print(
        f"{len(rows)} case(s) ok in both runs, {predicted} with a prediction; "
        f"{comparison.not_ok} shared case(s) not ok in A or B; "
        f"{comparison.only_a} case(s) in A only, {comparison.only_b} in B only"
    )
    for reason, count in comparison.no_prediction().items():
        console.print(f"  no prediction for {count} case(s): {reason}")
    for warning in comparison.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    print_frame(console, summarize(rows), "median speed-up B / A per kernel and mode, measured and predicted")
    for kernel, table in kernel_tables(rows).items():
        print_frame(console, table, f"{kernel}: speed-up B / A per case")


def register(app: typer.Typer) -> None:
    """Add `compare-gpus` to the main app."""
    app.command("compare-gpus")(compare_gpus_command)
