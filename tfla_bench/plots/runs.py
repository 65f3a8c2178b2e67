"""Paper-style figures of one run, written beside it (`tfla-bench plot RUN_DIR`).

- `runtime_vs_seq_len.png`: median runtime per kernel over the sequence length, fw and fwbw
  panels (the paper's Fig. 5, 15 and 16 left);
- `memory_vs_seq_len.png`: peak memory the same way (Fig. 15 and 16 right);
- `chunk_tradeoff_<shape>.png`: runtime and peak memory over the chunk size at one shape (Fig. 6);
- `runtime_vs_head_dim.png`: runtime over the head dim at a fixed sequence length (Fig. 17).

A figure is made only when the run sweeps its x axis. Published numbers (when a data set is given)
are drawn dashed in the colour of the adapter that answers to them. Only rows with status `ok` are
drawn; kernels without any are named under the figure with their status.

Each `*_figure` function returns a matplotlib `Figure` (made without pyplot, so nothing stays
open) or None; `plot_run` saves them as PNG.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tfla_bench.compare import Comparison, Run, compare_run, load_run, param_columns, resolve_published_name

PUBLISHED_GPU_SHORT = "H100"
MODE_TITLES = {"fw": "forward (fw)", "fwbw": "forward + backward (fwbw)"}
DPI = 120
GB = 1e9
LOG_Y_SPAN = 20.0  # a panel whose values span more than this factor gets a log y axis

# Stable colours per adapter, so a kernel looks the same in every figure of every run: one hue per
# family (mLSTM red-purple, attention blue, Mamba orange, GLA green), our kernels the darkest.
KERNEL_COLORS = {
    "tfla_sig": "#7b1f5e",
    "tfla_exp": "#c2185b",
    "limit_chunk": "#e57fa3",
    "mlstm_kernels_sig": "#b06a9c",
    "mlstm_kernels_exp": "#ef5f8f",
    "mlstm_kernels_limit": "#f3b6cb",
    "mlstm_torch": "#6d6d6d",
    "sdpa_math": "#a6c8e8",
    "sdpa_flash": "#1f4e8c",
    "sdpa_cudnn": "#3a7fc1",
    "fa2": "#5a9bd5",
    "fa3": "#0b2d5b",
    "mamba2": "#e08a00",
    "mamba2_split_conv": "#b35f00",
    "mamba": "#f2c14e",
    "gla": "#2e7d32",
    "simple_gla": "#7cb342",
    "lightning2": "#6d4c41",
}
_FALLBACK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#17becf", "#bcbd22", "#e377c2")

SHORT_NAMES = {
    "batch": "B",
    "seq_len": "T",
    "num_heads": "H",
    "head_dim_qk": "Dqk",
    "head_dim_v": "Dv",
    "chunk_size": "L",
}


def kernel_color(kernel: str) -> str:
    """The colour of an adapter in every figure."""
    if kernel in KERNEL_COLORS:
        return KERNEL_COLORS[kernel]
    return _FALLBACK_COLORS[sum(map(ord, kernel)) % len(_FALLBACK_COLORS)]


@dataclass
class Series:
    """One line of a figure: one kernel at one configuration, its rows sorted along the x column.

    Attributes:
        kernel: the adapter.
        config: the fixed columns and their values.
        label: the legend label (kernel plus the config values that tell its lines apart).
        rows: the rows of the series, sorted by x.
    """

    kernel: str
    config: dict[str, Any]
    label: str
    rows: pd.DataFrame


def _format_value(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def make_series(rows: pd.DataFrame, x: str, fixed: list[str]) -> list[Series]:
    """Split rows into lines: one per kernel and value combination of the `fixed` columns and params.

    Args:
        rows: result rows (any statuses).
        x: the x column; rows are sorted by it.
        fixed: shape columns held constant along a line (params always are).
    """
    if rows.empty:
        return []
    keys = ["kernel", *[c for c in fixed if c in rows.columns], *param_columns(rows)]
    groups = []
    for values, group in rows.groupby(keys, dropna=False, sort=True):
        config = {k: v for k, v in zip(keys[1:], values[1:], strict=True) if not pd.isna(v)}
        groups.append((values[0], config, group.sort_values(x)))
    labels = _labels(groups)
    return [Series(k, c, label, g) for (k, c, g), label in zip(groups, labels, strict=True)]


def _labels(groups: list[tuple[str, dict[str, Any], pd.DataFrame]]) -> list[str]:
    # Name only the config values that differ between lines of the same kernel.
    labels = []
    for kernel, config, _ in groups:
        siblings = [c for k, c, _ in groups if k == kernel]
        varying = [key for key in config if len({_format_value(s.get(key)) for s in siblings}) > 1]
        parts = []
        for key in varying:
            name = SHORT_NAMES.get(key, key.removeprefix("param_"))
            sep = "=" if key.startswith("param_") else ""
            parts.append(f"{name}{sep}{_format_value(config[key])}")
        labels.append(" ".join([kernel, *parts]))
    return labels


def _ok_points(rows: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    ok = rows[(rows["status"] == "ok") & rows[y].notna() & rows[x].notna()]
    return ok[[x, y]].astype(float)


def _published_points(rows: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    if y not in rows.columns:
        return pd.DataFrame(columns=[x, y])
    ok = rows[(rows["published_status"] == "ok") & rows[y].notna() & rows[x].notna()]
    return ok[[x, y]].astype(float)


def with_published(run: Run, comparison: Comparison | None) -> pd.DataFrame:
    """The run's rows with their published counterpart's columns beside them.

    The added columns are `published_ms`, `published_peak_memory_bytes`, `published_status` and
    `published_label`, NaN where a row has no counterpart (or no comparison is given).
    """
    results = run.results.copy()
    if comparison is None or comparison.matched.empty:
        return results
    columns = ["published_ms", "published_peak_memory_bytes", "published_status", "published_label"]
    published = comparison.matched.set_index("row_id")[columns]
    return results.join(published)


def _not_shown(rows: pd.DataFrame, shown: set[tuple[str, str]], min_points: int = 1) -> str:
    # Each missing line names its statuses; "ok" among them means too few ok points for a line.
    missing = []
    for (mode, kernel), group in rows.groupby(["mode", "kernel"], sort=True):
        if (kernel, mode) in shown:
            continue
        statuses = ", ".join(sorted(set(group["status"])))
        missing.append(f"{kernel} {mode} ({statuses})")
    need = "no ok rows" if min_points <= 1 else f"fewer than {min_points} ok points"
    return (f"not drawn ({need} along this axis): " + "; ".join(missing)) if missing else ""


def _note_not_shown(
    fig: Figure, rows: pd.DataFrame, shown: set[tuple[str, str]], min_points: int = 1
) -> None:
    """Name the kernels and modes without a line under the figure (`_not_shown`), wrapped to its width."""
    note = _not_shown(rows, shown, min_points)
    if note:
        # About 19 x-small characters per inch of figure: wrap, so no reason is cut off at the edges.
        width = int(fig.get_figwidth() * 19)
        fig.supxlabel(textwrap.fill(note, width=width), fontsize="x-small", ha="center")


def published_label(label: str) -> str:
    """The label of a published (dashed) line: hidden from the legend by the leading underscore."""
    return f"_published {label}"


def _legend(fig: Figure, axes: list[Axes], has_published: bool, published_gpu: str) -> None:
    # One legend for the figure: one entry per run series; the dashed convention named once.
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if has_published:
        handles.append(Line2D([], [], color="black", linestyle="--", marker="x"))
        labels.append(f"published ({published_gpu})" if published_gpu else "published")
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize="small")


def set_log2_x(ax: Axes, values: list[float]) -> None:
    """A log2 x axis with a tick labelled at each value."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(values))
    ax.set_xticks(ticks)
    ax.set_xticklabels([_format_value(float(t)) for t in ticks], rotation=45)
    ax.minorticks_off()


