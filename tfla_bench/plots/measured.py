"""Measured runs on the analytic model: roofline overlay, measured vs theoretical runtime, fraction of bound.

`measured_plots(context)` lists these figures of a run (drawn by `tfla-bench roofline --measured
RUN_DIR` and by the report), each against the context's roofs:

- `measured_roofline_<mode>.png`: the chunkwise mLSTM rows (TFLA and its peers) at their
  arithmetic intensity (analytic FLOPs / bytes of the row) and achieved FLOP/s (FLOPs / median
  runtime), labelled by chunk size, under the roofs min(bandwidth x intensity, peak) of each
  accelerator (the paper's Fig. 22 with our points);
- `measured_vs_theory_<shape>_<mode>.png`: per kernel, the measured runtime over the chunk size
  beside the model's runtime bounds on each accelerator, lower max(F/peak, B/bandwidth) and
  upper F/peak + B/bandwidth, from `tfla_bench.model.counts` (Fig. 20);
- `flops_vs_chunk_<shape>_<mode>.png`: achieved FLOP/s, total FLOPs and measured runtime over
  the chunk size (Fig. 23: a higher FLOP/s does not mean a shorter runtime);
- `roofline_fraction.png` and `roofline_fraction.csv`: every ok row's fraction of its roofline
  bound, lower-bound runtime / measured runtime, on the run's own GPU (1.0 = at the roof);
- `roofline_profiled_<mode>.png` (runs profiled under ncu, `tfla_bench.run.profiling`): every profiled
  row of any kernel at its measured intensity (filled), linked by a thin line to its model
  intensity (hollow).

Where the run recorded measured roofs (`env.json`, `tfla_bench.measure.roofs`), they are among the
context's roofs (black: HBM solid, L2 dotted, beside the data-sheet roofs); the roofline figures
place profiled rows at their measured intensity and ring in red every point above the measured roof.

The theory curves use the paper's model settings (causal factor 0.5, states in fp32, q/k/v and
gates in the run's dtype); the measured points use the FLOPs and bytes the adapters recorded. A
CPU run has no roof: its points are drawn alone and it has no fraction of a bound.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tfla_bench.adapters import registry
from tfla_bench.adapters.mlstm import ChunkwiseMlstmAdapter, mlstm_counts
from tfla_bench.adapters.workloads import Case
from tfla_bench.analyse.compare import Run, param_columns
from tfla_bench.analyse.published import CASE_KEYS
from tfla_bench.measure.roofs import from_env
from tfla_bench.model.hardware import Accelerator
from tfla_bench.model.roofline import runtime_ms_lower, runtime_ms_upper
from tfla_bench.plots.base import (
    FigureContext,
    Label,
    Plot,
    device_name,
    draw_roofs,
    grid_shape,
    new_figure,
    place_labels,
    run_subtitle,
)
from tfla_bench.plots.runs import (
    MODE_TITLES,
    SHORT_NAMES,
    chunk_sweep_shapes,
    select_shape,
    set_log2_x,
    shape_slug,
)
from tfla_bench.plots.style import accelerator_style, row_style
from tfla_bench.run.profiling import roof_check

MIN_THEORY_CHUNK = 16
FRACTION_MIN_HEIGHT = 3.6
# The gid of the thin line from a profiled row's model intensity to its measured one.
PROFILE_LINK = "profile-link"


def mlstm_gates() -> dict[str, str]:
    """The input gate of every chunkwise mLSTM adapter, for the analytic model's counts."""
    return {a.name: a.gate for a in registry.adapters() if isinstance(a, ChunkwiseMlstmAdapter)}


def chunkwise_mlstm_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Ok rows of chunkwise mLSTM adapters (`mlstm_gates`) with FLOPs, bytes and a runtime."""
    rows = results[
        results["kernel"].isin(mlstm_gates())
        & (results["status"] == "ok")
        & results["chunk_size"].notna()
        & (results["median_ms"] > 0)
        & (results["flops"] > 0)
        & (results["bytes"] > 0)
    ].copy()
    rows["intensity_flops_per_byte"] = rows["flops"] / rows["bytes"]
    rows["achieved_flops_per_s"] = rows["flops"] / (rows["median_ms"] * 1e-3)
    return rows


def own_accelerator(run: Run, accelerators: list[Accelerator]) -> tuple[Accelerator, bool]:
    """The run's GPU in the model (detected from env.json), else the first given one; and whether detected."""
    detected = run.gpu.accelerator
    if detected is not None:
        return detected, True
    if not accelerators:
        raise ValueError("no accelerator given")
    return accelerators[0], False


