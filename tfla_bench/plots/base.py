"""What every figure of the suite shares: the one figure type (`Plot`: name, caption, draw), the one
context a figure is drawn from (`FigureContext`), a figure before it is drawn (`Drawing`: what it is
drawn from, and its digest), the roofs, direct labels that never overlap, the 2.5:1 aspect limit, and
saving.

`tfla_bench.plots.catalog` lists every figure; `plot`, `roofline` and `report` draw from it.
"""

from __future__ import annotations

import contextvars
import hashlib
import io
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.mathtext import MathTextParser
from matplotlib.ticker import NullLocator
from matplotlib.transforms import Bbox
from PIL import Image

from tfla_bench.analyse.compare import Comparison, Run
from tfla_bench.model.hardware import Accelerator
from tfla_bench.plots.style import accelerator_style
from tfla_bench.run import rundir

MAX_ASPECT = 2.5  # width / height of any figure
DPI = 120
CPU = "CPU"
MEASURED = "measured"
DATASHEET = "datasheet"
HBM = "HBM"
L2 = "L2"


@dataclass(frozen=True)
class Roof:
    """One roofline: a GPU's peak FLOP/s and bandwidth, from its datasheet or measured on it.

    Attributes:
        accelerator: the peak and bandwidth (and the GPU's name and label).
        source: `datasheet` or `measured` (`tfla-bench roofs`): a datasheet roof is drawn in its
            GPU's style, a measured one in black, solid for device memory and dotted for L2.
        memory: the memory level whose bandwidth bounds it, `HBM` or `L2`.
    """

    accelerator: Accelerator
    source: str = DATASHEET
    memory: str = HBM

    @property
    def label(self) -> str:
        if self.source != MEASURED:
            return self.accelerator.display_name
        acc = self.accelerator
        return (
            f"{MEASURED}: {acc.peak_flops_per_s / 1e12:.0f} TFLOP/s, "
            f"{self.memory} {acc.bandwidth_bytes_per_s / 1e12:.2f} TB/s"
        )


@dataclass(frozen=True)
class FigureContext:
    """Everything a figure is drawn from.

    Attributes:
        run: the run whose rows are drawn (None for the model figures).
        comparison: the run beside a published data set (drawn dotted), or None.
        roofs: the roofs to draw and bound against, datasheet and measured; none for a CPU run.
    """

    run: Run | None = None
    comparison: Comparison | None = None
    roofs: tuple[Roof, ...] = field(default=())

    @property
    def accelerators(self) -> list[Accelerator]:
        """The GPUs of the datasheet roofs, each once, in order: the model's bounds are taken on these."""
        datasheet = [roof.accelerator for roof in self.roofs if roof.source == DATASHEET]
        return list({acc.name: acc for acc in datasheet}.values())


@dataclass(frozen=True)
class Drawing:
    """A figure before it is drawn: the function that draws it and everything that function is given.

    The function is module-level (or a `functools.partial` of one) and reads nothing but its
    arguments, so two drawings of the same `digest` draw the same figure: a site draws it once.
    """

    function: Callable[..., Figure | None]
    args: tuple

    def figure(self) -> Figure | None:
        return self.function(*self.args)

    def digest(self, salt: str) -> str:
        """The SHA-256 of `salt` (the code's digest), then the function (by name, with a partial's
        arguments) and the arguments, pickled by value (`_ByValue`)."""
        pickled = io.BytesIO()
        _ByValue(pickled, protocol=5).dump((self.function, self.args))
        return hashlib.sha256(salt.encode() + pickled.getvalue()).hexdigest()


class _ByValue(pickle.Pickler):
    """Pickles equal values to equal bytes. A pandas object goes as its labels, dtype names and values:
    its own pickle holds caches (a dtype's item size, once something asked for it). There is no memo
    (`fast`): it would write a value met twice as a reference only where both are one object."""

    def __init__(self, file: io.BytesIO, protocol: int) -> None:
        super().__init__(file, protocol)
        self.fast = True

    def reducer_override(self, obj: object) -> object:
        if isinstance(obj, pd.DataFrame):
            columns = list(obj.columns)
            values = [obj[column].tolist() for column in columns]
            return pd.DataFrame, (columns, [str(dtype) for dtype in obj.dtypes], obj.index.tolist(), values)
        if isinstance(obj, pd.Series):
            return pd.Series, (obj.name, str(obj.dtype), obj.index.tolist(), obj.tolist())
        return NotImplemented


@dataclass(frozen=True)
class Plot:
    """One figure of the suite.

    Attributes:
        name: the file stem (`runtime_vs_seq_len`, `fig22_roofline`, ...).
        caption: what the figure shows, one or two sentences (the report prints it under the figure).
        draw: makes the figure from a context, or returns None when the context has nothing to show.
        inputs: the `Drawing` that `draw` makes of a context, where it is drawn from less than the whole
            context (the rows of one measure, not the run): runs that differ elsewhere share it.
    """

    name: str
    caption: str
    draw: Callable[[FigureContext], Figure | None]
    inputs: Callable[[FigureContext], Drawing] | None = None

    def drawing(self, context: FigureContext) -> Drawing:
        """The figure of `context` before it is drawn: its `inputs`, else `draw` of the whole context."""
        return self.inputs(context) if self.inputs is not None else Drawing(self.draw, (context,))


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout figure (no pyplot: nothing stays open) of at most `MAX_ASPECT` : 1."""
    if width > MAX_ASPECT * height:
        raise ValueError(f"a {width}x{height} figure is wider than {MAX_ASPECT}:1")
    fig = Figure(figsize=(width, height), layout="constrained")
    Canvas(fig)
    return fig


class Canvas(FigureCanvasAgg):
    """Matplotlib's Agg canvas whose renderers share one math text parser: matplotlib keeps a parser
    and its cache per renderer, so each new figure parsed its log axes' tick labels
    (`10^{3}` in math text) anew. The same pixels, a label parsed once per process."""

    math_text = MathTextParser("path")

    def get_renderer(self) -> RendererAgg:
        renderer = super().get_renderer()
        renderer.mathtext_parser = Canvas.math_text
        return renderer


def _new_math_text() -> None:
    # Its parses hold fonts, which cannot cross a fork (matplotlib empties its own font cache there).
    Canvas.math_text = MathTextParser("path")


os.register_at_fork(after_in_child=_new_math_text)


def grid_shape(panels: int, max_columns: int = 3) -> tuple[int, int]:
    """Rows and columns for `panels` panels: as square as the column limit allows."""
    columns = min(max_columns, max(1, int(np.ceil(np.sqrt(panels)))))
    return int(np.ceil(panels / columns)), columns


def device_name(run: Run) -> str:
    """The run's GPU as env.json names it, or `CPU` for a run without one."""
    return CPU if run.gpu.cpu else run.gpu.name


def is_cpu_run(run: Run) -> bool:
    """Whether the run had no GPU (so no GPU roof applies to it)."""
    return run.gpu.cpu


def run_dtypes(run: Run) -> str:
    """The dtypes of the run's rows, comma-separated."""
    return ", ".join(sorted({str(d) for d in run.results["dtype"].dropna()})) or "unknown dtype"


def run_subtitle(run: Run) -> str:
    """`<spec> on <GPU or CPU>, <dtype>`: every run figure names its device and dtype."""
    return f"{run.spec} on {device_name(run)}, {run_dtypes(run)}"


def draw_roofs(ax: Axes, roofs: Sequence[Roof], intensities: np.ndarray) -> None:
    """Each roof min(bandwidth x intensity, peak) in TFLOP/s over `intensities`, its ridge marked.

    A datasheet roof is drawn in its GPU's style; a measured one in black, thick and solid for
    device memory, thin and dotted for L2.
    """
    for roof in roofs:
        acc = roof.accelerator
        style = accelerator_style(acc)
        color, linestyle, width = style.color, style.linestyle, 1.5
        if roof.source == MEASURED:
            color, linestyle, width = (
                "black",
                ("-" if roof.memory == HBM else ":"),
                (2.0 if roof.memory == HBM else 1.2),
            )
        values = np.minimum(acc.bandwidth_bytes_per_s * intensities, acc.peak_flops_per_s) / 1e12
        ax.plot(
            intensities,
            values,
            color=color,
            linestyle=linestyle,
            linewidth=width,
            label=f"{roof.label} roofline",
        )
        ridge = acc.intensity_flops_per_byte
        ax.plot([ridge], [acc.peak_flops_per_s / 1e12], marker=style.marker, color=color, linestyle="")


@dataclass(frozen=True)
class Label:
    """A direct label: text in a colour, anchored at a data point of an axes."""

    x: float
    y: float
    text: str
    color: str


# Set while `render` draws quick figures (for `figure_src`'s quick PNG): `place_labels` then drops the
# minor ticks that `figure_src` would drop before it lays the figure out, and keeps that layout.
_QUICK: contextvars.ContextVar[bool] = contextvars.ContextVar("quick", default=False)

# Offsets in points tried in turn: right of the point, then stepping up and down, then left.
_OFFSETS = [(5, dy) for dy in (-3, 7, -13, 17, -23, 27, -33, 37)] + [(-5, dy) for dy in (-3, 7, -13, 17)]


