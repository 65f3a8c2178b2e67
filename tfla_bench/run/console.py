"""What the CLI prints: rich consoles, the progress bar, status colours, one line per finished case,
and the rich tables of a sweep (its planned cases, its runtimes) and of any DataFrame.

Everything printed to a terminal goes through here, so that every command looks the same and a
pipe or a log file gets whole rows.
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter
from collections.abc import Iterable, Mapping

import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.measure.row import ResultRow
from tfla_bench.run.jobs import JobRecord, JobsRecord, Round

# Rich squeezes tables to 80 columns when the output is not a terminal: a log or pipe keeps one row
# per line at these widths.
LOG_WIDTH = 160
TABLE_WIDTH = 250
# A dry run lists this many cases at most; rendering a table of every case of a large grid takes minutes.
MAX_LISTED = 1000
STATUS_STYLE = {
    "ok": "green",
    "oom": "yellow",
    "timeout": "yellow",
    "no_reference": "yellow",
    "crashed": "red",
    "error": "red",
    "failed_check": "red",
    "unavailable": "dim",
    "unsupported": "dim",
    "interrupted": "yellow",
}
# Job states (`tfla_bench.run.jobs`); any other state that ended is a failure.
JOB_STATE_STYLE = {"COMPLETED": "green", "RUNNING": "yellow", "PENDING": "dim", "SUBMITTED": "dim"}


def make_console(*, stderr: bool = False, width: int = LOG_WIDTH) -> Console:
    """A rich console as wide as the terminal; when its stream is not a terminal, `COLUMNS` wide when
    the user sets it (as rich does for a terminal), else `width` wide."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    columns = os.environ.get("COLUMNS", "")
    return Console(stderr=stderr, width=int(columns) if columns.isdigit() else width)


def progress_bar(console: Console, *, eta: bool = False, transient: bool = False) -> Progress:
    """The suite's progress bar: spinner, description, bar, done/total, elapsed time (and the eta)."""
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    if eta:
        columns += [TextColumn("eta"), TimeRemainingColumn()]
    return Progress(*columns, console=console, transient=transient)


def styled_status(status: str, *, width: int = 0, unknown: str = "") -> str:
    """A status in its colour (rich markup), right-aligned to `width`; `unknown` styles other statuses."""
    return f"[{STATUS_STYLE.get(status, unknown)}]{status:>{width}}[/]"


def case_shape(case: Case) -> str:
    """A case's shape in one short token list, e.g. `B8 T8192 H16 Dqk128 Dv256 L128`."""
    chunk = f" L{case.chunk_size}" if case.chunk_size else ""
    return f"B{case.batch} T{case.seq_len} H{case.num_heads} Dqk{case.head_dim_qk} Dv{case.head_dim_v}{chunk}"


def case_params(case: Case) -> str:
    """A case's params as `key=value` words, sorted."""
    return " ".join(f"{k}={v}" for k, v in sorted(case.params.items()))


def case_label(case: Case) -> str:
    """Kernel, mode, dtype, shape and params of a case, for progress lines."""
    return f"{case.kernel} {case.mode} {case.dtype} {case_shape(case)} {case_params(case)}".rstrip()


def row_line(row: ResultRow) -> str:
    """One line for a finished case: its status, the case, and its runtime (with its reps, stop reason
    and interval, host gaps or throttling when seen) and memory, or its error."""
    if row.status == "ok":
        memory = f", {row.peak_memory_bytes / 1e9:.2f} GB" if row.peak_memory_bytes is not None else ""
        spread = f" ±{row.ci_rel:.1%}" if row.ci_rel is not None and math.isfinite(row.ci_rel) else ""
        calls = f" ({row.reps} reps, {row.stop}{spread})" if row.reps is not None else ""
        gaps = ", host gaps" if row.host_gap_share else ""
        throttled = ", throttled" if row.throttled else ""
        detail = f"{row.median_ms:.3f} ms{calls}{memory}{gaps}{throttled}"
    else:
        detail = row.error[:200]
    return f"{styled_status(row.status, width=11)} {case_label(row.case)}: {detail}"