def series_panels(
    rows: pd.DataFrame,
    *,
    x: str,
    y: str,
    fixed: list[str],
    xlabel: str,
    ylabel: str,
    title: str,
    published_y: str | None = None,
    published_gpu: str = "",
    y_scale: float = 1.0,
    log2_x: bool = True,
    min_points: int = 2,
    log_y_span: float = LOG_Y_SPAN,
) -> Figure | None:
    """A figure with one panel per mode: a line per series along `x`, published values dashed.

    Args:
        rows: result rows, optionally with published columns (`with_published`).
        x: the x column; y: the measured column; published_y: the published column or None.
        fixed: shape columns held constant along a line.
        xlabel, ylabel, title: axis labels (with units) and the figure title.
        published_gpu: named in the legend of the dashed lines.
        y_scale: divides y (e.g. 1e9 for bytes -> GB).
        log2_x: log2 x axis with a tick at every value.
        min_points: a line needs at least this many ok points.
        log_y_span: a panel whose drawn values span more than this factor gets a log y axis, so
            kernels a hundred times faster than the slowest stay readable (Fig. 5: attention
            against linear RNNs).

    Returns:
        The figure, or None when no series has `min_points` ok points in any mode.
    """
    modes = [m for m in ("fw", "fwbw") if m in set(rows["mode"])]
    drawable = {
        mode: [
            s
            for s in make_series(rows[rows["mode"] == mode], x, fixed)
            if len(_ok_points(s.rows, x, y)) >= min_points
        ]
        for mode in modes
    }
    modes = [m for m in modes if drawable[m]]
    if not modes:
        return None
    fig = Figure(figsize=(5.5 * len(modes) + 2.5, 5.2), layout="constrained")
    axes = list(fig.subplots(1, len(modes), squeeze=False)[0])
    shown: set[tuple[str, str]] = set()
    has_published = False
    for ax, mode in zip(axes, modes, strict=True):
        xs: list[float] = []
        ys: list[float] = []
        for series in drawable[mode]:
            points = _ok_points(series.rows, x, y)
            color = kernel_color(series.kernel)
            ax.plot(points[x], points[y] / y_scale, marker="o", color=color, label=series.label)
            xs += list(points[x])
            ys += list(points[y] / y_scale)
            shown.add((series.kernel, mode))
            if published_y is not None:
                pub = _published_points(series.rows, x, published_y)
                if len(pub):
                    ax.plot(
                        pub[x],
                        pub[published_y] / y_scale,
                        linestyle="--",
                        marker="x",
                        color=color,
                        alpha=0.8,
                        label=published_label(series.label),
                    )
                    xs += list(pub[x])
                    ys += list(pub[published_y] / y_scale)
                    has_published = True
        if log2_x:
            set_log2_x(ax, xs)
        positive = [v for v in ys if v > 0]
        if positive and max(positive) > log_y_span * min(positive):
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(MODE_TITLES.get(mode, mode))
        ax.grid(True, alpha=0.3)
    _legend(fig, axes, has_published, published_gpu)
    fig.suptitle(title)
    _note_not_shown(fig, rows, shown, min_points)
    return fig


