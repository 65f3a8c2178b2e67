"""The history figure of one case (`tfla_bench.analyse.history`): its median runtime run after run.

x is the runs that measured the case, in date order, each labelled with its date and commit; one
line per GPU, in that GPU's look (`accelerator_style`), with its p20-p80 band shaded. A point that
changed beyond the noise of both runs from the one before it is marked: a red triangle up when
slower, a green triangle down when faster.

A site holds one such figure per case, hundreds of them, each a line or two over a dozen runs: they
are written as SVG markup here, not drawn by matplotlib, which took 60 ms a figure (mostly shaping
and rasterizing its two dozen labels) where this takes about 6, most of it writing the file. Only the
y ticks come from matplotlib (`MaxNLocator`, the steps its figures use); the text is the browser's.
"""

from __future__ import annotations

import html
import math

import pandas as pd
from matplotlib.ticker import MaxNLocator

from tfla_bench.model.hardware import detect_accelerator
from tfla_bench.plots.style import ACCELERATOR_COLORS, ACCELERATOR_MARKERS, accelerator_style

WIDTH, HEIGHT = 680, 256  # pixels
LEFT, RIGHT, TOP, BOTTOM = 62, 452, 30, 196  # the plot area; the legend is right of it
LABEL_PX = 56  # a run's label on x (its date) is this wide: at most one run in so many pixels is labelled
Y_TICKS = 6
MARKS = {
    "slower": ("^", "#d62728", "slower beyond the noise"),
    "faster": ("v", "#2ca02c", "faster beyond the noise"),
}
FONT = "DejaVu Sans, Arial, sans-serif"


def _gpu_look(gpu: str, index: int) -> tuple[str, str]:
    accelerator = detect_accelerator(gpu)
    if accelerator is not None:
        style = accelerator_style(accelerator)
        return style.color, style.marker
    return ACCELERATOR_COLORS[-1 - index % 3], ACCELERATOR_MARKERS[-1 - index % 3]


def _marker(marker: str, x: float, y: float, size: float, color: str) -> str:
    """A marker at (x, y): matplotlib's square, diamond and triangles as polygons, anything else a circle."""
    r = size / 2
    shapes = {
        "s": [(-r, -r), (r, -r), (r, r), (-r, r)],
        "D": [(0, -r), (r, 0), (0, r), (-r, 0)],
        "^": [(0, -r), (r, r), (-r, r)],
        "v": [(0, r), (r, -r), (-r, -r)],
    }
    if marker not in shapes:
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{color}"/>'
    corners = " ".join(f"{x + dx:.1f},{y + dy:.1f}" for dx, dy in shapes[marker])
    return f'<polygon points="{corners}" fill="{color}"/>'


def _text(x: float, y: float, text: str, size: float, anchor: str = "start", extra: str = "") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
        f"{html.escape(text)}</text>"
    )


def _finite(values: pd.Series) -> pd.Series:
    return values.astype(float).map(math.isfinite)


def _y_ticks(low: float, high: float) -> list[float]:
    """Round tick values that span [low, high] (matplotlib's `MaxNLocator`)."""
    if not high > low:
        pad = abs(low) * 0.05 or 1.0
        low, high = low - pad, high + pad
    return [float(v) for v in MaxNLocator(nbins=Y_TICKS).tick_values(low, high)]


def _tick_label(value: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    return f"{value:.{decimals}f}"


def history_svg(points: pd.DataFrame, title: str) -> str:
    """The SVG of one case's points (`history` rows, every GPU), titled `title`."""
    runs = points.sort_values(["date", "run"]).drop_duplicates("run")
    position = {run: i for i, run in enumerate(runs["run"])}
    values = pd.concat([points["median_ms"], points["p20_ms"], points["p80_ms"]])
    values = values[_finite(values)]
    ticks = _y_ticks(float(values.min()), float(values.max())) if len(values) else _y_ticks(0.0, 1.0)
    y_low, y_high = ticks[0], ticks[-1]

    def x_at(run: str) -> float:
        return LEFT + (position[run] + 0.5) / len(runs) * (RIGHT - LEFT)

    def y_at(value: float) -> float:
        return BOTTOM - (value - y_low) / (y_high - y_low) * (BOTTOM - TOP)

    def points_of(rows: pd.DataFrame, column: str) -> list[tuple[float, float]]:
        return [(x_at(run), y_at(value)) for run, value in zip(rows["run"], rows[column], strict=True)]

    def polyline(coords: list[tuple[float, float]]) -> str:
        return " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)

    frame = f'x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}"'
    parts = [f'<rect {frame} fill="none" stroke="#333"/>']
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 0.0
    for value in ticks:
        y = y_at(value)
        parts.append(
            f'<line x1="{LEFT}" x2="{RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#000" stroke-opacity=".12"/>'
        )
        parts.append(_text(LEFT - 4, y + 3, _tick_label(value, step), 9, "end"))
    every = max(1, -(-len(runs) // ((RIGHT - LEFT) // LABEL_PX)))
    for run, date, commit in list(zip(runs["run"], runs["date"], runs["commit"], strict=True))[::every]:
        x = x_at(run)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{BOTTOM}" y2="{BOTTOM + 4}" stroke="#333"/>')
        label = f'<tspan x="{x:.1f}">{html.escape(str(date)[:10])}</tspan>'
        label += f'<tspan x="{x:.1f}" dy="10">{html.escape(str(commit))}</tspan>'
        parts.append(f'<text x="{x:.1f}" y="{BOTTOM + 14}" font-size="8" text-anchor="middle">{label}</text>')
    middle = (TOP + BOTTOM) / 2
    parts.append(
        _text(14, middle, "median runtime [ms]", 10, "middle", f' transform="rotate(-90 14 {middle})"')
    )
    parts.append(_text((LEFT + RIGHT) / 2, TOP - 10, title, 11, "middle"))

    legend: dict[str, str] = {}
    for index, (gpu, line) in enumerate(points.sort_values(["date", "run"]).groupby("gpu", sort=True)):
        color, marker = _gpu_look(str(gpu), index)
        band = line[_finite(line["p20_ms"]) & _finite(line["p80_ms"])]
        if len(band):
            outline = polyline(points_of(band, "p80_ms") + points_of(band, "p20_ms")[::-1])
            parts.append(f'<polygon points="{outline}" fill="{color}" fill-opacity=".2"/>')
        line = line[_finite(line["median_ms"])]
        coords = points_of(line, "median_ms")
        parts.append(
            f'<polyline points="{polyline(coords)}" fill="none" stroke="{color}" stroke-width="1.5"/>'
        )
        parts += [_marker(marker, x, y, 6, color) for x, y in coords]
        legend[f"{gpu} (median, p20-p80)"] = _marker(marker, 0, 0, 6, color)
        for verdict, (mark, mark_color, text) in MARKS.items():
            moved = line[line["verdict"] == verdict]
            parts += [_marker(mark, x, y, 11, mark_color) for x, y in points_of(moved, "median_ms")]
            if len(moved):
                legend[text] = _marker(mark, 0, 0, 9, mark_color)
    top = middle - 8 * len(legend)
    for number, (text, sample) in enumerate(legend.items()):
        y = top + 16 * number
        parts.append(f'<g transform="translate({RIGHT + 16} {y})">{sample}</g>')
        parts.append(_text(RIGHT + 26, y + 3, text, 8))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}">'
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>{"".join(parts)}</svg>\n'
    )