def place_labels(ax: Axes, labels: Sequence[Label], fontsize: str = "x-small") -> list[matplotlib.text.Text]:
    """Write each label beside its point where it overlaps no label already placed; drop it otherwise.

    The layout is settled first, so the check runs on the boxes as they will be drawn; the labels
    stay out of the layout, so placing them cannot move the axes again.

    Returns:
        The labels placed.
    """
    fig = ax.get_figure()
    renderer = fig.canvas.get_renderer()
    quick = _QUICK.get()
    if quick:
        drop_minor_ticks(fig)
    # The layout alone settles where the axes go: a draw without rendering cost as much again.
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
        if quick:
            # Drawn at the dpi laid out at (`figure_src`), with no minor tick left to drop: the draw
            # that writes the figure would lay it out again the same.
            fig.set_layout_engine("none")
    axes_box = ax.get_window_extent(renderer)
    placed: list[tuple[matplotlib.text.Text, Bbox]] = []
    for label in labels:
        for dx, dy in _OFFSETS:
            text = ax.annotate(
                label.text,
                (label.x, label.y),
                xytext=(dx, dy),
                textcoords="offset points",
                ha="left" if dx > 0 else "right",
                va="center",
                fontsize=fontsize,
                color=label.color,
                annotation_clip=True,
            )
            text.set_in_layout(False)
            box = text.get_window_extent(renderer)
            inside = axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1 and axes_box.y0 <= box.y0
            if inside and box.y1 <= axes_box.y1 and not any(box.overlaps(other) for _, other in placed):
                placed.append((text, box))
                break
            text.remove()
    return [text for text, _ in placed]


def render(plots: Sequence[Plot], context: FigureContext, quick: bool = False) -> list[tuple[Plot, Figure]]:
    """Draw each plot on the context (`draw`); the ones with nothing to show are left out."""
    drawn = [(plot, draw(plot.drawing(context), quick)) for plot in plots]
    return [(plot, fig) for plot, fig in drawn if fig is not None]


def draw(drawing: Drawing, quick: bool = False) -> Figure | None:
    """The figure of a drawing, or None when it has nothing to show.

    `quick` sets each title at the top of its axes, where matplotlib would place it anyway when no x
    axis is on top (none of the run and measured figures has one), without checking for one at every
    draw: the same pixels, and a tenth less time. Its direct labels are placed on the layout without
    minor ticks, which the figure keeps (`place_labels`).
    """
    token = _QUICK.set(quick)
    try:
        with matplotlib.rc_context({"axes.titley": 1.0} if quick else {}):
            return drawing.figure()
    finally:
        _QUICK.reset(token)


def save(
    drawn: Sequence[tuple[Plot, Figure]], out_dir: Path, *, svg: bool = False, dpi: int = DPI
) -> list[Path]:
    """Save each figure as `<out_dir>/<name>.png` (and `.svg`, reproducibly: no date, fixed ids).

    Raises:
        UserError: one of the files is there and not writable (`rundir.refuse_not_writable`);
            none of them is written then.
    """
    formats = [(".png", None)] + ([(".svg", {"Date": None})] if svg else [])
    files = [
        (out_dir / f"{plot.name}{suffix}", fig, metadata)
        for plot, fig in drawn
        for suffix, metadata in formats
    ]
    rundir.refuse_not_writable([path for path, _, _ in files], "figure")
    out_dir.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.hashsalt": "tfla-bench"}):
        for path, fig, metadata in files:
            rundir.save_atomic(path, lambda tmp, f=fig, m=metadata: f.savefig(tmp, dpi=dpi, metadata=m))
    return [path for path, _, _ in files]


def drop_minor_ticks(fig: Figure) -> None:
    """Drop the minor ticks of each log axis that has two or more major ticks in view, which label it
    on their own: the minor ticks cost about half the time of drawing a figure of many log panels."""
    for ax in fig.axes:
        for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            if axis.get_scale() != "log":
                continue
            low, high = min(limits), max(limits)
            if sum(low <= tick <= high for tick in axis.get_major_locator()()) >= 2:
                axis.set_minor_locator(NullLocator())


def png_bytes(fig: Figure, dpi: int = DPI, squeeze: bool = True) -> bytes:
    """A figure as a PNG of 256 colours: a quarter of the bytes of matplotlib's true-colour PNG, and
    the same to the eye for line plots on white. The canvas's pixels are taken as they are drawn
    (matplotlib's own PNG would be encoded only to be decoded here). Without `squeeze` (zlib's
    slowest level) the file is about a tenth larger and encoded in a third of the time."""
    fig.set_dpi(dpi)
    fig.canvas.draw()
    pixels = Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).convert("RGB")
    out = io.BytesIO()
    pixels.quantize(256, method=Image.Quantize.FASTOCTREE).save(
        out, format="png", **({"optimize": True} if squeeze else {"compress_level": 6})
    )
    return out.getvalue()
