"""The analytic model's figures: the TFLA paper's Figs. 18-25 (appendix F/G) for mLSTMsig.

Figures are built on `matplotlib.figure.Figure` objects, not through pyplot, so they need no GUI
backend and leave the backend of an importing notebook alone. Each `figure_*` function returns
one figure; `write_model_figures` saves all of them as PNG and SVG.

Settings follow the paper: Fig. 18 one head with T = 8192; Figs. 20-23 the 7B mLSTMsig
(`PAPER_7B`: d_hv = 512, d_qk = 256, 8 heads, batch 8, T = 8192, fp32 states); Figs. 19, 24, 25
vary the head dim d_hv with d_qk = p_qk * d_hv.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from tfla_bench.model.counts import MlstmShape
from tfla_bench.model.hardware import ACCELERATORS, Accelerator
from tfla_bench.model.roofline import (
    flop_optimal_chunk_size,
    roofline_flops_per_s,
    runtime_optimal_chunk_size,
)

PAPER_7B = MlstmShape(gate="sig", seq_len=8192, head_dim_qk=256, head_dim_v=512, batch=8, heads=8)
FIG18_HEAD_DIMS = ((256, 512), (128, 256), (64, 128))
CAUSAL_FACTORS = (0.5, 0.66, 1.0)
# Even head dims, so that d_qk = d_hv / 2 is an integer too.
HEAD_DIMS_V = np.unique(np.round(np.geomspace(32, 2048, 121) / 2).astype(int) * 2)
_POWERS_OF_TWO = [i for i, dhv in enumerate(HEAD_DIMS_V) if dhv & (dhv - 1) == 0]
MARKED_CHUNK_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
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

_PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _accelerator_index(accelerator: Accelerator) -> int:
    names = list(ACCELERATORS)
    return names.index(accelerator.name) if accelerator.name in names else len(_PALETTE) - 1


def accelerator_color(accelerator: Accelerator) -> str:
    """A fixed color per known GPU (the same in every figure); the last palette entry for others."""
    return _PALETTE[_accelerator_index(accelerator) % len(_PALETTE)]


def accelerator_linestyle(accelerator: Accelerator) -> str:
    """A fixed line style per known GPU for horizontal/vertical reference lines that may coincide."""
    return ("-", "--", "-.", ":")[_accelerator_index(accelerator) % 4]


def accelerator_marker(accelerator: Accelerator) -> str:
    """A fixed marker per known GPU, so that GPUs with nearly equal curves (H100, B200) stay apart."""
    return _MARKERS[_accelerator_index(accelerator) % len(_MARKERS)]


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
        f"{shape.heads} heads, batch {shape.batch}, {shape.state_bytes:g}-byte states"
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


def figure_flops_vs_chunk_size() -> Figure:
    """Fig. 18: FLOPs of the recurrent, parallel and chunkwise mLSTMsig vs chunk size (one head, T=8192)."""
    fig = Figure(figsize=(15, 4.6), layout="constrained")
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
    axes[0].set_ylabel(f"FLOPs (one head, T={seq_len})")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=6, fontsize=9)
    fig.suptitle("Fig. 18 — mLSTMsig forward FLOPs: chunkwise moves from recurrent (L=1) to parallel (L=T)")
    return fig


def figure_flop_optimal_chunk_vs_head_dim() -> Figure:
    """Fig. 19: FLOP-optimal chunk size of mLSTMsig vs head dim d_hv, for p_qk = 0.5 and 1.0."""
    fig = Figure(figsize=(11, 4.6), layout="constrained")
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
    axes[0].set_ylabel("FLOP-optimal chunk size L")
    fig.suptitle("Fig. 19 — FLOP-optimal chunk size of mLSTMsig grows as sqrt(d_hv)")
    return fig


def figure_runtime_vs_chunk_size(accelerators: Sequence[Accelerator]) -> Figure:
    """Fig. 20: theoretical runtime of the 7B mLSTMsig forward vs chunk size on each accelerator."""
    fig = Figure(figsize=(8, 5.2), layout="constrained")
    ax = fig.subplots()
    chunk = _chunk_grid(PAPER_7B.seq_len)
    for accelerator in accelerators:
        color = accelerator_color(accelerator)
        upper = _runtime_ms(PAPER_7B, chunk, accelerator, overlap=False)
        lower = _runtime_ms(PAPER_7B, chunk, accelerator, overlap=True)
        optimum = runtime_optimal_chunk_size(
            PAPER_7B.flop_terms(), PAPER_7B.byte_terms(), accelerator, PAPER_7B.seq_len
        )
        best = _runtime_ms(PAPER_7B, np.array([optimum]), accelerator, overlap=False)[0]
        name = accelerator.display_name
        ax.plot(chunk, upper, color=color, label=f"{name}, no overlap (L*={optimum:.0f})")
        ax.plot(chunk, lower, ":", color=color, label=f"{name}, full overlap")
        ax.plot([optimum], [best], "o", color=color)
    _log2_x(ax)
    ax.set_yscale("log")
    ax.set_ylabel("theoretical runtime (ms)")
    ax.set_title(
        f"Fig. 20 — runtime vs chunk size; dots: runtime-optimal L*\n{_setting(PAPER_7B)}", fontsize=10
    )
    _finish(ax)
    ax.legend(fontsize=8, ncol=2)
    return fig


def figure_intensity_vs_chunk_size(accelerators: Sequence[Accelerator]) -> Figure:
    """Fig. 21: arithmetic intensity of the mLSTMsig forward vs chunk size, fp32 and bf16 states."""
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    chunk = _chunk_grid(PAPER_7B.seq_len)
    for ax, state_bytes in zip(axes, (4, 2), strict=True):
        for dhv, style in ((512, "-"), (256, "--"), (128, "-.")):
            shape = replace(PAPER_7B, head_dim_qk=dhv // 2, head_dim_v=dhv, state_bytes=state_bytes)
            ax.plot(chunk, _intensity(shape, chunk), style, color="black", label=f"mLSTMsig d_hv={dhv}")
        for accelerator in accelerators:
            ax.axhline(
                accelerator.intensity_flops_per_byte,
                color=accelerator_color(accelerator),
                linestyle=accelerator_linestyle(accelerator),
                linewidth=1.2,
                label=f"{accelerator.display_name} ridge {accelerator.intensity_flops_per_byte:.0f}",
            )
        _log2_x(ax)
        ax.set_yscale("log")
        ax.set_title(f"state C in {'float32' if state_bytes == 4 else 'bfloat16'} ({state_bytes} bytes)")
        _finish(ax)
    axes[0].set_ylabel("arithmetic intensity (FLOP/byte)")
    axes[-1].legend(fontsize=8, loc="lower right")
    fig.suptitle("Fig. 21 — intensity grows with L and crosses each GPU's ridge point (d_qk = d_hv/2)")
    return fig


def figure_roofline(accelerators: Sequence[Accelerator]) -> Figure:
    """Fig. 22: rooflines of the accelerators with the 7B mLSTMsig forward placed at each chunk size."""
    fig = Figure(figsize=(9, 5.8), layout="constrained")
    ax = fig.subplots()
    intensities = _intensity(PAPER_7B, np.array(MARKED_CHUNK_SIZES, dtype=float))
    x = np.geomspace(1, 1e4, 300)
    for accelerator in accelerators:
        color = accelerator_color(accelerator)
        roof = [roofline_flops_per_s(i, accelerator) / 1e12 for i in x]
        ax.plot(x, roof, color=color, label=f"{accelerator.display_name} roofline")
        attained = [roofline_flops_per_s(i, accelerator) / 1e12 for i in intensities]
        ax.plot(intensities, attained, "o", color=color, markersize=5)
    for intensity in intensities:
        ax.axvline(intensity, color="grey", linewidth=0.6, alpha=0.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = ax.secondary_xaxis("top")
    top.set_xticks(intensities, labels=[str(c) for c in MARKED_CHUNK_SIZES], fontsize=8)
    top.xaxis.set_minor_locator(NullLocator())
    top.set_xlabel("chunk size L placed at its intensity")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable performance (TFLOP/s)")
    ax.set_title(f"Fig. 22 — roofline; dots: chunk sizes\n{_setting(PAPER_7B)}", fontsize=10)
    _finish(ax)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def figure_flops_per_s_and_flops(accelerators: Sequence[Accelerator]) -> Figure:
    """Fig. 23: model FLOP/s and total FLOPs vs chunk size: FLOP/s rises with L, so do the FLOPs."""
    fig = Figure(figsize=(13, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    chunk = _chunk_grid(PAPER_7B.seq_len)
    flops = PAPER_7B.flop_terms().total(PAPER_7B.seq_len, chunk) * PAPER_7B.batch * PAPER_7B.heads
    for accelerator in accelerators:
        color = accelerator_color(accelerator)
        achieved = flops / (_runtime_ms(PAPER_7B, chunk, accelerator, overlap=False) / 1e3)
        left.plot(chunk, achieved / 1e12, color=color, label=f"{accelerator.display_name}: FLOPs / runtime")
        left.axhline(accelerator.peak_flops_per_s / 1e12, linestyle="--", linewidth=0.8, color=color)
    _log2_x(left)
    left.set_yscale("log")
    left.set_ylabel("model FLOP/s, no overlap (TFLOP/s)")
    left.set_title("FLOP/s rises with L (dashed: peak)")
    left.legend(fontsize=8)
    _finish(left)

    right.plot(chunk, flops / 1e12, color="black", label="FLOPs")
    _log2_x(right)
    right.set_ylabel("FLOPs (TFLOP)")
    _finish(right)
    runtime_axis = right.twinx()
    for accelerator in accelerators:
        runtime = _runtime_ms(PAPER_7B, chunk, accelerator, overlap=False)
        runtime_axis.plot(
            chunk,
            runtime,
            ":",
            color=accelerator_color(accelerator),
            label=f"{accelerator.display_name} runtime",
        )
    runtime_axis.set_yscale("log")
    runtime_axis.set_ylabel("theoretical runtime, no overlap (ms)")
    lines = right.get_legend_handles_labels()
    twin_lines = runtime_axis.get_legend_handles_labels()
    right.legend(lines[0] + twin_lines[0], lines[1] + twin_lines[1], fontsize=8, loc="upper center")
    right.set_title("FLOPs rise with L too: runtime has a minimum")
    fig.suptitle(f"Fig. 23 — FLOP/s is not the metric to pick L by; {_setting(PAPER_7B)}", fontsize=11)
    return fig


def figure_runtime_optimal_chunk_vs_head_dim(accelerators: Sequence[Accelerator]) -> Figure:
    """Fig. 24: runtime-optimal chunk size of mLSTMsig vs head dim, fp32 and bf16 states (p_qk = 0.5)."""
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    # A long sequence so that the [1, T] clipping never hides the sqrt(d_hv) law.
    seq_len = 2**20
    for ax, state_bytes in zip(axes, (4, 2), strict=True):
        shapes = [
            MlstmShape("sig", seq_len, int(dhv) // 2, int(dhv), state_bytes=state_bytes)
            for dhv in HEAD_DIMS_V
        ]
        for accelerator in accelerators:
            optima = [
                runtime_optimal_chunk_size(s.flop_terms(), s.byte_terms(), accelerator, seq_len)
                for s in shapes
            ]
            ax.plot(
                HEAD_DIMS_V,
                optima,
                color=accelerator_color(accelerator),
                marker=accelerator_marker(accelerator),
                markevery=_POWERS_OF_TWO,
                label=accelerator.display_name,
            )
        flop_optima = [flop_optimal_chunk_size(s.flop_terms(), seq_len) for s in shapes]
        ax.plot(HEAD_DIMS_V, flop_optima, "--", color="black", label="FLOP-optimal (any GPU)")
        _log2_x(ax, "head dim d_hv")
        _log2_y(ax)
        ax.set_title(
            f"state C in {'float32' if state_bytes == 4 else 'bfloat16'} ({state_bytes} bytes), p_qk=0.5"
        )
        _finish(ax)
    axes[0].set_ylabel("runtime-optimal chunk size L (no overlap)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(
        "Fig. 24 — runtime-optimal chunk size of mLSTMsig grows as sqrt(d_hv), far above the FLOP optimum"
    )
    return fig


def figure_runtime_optimal_chunk_vs_intensity(accelerators: Sequence[Accelerator]) -> Figure:
    """Fig. 25: runtime-optimal chunk size of mLSTMsig vs accelerator intensity I_acc, for several d_hv."""
    fig = Figure(figsize=(9, 5.4), layout="constrained")
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
    for accelerator in accelerators:
        color = accelerator_color(accelerator)
        ax.axvline(
            accelerator.intensity_flops_per_byte,
            color=color,
            linestyle=accelerator_linestyle(accelerator),
            linewidth=1,
        )
        on_curves = [
            runtime_optimal_chunk_size(shape.flop_terms(), shape.byte_terms(), accelerator, seq_len)
            for shape in shapes.values()
        ]
        ax.plot(
            [accelerator.intensity_flops_per_byte] * len(on_curves),
            on_curves,
            linestyle="none",
            marker=accelerator_marker(accelerator),
            color=color,
            label=f"{accelerator.display_name} (I_acc={accelerator.intensity_flops_per_byte:.0f})",
        )
    ax.set_xscale("log")
    _log2_y(ax)
    ax.set_xlabel("accelerator intensity I_acc = peak / bandwidth (FLOP/byte)")
    ax.set_ylabel("runtime-optimal chunk size L (no overlap)")
    ax.set_title(
        "Fig. 25 — runtime-optimal chunk size of mLSTMsig grows as sqrt(I_acc)\n"
        "p_qk=0.5, F_c=0.5, state C in float32"
    )
    _finish(ax)
    ax.legend(fontsize=8, ncol=2)
    return fig


def write_model_figures(out_dir: Path, accelerators: Sequence[Accelerator]) -> list[Path]:
    """Write Figs. 18-25 as PNG and SVG into `out_dir` (created if missing); return the paths written.

    Args:
        out_dir: output folder.
        accelerators: the GPUs drawn in the per-accelerator figures (20-25).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = (
        figure_flops_vs_chunk_size(),
        figure_flop_optimal_chunk_vs_head_dim(),
        figure_runtime_vs_chunk_size(accelerators),
        figure_intensity_vs_chunk_size(accelerators),
        figure_roofline(accelerators),
        figure_flops_per_s_and_flops(accelerators),
        figure_runtime_optimal_chunk_vs_head_dim(accelerators),
        figure_runtime_optimal_chunk_vs_intensity(accelerators),
    )
    written = []
    # Reproducible SVGs (no date, fixed element ids): rewriting the committed figures changes no byte.
    with matplotlib.rc_context({"svg.hashsalt": "tfla-bench"}):
        for name, fig in zip(FIGURE_NAMES, figures, strict=True):
            for suffix, metadata in ((".png", None), (".svg", {"Date": None})):
                path = out_dir / f"{name}{suffix}"
                fig.savefig(path, dpi=150, metadata=metadata)
                written.append(path)
    return written