def roofline_fractions(run: Run, accelerators: list[Accelerator]) -> pd.DataFrame:
    """Each ok row's roofline bound and the fraction of it the measured runtime reaches.

    Args:
        run: the run.
        accelerators: bound columns are added for each (`bound_ms_<name>`, `fraction_<name>`).

    Returns:
        One row per ok result row with FLOPs and bytes: the case columns, `median_ms`,
        `intensity_flops_per_byte`, `achieved_tflops`, and `gpu`, `bound_ms`, `fraction` for the
        run's own GPU (the first accelerator if the GPU is unknown to the model), plus the
        per-accelerator columns. fraction = bound_ms / median_ms.
    """
    results = run.results
    rows = results[
        (results["status"] == "ok")
        & (results["median_ms"] > 0)
        & (results["flops"] > 0)
        & (results["bytes"] > 0)
    ]
    case_columns = [*CASE_KEYS, "chunk_size", *param_columns(rows)]
    table = rows[[*case_columns, "status", "median_ms", "flops", "bytes"]].copy()
    table["intensity_flops_per_byte"] = table["flops"] / table["bytes"]
    table["achieved_tflops"] = table["flops"] / (table["median_ms"] * 1e-3) / 1e12
    if not accelerators:
        return table.iloc[0:0].reset_index(drop=True)
    own, _ = own_accelerator(run, accelerators)
    table["gpu"] = own.name
    table["bound_ms"] = [
        runtime_ms_lower(f, b, own) for f, b in zip(table["flops"], table["bytes"], strict=True)
    ]
    table["fraction"] = table["bound_ms"] / table["median_ms"]
    for acc in accelerators:
        bound = [runtime_ms_lower(f, b, acc) for f, b in zip(table["flops"], table["bytes"], strict=True)]
        table[f"bound_ms_{acc.name}"] = bound
        table[f"fraction_{acc.name}"] = table[f"bound_ms_{acc.name}"] / table["median_ms"]
    return table.reset_index(drop=True)


def fraction_figure(
    run: Run, fractions: pd.DataFrame, accelerator: Accelerator, detected: bool
) -> Figure | None:
    """Every ok row's fraction of its roofline bound, one line of points per kernel, fw and fwbw markers."""
    if fractions.empty:
        return None
    order = fractions.groupby("kernel")["fraction"].median().sort_values().index.tolist()
    fig = new_figure(9, max(FRACTION_MIN_HEIGHT, 1.5 + 0.45 * len(order)))
    ax = fig.subplots()
    offsets = {"fw": -0.15, "fwbw": 0.15}
    markers = {"fw": "o", "fwbw": "s"}
    for mode in ("fw", "fwbw"):
        rows = fractions[fractions["mode"] == mode]
        if rows.empty:
            continue
        y = [order.index(k) + offsets[mode] for k in rows["kernel"]]
        colors = [row_style(k, "", {}).color for k in rows["kernel"]]
        ax.scatter(rows["fraction"], y, c=colors, marker=markers[mode], alpha=0.8, label=MODE_TITLES[mode])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels(order)
    ax.set_xlim(0, max(1.05, float(fractions["fraction"].max()) * 1.05))
    gpu = (
        accelerator.display_name
        if detected
        else f"{accelerator.display_name} (assumed; {run.gpu_name} unknown)"
    )
    ax.set_xlabel(f"fraction of the roofline bound on {gpu} (model lower-bound runtime / measured runtime)")
    ax.set_title(f"how close each kernel runs to the roofline (one point per case)\n{run_subtitle(run)}")
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(fontsize="small", loc="outside right center")
    return fig


def _kernel_style(rows: pd.DataFrame, kernel: str):
    # Chunkwise mLSTM rows of one kernel share their params along a figure: the first row's apply.
    first = rows[rows["kernel"] == kernel].iloc[0]
    params = {c: first[c] for c in param_columns(rows)}
    return row_style(kernel, str(first.get("family", "mlstm")), params)


