"""CLI command `check`: the correctness gate of `tfla_bench.run.correctness`.

Runs every available adapter (or the `--kernel` ones) at a small shape and compares its forward
output with a PyTorch reference of the same math; prints adapter, status, max relative error,
tolerance, pass, and the reason where an adapter did not run or failed.

Exit code: 0 when every adapter that ran passed; 1 when an available adapter failed (error above
its tolerance, an exception, a crash or a timeout). Unavailable and unsupported adapters and
adapters without a reference are listed but do not fail the gate. Mistakes in flags: 2.

What the gate's workers learn of each adapter's `available()` goes into the availability cache
(`tfla_bench.adapters.availability_cache`), so the `list` or sweep plan after it imports no library.

Examples::

    tfla-bench check
    tfla-bench check --kernel gla,simple_gla --json
    tfla-bench check --device cpu --kernel sdpa_math
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import DTYPES
from tfla_bench.cli.options import _names
from tfla_bench.errors import UserError
from tfla_bench.measure import settings
from tfla_bench.run.console import (
    STATUS_STYLE,
    Fitted,
    make_console,
    print_install_hints,
    progress_bar,
    split_reason,
)
from tfla_bench.run.correctness import (
    DEFAULT_TIMEOUT_S,
    GateResult,
    answers_availability,
    available_reasons,
    failed_names,
    json_row,
    run_gate,
)


def register(app: typer.Typer) -> None:
    """Add `check` to the main app."""
    app.command("check")(check)


def check(
    kernel: Annotated[
        list[str] | None,
        typer.Option("--kernel", "-k", help="kernel name; repeat or comma-separate (default: all)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list instead of a table")] = False,
    device: Annotated[
        str, typer.Option("--device", help="auto (CUDA if present), cuda, cuda:N or cpu")
    ] = "auto",
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="input dtype (default: bfloat16; float32 where it cannot run, as in Triton's interpreter)",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help=f"seconds per adapter in the worker, autotuning included (default {DEFAULT_TIMEOUT_S:g})",
        ),
    ] = None,
    isolate: Annotated[
        bool,
        typer.Option(
            "--isolate/--no-isolate",
            help="run the kernels in a worker process (one for all adapters, replaced after a crash, "
            "a hang or a lost CUDA context); --no-isolate runs them in this process",
        ),
    ] = True,
) -> None:
    """Check every available kernel's forward output against a PyTorch reference (exit 1 on a failure)."""
    names = _names(kernel, "--kernel")
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if timeout is not None and not isolate:
        raise UserError(
            "--timeout stops the worker; --no-isolate runs the kernels in this process, where none can"
        )
    timeout = settings.check("timeout_s", DEFAULT_TIMEOUT_S if timeout is None else timeout, "--timeout")
    chosen = names or None
    for name in chosen or []:
        registry.get(name)  # an unknown name is the user's mistake, said before torch loads
    device = _device(device)
    total = len(chosen) if chosen else len(registry.adapters())
    with gate_progress(total, lines=as_json) as callbacks:
        results = run_gate(chosen, device, dtype=dtype, isolate=isolate, timeout_s=timeout, **callbacks)
    # What the gate's workers learned makes the next `list` and sweep plan quick; an adapter whose
    # worker crashed or hung left its answer unknown, so it is asked now (a few seconds of imports
    # here, not in the next command).
    learned = available_reasons(results, device)
    registry.remember_availability(learned)
    unknown = [registry.get(result.name) for result in results if result.name not in learned]
    if unknown and answers_availability(device):
        registry.availability_answers(unknown)
    if as_json:
        typer.echo(json.dumps([json_row(result) for result in results], indent=2))
    else:
        console = make_console()
        console.print(gate_table(results))
        print_install_hints(console, {r.name: r.reason or "" for r in results if r.status == "unavailable"})
    if failed_names(results):
        raise typer.Exit(code=1)


def _device(text: str) -> str:
    # torch takes seconds to import; `--help` does not need it.
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text not in ("cpu", "cuda") and not re.fullmatch(r"cuda:\d+", text):
        raise UserError(f"--device must be auto, cpu, cuda or cuda:N, got {text!r}")
    if text.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(f"--device {text}: no CUDA device is visible")
        index = int(text.partition(":")[2] or 0)
        if index >= count:
            raise UserError(f"--device {text}: only {count} CUDA device(s) are visible")
    return text


@contextmanager
def gate_progress(total: int, *, lines: bool = False) -> Iterator[dict[str, Callable[[Any], None]]]:
    """`run_gate`'s `on_start` / `on_result` callbacks that show the gate's progress on stderr: a bar
    naming the adapter being checked and counting the verdicts so far, gone when the gate ends.

    Args:
        total: the number of adapters.
        lines: also print one line per adapter as it finishes. Only where no table of the verdicts
            follows on the terminal (`--json` keeps stdout for the program reading it), so that a
            person sees each verdict once.
    """
    counts: Counter[str] = Counter()
    with progress_bar(make_console(stderr=True), transient=True) as bar:
        task = bar.add_task("gate", total=total)

        def start(name: str) -> None:
            so_far = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
            bar.update(task, description=f"gate: {name}" + (f" ({so_far} so far)" if so_far else ""))

        def done(result: GateResult) -> None:
            counts[result.status] += 1
            if lines:
                bar.console.print(progress_line(result), highlight=False, soft_wrap=True)
            bar.advance(task)

        yield {"on_start": start, "on_result": done}


def progress_line(result: GateResult) -> str:
    """One line for a finished adapter: status, error against tolerance or the reason, seconds."""
    style = STATUS_STYLE.get(result.status, "red")
    if result.max_rel_error is not None:
        detail = f"max rel err {result.max_rel_error:.2e} (tol {result.tolerance:.0e})"
    else:
        detail = result.reason or ""
    return f"[{style}]{result.status:>11}[/] {result.name} {_seconds(result)}: {detail}"


def _seconds(result: GateResult) -> str:
    return "" if result.seconds is None else f"{result.seconds:.1f} s"


def gate_table(results: list[GateResult]) -> Fitted:
    """The verdicts, narrow enough for 80 columns; an unavailable adapter's install hint is left to
    `print_install_hints`, one unwrapped line each."""
    failed = failed_names(results)
    title = f"correctness gate: {len(results)} adapter(s), {len(failed)} failed"
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in ("adapter", "status", "max rel err (tol)"):
        table.add_column(column, no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("reason", overflow="fold")
    for result in results:
        style = STATUS_STYLE.get(result.status, "red")
        status = {True: "[green]passed[/]", False: "[red]FAILED[/]"}.get(
            result.passed, f"[{style}]{result.status}[/]"
        )
        error = "-"
        if result.max_rel_error is not None:
            error = f"{result.max_rel_error:.2e} ({result.tolerance:.0e})"
        reason = result.reason or ""
        table.add_row(
            result.name,
            status,
            error,
            _seconds(result) if result.status not in ("unavailable", "unsupported") else "",
            split_reason(reason)[0] if result.status == "unavailable" else reason,
        )
    return Fitted(table)
