"""The analytic model's figures: the TFLA paper's Figs. 18-25 (appendix F/G) for mLSTMsig.

Figures are built on `matplotlib.figure.Figure` objects, not through pyplot, so they need no GUI
backend and leave the backend of an importing notebook alone. `model_plots()` lists them as
`Plot`s; each `figure_*` function draws one from a `FigureContext`, whose roofs are the GPUs drawn.
Each GPU keeps one colour, line style and marker (`tfla_bench.plots.style.accelerator_style`) and
is named beside its curve, so GPUs whose curves nearly coincide (H100 and H200) stay apart.

Settings follow the paper: Fig. 18 one head with T = 8192; Figs. 20-23 the 7B mLSTMsig
(`PAPER_7B`: d_hv = 512, d_qk = 256, 8 heads, batch 8, T = 8192, fp32 states); Figs. 19, 24, 25
vary the head dim d_hv with d_qk = p_qk * d_hv.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from tfla_bench.model.counts import MlstmShape
from tfla_bench.model.hardware import Accelerator
from tfla_bench.model.roofline import (
    flop_optimal_chunk_size,
    roofline_flops_per_s,
    runtime_optimal_chunk_size,
)
from tfla_bench.plots.base import FigureContext, Label, Plot, draw_roofs, new_figure, place_labels
from tfla_bench.plots.style import accelerator_style

PAPER_7B = MlstmShape(gate="sig", seq_len=8192, head_dim_qk=256, head_dim_v=512, batch=8, heads=8)
FIG18_HEAD_DIMS = ((256, 512), (128, 256), (64, 128))
CAUSAL_FACTORS = (0.5, 0.66, 1.0)
# Even head dims, so that d_qk = d_hv / 2 is an integer too.
HEAD_DIMS_V = np.unique(np.round(np.geomspace(32, 2048, 121) / 2).astype(int) * 2)
_POWERS_OF_TWO = [i for i, dhv in enumerate(HEAD_DIMS_V) if dhv & (dhv - 1) == 0]
MARKED_CHUNK_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
QKV_DTYPE = "bf16"
ANY_GPU = "FLOP counts: the same on every GPU"
FIGURE_NAMES = (
    "fig18_flops_vs_chunk_size",
    "fig19_flop_optimal_chunk_vs_head_dim",
    "fig20_runtime_vs_chunk_size",
    "fig21_intensity_vs_chunk_size",
    "fig22_roofline",
    "fig23_flops_per_s_and_flops_vs_chunk_size",
    "fig24_runtime_optimal_chunk_vs_head_dim",
    "fig25_runtime_optimal_chunk_vs_accelerator_intensity",
)


def _chunk_grid(seq_len: int, points: int = 400) -> np.ndarray:
    return np.geomspace(1, seq_len, points)


_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")


def _log2_x(ax: Axes, label: str = "chunk size L") -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_PLAIN)
    ax.set_xlabel(label)


def _log2_y(ax: Axes) -> None:
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_locator(LogLocator(base=2))
    ax.yaxis.set_major_formatter(_PLAIN)


def _finish(ax: Axes) -> None:
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.12)


def _setting(shape: MlstmShape) -> str:
    return (
        f"{shape.label}, T={shape.seq_len}, d_qk={shape.head_dim_qk}, d_hv={shape.head_dim_v}, "
        f"{shape.heads} heads, batch {shape.batch}, {QKV_DTYPE} q/k/v, {shape.state_bytes:g}-byte states"
    )


def _gpu_labels(ax: Axes, curves: list[tuple[Accelerator, float, float]]) -> None:
    """Name each GPU beside a point of its curve (direct labels that never overlap)."""
    place_labels(
        ax,
        [Label(x, y, acc.display_name, accelerator_style(acc).color) for acc, x, y in curves],
        fontsize="small",
    )


def _runtime_ms(
    shape: MlstmShape, chunk: np.ndarray, accelerator: Accelerator, *, overlap: bool
) -> np.ndarray:
    scale = shape.batch * shape.heads * 1e3
    compute = shape.flop_terms().total(shape.seq_len, chunk) / accelerator.peak_flops_per_s * scale
    memory = shape.byte_terms().total(shape.seq_len, chunk) / accelerator.bandwidth_bytes_per_s * scale
    return np.maximum(compute, memory) if overlap else compute + memory


def _intensity(shape: MlstmShape, chunk: np.ndarray) -> np.ndarray:
    return shape.flop_terms().total(shape.seq_len, chunk) / shape.byte_terms().total(shape.seq_len, chunk)


def figure_flops_vs_chunk_size(context: FigureContext) -> Figure:
    """Fig. 18: FLOPs of the recurrent, parallel and chunkwise mLSTMsig vs chunk size (one head, T=8192)."""
    fig = new_figure(13, 5.4)
    axes = fig.subplots(1, len(FIG18_HEAD_DIMS), sharey=True)
    seq_len = PAPER_7B.seq_len
    chunk = _chunk_grid(seq_len)
    for ax, (dqk, dhv) in zip(axes, FIG18_HEAD_DIMS, strict=True):
        for fc, style in ((0.5, "-"), (0.66, "--")):
            shape = MlstmShape("sig", seq_len, dqk, dhv, causal_factor=fc)
            ax.plot(
                chunk,
                shape.flop_terms().total(seq_len, chunk),
                style,
                color="#1f77b4",
                label=f"chunkwise, F_c={fc}",
            )
            ax.axhline(shape.flops("parallel"), linestyle=style, color="#d62728", label=f"parallel, F_c={fc}")
            optimum = flop_optimal_chunk_size(shape.flop_terms(), seq_len)
            ax.plot([optimum], [shape.flops("chunkwise", optimum)], "o", color="#1f77b4", markersize=6)
        recurrent = MlstmShape("sig", seq_len, dqk, dhv).flops("recurrent")
        ax.axhline(recurrent, color="#2ca02c", label="recurrent")
        ax.plot([], [], "o", color="#1f77b4", label="FLOP-optimal L")
        _log2_x(ax)
        ax.set_yscale("log")
        ax.set_title(f"d_qk={dqk}, d_hv={dhv}")
        _finish(ax)
    axes[0].set_ylabel(f"FLOPs [FLOP] (one head, T={seq_len})")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=6, fontsize=9)
    fig.suptitle(
        f"Fig. 18 — mLSTMsig forward FLOPs: chunkwise moves from recurrent (L=1) to parallel (L=T)\n{ANY_GPU}"
    )
    return fig


def figure_flop_optimal_chunk_vs_head_dim(context: FigureContext) -> Figure:
    """Fig. 19: FLOP-optimal chunk size of mLSTMsig vs head dim d_hv, for p_qk = 0.5 and 1.0."""
    fig = new_figure(11, 4.6)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, p_qk in zip(axes, (0.5, 1.0), strict=True):
        for fc in CAUSAL_FACTORS:
            optima = [
                flop_optimal_chunk_size(
                    MlstmShape(
                        "sig", PAPER_7B.seq_len, int(p_qk * dhv), int(dhv), causal_factor=fc
                    ).flop_terms(),
                    PAPER_7B.seq_len,
                )
                for dhv in HEAD_DIMS_V
            ]
            ax.plot(HEAD_DIMS_V, optima, label=f"F_c={fc}")
        _log2_x(ax, "head dim d_hv")
        _log2_y(ax)
        ax.set_title(f"p_qk={p_qk} (d_qk = {p_qk} · d_hv)")
        _finish(ax)
        ax.legend()
    axes[0].set_ylabel("FLOP-optimal chunk size L [tokens]")
    fig.suptitle(f"Fig. 19 — FLOP-optimal chunk size of mLSTMsig grows as sqrt(d_hv)\n{ANY_GPU}, T=8192")
    return fig


def figure_runtime_vs_chunk_size(context: FigureContext) -> Figure:
    """Fig. 20: theoretical runtime of the 7B mLSTMsig forward vs chunk size on each accelerator."""
    fig = new_figure(9, 5.6)
    ax = fig.subplots()
    chunk = _chunk_grid(PAPER_7B.seq_len)
    ends = []
    for accelerator in context.accelerators:
        style = accelerator_style(accelerator)
        color = style.color
        upper = _runtime_ms(PAPER_7B, chunk, accelerator, overlap=False)
        lower = _runtime_ms(PAPER_7B, chunk, accelerator, overlap=True)
        optimum = runtime_optimal_chunk_size(
            PAPER_7B.flop_terms(), PAPER_7B.byte_terms(), accelerator, PAPER_7B.seq_len
        )
        best = _runtime_ms(PAPER_7B, np.array([optimum]), accelerator, overlap=False)[0]
        name = accelerator.display_name
        ax.plot(
            chunk,
            upper,
            color=color,
            linestyle=style.linestyle,
            label=f"{name}, no overlap (L*={optimum:.0f})",
        )
        ax.plot(chunk, lower, ":", color=color, label=f"{name}, full overlap")
        ax.plot([optimum], [best], marker=style.marker, color=color, linestyle="")
        ends.append((accelerator, optimum, best))
    _log2_x(ax, "chunk size L [tokens]")
    ax.set_yscale("log")
    ax.set_ylabel("theoretical runtime [ms]")
    ax.set_title(
        f"Fig. 20 — runtime vs chunk size; markers: runtime-optimal L*\n{_setting(PAPER_7B)}", fontsize=10
    )
    _finish(ax)
    fig.legend(fontsize=8, loc="outside right center")
    _gpu_labels(ax, ends)
    return fig


def _state_dtype_panels(draw: Callable[[Axes, int], str], ylabel: str, title: str) -> Figure:
    """Two panels sharing y, the chunk states C in float32 (4 bytes) and in bfloat16 (2 bytes);
    `draw(ax, state_bytes)` fills a panel and returns what its title adds to the state's dtype."""
    fig = new_figure(12, 4.8)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, state_bytes in zip(axes, (4, 2), strict=True):
        detail = draw(ax, state_bytes)
        ax.set_title(
            f"state C in {'float32' if state_bytes == 4 else 'bfloat16'} ({state_bytes} bytes){detail}"
        )
        _finish(ax)
    axes[0].set_ylabel(ylabel)
    fig.legend(*axes[-1].get_legend_handles_labels(), fontsize=8, loc="outside right center")
    fig.suptitle(title)
    return fig