def _title(run: Run, what: str, comparison: Comparison | None) -> str:
    title = f"{run.spec}: {what} on {run.gpu_name}"
    if comparison is not None:
        title += f"\nbeside the published data set {comparison.published_name}"
    return title


def _const_token_fixed(rows: pd.DataFrame) -> list[str]:
    # A constant-token sweep changes the batch with the sequence length; otherwise the batch is fixed.
    tokens = (rows["batch"] * rows["seq_len"]).nunique()
    return ["num_heads", "head_dim_qk", "head_dim_v", "chunk_size", *([] if tokens == 1 else ["batch"])]


def runtime_vs_seq_len_figure(run: Run, comparison: Comparison | None = None) -> Figure | None:
    """Median runtime over the sequence length, fw and fwbw panels (paper Fig. 5)."""
    rows = with_published(run, comparison)
    return series_panels(
        rows,
        x="seq_len",
        y="median_ms",
        fixed=_const_token_fixed(rows),
        xlabel="sequence length T",
        ylabel="median runtime [ms]",
        title=_title(run, "runtime vs sequence length", comparison),
        published_y="published_ms" if comparison is not None else None,
        published_gpu=PUBLISHED_GPU_SHORT,
    )


def memory_vs_seq_len_figure(run: Run, comparison: Comparison | None = None) -> Figure | None:
    """Peak memory over the sequence length, fw and fwbw panels (paper Fig. 15/16 right)."""
    rows = with_published(run, comparison)
    return series_panels(
        rows,
        x="seq_len",
        y="peak_memory_bytes",
        fixed=_const_token_fixed(rows),
        xlabel="sequence length T",
        ylabel="peak memory [GB]",
        title=_title(run, "peak memory vs sequence length", comparison),
        published_y="published_peak_memory_bytes" if comparison is not None else None,
        published_gpu=PUBLISHED_GPU_SHORT,
        y_scale=GB,
    )


def runtime_vs_head_dim_figure(run: Run, comparison: Comparison | None = None) -> Figure | None:
    """Median runtime over the value head dim at fixed batch and sequence length (paper Fig. 17)."""
    rows = with_published(run, comparison)
    return series_panels(
        rows,
        x="head_dim_v",
        y="median_ms",
        fixed=["batch", "seq_len", "chunk_size"],
        xlabel="head dim Dv (heads = embedding / Dv)",
        ylabel="median runtime [ms]",
        title=_title(run, "runtime vs head dim", comparison),
        published_y="published_ms" if comparison is not None else None,
        published_gpu=PUBLISHED_GPU_SHORT,
    )


SHAPE_KEYS = ("batch", "seq_len", "num_heads", "head_dim_qk", "head_dim_v")


def shape_slug(shape: dict[str, Any]) -> str:
    """A file-name part for a shape, e.g. `B8_T8192_H8_Dqk256_Dv512`."""
    return "_".join(f"{SHORT_NAMES[k]}{int(v)}" for k, v in shape.items())


