"""CLI command `profile`: a run's cases under Nsight Compute, for the bytes they really move.

Examples::

    tfla-bench profile results/runs/fig5_consttoken-20261121-140458 --seq-len 8192
    tfla-bench profile RUN_DIR --kernel tfla_sig,gla --mode fwbw --ncu-path /usr/local/cuda/bin/ncu
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from tfla_bench.adapters import registry
from tfla_bench.cli.options import _int_list, _names
from tfla_bench.cli.paths import output_dir
from tfla_bench.errors import UserError
from tfla_bench.measure import ncu, roofs
from tfla_bench.measure.row import ResultRow
from tfla_bench.run import rundir, runner
from tfla_bench.run.console import make_console
from tfla_bench.run.specs import Spec

if TYPE_CHECKING:
    from tfla_bench.run.profiling import CaseProfile

NcuPathOption = Annotated[
    Path | None, typer.Option("--ncu-path", help="the ncu executable (default: ncu on PATH)")
]


def register(app: typer.Typer) -> None:
    """Add `profile` to the main app."""
    app.command("profile")(profile)


def profile(
    run_dir: Annotated[Path, typer.Argument(help="a run directory (runs/SPEC-TIMESTAMP)")],
    kernel: Annotated[
        list[str] | None, typer.Option("--kernel", "-k", help="kernel name; repeat or comma-separate")
    ] = None,
    seq_len: Annotated[str | None, typer.Option("--seq-len", help="sequence length(s), e.g. 8192")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="fw, fwbw or fw,fwbw")] = None,
    ncu_path: NcuPathOption = None,
) -> None:
    """Profile the run's ok cases under ncu: DRAM bytes, duration and tensor-pipe use, into profile.csv."""
    if not (run_dir / rundir.SPEC).is_file():
        raise UserError(f"{run_dir}: not a run directory (no {rundir.SPEC})")
    output_dir(run_dir, "run directory")
    read = rundir.read_results(run_dir / rundir.RESULTS)
    if read.skipped:
        print(f"warning: {read.warning()}", file=sys.stderr)
    rows = read.one_per_case()
    seq_lens = _int_list("--seq-len", seq_len) if seq_len is not None else []
    modes = _names([mode] if mode is not None else [], "--mode")
    if bad := [m for m in modes if m not in ("fw", "fwbw")]:
        raise UserError(f"--mode: expected fw or fwbw, got {', '.join(bad)}")
    # pandas takes half a second to import: loaded once the flags are checked.
    from tfla_bench.run import profiling

    chosen = profiling.select_rows(rows, _names(kernel, "--kernel"), seq_lens, modes)
    ncu.require(ncu_path)  # before anything is written: without ncu no row could be profiled
    console = make_console()
    with rundir.RunLock(run_dir, warn=lambda line: print(line, file=sys.stderr)):
        _record_roofs(run_dir, console)
        profile_run(run_dir, chosen, runner.load_run_spec(run_dir), ncu_path, console)


def _record_roofs(run_dir: Path, console: Console) -> None:
    """Give a run without measured roofs in env.json the saved ones of its GPU (under its driver, else
    the latest of that GPU under another driver, with a note), so that its report can flag points
    above them: a run swept before roofs existed, or with --no-roofs."""
    path = run_dir / rundir.ENV
    env = rundir.read_env(run_dir)
    if not env:
        return
    if roofs.from_env(env) is not None:
        return
    if not env.get("gpu_name"):
        return  # a run on the CPU: no GPU whose roofs apply
    gpu_name, driver = str(env["gpu_name"]), str(env.get("driver") or "unknown")
    same_gpu = [record for record in roofs.load_saved() if record.gpu_name == gpu_name]
    record = roofs.saved(gpu_name, driver) or (same_gpu[-1] if same_gpu else None)
    if record is None:
        console.print(
            f"note: no measured roofs of {gpu_name} saved; "
            "`tfla-bench roofs` there lets the report flag points above them"
        )
        return
    if record.driver != driver:
        console.print(
            f"note: the run used driver {driver}; its roofs were measured under driver {record.driver}"
        )
    env["roofs"] = record.to_dict()
    rundir.write_json(path, env)
    console.print(f"recorded the saved roofs of {record.key} in {path}")


def profile_run(
    run_dir: Path, rows: Sequence[ResultRow], spec: Spec, ncu_path: Path | None, console: Console
) -> list[CaseProfile]:
    """Profile `rows` of the run in `run_dir` (measured with `spec`) and print one line per case; without
    ncu, one line saying so (`sweep --ncu` after its rows are written)."""
    from tfla_bench.run import profiling

    executable = ncu.locate(ncu_path)
    if executable is None:
        console.print(f"{ncu.NOT_FOUND}; no case profiled")
        return []
    registry.load()
    console.print(f"profiling {len(rows)} case(s) under ncu (one untimed call each; no timing is taken)")

    def show(result: CaseProfile) -> None:
        label = result.case.key
        if result.status == "ok" and result.measured_bytes is not None:
            intensity = result.measured_intensity
            console.print(
                f"  [green]ok[/] {label}: {result.kernels} kernel(s), {result.measured_bytes / 1e9:.3f} GB"
                + (f", {intensity:.1f} FLOP/B" if intensity else "")
            )
        else:
            console.print(f"  [yellow]{result.status}[/] {label}: {result.error}")

    profiles = profiling.profile_rows(
        run_dir,
        rows,
        executable,
        grad_of=lambda name: spec.measurement_for(registry.get(name)).grad,
        module_of=lambda name: type(registry.get(name)).__module__,
        timeout_s=spec.measurement.timeout_s,
        on_profile=show,
    )
    done = sum(result.status == "ok" for result in profiles)
    console.print(f"{done} of {len(profiles)} case(s) profiled; rows in {run_dir / rundir.PROFILE}")
    return profiles
