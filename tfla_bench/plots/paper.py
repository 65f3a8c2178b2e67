"""The figure of a spec's page on the site: each GPU and commit against the paper's published numbers.

One panel per mode; x is the kernels the paper has numbers for; y, on a log axis, the geometric mean
over a kernel's cases of runtime / the paper's runtime, one marker per series (a GPU and commit: the
latest run of each); the line at 1 is the paper itself. Below 1 the series is faster than the paper.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tfla_bench.plots.base import DPI, MAX_ASPECT, new_figure
from tfla_bench.plots.runs import MODE_TITLES
from tfla_bench.plots.style import MARKERS

PANEL_WIDTH, LEGEND_WIDTH, HEIGHT = 5.5, 3.2, 4.2


def paper_ratio_figure(table: pd.DataFrame, series: list[str], paper: str, title: str) -> Figure | None:
    """`table`: one row per case (`mode`, `kernel`, `case`) with a median runtime column per name of
    `series` and the `paper` column. None when the paper has no number for any case."""
    if paper not in table or table[paper].isna().all():
        return None
    modes = [mode for mode in MODE_TITLES if mode in set(table["mode"])]
    width = PANEL_WIDTH * len(modes) + LEGEND_WIDTH
    fig = new_figure(width, max(HEIGHT, width / MAX_ASPECT))
    fig.set_dpi(DPI)
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for ax, mode in zip(axes, modes, strict=True):
        rows = table[(table["mode"] == mode) & table[paper].notna()]
        kernels = sorted(rows["kernel"].unique())
        for index, name in enumerate(series):
            ratio = np.log(rows[name] / rows[paper])
            means = ratio.groupby(rows["kernel"]).mean().dropna().map(np.exp)
            shift = (index - (len(series) - 1) / 2) * 0.6 / max(len(series), 1)
            ax.plot([kernels.index(k) + shift for k in means.index], means, ls="", ms=6,
                    marker=MARKERS[index % len(MARKERS)], color=f"C{index % 10}", label=name)  # fmt: skip
        ax.axhline(1.0, color="#555", linewidth=1)
        ax.set_xticks(range(len(kernels)), kernels, rotation=40, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(MODE_TITLES.get(mode, mode))
        ax.set_ylabel(f"runtime / {paper} (geometric mean over cases)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig
