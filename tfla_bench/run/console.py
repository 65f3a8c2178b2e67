"""What the CLI prints: rich consoles, the progress bar, status colours, one line per finished case,
and the rich tables of a sweep (its planned cases, its runtimes) and of any DataFrame.

Everything printed to a terminal goes through here, so that every command looks the same and a
pipe or a log file gets whole rows.
"""

from __future__ import annotations

import math
import os
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
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
from rich.text import Text

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.measure.row import ResultRow
from tfla_bench.run.jobs import JobRecord, JobsRecord, Round

if TYPE_CHECKING:
    import pandas as pd

# Rich squeezes tables to 80 columns when the output is not a terminal: a log or pipe keeps one row
# per line at these widths.
LOG_WIDTH = 160
TABLE_WIDTH = 250
# A table in a log or a pipe fits a reader's window (`table_width`).
LOG_TABLE_WIDTH = 80
# The columns a part of a table split to fit leaves to values besides the repeated key columns.
KEYS_LEAVE = 18
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
    """The suite's progress bar: spinner, description, bar, done/total, elapsed time (and the eta).

    A `transient` bar, which leaves nothing behind on a terminal, is not shown where the console is
    no terminal (a log, a pipe): there it would leave an empty line."""
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    if eta:
        columns += [TextColumn("eta"), TimeRemainingColumn()]
    return Progress(
        *columns, console=console, transient=transient, disable=transient and not console.is_terminal
    )


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


def cases_table(cases: list[Case], fates: Mapping[str, str]) -> Fitted:
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
    return Fitted(table)


def timing_notes(kernels: Iterable[str]) -> list[str]:
    """One line per `row_note` of these kernels' adapters (that their timings are no speed claim,
    say), naming the kernels it applies to."""
    adapters = {adapter.name: adapter for adapter in registry.adapters()}
    by_note: dict[str, list[str]] = {}
    for name in sorted(set(kernels) & set(adapters)):  # a row's kernel may be gone from this install
        if note := adapters[name].row_note():
            by_note.setdefault(note, []).append(name)
    return [f"{', '.join(names)}: {note}" for note, names in by_note.items()]


def summary_table(rows: Iterable[ResultRow]) -> FittedTable:
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
    records = []
    for key in sorted(groups, key=str):
        by_len = groups[key]
        kernel, mode, dtype, heads, dqk, dv, chunk, params = key
        config = f"H{heads} Dqk{dqk} Dv{dv}" + (f" L{chunk}" if chunk else "")
        config += "".join(f" {k}={v}" for k, v in params)
        record = {"kernel": kernel, "mode": mode, "dtype": dtype, "config": config}
        for seq_len in seq_lens:
            row = by_len.get(seq_len)
            if row is None:
                record[str(seq_len)] = ""
            elif row.status == "ok" and row.median_ms is not None:
                record[str(seq_len)] = f"{row.median_ms:.3f}"
            else:
                record[str(seq_len)] = row.status
        records.append(record)
    # pandas takes a second to import; only a finished sweep's table needs it.
    import pandas as pd

    frame = pd.DataFrame(records, columns=["kernel", "mode", "dtype", "config", *map(str, seq_lens)])
    notes = timing_notes(row.case.kernel for row in rows if row.status == "ok")
    title = "median runtime (ms) by seq_len; the status where not ok"
    return FittedTable(frame, title, "\n".join(notes), keys=4)


def _cell(value: object) -> str:
    import pandas as pd

    if value is None or value is pd.NA:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def table_width(console: Console) -> int:
    """How wide a table may be: the terminal's width; in a log or a pipe `LOG_TABLE_WIDTH`, unless
    the user set `COLUMNS`."""
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console.width
    return min(console.width, LOG_TABLE_WIDTH)