def _profiled_points(ax: Any, check: pd.DataFrame) -> None:
    """Profiled rows at their measured intensity, each linked to its model intensity; points above
    the measured roof ringed in red."""
    for index, (_, row) in enumerate(check[check["measured_intensity"].notna()].iterrows()):
        color = row_style(row["kernel"], str(row.get("family", ""))).color
        y = row["achieved_flops_per_s"] / 1e12
        ax.plot(
            [row["model_intensity"], row["measured_intensity"]],
            [y, y],
            color=color,
            linewidth=0.6,
            alpha=0.7,
            gid=PROFILE_LINK,
        )
        label = "intensity from the DRAM bytes ncu measured" if index == 0 else None
        ax.scatter([row["measured_intensity"]], [y], marker="D", s=22, color=color, zorder=4, label=label)
    flagged = check[check["above_roof"]]
    if not flagged.empty:
        x = flagged["measured_intensity"].where(
            flagged["measured_intensity"].notna(), flagged["model_intensity"]
        )
        ax.scatter(
            x,
            flagged["achieved_flops_per_s"] / 1e12,
            s=160,
            facecolors="none",
            edgecolors="red",
            linewidths=1.5,
            zorder=5,
            label="above the measured roof (FLOPs or timing wrong)",
        )


def _intensity_axis(values: list[float], context: FigureContext) -> np.ndarray:
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    ridges = [roof.accelerator.intensity_flops_per_byte for roof in context.roofs]
    low = min(min(finite, default=1.0) / 4, 1.0)
    high = max(max(finite, default=1.0) * 4, max(ridges, default=1.0) * 4)
    return np.logspace(math.log10(low), math.log10(high), 200)


def _roof_title(context: FigureContext, what: str) -> str:
    roof_note = "" if context.roofs else " (CPU run: no GPU roof)"
    return f"{what}{roof_note}\n{run_subtitle(context.run)}"


def measured_roofline_figure(context: FigureContext, mode: str) -> Figure | None:
    """Measured chunkwise mLSTM points under the context's roofs (paper Fig. 22 with our points),
    with the profiled rows' measured intensities where the run has them."""
    rows = chunkwise_mlstm_rows(context.run.results)
    rows = rows[rows["mode"] == mode]
    if rows.empty or not context.roofs:  # a roofline without a roof (a CPU run) says nothing
        return None
    check = roof_check(rows, from_env(context.run.env))
    fig = new_figure(10, 6)
    ax = fig.subplots()
    values = [*rows["intensity_flops_per_byte"], *check["measured_intensity"].dropna()]
    draw_roofs(ax, context.roofs, _intensity_axis(values, context))
    labels: list[Label] = []
    for kernel, group in rows.groupby("kernel", sort=True):
        style = _kernel_style(rows, kernel)
        ax.scatter(
            group["intensity_flops_per_byte"],
            group["achieved_flops_per_s"] / 1e12,
            label=f"{kernel} (measured)",
            zorder=3,
            **style.points(),
        )
        # One chunk-size label per (kernel, chunk), at the median of its points (several T overlap).
        for chunk, points in group.groupby("chunk_size"):
            x = points["intensity_flops_per_byte"].median()
            y = points["achieved_flops_per_s"].median() / 1e12
            labels.append(Label(x, y, f"L={int(chunk)}", style.color))
    _profiled_points(ax, check)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity [FLOP/byte]")
    ax.set_ylabel("performance [TFLOP/s]")
    ax.set_title(_roof_title(context, MODE_TITLES.get(mode, mode)))
    ax.grid(True, which="both", alpha=0.2)
    fig.legend(fontsize="small", loc="outside right center")
    place_labels(ax, labels)
    return fig


def profiled_roofline_figure(context: FigureContext, mode: str) -> Figure | None:
    """Every profiled row of `mode`: hollow at its model intensity, filled at its measured one (ncu)."""
    check = roof_check(context.run.results, from_env(context.run.env))
    check = check[(check["mode"] == mode) & check["measured_intensity"].notna()]
    if check.empty:
        return None
    fig = new_figure(11, 6)
    ax = fig.subplots()
    draw_roofs(
        ax, context.roofs, _intensity_axis([*check["model_intensity"], *check["measured_intensity"]], context)
    )
    for kernel, group in check.groupby("kernel", sort=True):
        style = row_style(kernel, str(group["family"].iloc[0]) if "family" in group else "")
        ax.scatter(
            group["model_intensity"],
            group["achieved_flops_per_s"] / 1e12,
            facecolors="none",
            edgecolors=style.color,
            marker=style.marker,
            label=kernel,
            zorder=3,
        )
    _profiled_points(ax, check)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(
        "arithmetic intensity [FLOP/byte]: hollow = model bytes, filled = DRAM bytes measured by ncu"
    )
    ax.set_ylabel("performance [TFLOP/s] (model FLOPs / median runtime)")
    ax.set_title(_roof_title(context, f"measured vs model intensity, {MODE_TITLES.get(mode, mode)}"))
    ax.grid(True, which="both", alpha=0.2)
    fig.legend(fontsize="small", loc="outside right center")
    return fig


