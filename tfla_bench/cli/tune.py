"""CLI command `tune`: search our kernels' `KernelConfig` for this GPU at given shapes and add the
winners to the user's tuned-config file, which every later call of `mlstm_tfla` and
`mlstm_limit_chunk` loads (in the suite or not).

Examples::

    tfla-bench tune tfla:sig:8,16,8192,128,256:128
    tfla-bench tune tfla:sig:4,32,8192,128,128:256 tfla:exp:4,32,8192,128,128:128 --for-gpu
    tfla-bench tune tfla:sig:8,16,8192,128,256:64 --tma-only
    tfla-bench tune tfla:exp:8,16,8192,128,256:128 --group fwd
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.cli.bench import MAX_PRECOMPILE
from tfla_bench.cli.paths import output_dir, output_file, writes
from tfla_bench.errors import RunFailed, UserError
from tfla_bench.kernels.contract import interpreted
from tfla_bench.run.console import make_console

if TYPE_CHECKING:
    from rich.console import Console

    from tfla_bench.measure.tuning import Shape, Trial

SHAPE_FORM = "KERNEL:GATE:B,NH,T,DQK,DV:L"
SEARCH_GROUPS = ("fwd", "bwd", "state")  # `tuning.GROUPS`, named here so that --help imports no torch


def register(app: typer.Typer) -> None:
    """Add `tune` to the main app."""
    app.command("tune")(tune)


def tune(
    shapes: Annotated[
        list[str],
        typer.Argument(help=f"shapes as {SHAPE_FORM} (bfloat16), e.g. tfla:sig:8,16,8192,128,256:128"),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="the tuned-config file to add to (default: the user's file)")
    ] = None,
    tables: Annotated[
        Path | None, typer.Option("--tables", help="write each search's table of trials as markdown here")
    ] = None,
    for_gpu: Annotated[
        bool,
        typer.Option("--for-gpu", help="key the entries by this GPU's name, not by its architecture (sm90)"),
    ] = False,
    processes: Annotated[int, typer.Option("--processes", help="compile candidates in N processes")] = 8,
    tma_only: Annotated[
        bool,
        typer.Option(
            "--tma-only",
            help="only try TMA loads (tfla) on the config this GPU takes now at each shape, no whole search",
        ),
    ] = False,
    group: Annotated[
        list[str] | None,
        typer.Option(
            "--group",
            help="search only this group of fields (fwd, bwd or state; repeatable), from the config "
            "this GPU takes now at each shape, then the 16-bit-state and TMA stages",
        ),
    ] = None,
) -> None:
    """Tune our kernels' tile sizes and launch settings for this GPU: each candidate checked against the
    default config's result, timed with the suite's method; the fastest is kept per shape."""
    parsed = [parse_shape(text) for text in shapes]
    if not 0 <= processes <= MAX_PRECOMPILE:
        raise UserError(f"--processes: expected an integer in [0, {MAX_PRECOMPILE}], got {processes}")
    groups = tuple(dict.fromkeys(group or ()))
    if unknown := [name for name in groups if name not in SEARCH_GROUPS]:
        raise UserError(f"--group: expected one of {', '.join(SEARCH_GROUPS)}, got {unknown[0]!r}")
    if groups and tma_only:
        raise UserError("--group and --tma-only: the TMA stage alone searches no group; give one of them")
    if tma_only and (
        others := [text for text, shape in zip(shapes, parsed, strict=True) if shape.kernel != "tfla"]
    ):
        raise UserError(f"--tma-only: TMA loads are an option of the tfla kernel, not of {others[0]}")
    # torch and the kernels are heavy, and only this command needs them at this point.
    import torch

    # import torch and Triton, which only a tuning run needs.
    from tfla_bench.kernels import config as kconfig
    from tfla_bench.measure import tuning

    if not torch.cuda.is_available():
        raise UserError("tune times our kernels on a GPU and needs CUDA; no CUDA device is visible")
    if tma_only and not tuning.tma_available("cuda"):
        major, minor = torch.cuda.get_device_capability()
        raise UserError(f"--tma-only: TMA loads need a GPU of sm90 or later, this one is sm{major}{minor}")
    if tma_only and not kconfig.tma_supported():
        raise UserError(
            "--tma-only: TMA loads need Triton's triton.tools.tensor_descriptor, which is missing"
        )
    path = out or kconfig.user_tuned_file()
    output_file(path, "--out")
    if path.exists():
        try:
            kconfig.load_tuned(path)  # the search's entry is added to it: it must read, before the search
        except ValueError as exc:
            raise UserError(f"--out {exc}; repair or remove it first (nothing was searched)") from None
    if tables is not None:
        output_dir(tables, "--tables")
    arch, name = kconfig.gpu_target(torch.device("cuda"))
    target = name if for_gpu else arch
    console = make_console()
    with tuning.Compiler(processes) as compiler:
        for number, shape in enumerate(parsed, 1):
            console.print(f"[bold]{number}/{len(parsed)} {shape.label()}[/] on {name} (entry for {target})")
            try:
                entry, table = tuning.tune_entry(
                    shape,
                    target,
                    name,
                    compiler,
                    show_trial(console, shape),
                    tma_only=tma_only,
                    groups=groups,
                )
            except tuning.ContextLost as exc:
                given = [
                    *(["--out", str(out)] if out else []),
                    *(["--tables", str(tables)] if tables else []),
                ]
                given += [*(["--for-gpu"] if for_gpu else []), "--processes", str(processes)]
                given += ["--tma-only"] if tma_only else []
                given += [f"--group {name}" for name in groups]
                left = " ".join([*shapes[number - 1 :], *given])
                raise RunFailed(
                    f"{exc}. The {number - 1} shape(s) before it are saved in {path}; "
                    f"to go on, in a new process: tfla-bench tune {left}"
                ) from None
            kconfig.save_entry(path, entry)
            if tables is not None:
                # The search is saved by now: a table that cannot be written costs only itself.
                with writes(f"the table of trials in {tables} (the tuned config is saved in {path})"):
                    tables.mkdir(parents=True, exist_ok=True)
                    (tables / f"tuning-{slug(shape)}.md").write_text(table)
            gain = entry["default_fwbw_ms"] / entry["tuned_fwbw_ms"]
            console.print(
                f"  fwbw {entry['default_fwbw_ms']:.3f} -> {entry['tuned_fwbw_ms']:.3f} ms ({gain:.2f}x), "
                f"fw {entry['default_fw_ms']:.3f} -> {entry['tuned_fw_ms']:.3f} ms; "
                f"{entry['candidates']} candidates in {entry['search_s']:.0f} s "
                f"({entry['compile_s']:.0f} s compiling)"
            )
    console.print(f"saved to {path}")


def parse_shape(text: str) -> Shape:
    """`tfla:sig:8,16,8192,128,256:128` as a `tuning.Shape`; a `UserError` naming the form otherwise."""
    from tfla_bench.measure import tuning  # imports torch, which `--help` does not need

    try:
        kernel, gate, dims, chunk = text.split(":")
        batch, heads, seq_len, dqk, dv = (int(x) for x in dims.split(","))
        shape = tuning.Shape(kernel, gate, batch, heads, seq_len, dqk, dv, int(chunk))
    except ValueError:
        raise UserError(
            f"shape {text!r}: expected {SHAPE_FORM}, e.g. tfla:sig:8,16,8192,128,256:128"
        ) from None
    if (
        kernel not in tuning.KERNELS
        or gate not in ("exp", "sig")
        or (kernel == "limit_chunk" and gate != "exp")
    ):
        raise UserError(f"shape {text!r}: the kernel is tfla (gate exp or sig) or limit_chunk (gate exp)")
    if min(batch, heads, seq_len) < 1 or max(batch, heads, seq_len) > 2**31:
        raise UserError(f"shape {text!r}: batch, heads and T must be integers in [1, 2147483648]")
    # The kernel's own rules (T, chunk, head dims, the on-chip limit), as its adapter states them; in
    # Triton's interpreter, which runs no bfloat16, for float16, of the same size.
    adapter = registry.get("limit_chunk" if kernel == "limit_chunk" else f"tfla_{gate}")
    dtype = "float16" if interpreted() else "bfloat16"
    case = Case(adapter.name, "fwbw", dtype, batch, seq_len, heads, dqk, dv, shape.chunk_size)
    reason = adapter.check(case)
    if reason is not None:
        raise UserError(f"shape {text!r}: {reason}")
    return shape


def show_trial(console: Console, shape: Shape) -> Callable[[Trial], None]:
    """Print each trial of a search as one line: the fields it changes and its median (or why not)."""
    # imports torch, which only a tuning run needs.
    from tfla_bench.measure import tuning

    base = shape.default()

    def show(trial: Trial) -> None:
        if trial.median_ms is not None and trial.screen_ms is not None:
            ms = f"{trial.median_ms:.3f} ms (screened {trial.screen_ms:.3f})"
        elif trial.median_ms is not None:
            ms = f"{trial.median_ms:.3f} ms"
        elif trial.screen_ms is not None:
            ms = f"screened {trial.screen_ms:.3f} ms"
        else:
            ms = trial.error[:100]
        console.print(
            f"  {trial.group:5s} {trial.stage:4s} {tuning.changed_fields(trial.config, base)}: {ms}"
        )

    return show


def slug(shape: Shape) -> str:
    """A file name part for one shape: `tfla-sig-B8-NH16-T8192-Dqk128-Dv256-L128`."""
    return (
        f"{shape.kernel}-{shape.gate}-B{shape.batch}-NH{shape.heads}-T{shape.seq_len}"
        f"-Dqk{shape.head_dim_qk}-Dv{shape.head_dim_v}-L{shape.chunk_size}"
    )
