"""CLI commands of the analytic model: `tfla-bench model {flops,bytes,runtime,intensity,optimal-chunk}`
and `tfla-bench roofline` (the paper's Figs. 18-25 and the optimal chunk sizes per GPU).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from tfla_bench.cli.options import JsonOption
from tfla_bench.cli.paths import output_dir, path_option
from tfla_bench.errors import UserError
from tfla_bench.measure.roofs import BANDWIDTH_RULE, FLOPS_RULE, measured_accelerator
from tfla_bench.measure.settings import Rule
from tfla_bench.model.counts import MlstmShape, check_chunk_size
from tfla_bench.model.hardware import ACCELERATORS, CUSTOM, Accelerator, resolve_accelerator
from tfla_bench.model.roofline import ChunkOptima, Estimate, chunk_optima, chunkwise_runtime_s
from tfla_bench.run import specs
from tfla_bench.run.console import make_console

DEFAULT_ROOFLINE_GPUS = ("v100", "a100", "h100", "h200", "b200")
# The paper's Fig. 5 mLSTMsig setting (the README's example): the defaults of every `model` flag.
FIG5 = MlstmShape(gate="sig", seq_len=8192, head_dim_qk=128, head_dim_v=256, batch=8, heads=16)
FIG5_CHUNK = 128


class Gate(StrEnum):
    exp = "exp"
    sig = "sig"


class Formulation(StrEnum):
    chunkwise = "chunkwise"
    parallel = "parallel"
    recurrent = "recurrent"


_GPU_HELP = (
    f"accelerator: {', '.join(ACCELERATORS)}, auto (the present CUDA GPU), "
    "measured (the roofs `tfla-bench roofs` saved) or custom"
)
GateOption = Annotated[Gate, typer.Option("--gate", help="input gate: exp (mLSTMexp) or sig (mLSTMsig)")]
FormulationOption = Annotated[Formulation, typer.Option("--formulation", help="mLSTM formulation")]
SeqLenOption = Annotated[int, typer.Option("--seq-len", help="sequence length T")]
ChunkOption = Annotated[
    int | None,
    typer.Option(
        "--chunk-size",
        help=f"chunk size L (chunkwise only; default {FIG5_CHUNK}); for optimal-chunk the L the counts are "
        "shown at (default: the best power of two)",
    ),
]
HeadDimQkOption = Annotated[int, typer.Option("--head-dim-qk", help="query/key head dim d_qk")]
HeadDimVOption = Annotated[int, typer.Option("--head-dim-v", help="value/hidden head dim d_hv")]
CausalOption = Annotated[
    float, typer.Option("--causal-factor", help="fraction of the L x L matrices computed (0.5 ideal causal)")
]
BatchOption = Annotated[int, typer.Option("--batch", help="batch size")]
HeadsOption = Annotated[int, typer.Option("--heads", help="number of heads")]
QkvBytesOption = Annotated[float, typer.Option("--qkv-bytes", help="bytes per element of q, k, v, h")]
GateBytesOption = Annotated[float, typer.Option("--gate-bytes", help="bytes per element of the gates i, f")]
StateBytesOption = Annotated[
    float, typer.Option("--state-bytes", help="bytes per element of the states C, n, m")
]
GpuOption = Annotated[str, typer.Option("--gpu", help=_GPU_HELP)]
PeakOption = Annotated[
    float | None,
    typer.Option("--peak-flops", help="peak FLOP/s; overrides the GPU's or defines --gpu custom"),
]
BandwidthOption = Annotated[
    float | None,
    typer.Option(
        "--bandwidth", help="memory bandwidth in bytes/s; overrides the GPU's or defines --gpu custom"
    ),
]


def _si(value: float, unit: str) -> str:
    for prefix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _count(value: float, unit: str) -> str:
    return f"{value:,.0f} ({_si(value, unit)})"


def _setting_fields(
    shape: MlstmShape, formulation: str, chunk_size: int | None, accelerator: Accelerator
) -> dict[str, Any]:
    return {
        "gate": shape.gate,
        "formulation": formulation,
        "seq_len": shape.seq_len,
        "chunk_size": chunk_size,
        "head_dim_qk": shape.head_dim_qk,
        "head_dim_v": shape.head_dim_v,
        "batch": shape.batch,
        "heads": shape.heads,
        "causal_factor": shape.causal_factor,
        "qkv_bytes": shape.qkv_bytes,
        "gate_bytes": shape.gate_bytes,
        "state_bytes": shape.state_bytes,
        "gpu": accelerator.name,
        "peak_flops_per_s": accelerator.peak_flops_per_s,
        "bandwidth_bytes_per_s": accelerator.bandwidth_bytes_per_s,
    }


def _estimate_fields(estimate: Estimate) -> dict[str, Any]:
    return {
        "flops": estimate.flops,
        "bytes": estimate.bytes_moved,
        "arithmetic_intensity": estimate.arithmetic_intensity,
        "runtime_ms_lower": estimate.runtime_ms_lower,
        "runtime_ms_upper": estimate.runtime_ms_upper,
        "compute_ms": estimate.compute_ms,
        "memory_ms": estimate.memory_ms,
        "accelerator_intensity": estimate.accelerator.intensity_flops_per_byte,
        "roofline_flops_per_s": estimate.roofline_flops_per_s,
        "bound": estimate.bound,
    }


def _rows(
    kind: str, shape: MlstmShape, estimate: Estimate, optima: ChunkOptima | None
) -> list[tuple[str, str]]:
    calls = shape.batch * shape.heads
    accelerator = estimate.accelerator
    if kind == "flops":
        return [
            ("FLOPs", _count(estimate.flops, "FLOP")),
            ("FLOPs per head per sequence", _count(estimate.flops / calls, "FLOP")),
        ]
    if kind == "bytes":
        return [
            ("bytes moved", _count(estimate.bytes_moved, "B")),
            ("bytes per head per sequence", _count(estimate.bytes_moved / calls, "B")),
        ]
    if kind == "runtime":
        return [
            ("runtime, no overlap (upper bound)", f"{estimate.runtime_ms_upper:.4g} ms"),
            ("runtime, full overlap (lower bound)", f"{estimate.runtime_ms_lower:.4g} ms"),
            ("compute time FLOPs / peak", f"{estimate.compute_ms:.4g} ms"),
            ("memory time bytes / bandwidth", f"{estimate.memory_ms:.4g} ms"),
            ("peak", _si(accelerator.peak_flops_per_s, "FLOP/s")),
            ("bandwidth", _si(accelerator.bandwidth_bytes_per_s, "B/s")),
        ]
    if kind == "intensity":
        return [
            ("arithmetic intensity", f"{estimate.arithmetic_intensity:.4g} FLOP/B"),
            ("accelerator intensity (ridge point)", f"{accelerator.intensity_flops_per_byte:.4g} FLOP/B"),
            ("bound", estimate.bound),
            ("roofline min(bandwidth * I, peak)", _si(estimate.roofline_flops_per_s, "FLOP/s")),
        ]
    assert optima is not None
    return [
        ("FLOP-optimal L (closed form)", f"{optima.flop_optimal_chunk_size:.2f}"),
        ("FLOP-optimal L (numeric argmin)", f"{optima.flop_optimal_chunk_size_numeric:.2f}"),
        ("runtime-optimal L, no overlap (closed form)", f"{optima.runtime_optimal_chunk_size:.2f}"),
        (
            "runtime-optimal L, no overlap (numeric argmin)",
            f"{optima.runtime_optimal_chunk_size_numeric:.2f}",
        ),
        ("best power-of-two L (runtime)", str(optima.best_power_of_two_chunk_size)),
        ("best power-of-two L (FLOPs)", str(optima.best_power_of_two_flop_chunk_size)),
        ("runtime at the shown L, no overlap", f"{estimate.runtime_ms_upper:.4g} ms"),
    ]


def _chunk_and_optima(
    kind: str, formulation: Formulation, chunk_size: int | None, shape: MlstmShape, accelerator: Accelerator
) -> tuple[int | None, ChunkOptima | None]:
    """The chunk size the counts are shown at (None: not chunkwise) and, for optimal-chunk, the optima.

    A chunkwise count without `--chunk-size` is at the Fig. 5 chunk, optimal-chunk's at the best
    power of two."""
    optima = None
    if kind == "optimal-chunk":
        if formulation is not Formulation.chunkwise:
            raise UserError("optimal-chunk needs --formulation chunkwise")
        optima = chunk_optima(shape.flop_terms(), shape.byte_terms(), accelerator, shape.seq_len)
        if chunk_size is None:
            chunk_size = optima.best_power_of_two_chunk_size
    if chunk_size is not None:
        check_chunk_size(shape.seq_len, chunk_size)
    if formulation is not Formulation.chunkwise:
        if chunk_size is not None:
            raise UserError(f"--chunk-size: the {formulation.value} formulation has no chunks; drop it")
        return None, optima
    if chunk_size is None:
        check_chunk_size(shape.seq_len, FIG5_CHUNK)
        chunk_size = FIG5_CHUNK
    return chunk_size, optima


def _report(
    kind: str,
    shape: MlstmShape,
    formulation: Formulation,
    chunk_size: int | None,
    accelerator: Accelerator,
    as_json: bool,
) -> None:
    chunk_size, optima = _chunk_and_optima(kind, formulation, chunk_size, shape, accelerator)
    estimate = Estimate(
        shape.flops(formulation.value, chunk_size),
        shape.bytes_moved(formulation.value, chunk_size),
        accelerator,
    )
    if as_json:
        payload = _setting_fields(shape, formulation.value, chunk_size, accelerator) | _estimate_fields(
            estimate
        )
        if optima is not None:
            payload |= {
                "flop_optimal_chunk_size": optima.flop_optimal_chunk_size,
                "flop_optimal_chunk_size_numeric": optima.flop_optimal_chunk_size_numeric,
                "runtime_optimal_chunk_size": optima.runtime_optimal_chunk_size,
                "runtime_optimal_chunk_size_numeric": optima.runtime_optimal_chunk_size_numeric,
                "best_power_of_two_chunk_size": optima.best_power_of_two_chunk_size,
                "best_power_of_two_flop_chunk_size": optima.best_power_of_two_flop_chunk_size,
            }
        print(json.dumps(payload, indent=2))
        return
    chunk_text = f"L={chunk_size}, " if chunk_size is not None else ""
    console = make_console()
    console.print(
        f"{shape.label} {formulation.value} forward on {accelerator.display_name} "
        f"({_si(accelerator.peak_flops_per_s, 'FLOP/s')}, {_si(accelerator.bandwidth_bytes_per_s, 'B/s')})\n"
        f"T={shape.seq_len}, {chunk_text}d_qk={shape.head_dim_qk}, d_hv={shape.head_dim_v}, "
        f"batch={shape.batch}, heads={shape.heads}, F_c={shape.causal_factor:g}\n"
        f"bytes per element: q/k/v {shape.qkv_bytes:g}, gates {shape.gate_bytes:g}, "
        f"states {shape.state_bytes:g}",
        highlight=False,
    )
    table = Table()
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for name, value in _rows(kind, shape, estimate, optima):
        table.add_row(name, value)
    console.print(table)


_DESCRIPTIONS = {
    "flops": "Forward FLOPs of an mLSTM call (batch * heads * the paper's per-head count).",
    "bytes": "Forward memory bytes (loads + stores) of an mLSTM call.",
    "runtime": "Theoretical runtime of an mLSTM call: no-overlap upper and full-overlap lower bound.",
    "intensity": "Arithmetic intensity of an mLSTM call against the accelerator's ridge point and roofline.",
    "optimal-chunk": "Optimal chunk sizes (FLOPs, runtime): closed form, numeric argmin, best power of two.",
}


# The model's float flags and their ranges: a value past them overflows the counts, the times or the
# intensities to inf (a byte per element below one bit, a roof below one FLOP or byte a second).
FLOAT_RULES = {
    "causal_factor": Rule("number", 0, 1, open_low=True),
    "qkv_bytes": Rule("number", 0.125, 16, unit=" bytes"),
    "gate_bytes": Rule("number", 0.125, 16, unit=" bytes"),
    "state_bytes": Rule("number", 0.125, 16, unit=" bytes"),
    "peak_flops": FLOPS_RULE,
    "bandwidth": BANDWIDTH_RULE,
}


def _check_floats(**values: float | None) -> None:
    """One `error:` line for the first float flag outside its range (`FLOAT_RULES`); None is unset."""
    for name, value in values.items():
        rule = FLOAT_RULES[name]
        if value is not None and not rule.accepts(value):
            raise UserError(f"--{name.replace('_', '-')}: expected {rule.expected()}, got {value!r}")


def _make_command(kind: str) -> Callable[..., None]:
    def command(
        seq_len: SeqLenOption = FIG5.seq_len,
        head_dim_qk: HeadDimQkOption = FIG5.head_dim_qk,
        head_dim_v: HeadDimVOption = FIG5.head_dim_v,
        gate: GateOption = Gate.sig,
        formulation: FormulationOption = Formulation.chunkwise,
        chunk_size: ChunkOption = None,
        causal_factor: CausalOption = FIG5.causal_factor,
        batch: BatchOption = FIG5.batch,
        heads: HeadsOption = FIG5.heads,
        qkv_bytes: QkvBytesOption = FIG5.qkv_bytes,
        gate_bytes: GateBytesOption = FIG5.gate_bytes,
        state_bytes: StateBytesOption = FIG5.state_bytes,
        gpu: GpuOption = "h100",
        peak_flops: PeakOption = None,
        bandwidth: BandwidthOption = None,
        as_json: JsonOption = False,
    ) -> None:
        for flag, value in (
            ("--seq-len", seq_len),
            ("--head-dim-qk", head_dim_qk),
            ("--head-dim-v", head_dim_v),
            ("--chunk-size", chunk_size),
            ("--batch", batch),
            ("--heads", heads),
        ):
            # A shape past the spec's cap overflows the model's floats (a traceback, not a number).
            if value is not None and not specs.shape_integer(value):
                raise UserError(
                    f"{flag}: expected a positive integer (at most {specs.MAX_SHAPE:,}), got {value}"
                )
        _check_floats(
            causal_factor=causal_factor,
            qkv_bytes=qkv_bytes,
            gate_bytes=gate_bytes,
            state_bytes=state_bytes,
            peak_flops=peak_flops,
            bandwidth=bandwidth,
        )
        shape = MlstmShape(
            gate=gate.value,
            seq_len=seq_len,
            head_dim_qk=head_dim_qk,
            head_dim_v=head_dim_v,
            batch=batch,
            heads=heads,
            causal_factor=causal_factor,
            qkv_bytes=qkv_bytes,
            gate_bytes=gate_bytes,
            state_bytes=state_bytes,
        )
        accelerator = resolve_accelerator(
            gpu, peak_flops_per_s=peak_flops, bandwidth_bytes_per_s=bandwidth, measured=measured_accelerator
        )
        _report(kind, shape, formulation, chunk_size, accelerator, as_json)

    command.__doc__ = _DESCRIPTIONS[kind]
    return command


def _roofline_accelerators(
    gpus: list[str] | None, peak_flops: float | None, bandwidth: float | None
) -> list[Accelerator]:
    names = [name.strip().lower() for value in (gpus or DEFAULT_ROOFLINE_GPUS) for name in value.split(",")]
    accelerators = [resolve_accelerator(n, measured=measured_accelerator) for n in names if n and n != CUSTOM]
    if CUSTOM in names or peak_flops is not None or bandwidth is not None:
        if peak_flops is None or bandwidth is None:
            raise UserError("a custom accelerator needs both --peak-flops and --bandwidth")
        accelerators.append(
            resolve_accelerator(CUSTOM, peak_flops_per_s=peak_flops, bandwidth_bytes_per_s=bandwidth)
        )
    if not accelerators:
        raise UserError("no accelerator to plot; name one with --gpu or give --peak-flops and --bandwidth")
    unique = {a.name: a for a in accelerators}
    return list(unique.values())


def _summary_table(accelerators: list[Accelerator]) -> Table:
    # matplotlib takes a second to import; only the figures need it.
    from tfla_bench.plots.model_figures import PAPER_7B

    shape = PAPER_7B
    table = Table(
        title=(
            f"Optimal chunk sizes, {shape.label} forward (paper Figs. 20/24):\nT={shape.seq_len}, "
            f"d_qk={shape.head_dim_qk}, d_hv={shape.head_dim_v}, batch={shape.batch}, heads={shape.heads}, "
            f"F_c={shape.causal_factor:g},\nbf16 q/k/v and gates, fp32 state C"
        ),
        caption="runtime: no-overlap model at the best power-of-two L",
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for column in (
        "GPU",
        "I_acc\nFLOP/B",
        "FLOP-opt\nL",
        "runtime-opt\nL",
        "numeric\nargmin",
        "best\n2^k L",
        "runtime\nms",
    ):
        table.add_column(column, justify="left" if column == "GPU" else "right", no_wrap=True)
    flop_terms, byte_terms = shape.flop_terms(), shape.byte_terms()
    calls = shape.batch * shape.heads
    for accelerator in accelerators:
        optima = chunk_optima(flop_terms, byte_terms, accelerator, shape.seq_len)
        best_runtime_s = calls * chunkwise_runtime_s(
            flop_terms, byte_terms, accelerator, shape.seq_len, optima.best_power_of_two_chunk_size
        )
        table.add_row(
            accelerator.display_name,
            f"{accelerator.intensity_flops_per_byte:.1f}",
            f"{optima.flop_optimal_chunk_size:.1f}",
            f"{optima.runtime_optimal_chunk_size:.1f}",
            f"{optima.runtime_optimal_chunk_size_numeric:.1f}",
            str(optima.best_power_of_two_chunk_size),
            f"{best_runtime_s * 1e3:.3f}",
        )
    return table


def roofline(
    gpu: Annotated[
        list[str] | None,
        typer.Option(
            "--gpu",
            help=f"GPUs to draw, repeated or comma-separated (default {','.join(DEFAULT_ROOFLINE_GPUS)}); "
            + _GPU_HELP,
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", parser=path_option("--out"), help="folder for the PNG and SVG figures")
    ] = Path("results/figures"),
    peak_flops: Annotated[
        float | None, typer.Option("--peak-flops", help="peak FLOP/s of an extra custom accelerator")
    ] = None,
    bandwidth: Annotated[
        float | None, typer.Option("--bandwidth", help="bandwidth in bytes/s of an extra custom accelerator")
    ] = None,
    measured: Annotated[
        Path | None,
        typer.Option("--measured", help="a run directory whose measurements to place on the roofline"),
    ] = None,
    measured_gpu: Annotated[
        str | None,
        typer.Option(
            "--measured-gpu", help="with --measured: place the rows of this GPU (runs that mix GPUs)"
        ),
    ] = None,
) -> None:
    """Write the model figures (paper Figs. 18-25) as PNG and SVG; print the optimal chunk sizes per GPU."""
    _check_floats(peak_flops=peak_flops, bandwidth=bandwidth)
    if measured_gpu is not None and measured is None:
        raise UserError("--measured-gpu picks the rows of the --measured run; give --measured RUN too")
    accelerators = _roofline_accelerators(gpu, peak_flops, bandwidth)
    if measured is not None and not measured.is_dir():
        raise UserError(f"--measured {measured} is not a directory")
    output_dir(out, "--out")
    # matplotlib takes a second to import; only the figures need it.
    from tfla_bench.plots import catalog

    run = catalog.measured_run(measured, measured_gpu) if measured is not None else None
    written = catalog.write_model_figures(out, accelerators)
    if run is not None:
        written += catalog.plot_measured_roofline(run, out, accelerators)
    console = make_console()
    console.print(_summary_table(accelerators))
    # Plain print: rich would wrap long paths, and a path should be copyable as one line.
    print(f"wrote {len(written)} files:")
    for path in written:
        print(f"  {path}")


def register(app: typer.Typer) -> None:
    """Add the `model` sub-app and the top-level `roofline` command to the main app."""
    model_app = typer.Typer(
        name="model",
        help="The TFLA paper's analytic model: FLOPs, bytes, runtime, intensity, optimal chunk size.",
        no_args_is_help=True,
    )
    for kind in _DESCRIPTIONS:
        model_app.command(kind)(_make_command(kind))
    app.add_typer(model_app, name="model")
    app.command("roofline")(roofline)
