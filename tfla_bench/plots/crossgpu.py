"""The figure of `tfla-bench compare-gpus`: measured speed-up of B over A against the model's prediction.

One panel per mode; one point per case with a prediction, x the predicted speed-up t_A / t_B, y the
measured runtime_A / runtime_B with the two medians' noise as its bar (`diff.noise`), each kernel
in its own look (`tfla_bench.plots.style`), the area of each point growing with the shape value
that varies across the cases (sequence length, else head dim, else chunk size: `diff.X_COLUMNS`).
Points on the diagonal y = x are where the model's ratio holds; the dotted verticals mark the two
ratios it gives outside the ridges, bandwidth_B / bandwidth_A (memory-bound on both GPUs) and
peak_B / peak_A (compute-bound on both). Both axes are linear over one range, so the diagonal is at
45 degrees.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tfla_bench.analyse.compare import SHORT_NAMES
from tfla_bench.analyse.crossgpu import GpuComparison
from tfla_bench.analyse.diff import X_COLUMNS
from tfla_bench.plots.base import DPI, MAX_ASPECT, new_figure
from tfla_bench.plots.runs import MODE_TITLES
from tfla_bench.plots.style import row_style

PANEL_SIZE, LEGEND_WIDTH = 5.0, 2.8
# Room around the points and the ratios drawn, relative to the range they span.
MARGIN = 0.06
# Marker areas (points^2) of the smallest and the largest value of the shape column that varies.
MIN_AREA, MAX_AREA = 16.0, 160.0
MAX_SIZE_ENTRIES = 5
RATIO_LINES = (
    ("bandwidth B / A: memory-bound on both", "#1f78b4"),
    ("peak B / A: compute-bound on both", "#d95f02"),
)


def speedup_figure(comparison: GpuComparison) -> Figure | None:
    """Measured against predicted speed-up of B over A per case (module docstring); None when no
    case has a prediction."""
    rows = comparison.rows.dropna(subset=["predicted_speedup"])
    if rows.empty:
        return None
    size_column = next((c for c in X_COLUMNS if rows[c].nunique() > 1), X_COLUMNS[0])
    sizes = _sizes(rows[size_column])
    modes = [mode for mode in MODE_TITLES if mode in set(rows["mode"])]
    modes += sorted(set(rows["mode"]) - set(modes))
    width = PANEL_SIZE * len(modes) + LEGEND_WIDTH
    fig = new_figure(width, max(PANEL_SIZE + 0.8, width / MAX_ASPECT))
    fig.set_dpi(DPI)
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    a_roof, b_roof = comparison.a.roof.accelerator, comparison.b.roof.accelerator
    ratios = (
        b_roof.bandwidth_bytes_per_s / a_roof.bandwidth_bytes_per_s,
        b_roof.peak_flops_per_s / a_roof.peak_flops_per_s,
    )
    low, high = _limits(rows, ratios)
    kernels: dict[str, Any] = {}
    for ax, mode in zip(axes, modes, strict=True):
        kernels.update(_draw_points(ax, rows[rows["mode"] == mode], sizes, size_column))
        ax.plot([low, high], [low, high], color="#555", linewidth=1)
        for ratio, (_, color) in zip(ratios, RATIO_LINES, strict=True):
            ax.axvline(ratio, color=color, linestyle=":", linewidth=1.2)
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_aspect("equal", adjustable="box")
        ax.set_title(MODE_TITLES.get(mode, mode))
        ax.set_xlabel("predicted speed-up t_A / t_B")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("measured speed-up: runtime A / runtime B")
    entries = {
        **dict(sorted(kernels.items())),
        **{text: Line2D([], [], color=color, linestyle=":") for text, color in RATIO_LINES},
        "y = x: as predicted": Line2D([], [], color="#555"),
        **_size_entries(sizes, size_column),
    }
    fig.legend(list(entries.values()), list(entries), loc="outside right center", fontsize=8)
    fig.suptitle(
        f"B {comparison.b.gpu_name} against A {comparison.a.gpu_name}: measured and predicted speed-up "
        f"(t = max(FLOPs / peak, bytes / bandwidth) on each GPU)"
        f"\nA: {comparison.a.describe()}\nB: {comparison.b.describe()}",
        fontsize=9,
    )
    return fig


def _limits(rows: pd.DataFrame, ratios: tuple[float, float]) -> tuple[float, float]:
    """One range for both axes that holds every point, both ratios and 1 (no change)."""
    values = [*rows["predicted_speedup"], *rows["measured_speedup"], *ratios, 1.0]
    low, high = min(values), max(values)
    pad = MARGIN * (high - low or 1.0)
    return max(low - pad, 0.0), high + pad


def _sizes(values: pd.Series) -> dict[Any, float]:
    """A marker area per value of the varying shape column, growing with the value's rank."""
    ordered = sorted(values.dropna().unique())
    step = (MAX_AREA - MIN_AREA) / max(len(ordered) - 1, 1)
    return {value: MIN_AREA + step * rank for rank, value in enumerate(ordered)}


def _draw_points(ax: Any, rows: pd.DataFrame, sizes: dict[Any, float], size_column: str) -> dict[str, Any]:
    """One kernel (and params) at a time, in its look, each point's area by its `size_column`
    value; returns the legend entries of the kernels."""
    entries = {}
    for (kernel, params, family), group in rows.groupby(["kernel", "params", "family"], sort=True):
        words = dict(word.split("=", 1) for word in str(params).split())
        style = row_style(str(kernel), str(family), words)
        x, y = group["predicted_speedup"], group["measured_speedup"]
        bars = group["noise"].fillna(0) * y
        ax.errorbar(x, y, yerr=bars, fmt="none", ecolor=style.color, alpha=0.6, capsize=2)
        ax.scatter(x, y, s=[sizes.get(v, MIN_AREA) for v in group[size_column]], alpha=0.8, **style.points())
        entries[f"{kernel} {params}".strip()] = Line2D(
            [], [], marker=style.marker, color=style.color, linestyle="", fillstyle=style.fillstyle
        )
    return entries


def _size_entries(sizes: dict[Any, float], size_column: str) -> dict[str, Any]:
    """Legend entries for the marker areas: every value, or the smallest, a middle and the largest."""
    values = list(sizes)
    shown = values if len(values) <= MAX_SIZE_ENTRIES else [values[0], values[len(values) // 2], values[-1]]
    short = SHORT_NAMES.get(size_column, size_column)
    return {
        f"{short} {int(value)}": Line2D(
            [], [], marker="o", color="#777", linestyle="", markersize=math.sqrt(sizes[value])
        )
        for value in shown
    }