def cases_table(cases: list[Case], fates: Mapping[str, str]) -> Table:
    """The expanded cases of a dry run and what would happen to each: `run`, or `fates[case.key]`;
    past `MAX_LISTED` cases, the first ones and a caption counting the plan of all."""
    table = Table(title=f"{len(cases)} case(s)")
    for column in ("kernel", "mode", "dtype", "shape"):
        table.add_column(column, no_wrap=True)
    for column in ("params", "plan"):
        table.add_column(column, overflow="fold")
    for case in cases[:MAX_LISTED]:
        fate = fates.get(case.key, "run")
        table.add_row(case.kernel, case.mode, case.dtype, case_shape(case), case_params(case), fate)
    if len(cases) > MAX_LISTED:
        plans = Counter(fates.get(case.key, "run") for case in cases)
        counted = "; ".join(f"{plan}: {count:,}" for plan, count in plans.most_common())
        table.caption = f"the first {MAX_LISTED:,} of {len(cases):,} cases; the plan of all: {counted}"
    return table


def timing_notes(kernels: Iterable[str]) -> list[str]:
    """One line per `row_note` of these kernels' adapters (that their timings are no speed claim,
    say), naming the kernels it applies to."""
    adapters = {adapter.name: adapter for adapter in registry.adapters()}
    by_note: dict[str, list[str]] = {}
    for name in sorted(set(kernels) & set(adapters)):  # a row's kernel may be gone from this install
        if note := adapters[name].row_note():
            by_note.setdefault(note, []).append(name)
    return [f"{', '.join(names)}: {note}" for note, names in by_note.items()]


def summary_table(rows: Iterable[ResultRow]) -> Table:
    """Median ms per kernel configuration (rows) and seq_len (columns); the status where not ok."""
    rows = list(rows)
    seq_lens = sorted({row.case.seq_len for row in rows})
    groups: dict[tuple, dict[int, ResultRow]] = {}
    for row in rows:
        case = row.case
        key = (
            case.kernel,
            case.mode,
            case.dtype,
            case.num_heads,
            case.head_dim_qk,
            case.head_dim_v,
            case.chunk_size,
            tuple(sorted(case.params.items())),
        )
        groups.setdefault(key, {})[case.seq_len] = row
    table = Table(title="median runtime (ms) by seq_len; the status where not ok")
    for column in ("kernel", "mode", "dtype", "config"):
        table.add_column(column)
    for seq_len in seq_lens:
        table.add_column(str(seq_len), justify="right")
    for key in sorted(groups, key=str):
        by_len = groups[key]
        kernel, mode, dtype, heads, dqk, dv, chunk, params = key
        config = f"H{heads} Dqk{dqk} Dv{dv}" + (f" L{chunk}" if chunk else "")
        config += "".join(f" {k}={v}" for k, v in params)
        cells = []
        for seq_len in seq_lens:
            row = by_len.get(seq_len)
            if row is None:
                cells.append("")
            elif row.status == "ok" and row.median_ms is not None:
                cells.append(f"{row.median_ms:.3f}")
            else:
                cells.append(styled_status(row.status))
        table.add_row(kernel, mode, dtype, config, *cells)
    notes = timing_notes(row.case.kernel for row in rows if row.status == "ok")
    if notes:
        table.caption, table.caption_justify = "\n".join(notes), "left"
    return table


def _cell(value: object) -> str:
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def print_frame(console: Console, df: pd.DataFrame, title: str) -> None:
    """Print a DataFrame as a rich table (numbers to 4 significant digits, empty cells for NaN)."""
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in df.columns:
        numeric = pd.api.types.is_numeric_dtype(df[column])
        table.add_column(str(column), justify="right" if numeric else "left")
    for row in df.itertuples(index=False):
        table.add_row(*(_cell(v) for v in row))
    console.print(table)


def job_line(one: Round, job: JobRecord) -> str:
    """One line for a job: its id, shard and cases, its state, its node, and the error of a failure."""
    where = f" on {job.host}" if job.host else ""
    error = f": {job.error}" if job.error else ""
    return f"job {job.job_id} ({one.shard(job)}, {job.cases} cases) {job.state}{where}{error}"


def jobs_table(record: JobsRecord, shard_rows: Mapping[str, int]) -> Table:
    """Every job of a run: round, shard, id, state, node, cases, rows written, and its error log."""
    table = Table(title=f"{record.executor} jobs")
    for column in ("shard", "job id", "state", "node"):
        table.add_column(column, no_wrap=True)
    for column in ("cases", "rows"):
        table.add_column(column, justify="right")
    table.add_column("error log / error", overflow="fold")
    for one, job in record.jobs():
        style = JOB_STATE_STYLE.get(job.state, "yellow" if not job.ended else "red")
        detail = job.stderr + (f": {job.error}" if job.error else "")
        table.add_row(
            one.shard(job),
            job.job_id,
            f"[{style}]{job.state}[/]",
            job.host,
            str(job.cases),
            str(shard_rows.get(one.shard(job), 0)),
            detail,
        )
    return table