def _theory_counts(
    kernel: str, shape: dict[str, Any], mode: str, dtype: str, chunk: int
) -> tuple[float, float]:
    """The model's FLOPs and bytes of the kernel's call at chunk size `chunk`, from the counts its
    adapter reports (`mlstm_counts` with the adapter's state bytes)."""
    case = Case(kernel=kernel, mode=mode, dtype=dtype, **shape)
    adapter = registry.get(kernel)
    return mlstm_counts(case, mode, adapter.gate, "chunkwise", chunk, adapter.state_bytes(case))


def _theory_chunks(seq_len: int) -> list[int]:
    chunks, chunk = [], MIN_THEORY_CHUNK
    while chunk <= seq_len:
        chunks.append(chunk)
        chunk *= 2
    return chunks


def _swept(rows: pd.DataFrame, shape: dict[str, Any], mode: str) -> tuple[pd.DataFrame, list[str]]:
    """The rows of `shape` in `mode`, and the kernels measured there at two chunk sizes or more."""
    rows = select_shape(rows, shape)
    rows = rows[rows["mode"] == mode]
    counts = rows.groupby("kernel")["chunk_size"].nunique()
    return rows, sorted(counts[counts >= 2].index)


def measured_vs_theory_figure(context: FigureContext, shape: dict[str, Any], mode: str) -> Figure | None:
    """Per kernel a panel: measured runtime over chunk size beside the model's bounds per roof (Fig. 20)."""
    rows, kernels = _swept(chunkwise_mlstm_rows(context.run.results), shape, mode)
    if not kernels:
        return None
    n_rows, n_columns = grid_shape(len(kernels))
    width = 4.2 * n_columns + 2.6
    fig = new_figure(width, max(3.8 * n_rows + 1.2, width / 2.4))
    axes = list(fig.subplots(n_rows, n_columns, squeeze=False).flat)
    for ax in axes[len(kernels) :]:
        ax.set_visible(False)
    chunks = _theory_chunks(shape["seq_len"])
    for ax, kernel in zip(axes, kernels, strict=False):
        measured = rows[rows["kernel"] == kernel].sort_values("chunk_size")
        dtype = str(measured["dtype"].iloc[0])
        # The counts do not depend on the roof: counted once per chunk size, bounded per roof.
        counts = [_theory_counts(kernel, shape, mode, dtype, c) for c in chunks]
        for roof in context.roofs:
            acc = roof.accelerator
            lower = [runtime_ms_lower(flops, moved, acc) for flops, moved in counts]
            upper = [runtime_ms_upper(flops, moved, acc) for flops, moved in counts]
            color = accelerator_style(acc).color
            ax.plot(chunks, lower, linestyle="--", color=color, label=f"{roof.label} lower")
            ax.plot(chunks, upper, linestyle=":", color=color, label=f"{roof.label} upper")
        style = _kernel_style(rows, kernel)
        ax.plot(
            measured["chunk_size"].astype(float),
            measured["median_ms"],
            label=f"{kernel} measured",
            **{**style.line(), "linestyle": "-"},
        )
        set_log2_x(ax, chunks)
        ax.set_yscale("log")
        ax.set_xlabel("chunk size L [tokens]")
        ax.set_ylabel("runtime [ms]")
        ax.set_title(f"{kernel} ({mlstm_gates()[kernel]} gate)", fontsize="medium")
        ax.grid(True, which="both", alpha=0.2)
    _figure_legend(fig)
    shape_text = ", ".join(f"{SHORT_NAMES[k]}={v}" for k, v in shape.items())
    fig.suptitle(
        f"measured vs theoretical runtime, {MODE_TITLES.get(mode, mode)}, {shape_text}\n"
        f"{run_subtitle(context.run)}",
        fontsize="medium",
    )
    return fig


def _figure_legend(fig: Figure) -> None:
    """One legend right of the panels, each label once."""
    entries: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside right center", fontsize="small")