def figure_intensity_vs_chunk_size(context: FigureContext) -> Figure:
    """Fig. 21: arithmetic intensity of the mLSTMsig forward vs chunk size, fp32 and bf16 states."""
    chunk = _chunk_grid(PAPER_7B.seq_len)

    def draw(ax: Axes, state_bytes: int) -> str:
        for dhv, style in ((512, "-"), (256, "--"), (128, "-.")):
            shape = replace(PAPER_7B, head_dim_qk=dhv // 2, head_dim_v=dhv, state_bytes=state_bytes)
            ax.plot(chunk, _intensity(shape, chunk), style, color="black", label=f"mLSTMsig d_hv={dhv}")
        for accelerator in context.accelerators:
            ax.axhline(
                accelerator.intensity_flops_per_byte,
                color=accelerator_style(accelerator).color,
                linestyle=accelerator_style(accelerator).linestyle,
                linewidth=1.2,
                label=f"{accelerator.display_name} ridge {accelerator.intensity_flops_per_byte:.0f}",
            )
        _log2_x(ax)
        ax.set_yscale("log")
        return ""

    return _state_dtype_panels(
        draw,
        "arithmetic intensity [FLOP/byte]",
        "Fig. 21 — intensity grows with L and crosses each GPU's ridge point (d_qk = d_hv/2)\n"
        f"{QKV_DTYPE} q/k/v and gates",
    )


def figure_roofline(context: FigureContext) -> Figure:
    """Fig. 22: rooflines of the accelerators with the 7B mLSTMsig forward placed at each chunk size."""
    fig = new_figure(10, 5.8)
    ax = fig.subplots()
    intensities = _intensity(PAPER_7B, np.array(MARKED_CHUNK_SIZES, dtype=float))
    draw_roofs(ax, context.roofs, np.geomspace(1, 1e4, 300))
    ridges = []
    for accelerator in context.accelerators:
        style = accelerator_style(accelerator)
        attained = [roofline_flops_per_s(i, accelerator) / 1e12 for i in intensities]
        ax.plot(intensities, attained, marker=style.marker, color=style.color, markersize=5, linestyle="")
        ridges.append(
            (accelerator, accelerator.intensity_flops_per_byte, accelerator.peak_flops_per_s / 1e12)
        )
    for intensity in intensities:
        ax.axvline(intensity, color="grey", linewidth=0.6, alpha=0.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = ax.secondary_xaxis("top")
    top.set_xticks(intensities, labels=[str(c) for c in MARKED_CHUNK_SIZES], fontsize=8)
    top.xaxis.set_minor_locator(NullLocator())
    top.set_xlabel("chunk size L placed at its intensity")
    ax.set_xlabel("arithmetic intensity [FLOP/byte]")
    ax.set_ylabel("attainable performance [TFLOP/s]")
    ax.set_title(
        f"Fig. 22 — roofline; markers: chunk sizes, labels: ridge points\n{_setting(PAPER_7B)}", fontsize=10
    )
    _finish(ax)
    fig.legend(fontsize=8, loc="outside right center")
    _gpu_labels(ax, ridges)
    return fig


def figure_flops_per_s_and_flops(context: FigureContext) -> Figure:
    """Fig. 23: model FLOP/s and total FLOPs vs chunk size: FLOP/s rises with L, so do the FLOPs."""
    accelerators = context.accelerators
    fig = new_figure(13, 5.4)
    left, right = fig.subplots(1, 2)
    chunk = _chunk_grid(PAPER_7B.seq_len)
    flops = PAPER_7B.flop_terms().total(PAPER_7B.seq_len, chunk) * PAPER_7B.batch * PAPER_7B.heads
    ends = []
    for accelerator in accelerators:
        style = accelerator_style(accelerator)
        achieved = flops / (_runtime_ms(PAPER_7B, chunk, accelerator, overlap=False) / 1e3)
        left.plot(
            chunk,
            achieved / 1e12,
            color=style.color,
            linestyle=style.linestyle,
            label=f"{accelerator.display_name}: FLOPs / runtime",
        )
        left.axhline(accelerator.peak_flops_per_s / 1e12, linestyle="--", linewidth=0.8, color=style.color)
        ends.append((accelerator, chunk[-1], achieved[-1] / 1e12))
    _log2_x(left, "chunk size L [tokens]")
    left.set_yscale("log")
    left.set_ylabel("model FLOP/s, no overlap [TFLOP/s]")
    left.set_title("FLOP/s rises with L (dashed: peak)")
    left.legend(fontsize=8)
    _finish(left)

    right.plot(chunk, flops / 1e12, color="black", label="FLOPs")
    _log2_x(right, "chunk size L [tokens]")
    right.set_ylabel("FLOPs [TFLOP]")
    _finish(right)
    runtime_axis = right.twinx()
    for accelerator in accelerators:
        runtime = _runtime_ms(PAPER_7B, chunk, accelerator, overlap=False)
        runtime_axis.plot(
            chunk,
            runtime,
            ":",
            color=accelerator_style(accelerator).color,
            marker=accelerator_style(accelerator).marker,
            markevery=40,
            label=f"{accelerator.display_name} runtime",
        )
    runtime_axis.set_yscale("log")
    runtime_axis.set_ylabel("theoretical runtime, no overlap [ms]")
    lines = right.get_legend_handles_labels()
    twin_lines = runtime_axis.get_legend_handles_labels()
    right.legend(lines[0] + twin_lines[0], lines[1] + twin_lines[1], fontsize=8, loc="upper center")
    right.set_title("FLOPs rise with L too: runtime has a minimum")
    fig.suptitle(f"Fig. 23 — FLOP/s is not the metric to pick L by\n{_setting(PAPER_7B)}", fontsize=11)
    _gpu_labels(left, ends)
    return fig


def figure_runtime_optimal_chunk_vs_head_dim(context: FigureContext) -> Figure:
    """Fig. 24: runtime-optimal chunk size of mLSTMsig vs head dim, fp32 and bf16 states (p_qk = 0.5)."""
    # A long sequence so that the [1, T] clipping never hides the sqrt(d_hv) law.
    seq_len = 2**20

    def draw(ax: Axes, state_bytes: int) -> str:
        shapes = [
            MlstmShape("sig", seq_len, int(dhv) // 2, int(dhv), state_bytes=state_bytes)
            for dhv in HEAD_DIMS_V
        ]
        for accelerator in context.accelerators:
            optima = [
                runtime_optimal_chunk_size(s.flop_terms(), s.byte_terms(), accelerator, seq_len)
                for s in shapes
            ]
            style = accelerator_style(accelerator)
            ax.plot(
                HEAD_DIMS_V,
                optima,
                color=style.color,
                linestyle=style.linestyle,
                marker=style.marker,
                markevery=_POWERS_OF_TWO,
                label=accelerator.display_name,
            )
        flop_optima = [flop_optimal_chunk_size(s.flop_terms(), seq_len) for s in shapes]
        ax.plot(HEAD_DIMS_V, flop_optima, "--", color="black", label="FLOP-optimal (any GPU)")
        _log2_x(ax, "head dim d_hv")
        _log2_y(ax)
        return ", p_qk=0.5"

    return _state_dtype_panels(
        draw,
        "runtime-optimal chunk size L [tokens] (no overlap)",
        "Fig. 24 — runtime-optimal chunk size of mLSTMsig grows as sqrt(d_hv), far above the FLOP optimum\n"
        f"{QKV_DTYPE} q/k/v and gates, T=2^20",
    )


def figure_runtime_optimal_chunk_vs_intensity(context: FigureContext) -> Figure:
    """Fig. 25: runtime-optimal chunk size of mLSTMsig vs accelerator intensity I_acc, for several d_hv."""
    fig = new_figure(10, 5.4)
    ax = fig.subplots()
    seq_len = 2**20
    intensities = np.geomspace(10, 2000, 200)
    # Only the ratio peak/bandwidth enters the optimum; fix the bandwidth at 1e12 bytes/s.
    sweep = [Accelerator("sweep", i * 1e12, 1e12) for i in intensities]
    shapes = {dhv: MlstmShape("sig", seq_len, dhv // 2, dhv) for dhv in (128, 256, 512, 1024)}
    for dhv, shape in shapes.items():
        optima = [
            runtime_optimal_chunk_size(shape.flop_terms(), shape.byte_terms(), a, seq_len) for a in sweep
        ]
        ax.plot(
            intensities, optima, color="black", alpha=0.35 + 0.6 * np.log2(dhv / 128) / 3, label=f"d_hv={dhv}"
        )
    for accelerator in context.accelerators:
        style = accelerator_style(accelerator)
        color = style.color
        ax.axvline(accelerator.intensity_flops_per_byte, color=color, linestyle=style.linestyle, linewidth=1)
        on_curves = [
            runtime_optimal_chunk_size(shape.flop_terms(), shape.byte_terms(), accelerator, seq_len)
            for shape in shapes.values()
        ]
        ax.plot(
            [accelerator.intensity_flops_per_byte] * len(on_curves),
            on_curves,
            linestyle="none",
            marker=style.marker,
            color=color,
            label=f"{accelerator.display_name} (I_acc={accelerator.intensity_flops_per_byte:.0f})",
        )
    ax.set_xscale("log")
    _log2_y(ax)
    ax.set_xlabel("accelerator intensity I_acc = peak / bandwidth [FLOP/byte]")
    ax.set_ylabel("runtime-optimal chunk size L [tokens] (no overlap)")
    ax.set_title(
        "Fig. 25 — runtime-optimal chunk size of mLSTMsig grows as sqrt(I_acc)\n"
        f"p_qk=0.5, F_c=0.5, {QKV_DTYPE} q/k/v, state C in float32"
    )
    _finish(ax)
    fig.legend(fontsize=8, loc="outside right center")
    return fig


def model_plots() -> list[Plot]:
    """The analytic model's figures, paper Figs. 18-25, drawn for the context's GPUs."""
    captions = (
        "FLOPs of the mLSTMsig forward over the chunk size for three head dims: the chunkwise form "
        "moves from the recurrent (L=1) to the parallel (L=T) count, with a FLOP-optimal L between.",
        "FLOP-optimal chunk size over the head dim d_hv for several causal factors: it grows as sqrt(d_hv).",
        "Theoretical runtime of the 7B mLSTMsig forward over the chunk size on each GPU, with and "
        "without overlap of compute and memory; markers: the runtime-optimal L.",
        "Arithmetic intensity over the chunk size for three head dims, fp32 and bf16 states, against "
        "each GPU's ridge point.",
        "Each GPU's roofline with the 7B mLSTMsig forward placed at its intensity for each chunk size.",
        "Model FLOP/s and total FLOPs over the chunk size: FLOP/s rises with L, and so do the FLOPs, so "
        "the runtime has a minimum.",
        "Runtime-optimal chunk size over the head dim on each GPU, fp32 and bf16 states, beside the "
        "FLOP optimum.",
        "Runtime-optimal chunk size over the accelerator intensity I_acc for several head dims, with "
        "each GPU's I_acc marked.",
    )
    draws = (
        figure_flops_vs_chunk_size,
        figure_flop_optimal_chunk_vs_head_dim,
        figure_runtime_vs_chunk_size,
        figure_intensity_vs_chunk_size,
        figure_roofline,
        figure_flops_per_s_and_flops,
        figure_runtime_optimal_chunk_vs_head_dim,
        figure_runtime_optimal_chunk_vs_intensity,
    )
    return [Plot(n, c, d) for n, c, d in zip(FIGURE_NAMES, captions, draws, strict=True)]
