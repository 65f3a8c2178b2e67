"""Paper-style figures of one run, written beside it (`tfla-bench plot RUN_DIR`).

- `runtime_vs_seq_len.png`: median runtime per kernel over the sequence length, fw and fwbw
  panels (the paper's Fig. 5, 15 and 16 left);
- `energy_vs_seq_len.png`: the GPU's energy per token (uJ) the same way, beside it, for a run whose
  rows have energy (`energy_mj`, `tfla_bench.measure.energy`);
- `memory_vs_seq_len.png`: peak memory the same way (Fig. 15 and 16 right);
- `chunk_tradeoff_<shape>.png`: runtime and peak memory over the chunk size at one shape (Fig. 6);
- `runtime_vs_head_dim.png`: runtime over the head dim at a fixed sequence length (Fig. 17).

A figure is made only when the run sweeps its x axis. Published numbers (when a data set is given)
are drawn dotted with crosses in the colour of the series that answers to them. Only rows with
status `ok` are drawn; kernels without any are named under the figure with their status. Each line
takes its look from its kernel and params (`tfla_bench.plots.style`); the legend sits outside the
axes, so no label covers a line. On the runtime figures a grey ring marks each point measured while
NVML reported a power cap, thermal or hardware slowdown (`throttled`).

`run_plots(context)` lists the figures of a run as `Plot`s (`tfla_bench.plots.base`); each draws a
matplotlib `Figure` from the context, or None when the run does not sweep its axis.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tfla_bench.adapters import registry
from tfla_bench.analyse.compare import SHORT_NAMES, Comparison, Run, param_columns
from tfla_bench.analyse.headline import own_kernels
from tfla_bench.plots.base import (
    MAX_ASPECT,
    Drawing,
    FigureContext,
    Plot,
    is_cpu_run,
    new_figure,
    run_subtitle,
)
from tfla_bench.plots.style import LineStyle, row_style

PUBLISHED_GPU_SHORT = "H100"
PUBLISHED_LINESTYLE = ":"
PUBLISHED_MARKER = "x"
# A grey ring around each point measured while NVML reported a power cap or slowdown.
THROTTLED_RING = {"marker": "o", "markersize": 12, "markerfacecolor": "none", "markeredgecolor": "#999999"}
MODE_TITLES = {"fw": "forward (fw)", "fwbw": "forward + backward (fwbw)"}
GB = 1e9
LOG_Y_SPAN = 20.0  # a panel whose values span more than this factor gets a log y axis
PANEL_WIDTH, LEGEND_WIDTH, PANEL_HEIGHT = 5.5, 2.5, 5.2
# Above this many lines in one panel, over several families, a figure gets a row of panels per family.
FACET_SERIES = 6
FACET_HEIGHT = 2.9
# The other families' lines in a family's panel: for scale, behind its own lines.
CONTEXT_LINE = {"color": "#c8c8c8", "linewidth": 0.9, "zorder": 0}


@dataclass(frozen=True)
class Measure:
    """What a panel draws on y: the measured column, its published column (None: the paper has
    none), the axis label and the divisor from the column's unit to the axis's; `timed` when
    throttling can move it (a timing); `derive` makes the column from the rows when the run has no
    such column of its own."""

    column: str
    published: str | None
    label: str
    scale: float = 1.0
    timed: bool = False
    derive: Callable[[pd.DataFrame], pd.Series] | None = None


def energy_uj_per_token(rows: pd.DataFrame) -> pd.Series:
    """The GPU's energy per token of each row in uJ: `energy_mj` over the call's batch x seq_len tokens."""
    energy_mj = pd.to_numeric(rows["energy_mj"], errors="coerce").astype(float)
    return energy_mj * 1e3 / (rows["batch"] * rows["seq_len"]).astype(float)


RUNTIME = Measure("median_ms", "published_ms", "median runtime [ms]", timed=True)
MEMORY = Measure("peak_memory_bytes", "published_peak_memory_bytes", "peak memory [GB]", GB)
ENERGY = Measure("energy_uj_per_token", None, "GPU energy per token [µJ]", derive=energy_uj_per_token)


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

    @property
    def style(self) -> LineStyle:
        """The series' look from its kernel, family and params."""
        family = str(self.rows["family"].iloc[0]) if "family" in self.rows.columns else ""
        params = {k: v for k, v in self.config.items() if k.startswith("param_")}
        return row_style(self.kernel, family, params)


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
    # The two columns picked with the rows: not every column of the rows filtered, once per line.
    return rows.loc[(rows["status"] == "ok") & rows[y].notna() & rows[x].notna(), [x, y]].astype(float)


def _throttled_points(rows: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The ok points measured while NVML reported a power cap, thermal or hardware slowdown."""
    if "throttled" not in rows.columns:
        return pd.DataFrame(columns=[x, y])
    slowed = rows["throttled"].astype(str).str.lower() == "true"
    return _ok_points(rows.loc[slowed, ["status", x, y]], x, y)


def _published_points(rows: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    if y not in rows.columns:
        return pd.DataFrame(columns=[x, y])
    ok = (rows["published_status"] == "ok") & rows[y].notna() & rows[x].notna()
    return rows.loc[ok, [x, y]].astype(float)


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
    """The label of a published (dotted) line: hidden from the legend by the leading underscore."""
    return f"_published {label}"


def _legend(
    fig: Figure, axes: list[Axes], has_published: bool, published_gpu: str, has_throttled: bool = False
) -> None:
    # One legend for the figure: one entry per run series; the dotted and ring conventions named once.
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if has_published:
        handles.append(Line2D([], [], color="black", linestyle=PUBLISHED_LINESTYLE, marker=PUBLISHED_MARKER))
        labels.append(f"published ({published_gpu})" if published_gpu else "published")
    if has_throttled:
        handles.append(Line2D([], [], linestyle="", **THROTTLED_RING))
        labels.append("ring: GPU throttled (NVML)")
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize="small")


def set_log2_x(ax: Axes, values: list[float]) -> None:
    """A log2 x axis with a tick labelled at each value."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(values))
    ax.set_xticks(ticks)
    ax.set_xticklabels([_format_value(float(t)) for t in ticks], rotation=45)
    ax.minorticks_off()


@dataclass(frozen=True)
class Draw:
    """What every panel of one figure draws: the x and y columns, the published y column (or None),
    the divisor of y, and whether to ring throttled points."""

    x: str
    y: str
    published_y: str | None
    scale: float
    ring_throttled: bool


def _drawable(
    rows: pd.DataFrame, x: str, y: str, fixed: list[str], min_points: int
) -> dict[str, list[Series]]:
    """The series of each mode with at least `min_points` ok points, for the modes that have any."""
    drawable = {}
    # Counted once for all rows: filtering each series' rows anew takes most of a large run's drawing.
    usable = (rows["status"] == "ok") & rows[y].notna() & rows[x].notna()
    for mode in (m for m in ("fw", "fwbw") if m in set(rows["mode"])):
        series = make_series(rows[rows["mode"] == mode], x, fixed)
        kept = [s for s in series if usable[s.rows.index].sum() >= min_points]
        if kept:
            drawable[mode] = kept
    return drawable


def _family(series: Series) -> str:
    return str(series.rows["family"].iloc[0]) if "family" in series.rows.columns else ""


def _needs_facets(drawable: dict[str, list[Series]]) -> bool:
    """More lines in a panel than a reader can pair with their published lines, of several families."""
    every = [s for series in drawable.values() for s in series]
    return (
        len({_family(s) for s in every}) > 1
        and max(len(series) for series in drawable.values()) > FACET_SERIES
    )


def family_order(families: set[str]) -> list[str]:
    """The families of a figure, the one of our kernels first (the reader's question), then by name."""
    ours = {_family_of(kernel) for kernel in own_kernels()}
    return sorted(families, key=lambda family: (family not in ours, family))


def _family_of(kernel: str) -> str:
    adapter = registry.find(kernel)
    return adapter.family if adapter is not None else ""


def _family_figure(
    drawable: dict[str, list[Series]],
    draw: Draw,
    xlabel: str,
    ylabel: str,
    log_y_span: float,
    published_gpu: str,
) -> Figure:
    """One row of panels per kernel family, one column per mode: each family's lines in colour with
    their published lines, the other families' lines thin and grey behind them for scale; the y
    axis is shared down each column, so rows compare at a glance. Each row has its own legend."""
    modes = list(drawable)
    families = family_order({_family(s) for series in drawable.values() for s in series})
    width = PANEL_WIDTH * len(modes) + LEGEND_WIDTH
    height = max(FACET_HEIGHT * len(families) + 1.2, width / MAX_ASPECT)
    fig = new_figure(width, height)
    grid = fig.subplots(len(families), len(modes), squeeze=False, sharex=True, sharey="col")
    for column, mode in enumerate(modes):
        values: list[float] = []
        xs: list[float] = []
        # Each series is drawn grey in every other family's row: its points are picked out once.
        greys = [(_family(s), _ok_points(s.rows, draw.x, draw.y)) for s in drawable[mode]]
        for row, family in enumerate(families):
            ax = grid[row][column]
            for points in (points for other, points in greys if other != family):
                ax.plot(points[draw.x], points[draw.y] / draw.scale, label="_other", **CONTEXT_LINE)
            for series in (s for s in drawable[mode] if _family(s) == family):
                drawn_x, drawn_y, _ = _draw_series(ax, series, draw.x, draw.y, draw.published_y, draw.scale)
                xs += drawn_x
                values += drawn_y
                if draw.ring_throttled:
                    _ring_throttled(ax, series, draw.x, draw.y, draw.scale)
            ax.set_title(f"{family}: {MODE_TITLES.get(mode, mode)}", fontsize="medium")
            ax.set_ylabel(ylabel if column == 0 else "")
            ax.grid(True, alpha=0.3)
        set_log2_x(grid[-1][column], xs)
        grid[-1][column].set_xlabel(xlabel)
        positive = [v for v in values if v > 0]
        if positive and max(positive) > log_y_span * min(positive):
            grid[0][column].set_yscale("log")
    for row in grid:
        _row_legend(list(row), published_gpu)
    return fig


def _row_legend(axes: list[Axes], published_gpu: str) -> None:
    """The legend of one family's row, right of its last panel: its lines, then the conventions."""
    handles, labels = [], []
    lines = [line for ax in axes for line in ax.get_lines()]
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    conventions = [
        (
            any(line.get_label().startswith("_published") for line in lines),
            Line2D([], [], color="black", linestyle=PUBLISHED_LINESTYLE, marker=PUBLISHED_MARKER),
            f"published ({published_gpu})" if published_gpu else "published",
        ),
        (
            any(line.get_label() == "_other" for line in lines),
            Line2D([], [], **CONTEXT_LINE),
            "other families",
        ),
        (
            any(line.get_label() == "_throttled" for line in lines),
            Line2D([], [], linestyle="", **THROTTLED_RING),
            "ring: GPU throttled (NVML)",
        ),
    ]
    for present, handle, label in conventions:
        if present:
            handles.append(handle)
            labels.append(label)
    axes[-1].legend(handles, labels, loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")


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
    ring_throttled: bool = False,
    by_family: bool = False,
) -> Figure | None:
    """A figure with one panel per mode: a line per series along `x`, published values dotted.

    Args:
        rows: result rows, optionally with published columns (`with_published`).
        x: the x column; y: the measured column; published_y: the published column or None.
        fixed: shape columns held constant along a line.
        xlabel, ylabel, title: axis labels (with units) and the figure title.
        published_gpu: named in the legend of the dotted lines.
        y_scale: divides y (e.g. 1e9 for bytes -> GB).
        log2_x: log2 x axis with a tick at every value.
        min_points: a line needs at least this many ok points.
        log_y_span: a panel whose drawn values span more than this factor gets a log y axis, so
            kernels a hundred times faster than the slowest stay readable (Fig. 5: attention
            against linear RNNs).
        ring_throttled: ring the points measured on a throttled GPU (for timings).
        by_family: when a panel would hold more than `FACET_SERIES` lines of several kernel
            families, draw one row of panels per family instead (`_family_figure`).

    Returns:
        The figure, or None when no series has `min_points` ok points in any mode.
    """
    drawable = _drawable(rows, x, y, fixed, min_points)
    if not drawable:
        return None
    draw = Draw(x, y, published_y, y_scale, ring_throttled)
    if by_family and _needs_facets(drawable):
        fig = _family_figure(drawable, draw, xlabel, ylabel, log_y_span, published_gpu)
        fig.suptitle(title)
        _note_not_shown(
            fig, rows, {(s.kernel, m) for m, series in drawable.items() for s in series}, min_points
        )
        return fig
    modes = list(drawable)
    width = PANEL_WIDTH * len(modes) + LEGEND_WIDTH
    fig = new_figure(width, max(PANEL_HEIGHT, width / MAX_ASPECT))
    axes = list(fig.subplots(1, len(modes), squeeze=False)[0])
    shown: set[tuple[str, str]] = set()
    has_published = has_throttled = False
    for ax, mode in zip(axes, modes, strict=True):
        xs: list[float] = []
        ys: list[float] = []
        for series in drawable[mode]:
            drawn_x, drawn_y, published = _draw_series(ax, series, x, y, published_y, y_scale)
            xs += drawn_x
            ys += drawn_y
            shown.add((series.kernel, mode))
            has_published |= published
            has_throttled |= ring_throttled and _ring_throttled(ax, series, x, y, y_scale)
        if log2_x:
            set_log2_x(ax, xs)
        positive = [v for v in ys if v > 0]
        if positive and max(positive) > log_y_span * min(positive):
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(MODE_TITLES.get(mode, mode))
        ax.grid(True, alpha=0.3)
    _legend(fig, axes, has_published, published_gpu, has_throttled)
    fig.suptitle(title)
    _note_not_shown(fig, rows, shown, min_points)
    return fig


def _draw_series(
    ax: Axes, series: Series, x: str, y: str, published_y: str | None, scale: float
) -> tuple[list[float], list[float], bool]:
    """Draw a series' ok points along `x` in its look, and its published values (`published_y`, when
    given) dotted with crosses in its colour; return the x and y values drawn and whether any of
    them were published."""
    points = _ok_points(series.rows, x, y)
    ax.plot(points[x], points[y] / scale, label=series.label, **series.style.line())
    xs, ys = list(points[x]), list(points[y] / scale)
    pub = _published_points(series.rows, x, published_y) if published_y is not None else pd.DataFrame()
    if len(pub):
        ax.plot(
            pub[x],
            pub[published_y] / scale,
            linestyle=PUBLISHED_LINESTYLE,
            marker=PUBLISHED_MARKER,
            color=series.style.color,
            alpha=0.8,
            label=published_label(series.label),
        )
        xs += list(pub[x])
        ys += list(pub[published_y] / scale)
    return xs, ys, bool(len(pub))


def _ring_throttled(ax: Axes, series: Series, x: str, y: str, scale: float) -> bool:
    """Ring the series' points measured on a throttled GPU; whether there were any."""
    slowed = _throttled_points(series.rows, x, y)
    if len(slowed):
        ax.plot(slowed[x], slowed[y] / scale, linestyle="", label="_throttled", **THROTTLED_RING)
    return bool(len(slowed))


def _title(run: Run, what: str, comparison: Comparison | None) -> str:
    title = f"{what}\n{run_subtitle(run)}"
    if comparison is not None:
        title += f"\nbeside the published data set {comparison.published_name}"
    return title


def _const_token_fixed(rows: pd.DataFrame) -> list[str]:
    # A constant-token sweep changes the batch with the sequence length; otherwise the batch is fixed.
    tokens = (rows["batch"] * rows["seq_len"]).nunique()
    return ["num_heads", "head_dim_qk", "head_dim_v", "chunk_size", *([] if tokens == 1 else ["batch"])]


def _panel_rows(
    rows: pd.DataFrame, *, x: str, y: str, fixed: list[str], published_y: str | None, ring_throttled: bool
) -> pd.DataFrame:
    """The columns of `rows` that `series_panels` reads with these arguments, numbered from 0: all it
    is drawn from, so that runs whose rows differ only elsewhere draw the same figure."""
    published = [published_y, "published_status"] if published_y is not None else []
    wanted = ["kernel", "mode", "status", "family", x, y, *fixed, *param_columns(rows), *published]
    wanted += ["throttled"] if ring_throttled else []
    return rows[[c for c in dict.fromkeys(wanted) if c in rows.columns]].reset_index(drop=True)


def _measure_drawing(
    context: FigureContext,
    measure: Measure,
    *,
    x: str,
    xlabel: str,
    what: str,
    fixed: Callable[[pd.DataFrame], list[str]],
    by_family: bool = False,
) -> Drawing:
    """`series_panels` of the run's `measure` along `x`, beside the published values when compared,
    given only the rows' columns it reads (`_panel_rows`)."""
    run, comparison = context.run, context.comparison
    rows = with_published(run, comparison)
    if measure.derive is not None:
        rows[measure.column] = measure.derive(rows)
    published_y = measure.published if comparison is not None else None
    columns = fixed(rows)
    panels = partial(
        series_panels,
        x=x,
        y=measure.column,
        fixed=columns,
        xlabel=xlabel,
        ylabel=measure.label,
        title=_title(run, what, comparison),
        published_y=published_y,
        published_gpu=PUBLISHED_GPU_SHORT,
        y_scale=measure.scale,
        ring_throttled=measure.timed,
        by_family=by_family,
    )
    drawn = _panel_rows(
        rows, x=x, y=measure.column, fixed=columns, published_y=published_y, ring_throttled=measure.timed
    )
    return Drawing(panels, (drawn,))


def _nothing() -> None:
    return None


NOTHING = Drawing(_nothing, ())  # a figure with nothing to show


def runtime_vs_seq_len_drawing(context: FigureContext) -> Drawing:
    """Median runtime over the sequence length, fw and fwbw panels (paper Fig. 5)."""
    return _measure_drawing(
        context,
        RUNTIME,
        x="seq_len",
        xlabel="sequence length T",
        what="runtime vs sequence length",
        fixed=_const_token_fixed,
        by_family=True,
    )


def energy_vs_seq_len_drawing(context: FigureContext) -> Drawing:
    """The GPU's energy per token over the sequence length, fw and fwbw panels, drawn as the runtime
    figure is (the same lines, looks and rows of panels); nothing when no row has energy."""
    energy = context.run.results.get("energy_mj")
    if energy is None or pd.to_numeric(energy, errors="coerce").isna().all():
        return NOTHING
    return _measure_drawing(
        context,
        ENERGY,
        x="seq_len",
        xlabel="sequence length T",
        what="energy per token vs sequence length",
        fixed=_const_token_fixed,
        by_family=True,
    )


def memory_vs_seq_len_drawing(context: FigureContext) -> Drawing:
    """Peak memory over the sequence length, fw and fwbw panels (paper Fig. 15/16 right)."""
    return _measure_drawing(
        context,
        MEMORY,
        x="seq_len",
        xlabel="sequence length T",
        what="peak memory vs sequence length",
        fixed=_const_token_fixed,
    )


def runtime_vs_head_dim_drawing(context: FigureContext) -> Drawing:
    """Median runtime over the value head dim at fixed batch and sequence length (paper Fig. 17)."""
    # A line needs two head dims of one kernel and mode; a run that sweeps none (Fig. 5) has no figure.
    if context.run.results.groupby(["kernel", "mode"])["head_dim_v"].nunique().max() < 2:
        return NOTHING
    return _measure_drawing(
        context,
        RUNTIME,
        x="head_dim_v",
        xlabel="head dim Dv (heads = embedding / Dv)",
        what="runtime vs head dim",
        fixed=lambda _rows: ["batch", "seq_len", "chunk_size"],
    )


def runtime_vs_seq_len_figure(context: FigureContext) -> Figure | None:
    return runtime_vs_seq_len_drawing(context).figure()


def energy_vs_seq_len_figure(context: FigureContext) -> Figure | None:
    return energy_vs_seq_len_drawing(context).figure()


def memory_vs_seq_len_figure(context: FigureContext) -> Figure | None:
    return memory_vs_seq_len_drawing(context).figure()


def runtime_vs_head_dim_figure(context: FigureContext) -> Figure | None:
    return runtime_vs_head_dim_drawing(context).figure()


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


def chunk_tradeoff_figure(context: FigureContext, shape: dict[str, Any]) -> Figure:
    """Runtime and peak memory over the chunk size at one shape, a row of panels per mode (paper Fig. 6)."""
    run, comparison = context.run, context.comparison
    rows = select_shape(with_published(run, comparison), shape)
    rows = rows[rows["chunk_size"].notna()]
    modes = [m for m in ("fw", "fwbw") if m in set(rows["mode"])]
    fig = new_figure(13, max(4.6 * len(modes), 13 / MAX_ASPECT))
    axes = fig.subplots(len(modes), 2, squeeze=False)
    shown: set[tuple[str, str]] = set()
    has_published = False
    for row_axes, mode in zip(axes, modes, strict=True):
        mode_rows = rows[rows["mode"] == mode]
        for ax, measure in zip(row_axes, (RUNTIME, MEMORY), strict=True):
            xs: list[float] = []
            for series in make_series(mode_rows, "chunk_size", []):
                if _ok_points(series.rows, "chunk_size", measure.column).empty:
                    continue
                drawn_x, _, published = _draw_series(
                    ax, series, "chunk_size", measure.column, measure.published, measure.scale
                )
                xs += drawn_x
                shown.add((series.kernel, mode))
                has_published |= published
            if xs:
                set_log2_x(ax, xs)
            ax.set_xlabel("chunk size L")
            ax.set_ylabel(measure.label)
            ax.set_title(MODE_TITLES.get(mode, mode))
            ax.grid(True, alpha=0.3)
    _legend(fig, list(axes.flat), has_published, PUBLISHED_GPU_SHORT)
    shape_text = ", ".join(f"{SHORT_NAMES[k]}={v}" for k, v in shape.items())
    fig.suptitle(_title(run, f"memory/runtime trade-off over chunk size ({shape_text})", comparison))
    _note_not_shown(fig, rows, shown)
    return fig


def run_plots(context: FigureContext) -> list[Plot]:
    """The figures of a run: one per swept axis, and one chunk trade-off per shape with a chunk sweep."""
    published = " Published values are dotted with crosses." if context.comparison is not None else ""
    throttled = (
        " A grey ring marks a case measured while the GPU was throttled (power cap or slowdown, from NVML)."
    )
    throttled = "" if is_cpu_run(context.run) else throttled
    plots = [
        Plot(
            "runtime_vs_seq_len",
            "Median runtime of each kernel over the sequence length at a constant number of tokens, "
            f"forward and forward + backward (paper Fig. 5).{published}{throttled}",
            runtime_vs_seq_len_figure,
            runtime_vs_seq_len_drawing,
        ),
        Plot(
            "energy_vs_seq_len",
            "The GPU's energy per token of each kernel over the sequence length, beside the runtime "
            "figure (same kernels and lines): NVML's energy counter over at least half a second of "
            "back-to-back calls, the GPU's idle power included, divided by the calls and by batch x "
            "sequence length (docs/energy.md). Drawn when the run has energy.",
            energy_vs_seq_len_figure,
            energy_vs_seq_len_drawing,
        ),
        Plot(
            "memory_vs_seq_len",
            f"Peak GPU memory of each kernel over the sequence length (paper Figs. 15 and 16).{published}",
            memory_vs_seq_len_figure,
            memory_vs_seq_len_drawing,
        ),
        Plot(
            "runtime_vs_head_dim",
            "Median runtime over the value head dim at a fixed batch and sequence length, with "
            f"heads = embedding / head dim (paper Fig. 17).{published}",
            runtime_vs_head_dim_figure,
            runtime_vs_head_dim_drawing,
        ),
    ]
    for shape in chunk_sweep_shapes(context.run.results):
        shape_text = ", ".join(f"{SHORT_NAMES[k]}={v}" for k, v in shape.items())
        plots.append(
            Plot(
                f"chunk_tradeoff_{shape_slug(shape)}",
                f"Runtime and peak memory over the chunk size L at {shape_text}: a larger chunk "
                f"stores fewer states but computes more per chunk (paper Fig. 6).{published}",
                partial(chunk_tradeoff_figure, shape=shape),
            )
        )
    return plots