def flops_vs_chunk_figure(context: FigureContext, shape: dict[str, Any], mode: str) -> Figure | None:
    """Achieved FLOP/s, total FLOPs and runtime over the chunk size (paper Fig. 23 with our points)."""
    rows, kernels = _swept(chunkwise_mlstm_rows(context.run.results), shape, mode)
    if not kernels:
        return None
    fig = new_figure(14, 5.6)
    ax_rate, ax_flops, ax_time = fig.subplots(1, 3)
    chunks: list[float] = []
    for kernel in kernels:
        measured = rows[rows["kernel"] == kernel].sort_values("chunk_size")
        x = measured["chunk_size"].astype(float)
        chunks += list(x)
        line = _kernel_style(rows, kernel).line()
        ax_rate.plot(x, measured["achieved_flops_per_s"] / 1e12, label=kernel, **line)
        ax_flops.plot(x, measured["flops"] / 1e12, label=kernel, **line)
        ax_time.plot(x, measured["median_ms"], label=kernel, **line)
    for roof in context.roofs:
        style = accelerator_style(roof.accelerator)
        ax_rate.axhline(
            roof.accelerator.peak_flops_per_s / 1e12,
            linestyle=style.linestyle,
            color=style.color,
            label=f"{roof.label} peak",
        )
    for ax, ylabel, panel in (
        (ax_rate, "achieved [TFLOP/s]", "FLOP/s (measured)"),
        (ax_flops, "FLOPs per call [TFLOP]", "FLOPs (model)"),
        (ax_time, "median runtime [ms]", "runtime (measured)"),
    ):
        set_log2_x(ax, chunks)
        ax.set_xlabel("chunk size L [tokens]")
        ax.set_ylabel(ylabel)
        ax.set_title(panel)
        ax.grid(True, alpha=0.3)
    ax_rate.set_yscale("log")
    _figure_legend(fig)
    shape_text = ", ".join(f"{SHORT_NAMES[k]}={v}" for k, v in shape.items())
    fig.suptitle(
        f"FLOP/s, FLOPs and runtime over chunk size, {MODE_TITLES.get(mode, mode)}, {shape_text}\n"
        f"{run_subtitle(context.run)}"
    )
    return fig


def roofline_fraction_figure(context: FigureContext) -> Figure | None:
    """Every ok row's fraction of its roofline bound on the run's GPU; None without a roof (CPU run)."""
    accelerators = context.accelerators
    if not accelerators:
        return None
    own, detected = own_accelerator(context.run, accelerators)
    return fraction_figure(context.run, roofline_fractions(context.run, accelerators), own, detected)


def measured_plots(context: FigureContext) -> list[Plot]:
    """The measured-vs-model figures of a run: rooflines per mode, chunk-sweep figures per shape and
    mode, and the fraction of the bound."""
    device = device_name(context.run)
    roofs = ", ".join(roof.label for roof in context.roofs) or "no GPU roof (CPU run)"
    plots = [
        Plot(
            f"measured_roofline_{mode}",
            f"Chunkwise mLSTM kernels measured on {device}, {MODE_TITLES[mode]}: achieved TFLOP/s at "
            f"their analytic intensity, labelled by chunk size, under the rooflines of {roofs} "
            "(paper Fig. 22 with measured points).",
            partial(measured_roofline_figure, mode=mode),
        )
        for mode in ("fw", "fwbw")
    ]
    plots += [
        Plot(
            f"roofline_profiled_{mode}",
            f"Every row profiled under Nsight Compute on {device}, {MODE_TITLES[mode]}: hollow at its "
            "model intensity, filled at the intensity from the DRAM bytes ncu measured, linked by a "
            "thin line; points above the measured roof ringed in red.",
            partial(profiled_roofline_figure, mode=mode),
        )
        for mode in ("fw", "fwbw")
    ]
    for shape in chunk_sweep_shapes(chunkwise_mlstm_rows(context.run.results)):
        slug = shape_slug(shape)
        shape_text = ", ".join(f"{SHORT_NAMES[k]}={v}" for k, v in shape.items())
        for mode in ("fw", "fwbw"):
            plots.append(
                Plot(
                    f"measured_vs_theory_{slug}_{mode}",
                    f"One panel per chunkwise mLSTM kernel at {shape_text}, {MODE_TITLES[mode]}: measured "
                    "runtime over the chunk size beside the model's lower (full overlap) and upper (no "
                    f"overlap) runtime bounds on {roofs} (paper Fig. 20).",
                    partial(measured_vs_theory_figure, shape=shape, mode=mode),
                )
            )
            plots.append(
                Plot(
                    f"flops_vs_chunk_{slug}_{mode}",
                    f"At {shape_text}, {MODE_TITLES[mode]}: achieved FLOP/s, model FLOPs and measured "
                    "runtime over the chunk size; a higher FLOP/s need not mean a shorter runtime "
                    "(paper Fig. 23).",
                    partial(flops_vs_chunk_figure, shape=shape, mode=mode),
                )
            )
    plots.append(
        Plot(
            "roofline_fraction",
            f"Each ok row's model lower-bound runtime over its measured runtime on {device} "
            "(1.0 = at the roof), one row of points per kernel.",
            roofline_fraction_figure,
        )
    )
    return plots