class Fitted:
    """A rich renderable drawn no wider than `table_width`: a table with folding columns folds them to
    fit 80 columns in a log, as it does in a terminal."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from console.render(
            self.renderable, options.update(width=min(options.max_width, table_width(console)))
        )


def print_frame(console: Console, df: pd.DataFrame, title: str) -> None:
    """Print a DataFrame as rich tables that fit the console (`FittedTable`)."""
    console.print(FittedTable(df, title))


class FittedTable:
    """A DataFrame as rich tables no wider than `table_width` (numbers to 4 significant digits, empty
    cells for NaN).

    Columns without a value are left out. A frame wider than that gives its columns of one value to
    a line under it (`every row has dtype: bfloat16`), then is printed in parts, each repeating the
    leading text columns (kernel, mode, shape, ...) so that every row stays readable and no cell is
    cut short; a last line says how to see it whole.

    Args:
        df: the frame.
        title: the table's title.
        caption: lines printed under the table.
        keys: how many leading columns each part repeats; default the leading text columns.
    """

    def __init__(self, df: pd.DataFrame, title: str, caption: str = "", keys: int | None = None) -> None:
        self.df, self.title, self.caption, self.keys = df, title, caption, keys

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        df = self.df
        cells = {column: [_cell(value) for value in df[column]] for column in df.columns}
        columns = [column for column in df.columns if any(cells[column]) or df.empty]
        # A column takes its widest cell, a space each side and one border.
        widths = {column: max(map(len, [str(column), *cells[column]])) + 3 for column in columns}
        room = min(options.max_width, table_width(console)) - 1
        legend = []
        if sum(widths.values()) > room and len(df) > 1:
            for column in [c for c in columns if len(set(cells[c])) == 1]:
                legend.append(f"{column}: {cells[column][0]}")
                columns.remove(column)
        keys: list = []
        for column in columns[: self.keys]:
            text = self.keys is not None or not _numeric(cells[column])
            if not text or sum(widths[key] for key in [*keys, column]) > room - KEYS_LEAVE:
                break
            keys.append(column)
        parts: list[list] = []
        for column in columns[len(keys) :]:
            if parts and sum(widths[c] for c in [*keys, *parts[-1], column]) <= room:
                parts[-1].append(column)
            else:
                parts.append([column])
        parts = parts or [[]]
        for number, part in enumerate(parts, 1):
            suffix = f" ({number}/{len(parts)})" if len(parts) > 1 else ""
            table = Table(title=self.title + suffix, title_justify="left")
            for column in [*keys, *part]:
                justify = "right" if _numeric(cells[column]) else "left"
                table.add_column(str(column), justify=justify, overflow="fold")
            for index in range(len(df)):
                table.add_row(*(cells[column][index] for column in [*keys, *part]))
            yield table
        if legend:
            yield Text(textwrap.fill(f"every row has {'; '.join(legend)}", room + 1))
        if len(parts) > 1:
            yield Text(
                f"({len(parts)} parts to fit {room + 1} columns; COLUMNS=250 shows it whole)", style="dim"
            )
        if self.caption:
            yield Text(self.caption)


def _numeric(cells: list[str]) -> bool:
    """Whether a column holds numbers (a status may stand among them): right-aligned."""
    return any(re.fullmatch(r"-?[\d.]+(e[-+]?\d+)?%?", cell) for cell in cells)


def split_reason(reason: str) -> tuple[str, str]:
    """An unavailable adapter's reason as (why, how to install): `fla-core not installed (pip install
    fla-core==0.6.0)` gives the words before the parentheses and what they hold ("" without)."""
    why, bracket, rest = reason.partition(" (")
    depth = 0
    for char in rest[:-1]:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:  # the parentheses close before the end: not one hint
            return reason, ""
    if not bracket or not rest.endswith(")") or depth:
        return reason, ""
    return why, rest[:-1]


def print_install_hints(console: Console, reasons: Mapping[str, str]) -> None:
    """One line per adapter with an install hint in its reason, never wrapped, so that a command
    pastes whole."""
    names: dict[str, list[str]] = {}
    for name, reason in reasons.items():
        if hint := split_reason(reason)[1]:
            names.setdefault(hint, []).append(name)
    if names:
        console.print("how to install:")
    for hint, same in names.items():
        console.print(f"  {', '.join(same)}: {hint}", soft_wrap=True, highlight=False, markup=False)


def job_line(one: Round, job: JobRecord) -> str:
    """One line for a job: its id, shard and cases, its state, its node, and the error of a failure."""
    where = f" on {job.host}" if job.host else ""
    error = f": {job.error}" if job.error else ""
    return f"job {job.job_id} ({one.shard(job)}, {job.cases} cases) {job.state}{where}{error}"


def jobs_table(record: JobsRecord, shard_rows: Mapping[str, int]) -> Fitted:
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
    return Fitted(table)