def chunk_sweep_shapes(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Shapes at which some kernel has ok rows at two or more chunk sizes."""
    ok = rows[(rows["status"] == "ok") & rows["chunk_size"].notna()]
    shapes = []
    for values, group in ok.groupby(list(SHAPE_KEYS), sort=True):
        if group.groupby(["kernel", "mode"])["chunk_size"].nunique().max() >= 2:
            shapes.append(dict(zip(SHAPE_KEYS, (int(v) for v in values), strict=True)))
    return shapes


def select_shape(rows: pd.DataFrame, shape: dict[str, Any]) -> pd.DataFrame:
    """Rows at one shape."""
    mask = pd.Series(True, index=rows.index)
    for key, value in shape.items():
        mask &= rows[key] == value
    return rows[mask]


def chunk_tradeoff_figure(run: Run, shape: dict[str, Any], comparison: Comparison | None = None) -> Figure:
    """Runtime and peak memory over the chunk size at one shape, a row of panels per mode (paper Fig. 6)."""
    rows = select_shape(with_published(run, comparison), shape)
    rows = rows[rows["chunk_size"].notna()]
    modes = [m for m in ("fw", "fwbw") if m in set(rows["mode"])]
    fig = Figure(figsize=(13, 4.6 * len(modes)), layout="constrained")
    axes = fig.subplots(len(modes), 2, squeeze=False)
    shown: set[tuple[str, str]] = set()
    has_published = False
    panels: list[tuple[str, str, str, float]] = [
        ("median_ms", "published_ms", "median runtime [ms]", 1.0),
        ("peak_memory_bytes", "published_peak_memory_bytes", "peak memory [GB]", GB),
    ]
    for row_axes, mode in zip(axes, modes, strict=True):
        mode_rows = rows[rows["mode"] == mode]
        for ax, (y, published_y, ylabel, scale) in zip(row_axes, panels, strict=True):
            xs: list[float] = []
            for series in make_series(mode_rows, "chunk_size", []):
                points = _ok_points(series.rows, "chunk_size", y)
                if points.empty:
                    continue
                color = kernel_color(series.kernel)
                ax.plot(points["chunk_size"], points[y] / scale, marker="o", color=color, label=series.label)
                xs += list(points["chunk_size"])
                shown.add((series.kernel, mode))
                pub = _published_points(series.rows, "chunk_size", published_y)
                if len(pub):
                    ax.plot(
                        pub["chunk_size"],
                        pub[published_y] / scale,
                        linestyle="--",
                        marker="x",
                        color=color,
                        alpha=0.8,
                        label=published_label(series.label),
                    )
                    xs += list(pub["chunk_size"])
                    has_published = True
            if xs:
                set_log2_x(ax, xs)
            ax.set_xlabel("chunk size L")
            ax.set_ylabel(ylabel)
            ax.set_title(MODE_TITLES.get(mode, mode))
            ax.grid(True, alpha=0.3)
    _legend(fig, list(axes.flat), has_published, PUBLISHED_GPU_SHORT)
    shape_text = ", ".join(f"{SHORT_NAMES[k]}={v}" for k, v in shape.items())
    fig.suptitle(_title(run, f"memory/runtime trade-off over chunk size ({shape_text})", comparison))
    _note_not_shown(fig, rows, shown)
    return fig


def run_figures(run: Run, comparison: Comparison | None = None) -> dict[str, Figure]:
    """Every figure the run supports, keyed by file stem."""
    figures: dict[str, Figure] = {}
    makers: list[tuple[str, Callable[[Run, Comparison | None], Figure | None]]] = [
        ("runtime_vs_seq_len", runtime_vs_seq_len_figure),
        ("memory_vs_seq_len", memory_vs_seq_len_figure),
        ("runtime_vs_head_dim", runtime_vs_head_dim_figure),
    ]
    for name, maker in makers:
        fig = maker(run, comparison)
        if fig is not None:
            figures[name] = fig
    for shape in chunk_sweep_shapes(run.results):
        figures[f"chunk_tradeoff_{shape_slug(shape)}"] = chunk_tradeoff_figure(run, shape, comparison)
    return figures


def save_figures(figures: dict[str, Figure], out_dir: Path) -> list[Path]:
    """Save each figure as `<out_dir>/<name>.png`; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=DPI)
        paths.append(path)
    return paths


def plot_run(run_dir: Path, out_dir: Path | None = None, published: str | None = None) -> list[Path]:
    """Write the run's figures as PNG.

    Args:
        run_dir: the run directory.
        out_dir: where to write; default `<run_dir>/figures`.
        published: the published data set drawn dashed; default the run's env.json `published`
            field; `"none"` for none.

    Returns:
        The written files.
    """
    run = load_run(run_dir)
    name = resolve_published_name(run, published)
    comparison = compare_run(run, name) if name else None
    return save_figures(run_figures(run, comparison), out_dir or Path(run_dir) / "figures")
