"""Measured runs on the analytic model: roofline overlay, measured vs theoretical runtime, fraction of bound.

`plot_measured_roofline(run_dir, out_dir, accelerators)` (called by `tfla-bench roofline
--measured RUN_DIR`) writes:

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
- `roofline_profiled_<mode>.png` (runs profiled under ncu, `tfla_bench.profiling`): every profiled
  row of any kernel at its measured intensity (filled), linked by a thin line to its model
  intensity (hollow).

Where the run recorded measured roofs (`env.json`, `tfla_bench.roofs`), the roofline figures draw
them (matmul and HBM solid black, L2 dotted) beside the data-sheet roofs, place profiled rows at
their measured intensity, and ring in red every point above the measured roof.

The theory curves use the paper's model settings (causal factor 0.5, states in fp32, q/k/v and
gates in the run's dtype); the measured points use the FLOPs and bytes the adapters recorded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tfla_bench.compare import Run, load_run, param_columns
from tfla_bench.model.counts import mlstm_bytes, mlstm_flops, mode_bytes, mode_flops
from tfla_bench.model.hardware import Accelerator, detect_accelerator
from tfla_bench.model.roofline import runtime_ms_lower, runtime_ms_upper
from tfla_bench.plots.runs import (
    MODE_TITLES,
    SHORT_NAMES,
    chunk_sweep_shapes,
    kernel_color,
    save_figures,
    select_shape,
    set_log2_x,
    shape_slug,
)
from tfla_bench.profiling import roof_check
from tfla_bench.published import CASE_KEYS, MLSTM_GATES
from tfla_bench.roofs import MeasuredRoofs, from_env

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
STATE_BYTES = 4
ACCELERATOR_STYLES = ("-", "--", ":", "-.")
ACCELERATOR_COLORS = ("#222222", "#1f77b4", "#2ca02c", "#d62728", "#9467bd")
MIN_THEORY_CHUNK = 16
# The gid of the thin line from a profiled row's model intensity to its measured one.
PROFILE_LINK = "profile-link"


def chunkwise_mlstm_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Ok rows of chunkwise mLSTM adapters (`MLSTM_GATES`) with FLOPs, bytes and a runtime."""
    rows = results[
        results["kernel"].isin(MLSTM_GATES)
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
    detected = detect_accelerator(run.gpu_name)
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
    own, _ = own_accelerator(run, accelerators)
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
    fig = Figure(figsize=(9, 1.5 + 0.45 * len(order)), layout="constrained")
    ax = fig.subplots()
    offsets = {"fw": -0.15, "fwbw": 0.15}
    markers = {"fw": "o", "fwbw": "s"}
    for mode in ("fw", "fwbw"):
        rows = fractions[fractions["mode"] == mode]
        if rows.empty:
            continue
        y = [order.index(k) + offsets[mode] for k in rows["kernel"]]
        colors = [kernel_color(k) for k in rows["kernel"]]
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
    ax.set_title(f"{run.spec}: how close each kernel runs to the roofline (one point per case)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    return fig


def _roof(ax: Any, accelerator: Accelerator, intensities: np.ndarray, style: str, color: str) -> None:
    roof = np.minimum(accelerator.bandwidth_bytes_per_s * intensities, accelerator.peak_flops_per_s)
    ax.plot(
        intensities, roof / 1e12, linestyle=style, color=color, label=f"{accelerator.display_name} roofline"
    )
    ridge = accelerator.intensity_flops_per_byte
    ax.axvline(ridge, color=color, linestyle=style, alpha=0.3, linewidth=0.8)


def _measured_roofs(ax: Any, roofs: MeasuredRoofs, intensities: np.ndarray) -> None:
    peak = roofs.matmul_flops_per_s
    for bandwidth, style, what in ((roofs.hbm_bytes_per_s, "-", "HBM"), (roofs.l2_bytes_per_s, ":", "L2")):
        ax.plot(
            intensities,
            np.minimum(bandwidth * intensities, peak) / 1e12,
            linestyle=style,
            color="black",
            linewidth=2.0 if what == "HBM" else 1.2,
            label=f"measured: {peak / 1e12:.0f} TFLOP/s, {what} {bandwidth / 1e12:.2f} TB/s",
        )


def _profiled_points(ax: Any, check: pd.DataFrame) -> None:
    """Profiled rows at their measured intensity, each linked to its model intensity; points above
    the measured roof ringed in red."""
    for index, (_, row) in enumerate(check[check["measured_intensity"].notna()].iterrows()):
        color = kernel_color(row["kernel"])
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


def _intensity_axis(values: list[float], accelerators: list[Accelerator]) -> np.ndarray:
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    low = min(min(finite, default=1.0) / 4, 1.0)
    high = max(
        max(finite, default=1.0) * 4, max((a.intensity_flops_per_byte for a in accelerators), default=1) * 4
    )
    return np.logspace(math.log10(low), math.log10(high), 200)


def measured_roofline_figure(
    rows: pd.DataFrame,
    accelerators: list[Accelerator],
    mode: str,
    title: str,
    roofs: MeasuredRoofs | None = None,
) -> Figure:
    """Measured chunkwise mLSTM points on each accelerator's roofline (paper Fig. 22 with our points),
    with the measured roofs and the profiled rows' measured intensities where the run has them."""
    rows = rows[rows["mode"] == mode]
    check = roof_check(rows, roofs)
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.subplots()
    intensities = _intensity_axis(
        [*rows["intensity_flops_per_byte"], *check["measured_intensity"].dropna()], accelerators
    )
    for i, acc in enumerate(accelerators):
        _roof(
            ax, acc, intensities, ACCELERATOR_STYLES[i % 4], ACCELERATOR_COLORS[i % len(ACCELERATOR_COLORS)]
        )
    if roofs is not None:
        _measured_roofs(ax, roofs, intensities)
    for kernel, group in rows.groupby("kernel", sort=True):
        ax.scatter(
            group["intensity_flops_per_byte"],
            group["achieved_flops_per_s"] / 1e12,
            color=kernel_color(kernel),
            label=f"{kernel} (measured)",
            zorder=3,
        )
        # One chunk-size label per (kernel, chunk), at the median of its points (several T overlap).
        for chunk, points in group.groupby("chunk_size"):
            ax.annotate(
                f"L={int(chunk)}",
                (points["intensity_flops_per_byte"].median(), points["achieved_flops_per_s"].median() / 1e12),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize="x-small",
                color=kernel_color(kernel),
            )
    _profiled_points(ax, check)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity [FLOP/byte]")
    ax.set_ylabel("performance [TFLOP/s]")
    ax.set_title(f"{title}\n{MODE_TITLES.get(mode, mode)}")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize="small")
    return fig


def profiled_roofline_figure(
    check: pd.DataFrame, accelerators: list[Accelerator], roofs: MeasuredRoofs | None, mode: str, title: str
) -> Figure | None:
    """Every profiled row of `mode`: hollow at its model intensity, filled at its measured one (ncu)."""
    check = check[(check["mode"] == mode) & check["measured_intensity"].notna()]
    if check.empty:
        return None
    fig = Figure(figsize=(10, 6), layout="constrained")
    ax = fig.subplots()
    intensities = _intensity_axis([*check["model_intensity"], *check["measured_intensity"]], accelerators)
    for i, acc in enumerate(accelerators):
        _roof(
            ax, acc, intensities, ACCELERATOR_STYLES[i % 4], ACCELERATOR_COLORS[i % len(ACCELERATOR_COLORS)]
        )
    if roofs is not None:
        _measured_roofs(ax, roofs, intensities)
    for kernel, group in check.groupby("kernel", sort=True):
        ax.scatter(
            group["model_intensity"],
            group["achieved_flops_per_s"] / 1e12,
            facecolors="none",
            edgecolors=kernel_color(kernel),
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
    ax.set_title(f"{title}\nmeasured vs model intensity, {MODE_TITLES.get(mode, mode)}")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def _theory_ms(kernel: str, shape: dict[str, Any], mode: str, dtype: str, chunk: float, acc: Accelerator):
    gate = MLSTM_GATES[kernel]
    element = DTYPE_BYTES.get(dtype, 2)
    dims = {
        "seq_len": shape["seq_len"],
        "head_dim_qk": shape["head_dim_qk"],
        "head_dim_v": shape["head_dim_v"],
    }
    fw_flops = mlstm_flops(gate, "chunkwise", chunk_size=chunk, **dims)
    fw_bytes = mlstm_bytes(
        gate,
        "chunkwise",
        chunk_size=chunk,
        qkv_bytes=element,
        gate_bytes=element,
        state_bytes=STATE_BYTES,
        **dims,
    )
    scale = shape["batch"] * shape["num_heads"]
    flops = mode_flops(fw_flops, "mlstm", mode) * scale
    moved = mode_bytes(fw_bytes, "mlstm", mode) * scale
    return runtime_ms_lower(flops, moved, acc), runtime_ms_upper(flops, moved, acc)


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


def measured_vs_theory_figure(
    rows: pd.DataFrame, shape: dict[str, Any], accelerators: list[Accelerator], mode: str, title: str
) -> Figure | None:
    """Per kernel, measured runtime over chunk size beside the model's bounds per accelerator (Fig. 20)."""
    rows, kernels = _swept(rows, shape, mode)
    if not kernels:
        return None
    fig = Figure(figsize=(max(9, 6 * len(kernels)), 5.5), layout="constrained")
    axes = fig.subplots(1, len(kernels), squeeze=False)[0]
    chunks = _theory_chunks(shape["seq_len"])
    for ax, kernel in zip(axes, kernels, strict=True):
        measured = rows[rows["kernel"] == kernel].sort_values("chunk_size")
        dtype = str(measured["dtype"].iloc[0])
        for i, acc in enumerate(accelerators):
            bounds = [_theory_ms(kernel, shape, mode, dtype, c, acc) for c in chunks]
            color = ACCELERATOR_COLORS[i % len(ACCELERATOR_COLORS)]
            ax.plot(
                chunks, [b[0] for b in bounds], linestyle="--", color=color, label=f"{acc.display_name} lower"
            )
            ax.plot(
                chunks, [b[1] for b in bounds], linestyle=":", color=color, label=f"{acc.display_name} upper"
            )
        ax.plot(
            measured["chunk_size"].astype(float),
            measured["median_ms"],
            marker="o",
            color=kernel_color(kernel),
            label=f"{kernel} measured",
        )
        set_log2_x(ax, chunks)
        ax.set_yscale("log")
        ax.set_xlabel("chunk size L")
        ax.set_ylabel("runtime [ms]")
        ax.set_title(f"{kernel} ({MLSTM_GATES[kernel]} gate)")
        ax.grid(True, which="both", alpha=0.2)
        ax.legend(fontsize="x-small")
    fig.suptitle(
        f"{title}\nmeasured vs theoretical runtime, {MODE_TITLES.get(mode, mode)}", fontsize="medium"
    )
    return fig


def flops_vs_chunk_figure(
    rows: pd.DataFrame, shape: dict[str, Any], accelerators: list[Accelerator], mode: str, title: str
) -> Figure | None:
    """Achieved FLOP/s, total FLOPs and runtime over the chunk size (paper Fig. 23 with our points)."""
    rows, kernels = _swept(rows, shape, mode)
    if not kernels:
        return None
    fig = Figure(figsize=(16, 4.8), layout="constrained")
    ax_rate, ax_flops, ax_time = fig.subplots(1, 3)
    chunks: list[float] = []
    for kernel in kernels:
        measured = rows[rows["kernel"] == kernel].sort_values("chunk_size")
        x = measured["chunk_size"].astype(float)
        chunks += list(x)
        color = kernel_color(kernel)
        ax_rate.plot(x, measured["achieved_flops_per_s"] / 1e12, marker="o", color=color, label=kernel)
        ax_flops.plot(x, measured["flops"] / 1e12, marker="o", color=color, label=kernel)
        ax_time.plot(x, measured["median_ms"], marker="o", color=color, label=kernel)
    for i, acc in enumerate(accelerators):
        ax_rate.axhline(
            acc.peak_flops_per_s / 1e12,
            linestyle=ACCELERATOR_STYLES[i % 4],
            color=ACCELERATOR_COLORS[i % len(ACCELERATOR_COLORS)],
            label=f"{acc.display_name} peak",
        )
    for ax, ylabel, panel in (
        (ax_rate, "achieved [TFLOP/s]", "FLOP/s (measured)"),
        (ax_flops, "FLOPs per call [TFLOP]", "FLOPs (model)"),
        (ax_time, "median runtime [ms]", "runtime (measured)"),
    ):
        set_log2_x(ax, chunks)
        ax.set_xlabel("chunk size L")
        ax.set_ylabel(ylabel)
        ax.set_title(panel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    ax_rate.set_yscale("log")
    fig.suptitle(f"{title}\nFLOP/s, FLOPs and runtime over chunk size, {MODE_TITLES.get(mode, mode)}")
    return fig


def measured_figures(run: Run, accelerators: list[Accelerator]) -> dict[str, Figure]:
    """Every measured-vs-model figure the run supports, keyed by file stem."""
    figures: dict[str, Figure] = {}
    rows = chunkwise_mlstm_rows(run.results)
    title = f"{run.spec} on {run.gpu_name}"
    roofs = from_env(run.env)
    check = roof_check(run.results, roofs)
    for mode in ("fw", "fwbw"):
        if (rows["mode"] == mode).any():
            figures[f"measured_roofline_{mode}"] = measured_roofline_figure(
                rows, accelerators, mode, title, roofs
            )
        profiled = profiled_roofline_figure(check, accelerators, roofs, mode, title)
        if profiled is not None:
            figures[f"roofline_profiled_{mode}"] = profiled
    for shape in chunk_sweep_shapes(rows):
        shape_text = ", ".join(f"{SHORT_NAMES[k]}={v}" for k, v in shape.items())
        for mode in ("fw", "fwbw"):
            shape_title = f"{title}\n{shape_text}"
            theory = measured_vs_theory_figure(rows, shape, accelerators, mode, shape_title)
            if theory is not None:
                figures[f"measured_vs_theory_{shape_slug(shape)}_{mode}"] = theory
            rates = flops_vs_chunk_figure(rows, shape, accelerators, mode, shape_title)
            if rates is not None:
                figures[f"flops_vs_chunk_{shape_slug(shape)}_{mode}"] = rates
    own, detected = own_accelerator(run, accelerators)
    fraction = fraction_figure(run, roofline_fractions(run, accelerators), own, detected)
    if fraction is not None:
        figures["roofline_fraction"] = fraction
    return figures


def plot_measured_roofline(run_dir: Path, out_dir: Path, accelerators: list[Accelerator]) -> list[Path]:
    """Write the measured roofline figures and `roofline_fraction.csv` of a run.

    Args:
        run_dir: a run directory (results.csv and env.json).
        out_dir: where to write the PNGs and the CSV.
        accelerators: the roofs to draw (e.g. H100 and H200); the fraction of the bound is taken
            on the run's own GPU, or on the first of these if the model does not know it.

    Returns:
        The written files.

    Examples::

        >>> from tfla_bench.model.hardware import ACCELERATORS
        >>> plot_measured_roofline(Path("results/runs/fig6_chunk_tradeoff-..."), Path("out"),
        ...                        [ACCELERATORS["h100"], ACCELERATORS["h200"]])  # doctest: +SKIP
    """
    if not accelerators:
        raise ValueError("plot_measured_roofline needs at least one accelerator")
    run = load_run(run_dir)
    paths = save_figures(measured_figures(run, accelerators), out_dir)
    fractions = roofline_fractions(run, accelerators)
    csv_path = out_dir / "roofline_fraction.csv"
    fractions.to_csv(csv_path, index=False)
    return [*paths, csv_path]
