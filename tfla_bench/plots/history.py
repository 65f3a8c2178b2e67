"""The history figure of one case (`tfla_bench.analyse.history`): its median runtime run after run.

x is the runs that measured the case, in date order, each labelled with its date and commit; one
line per GPU, in that GPU's look (`accelerator_style`), with its p20-p80 band shaded. A point that
changed beyond the noise of both runs from the one before it is marked: a red triangle up when
slower, a green triangle down when faster. The site draws every case of a kernel and mode on one
figure, one case at a time, so the figure and its axes are made once and only the case's data is
replaced per case (`HistoryFigure`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from tfla_bench.model.hardware import detect_accelerator
from tfla_bench.plots.base import Canvas, png_bytes
from tfla_bench.plots.style import ACCELERATOR_COLORS, ACCELERATOR_MARKERS, accelerator_style
from tfla_bench.run import rundir

WIDTH, HEIGHT, DPI = 7.0, 3.2, 80
MAX_TICKS = 12  # at most this many runs are labelled on x
MARKS = {
    "slower": ("^", "#d62728", "slower beyond the noise"),
    "faster": ("v", "#2ca02c", "faster beyond the noise"),
}


def _gpu_look(gpu: str, index: int) -> tuple[str, str]:
    accelerator = detect_accelerator(gpu)
    if accelerator is not None:
        style = accelerator_style(accelerator)
        return style.color, style.marker
    return ACCELERATOR_COLORS[-1 - index % 3], ACCELERATOR_MARKERS[-1 - index % 3]


class HistoryFigure:
    """One figure and its axes, redrawn for each case of a kernel and mode: only the case's lines,
    bands, ticks, title and legend are replaced, so the axes and their tick artists are made once
    (making them anew per case cost more than drawing the case). Each PNG is the one a new
    `HistoryFigure` draws for that case."""

    def __init__(self) -> None:
        # A fixed layout: the constrained one would be solved again for every case.
        self.fig = Figure(figsize=(WIDTH, HEIGHT))
        Canvas(self.fig)
        self.fig.subplots_adjust(left=0.11, right=0.7, top=0.88, bottom=0.24)
        # The title at the top, where it goes with no x axis there, without a check for one at each draw.
        with matplotlib.rc_context({"axes.titley": 1.0}):
            self.ax = self.fig.add_subplot()
        self.ax.set_ylabel("median runtime [ms]")
        self.ax.grid(True, alpha=0.3)

    def _clear(self) -> None:
        """Take the last case's data off the axes, which then autoscale to the next case alone."""
        ax = self.ax
        for artist in [*ax.lines, *ax.collections]:
            artist.remove()
        for legend in list(self.fig.legends):
            legend.remove()
        ax.dataLim.set_points(Bbox.null().get_points())
        ax.ignore_existing_data_limits = True
        ax.set_autoscaley_on(True)

    def save(self, points: pd.DataFrame, title: str, path: Path) -> None:
        """Draw the points of one case (`history` rows, every GPU) and write them as a PNG to `path`."""
        self._clear()
        ax = self.ax
        runs = points.sort_values(["date", "run"]).drop_duplicates("run")
        position = {run: i for i, run in enumerate(runs["run"])}
        entries = {}
        for index, (gpu, line) in enumerate(points.groupby("gpu", sort=True)):
            color, marker = _gpu_look(str(gpu), index)
            x = line["run"].map(position)
            ax.fill_between(x, line["p20_ms"], line["p80_ms"], color=color, alpha=0.2, linewidth=0)
            ax.plot(x, line["median_ms"], color=color, marker=marker, markersize=4, linewidth=1.2)
            entries[f"{gpu} (median, p20-p80)"] = Line2D([], [], color=color, marker=marker)
            for verdict, (mark, mark_color, text) in MARKS.items():
                moved = line[line["verdict"] == verdict]
                if len(moved):
                    ax.plot(moved["run"].map(position), moved["median_ms"], ls="", marker=mark, ms=10,
                            color=mark_color, zorder=5)  # fmt: skip
                    entries[text] = Line2D([], [], ls="", marker=mark, color=mark_color)
        step = max(1, -(-len(runs) // MAX_TICKS))
        shown = runs.iloc[::step]
        ax.set_xticks(
            [position[run] for run in shown["run"]],
            [f"{str(d)[:10]}\n{c}" for d, c in zip(shown["date"], shown["commit"], strict=True)],
            fontsize=7,
        )
        ax.set_xlim(-0.5, len(runs) - 0.5)
        ax.set_title(title, fontsize=9)
        self.fig.legend(list(entries.values()), list(entries), loc="center right", fontsize=7)
        rundir.write_atomic(path, png_bytes(self.fig, DPI, squeeze=False))
