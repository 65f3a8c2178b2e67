"""Every figure of the suite in one list, and the three ways they are written.

The figures come in three groups, each a function from a `FigureContext` to its `Plot`s:
`run` (a run's paper-style figures, `tfla_bench.plots.runs`), `measured` (a run on the analytic
model, `tfla_bench.plots.measured`) and `model` (the paper's Figs. 18-25,
`tfla_bench.plots.model_figures`). `tfla-bench plot` writes the run group, `tfla-bench roofline`
the model group (and the measured group with `--measured`), and the report embeds the run and
measured groups with their captions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tfla_bench.analyse.compare import Comparison, Run, compare_run, load_run, resolve_published_name
from tfla_bench.errors import UserError
from tfla_bench.measure.roofs import from_env
from tfla_bench.model.hardware import Accelerator
from tfla_bench.plots.base import HBM, L2, MEASURED, FigureContext, Plot, Roof, is_cpu_run, render, save
from tfla_bench.plots.measured import measured_plots, roofline_fractions
from tfla_bench.plots.model_figures import model_plots
from tfla_bench.plots.runs import run_plots
from tfla_bench.run import rundir

GROUPS: dict[str, Callable[[FigureContext], list[Plot]]] = {
    "run": run_plots,
    "measured": measured_plots,
    "model": lambda _: model_plots(),
}
MODEL_DPI = 150


def plots(context: FigureContext, groups: Sequence[str]) -> list[Plot]:
    """The figures of the named groups for this context, in group order."""
    return [plot for group in groups for plot in GROUPS[group](context)]


def measured_roofs(run: Run) -> tuple[Roof, ...]:
    """The roofs the run measured (env.json `roofs`, `tfla-bench roofs`): device memory and L2."""
    roofs = from_env(run.env)
    if roofs is None:
        return ()
    return tuple(
        Roof(
            Accelerator(f"{MEASURED}-{memory.lower()}", roofs.matmul_flops_per_s, bandwidth), MEASURED, memory
        )
        for memory, bandwidth in ((HBM, roofs.hbm_bytes_per_s), (L2, roofs.l2_bytes_per_s))
    )


def run_context(
    run: Run, comparison: Comparison | None = None, accelerators: Sequence[Accelerator] = ()
) -> FigureContext:
    """A run's context: the datasheet roofs of `accelerators` and the roofs the run measured; none
    for a CPU run (no GPU roof bounds it)."""
    if is_cpu_run(run):
        return FigureContext(run=run, comparison=comparison)
    roofs = (*(Roof(acc) for acc in accelerators), *measured_roofs(run))
    return FigureContext(run=run, comparison=comparison, roofs=roofs)


def plot_run(
    run_dir: Path, out_dir: Path | None = None, published: str | None = None, gpu: str | None = None
) -> list[Path]:
    """Write the run group of a run as PNG.

    Args:
        run_dir: the run directory.
        out_dir: where to write; default `<run_dir>/figures` (`figures-<gpu>` with `gpu`).
        published: the published data set drawn dotted; default the run's env.json `published`
            field; `"none"` for none.
        gpu: draw the rows of this GPU, for a run that mixes GPUs (`compare.load_run`).

    Returns:
        The written files.
    """
    run = load_run(run_dir, gpu)
    name = resolve_published_name(run, published)
    context = run_context(run, compare_run(run, name) if name else None)
    out_dir = out_dir or Path(run_dir) / rundir.for_gpu(rundir.FIGURES, gpu)
    return save(render(plots(context, ["run"]), context), out_dir)


def write_model_figures(out_dir: Path, accelerators: Sequence[Accelerator]) -> list[Path]:
    """Write Figs. 18-25 as PNG and reproducible SVG into `out_dir`; return the paths written."""
    context = FigureContext(roofs=tuple(Roof(acc) for acc in accelerators))
    return save(render(plots(context, ["model"]), context), out_dir, svg=True, dpi=MODEL_DPI)


def measured_run(run_dir: Path, gpu: str | None = None) -> Run:
    """The run `roofline --measured` places on the roofline (`gpu`: the rows of that GPU, for a run
    that mixes GPUs).

    Raises:
        UserError: what `load_run` refuses, or a run measured on no GPU, which no roof bounds.
    """
    run = load_run(run_dir, gpu, flag="--measured-gpu")
    if is_cpu_run(run):
        raise UserError(
            f"--measured {run_dir}: its env.json names no GPU (gpu_name), so no roof bounds its rows; "
            "give a run measured on a GPU"
        )
    return run


def plot_measured_roofline(run: Run, out_dir: Path, accelerators: Sequence[Accelerator]) -> list[Path]:
    """Write the measured group of a run as PNG, and every ok row's fraction of its bound as CSV.

    Args:
        run: a run measured on a GPU (`measured_run`).
        out_dir: where to write the PNGs and `roofline_fraction.csv`.
        accelerators: the roofs to draw (e.g. H100 and H200); the fraction of the bound is taken
            on the run's own GPU, or on the first of these if the model does not know it.

    Returns:
        The written files.
    """
    if not accelerators:
        raise ValueError("plot_measured_roofline needs at least one accelerator")
    context = run_context(run, None, accelerators)
    csv_path = out_dir / rundir.ROOFLINE_FRACTION
    rundir.refuse_not_writable([csv_path], "--out")
    paths = save(render(plots(context, ["measured"]), context), out_dir)
    rundir.write_atomic(csv_path, roofline_fractions(run, context.accelerators).to_csv(index=False))
    return [*paths, csv_path]
