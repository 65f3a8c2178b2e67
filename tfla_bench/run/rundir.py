"""The run directory: the names of its files, its result rows, its lock and its schema version.

A run directory (`runs/<spec>-<YYYYmmdd-HHMMSS>[-N]/`, the committed ones in `results/runs/`) holds:

- `results.csv`: one row per case (`ResultRow`), appended as cases finish;
- `env.json`: the environment (GPU, versions, measurement settings, `results_schema`); a resumed
  run appends its own record under `resumed`;
- `spec.json`: the spec the run measures, for `--resume`;
- `selection.json`: the kernels (`-k`) and sequence lengths (`--seq-len`) the sweep kept of the
  spec's cases (null: all), which `--resume` keeps unless it is given its own;
- `timings.json`: where the sweep's wall time went (`tfla_bench.run.phases`);
- `check.json` and `check.log`: the correctness gate of `sweep --check` and its worker's output;
- `worker-<i>.log` and `precompile-<i>.log`: the output of the worker processes;
- `profile.csv` and `ncu/<case>.csv`: what `profile` (or `sweep --ncu`) measured under Nsight Compute;
- `sweep.lock`: present while a sweep, resume or profile writes into the directory;
- a sweep through a job scheduler (`sweep --executor slurm|local`, `tfla_bench.run.cluster`):
  `jobs.json` (the jobs of each submission: ids, shards, states, logs), `submitit/<round>/`
  (submitit's scripts, pickles and the jobs' logs) and `shards/<round>-<index>/`, the run directory
  of one job (its shard file `results.csv`, its node's `env.json`, its worker logs, and
  `job-end.json`, how the job ended when it was stopped), whose rows the sweep merges into `results.csv`;
- what the analysis commands write beside the rows: `compare.csv`, `report.html`, `figures/`,
  `roofline/` (its figures and `roofline_fraction.csv`, every ok row's fraction of its bound).

Rows
----
The columns of `results.csv` are the case columns (`CASE_COLUMNS`, then `param_<name>` sorted),
then one column per field of `ResultRow` after `case` (`METRIC_COLUMNS`; the schema is
`tfla_bench.measure.row`). Adding a column is one
new field of `ResultRow` with a default; a file without it reads the default. A value that was not
measured is an empty cell, never zero.

A row is appended with one `os.write` of the whole line, then fsynced, so a failure (a full disk,
a kill) leaves at most a torn last line. `read_results` returns the rows it could parse and, for
every other line, why it was skipped. For `--resume`, `RowsRead.for_resume` drops a torn last
line (the last line when it lacks its newline or does not parse; `--resume` warns and runs that
case again) and refuses a bad line before the last one, two different rows of one case (which of
them holds is the user's call) and a file without write permission (a resume would replace it);
`read_results` refuses a wrong header. All leave the file as it was. Every other file of the
directory is written to a temporary file beside it, fsynced and renamed (`write_atomic`); a file
without its owner's write bit is never replaced, by root either (`refuse_not_writable` says so before
a command's work).
A rewrite of `results.csv` (`rewrite_results`, `order_results`) writes every row the file already
held as it was, byte for byte (a NaN cell stays `nan`, `1.50` stays `1.50`), and a finished sweep
lists its rows in its spec's order.

The environment variable `TFLA_BENCH_FAULT_ROW=N` makes the Nth row a `RowWriter` writes fail
halfway with `ENOSPC` (a full disk), leaving a torn line, so tests can inject that fault.
A process that takes a `RunLock` or makes a `RowWriter` (in its main thread) ignores `SIGXFSZ`, so
a file-size limit (`RLIMIT_FSIZE`) is an `OSError` (`EFBIG`) there, like a full disk.

Lock
----
`RunLock` holds `sweep.lock` for a whole sweep or resume: an `flock` on the file, which holds the
owner's pid, host and start time as JSON. A second sweep into the directory is refused (a
`UserError` naming `pid@host`) while the flock is held, or while the file names another live
process of this host, or a process of another host. A file naming a process of this host that is
no longer alive (a killed sweep) is taken over with a warning. The lock file is removed on release.

Schema version
--------------
`SCHEMA_VERSION` is written into `env.json` as `results_schema`. Run directories without it are
version 1 (the same columns as 2); version 3 adds `settle_s`, version 4 `energy_mj` and
`tokens_per_joule`, each empty when read from an older run. A version above `SCHEMA_VERSION` is
refused with one line.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import re
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tfla_bench.errors import UserError
from tfla_bench.measure.roofs import from_env
from tfla_bench.measure.row import CASE_COLUMNS, METRIC_COLUMNS, REQUIRED_COLUMNS, ResultRow
from tfla_bench.measure.settings import as_recorded
from tfla_bench.model.hardware import Accelerator, detect_accelerator

SCHEMA_VERSION = 4
RESULTS = "results.csv"
ENV = "env.json"
SPEC = "spec.json"
SELECTION = "selection.json"
CHECK = "check.json"
CHECK_LOG = "check.log"
COMPARE = "compare.csv"
REPORT = "report.html"
FIGURES = "figures"
ROOFLINE = "roofline"
ROOFLINE_FRACTION = "roofline_fraction.csv"
PROFILE = "profile.csv"
NCU = "ncu"
TIMINGS = "timings.json"
LOCK = "sweep.lock"
MAX_PID = 2**22  # Linux's largest pid_max: a lock record naming another pid was written by hand
JOBS = "jobs.json"
SUBMITIT = "submitit"
SHARDS = "shards"
JOB_END = "job-end.json"
FAULT_ROW_ENV = "TFLA_BENCH_FAULT_ROW"
# What a run directory keeps of itself (its rows, its records, its jobs' folders): no command's output
# may replace one of them or write inside one (`own_part`).
OWN_FILES = (RESULTS, ENV, SPEC, SELECTION, TIMINGS, CHECK, CHECK_LOG, PROFILE, LOCK, JOBS, JOB_END)
OWN_FOLDERS = (SHARDS, SUBMITIT, NCU)


def worker_log(index: int) -> str:
    """The log file of the sweep's worker `index`."""
    return f"worker-{index}.log"


def precompile_log(index: int) -> str:
    """The log file of precompile process `index`."""
    return f"precompile-{index}.log"


def shard_dir(round_number: int, index: int) -> str:
    """The run directory of job `index` of submission `round_number`, relative to the run's."""
    return f"{SHARDS}/{round_number}-{index}"


def submitit_dir(round_number: int) -> str:
    """submitit's folder for submission `round_number` (one per submission: local job ids are pids,
    which a later submission may see again)."""
    return f"{SUBMITIT}/{round_number}"


def for_gpu(name: str, gpu: str | None) -> str:
    """An output's default file or folder name, with the GPU's name in it when one GPU is picked
    (`report.html` -> `report-nvidia-h100-80gb-hbm3.html`), so the views of one run never overwrite
    each other."""
    if gpu is None:
        return name
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "gpu"
    stem, dot, suffix = name.partition(".")
    return f"{stem}-{slug}{dot}{suffix}"


def own_part(path: Path) -> Path | None:
    """The file or folder of a run directory's own (`OWN_FILES`, its processes' logs, `OWN_FOLDERS`)
    that `path` is or lies in, or None. A run directory is a folder holding `SPEC` or `RESULTS`."""
    path = Path(os.path.abspath(path))
    if (path.name in OWN_FILES or _is_process_log(path.name)) and _is_run_dir(path.parent):
        return path
    for place in (path, *path.parents):
        if place.name in OWN_FOLDERS and _is_run_dir(place.parent):
            return place
    return None


def refuse_folders_for_files(run_dir: Path) -> None:
    """Refuse a run directory holding a folder where a sweep writes a file of its own (`OWN_FILES`,
    its processes' logs), which the sweep could not write or replace.

    Raises:
        UserError: naming the first such folder.
    """
    if not run_dir.is_dir():
        return
    for path in sorted(run_dir.iterdir()):
        if path.is_dir() and (path.name in OWN_FILES or _is_process_log(path.name)):
            raise UserError(folder_for_file(path))


def folder_for_file(path: Path) -> str:
    """The line refusing a folder at `path`, where a run keeps a file of its own."""
    return f"{path}: a folder where the run keeps a file of its own; move it out of the run"


def _is_process_log(name: str) -> bool:
    """Whether `name` is the log of one of a sweep's processes (`worker_log`, the precompile's)."""
    return re.fullmatch(r"(worker|precompile)-\d+\.log", name) is not None


def _is_run_dir(folder: Path) -> bool:
    return (folder / SPEC).is_file() or (folder / RESULTS).is_file()


def _line(cells: list[str]) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer).writerow(cells)
    return buffer.getvalue().encode()


# ----------------------------------------------------------------------------------------------
# Reading


@dataclass
class Skipped:
    """A line of `results.csv` that gave no row: its 1-based line number and why."""

    line: int
    reason: str


@dataclass
class RowsRead:
    """What `read_results` found.

    Attributes:
        path: the file.
        header: its columns (empty for a missing or empty file).
        rows: every row that parsed, in file order.
        lines: the 1-based line number of each row in `rows`.
        skipped: the lines that did not, with the reason.
        torn: whether the last record is one of them: cut by an interrupted write (no newline) or
            unparsable.
        texts: the text of each row in `rows` as it is in the file, line ending included, and
            `header_text` the header's: a rewrite keeps them byte for byte.
    """

    path: Path
    header: list[str] = field(default_factory=list)
    rows: list[ResultRow] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    header_text: str = ""
    skipped: list[Skipped] = field(default_factory=list)
    torn: bool = False

    def warning(self) -> str | None:
        """One line saying how many lines were skipped and why, or None when none was."""
        if not self.skipped:
            return None
        reasons = "; ".join(f"line {s.line}: {s.reason}" for s in self.skipped[:3])
        more = f"; {len(self.skipped) - 3} more" if len(self.skipped) > 3 else ""
        return f"{self.path}: {len(self.skipped)} unreadable row(s) skipped ({reasons}{more})"

    def for_resume(self) -> list[ResultRow]:
        """The rows a resume keeps, one per case (a row repeated word for word is kept once).

        Raises:
            UserError: a bad line before the last one (the file cannot be repaired by dropping a
                torn last line), two different rows of one case, or a file without write
                permission; the file is left as it is.
        """
        broken = [s for s in self.skipped if not (self.torn and s is self.skipped[-1])]
        if broken:
            first = broken[0]
            raise UserError(
                f"{self.path} cannot be repaired: line {first.line}: {first.reason} "
                f"({len(broken)} bad line(s) before the last); the file is left as it is"
            )
        if self.path.exists() and not writable(self.path):
            mode = stat.S_IMODE(self.path.stat().st_mode)
            raise UserError(
                f"{self.path} is read-only (mode {mode:o}); a resume rewrites it: make it writable "
                f"(chmod u+w) to resume, or copy the run; the file is left as it is"
            )
        return self.one_per_case()

    def one_per_case(self) -> list[ResultRow]:
        """The rows, one per case, in file order: a row repeated word for word is kept once.

        Raises:
            UserError: two different rows of one case; which of them holds is the user's call.
        """
        kept: dict[str, tuple[int, ResultRow]] = {}
        for line, row in zip(self.lines, self.rows, strict=True):
            first = kept.setdefault(row.case.key, (line, row))
            if first[1].to_csv() != row.to_csv():
                raise UserError(
                    f"{self.path}: lines {first[0]} and {line} are two different rows of case "
                    f"{row.case.key} ({first[1].status} and {row.status}); delete the one that is wrong; "
                    "the file is left as it is"
                )
        return [row for _, row in kept.values()]


def read_results(path: Path) -> RowsRead:
    """Every row of a results CSV that parses, and why the other lines did not.

    Raises:
        UserError: the file cannot be read, or its header is not a results header (a column
            required or unknown to this version).
    """
    read = RowsRead(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return read
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if not data:
        return read
    # An editor may have saved the file with a byte-order mark; its rows are the same.
    text = data.decode("utf-8-sig", errors="replace")
    records = list(_records(text))
    header_cells, header_end = records[0]
    if header_end == len(text) and not text.endswith("\n"):
        # The header line itself was cut: the file holds no row yet.
        read.torn = True
        read.skipped.append(Skipped(1, "torn header (an interrupted write)"))
        return read
    read.header, read.header_text = header_cells, text[:header_end]
    _check_header(path, read.header)
    start, line = header_end, 2
    for index, (cells, end) in enumerate(records[1:], start=1):
        last = index == len(records) - 1
        reason = "torn last line (an interrupted write)" if last and not text.endswith("\n") else None
        reason = reason or _row_problem(read.header, cells)
        if reason is None:
            try:
                read.rows.append(ResultRow.from_csv(dict(zip(read.header, cells, strict=True))))
                read.lines.append(line)
                read.texts.append(text[start:end])
            except (ValueError, KeyError) as exc:
                reason = f"bad value ({exc})"
        if reason is not None:
            read.skipped.append(Skipped(line, reason))
            read.torn = last
        line += text.count("\n", start, end)
        start = end
    return read


def writable(path: Path) -> bool:
    """Whether `path` may be written: its owner's write bit (which root's own access ignores, so
    a file made read-only on purpose stays so for root too) and the process's access."""
    return bool(path.stat().st_mode & stat.S_IWUSR) and os.access(path, os.W_OK)


def refuse_not_writable(paths: Iterable[Path], what: str) -> None:
    """Refuse to replace a file among `paths` that is not `writable`; called before the writing begins.

    Raises:
        UserError: naming the first such file, as `what` (`--out`, `figure`) and its mode.
    """
    for path in paths:
        if _kept_as_it_is(path):
            mode = stat.S_IMODE(path.stat().st_mode)
            raise UserError(
                f"{what} {path}: is not writable (mode {mode:o}); make it writable (chmod u+w) or write "
                "elsewhere; it is left as it is"
            )


def _kept_as_it_is(path: Path) -> bool:
    """Whether `path` is a file that is not `writable`, which no writer replaces."""
    return path.is_file() and not writable(path)


def _through_link(path: Path) -> Path:
    """The file a symlink leads to (a rename would replace the link itself), else `path`."""
    return path.resolve() if path.is_symlink() else path


def _replaceable(path: Path) -> None:
    """The last guard of the atomic writers: a rename would replace a file that is not `writable`
    (the checks before the work, `refuse_not_writable`, say so as a `UserError`); here it is a failed
    write, as the callers report one."""
    if _kept_as_it_is(path):
        raise PermissionError(errno.EACCES, "not writable; left as it is", str(path))


def _records(text: str) -> Iterator[tuple[list[str], int]]:
    """The CSV records of `text`, each with the character offset where it ends."""
    lines = text.splitlines(keepends=True)
    consumed = 0

    def feed() -> Iterator[str]:
        nonlocal consumed
        for part in lines:
            consumed += len(part)
            yield part

    reader = csv.reader(feed())
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error:
            cells = ["<unparsable>"]
        yield cells, consumed


def _row_problem(header: list[str], cells: list[str]) -> str | None:
    if "\ufffd" in "".join(cells):
        return "not UTF-8 text"
    if len(cells) != len(header):
        return f"{len(cells)} cell(s), the header has {len(header)}"
    return None


def _check_header(path: Path, header: list[str]) -> None:
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    unknown = [
        name
        for name in header
        if not name.startswith("param_") and name not in (*CASE_COLUMNS, *METRIC_COLUMNS)
    ]
    if missing or unknown:
        what = f"lacks {', '.join(missing)}" if missing else f"has unknown column(s) {', '.join(unknown)}"
        raise UserError(
            f"{path}: not a results header of schema {SCHEMA_VERSION} ({what}); the file is left as it is"
        )


# ----------------------------------------------------------------------------------------------
# Writing


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `path` whole or not at all: a temporary file beside it, fsynced, then renamed over it; a
    symlink is written through, as an append to it would be."""
    payload = data.encode() if isinstance(data, str) else data
    path = _through_link(path)
    _replaceable(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def save_atomic(path: Path, save: Callable[[Path], None]) -> None:
    """Let `save` write a temporary file beside `path` (e.g. `fig.savefig`), then rename it over `path`
    (a symlink: over the file it leads to)."""
    path = _through_link(path)
    _replaceable(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        save(tmp)
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any) -> None:
    """`value` as indented JSON, written atomically."""
    write_atomic(path, json.dumps(value, indent=2) + "\n")


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RowWriter:
    """Appends rows to a results CSV, one `os.write` and one fsync per row.

    Args:
        path: the CSV file; created with `columns` as header if missing or empty.
        columns: the header (see `columns_for`); a row with another param column is a bug.
    """

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns
        self.written = 0
        fault = os.environ.get(FAULT_ROW_ENV, "")
        self._fault_row = int(fault) if fault.isdigit() else 0
        _ignore_file_size_signal()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size == 0:
            self._append(_line(columns))

    def write(self, row: ResultRow) -> None:
        """Append one row and fsync it."""
        cells = row.to_csv()
        extra = set(cells) - set(self.columns)
        if extra:
            raise ValueError(f"row has columns the header lacks: {sorted(extra)}")
        line = _line([cells.get(name, "") for name in self.columns])
        if self.written + 1 == self._fault_row:
            self._append(line[: len(line) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        self._append(line)
        self.written += 1

    def close(self) -> None:
        os.close(self._fd)

    def _append(self, line: bytes) -> None:
        written = os.write(self._fd, line)
        if written != len(line):
            # The rest would go in a second write; a full disk is the usual cause of a short one.
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (short write)", str(self.path))
        os.fsync(self._fd)


def _ignore_file_size_signal() -> None:
    """Past `RLIMIT_FSIZE` a write then fails with `EFBIG` instead of the signal killing the process."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def rewrite_results(path: Path, rows: list[ResultRow], columns: list[str]) -> None:
    """Replace a results CSV by `rows` under `columns`, atomically.

    A row equal to the file's own row of its case is written as the file held it: its line byte for
    byte under the same header, else its cells as they were read, so a rewrite changes no finished
    row, not even how a NaN cell or a number is spelled."""
    try:
        before = read_results(path)
    except UserError:
        before = RowsRead(path)
    same_header = before.header == columns
    held = {row.case.key: (row.to_csv(), text) for row, text in zip(before.rows, before.texts, strict=True)}
    lines = [before.header_text.encode() if same_header else _line(columns)]
    for row in rows:
        cells = row.to_csv()
        kept = held.get(row.case.key)
        if kept is not None and kept[0] == cells:
            if same_header:
                lines.append(kept[1].encode())
                continue
            cells = dict(zip(before.header, next(_records(kept[1]))[0], strict=True))
        lines.append(_line([cells.get(name, "") for name in columns]))
    write_atomic(path, b"".join(lines))


def order_results(path: Path, keys: list[str]) -> bool:
    """Put the rows of a results CSV in the order of their case keys in `keys` (rows of other cases
    after them, as they were), each line as it was; the file is rewritten only when the order
    changes, and left alone while it holds a line that is not a row. Returns whether it was."""
    read = read_results(path)
    if read.skipped or not read.rows:
        return False
    position = {key: index for index, key in enumerate(keys)}
    order = sorted(range(len(read.rows)), key=lambda i: position.get(read.rows[i].case.key, len(keys)))
    if order == sorted(order):
        return False
    write_atomic(path, (read.header_text + "".join(read.texts[i] for i in order)).encode())
    return True


# ----------------------------------------------------------------------------------------------
# Environment, spec, GPU


def read_json(path: Path) -> Any:
    """A JSON file of the run directory, read as UTF-8 whatever the locale, a byte-order mark (an
    editor's) allowed.

    Raises:
        OSError, UnicodeDecodeError, json.JSONDecodeError: as reading and parsing raise them.
    """
    return json.loads(path.read_text(encoding="utf-8-sig"))


def write_selection(run_dir: Path, kernels: list[str] | None, seq_lens: list[int] | None) -> None:
    """Record which of the spec's cases the sweep keeps (`SELECTION`; None: no filter)."""
    write_json(run_dir / SELECTION, {"kernels": kernels or None, "seq_lens": seq_lens or None})


def read_selection(run_dir: Path) -> tuple[list[str] | None, list[int] | None]:
    """The kernels and sequence lengths a run kept of its spec's cases; (None, None) for a run that
    recorded none (a whole spec, or a run older than `SELECTION`).

    Raises:
        UserError: the file is there but is not a selection record.
    """
    path = run_dir / SELECTION
    try:
        record = read_json(path)
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not readable JSON: {exc}") from None
    # `write_selection` writes both keys, and null rather than an empty list: anything else would
    # read as no filter and widen a resume to every case of the spec
    shaped = isinstance(record, dict) and set(record) == {"kernels", "seq_lens"}
    if not (shaped and _list_or_null(record["kernels"], str) and _list_or_null(record["seq_lens"], int)):
        raise UserError(f'{path}: expected {{"kernels": [names] or null, "seq_lens": [ints] or null}}')
    return record["kernels"], record["seq_lens"]


def _list_or_null(value: Any, kind: type) -> bool:
    """Whether `value` is null or a non-empty list of `kind` (no bools for int)."""
    return value is None or (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, kind) and not isinstance(item, bool) for item in value)
    )


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """The run directories among `paths`: each path a run directory (it holds results.csv) or a
    folder of them.

    Raises:
        UserError: a path that does not exist, or none that holds a run.
    """
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UserError(f"{path}: no such run directory or folder")
        if (path / RESULTS).is_file():
            found.append(path)
        elif path.is_dir():
            found += sorted(child for child in path.iterdir() if (child / RESULTS).is_file())
    if not found:
        raise UserError(f"no run directory (a folder with {RESULTS}) in {' '.join(map(str, paths))}")
    return list(dict.fromkeys(found))


def require_results(run_dir: Path) -> Path:
    """`run_dir`'s results.csv, or a UserError that says the folder is missing or is not a run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    path = run_dir / RESULTS
    if not path.is_file():
        raise UserError(f"{run_dir}: no {RESULTS} (not a run directory, or the run wrote no rows yet)")
    return path


def record_warnings(run_dir: Path) -> list[str]:
    """One line for each of the run's own records that `--resume` needs (`SPEC`, `SELECTION`) and
    cannot read, for the commands that read the rows without them."""
    problems = []
    path = run_dir / SPEC
    try:
        record = read_json(path)
        if not isinstance(record, dict) or not record:
            problems.append(f"{path} is not a spec record")
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path} is not readable JSON: {exc}")
    try:
        read_selection(run_dir)
    except UserError as exc:
        problems.append(str(exc))
    return [
        f"{problem}; the rows are read as they are, but --resume cannot continue this run"
        for problem in problems
    ]


# What each key of `env.json` (and of each attempt under `resumed`) holds where it is not null; the
# readers index into them, so `read_env` refuses a record that holds anything else.
_ENV_KEYS: dict[type, tuple[str, ...]] = {
    dict: ("clocks", "device_info", "measurement", "nvml", "packages", "precompile", "roofs", "spec_record"),
    list: ("command", "device_infos", "devices", "resumed"),
    str: (
        *("compute_capability", "cuda", "description", "driver", "git_sha", "gpu_name", "host", "platform"),
        *("published", "python", "spec", "spec_source", "started_at", "tfla_bench", "torch", "triton"),
    ),
    int: (
        *("cpu_count", "cudnn", "gpu_count", "gpu_memory_bytes", "l2_cache_bytes", "results_schema"),
        "sm_count",
    ),
    bool: ("git_dirty",),
}
ENV_TYPES = {key: kind for kind, keys in _ENV_KEYS.items() for key in keys}
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "true or false"}


def _env_problem(env: dict[str, Any], where: str = "") -> str | None:
    """The first key of an environment record whose value is not of its `ENV_TYPES`, said in words;
    None when every one is (and every attempt under `resumed` is an object that passes too)."""
    for key, kind in ENV_TYPES.items():
        value = env.get(key)
        wrong_bool = isinstance(value, bool) and kind is not bool  # a bool is an int to isinstance
        if value is not None and (wrong_bool or not isinstance(value, kind)):
            return f"key {where}{key!r}: expected {_TYPE_NAMES[kind]}, got {json.dumps(value)[:40]}"
    for index, attempt in enumerate(env.get("resumed") or []):
        if not isinstance(attempt, dict):
            return f"key 'resumed'[{index}]: expected an object, got {json.dumps(attempt)[:40]}"
        problem = _env_problem(attempt, f"'resumed'[{index}].")
        if problem is not None:
            return problem
    try:
        from_env(env, f"key {where}'roofs'")
    except UserError as exc:
        return str(exc)
    return None


def read_env(run_dir: Path) -> dict[str, Any]:
    """The run's `env.json` (empty when it has none yet).

    Raises:
        UserError: the file is not JSON, names a schema version above `SCHEMA_VERSION`, or holds a
            key whose value is not of its type (`ENV_TYPES`).
    """
    path = run_dir / ENV
    try:
        env = read_json(path)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not readable JSON: {exc}") from None
    version = env.get("results_schema", 1) if isinstance(env, dict) else None
    if not isinstance(version, int):
        raise UserError(f"{path} is not an environment record")
    if version > SCHEMA_VERSION:
        raise UserError(
            f"{run_dir} holds results schema version {version}; this tfla-bench reads up to "
            f"version {SCHEMA_VERSION} (upgrade tfla-bench)"
        )
    problem = _env_problem(env)
    if problem is not None:
        raise UserError(f"{path} is not an environment record: {problem}")
    return env


def update_env(run_dir: Path, change: Callable[[dict[str, Any]], bool]) -> None:
    """Apply `change` to the record of the run's latest attempt in `env.json` (the last one under
    `resumed`, else the top one), and write the file when `change` says it changed it."""
    env = read_env(run_dir)
    if change(_latest_attempt(env)):
        write_json(run_dir / ENV, env)


def _latest_attempt(env: dict[str, Any]) -> dict[str, Any]:
    """The record of a run's latest attempt in its `env.json`: the last one under `resumed`, else
    the top one."""
    resumed = env.get("resumed")
    return resumed[-1] if isinstance(resumed, list) and resumed and isinstance(resumed[-1], dict) else env


@dataclass(frozen=True)
class RunGpu:
    """The GPU a run measured on, resolved once from its `env.json`.

    Attributes:
        name: the device name (`"unknown GPU"` when the run recorded none).
        accelerator: the model's accelerator for it, or None when the model does not know it.
        cpu: whether the run recorded no GPU (a CPU run, which no GPU roof bounds).
    """

    name: str
    accelerator: Accelerator | None
    cpu: bool = False


def run_gpu(env: dict[str, Any]) -> RunGpu:
    """The GPU named in a run's `env.json` and its accelerator in the model."""
    recorded = env.get("gpu_name")
    name = str(recorded or "unknown GPU")
    return RunGpu(name, detect_accelerator(name), cpu=not recorded)


def gpu_counts(rows: list[ResultRow], env: dict[str, Any]) -> dict[str, int]:
    """The GPUs that measured a run's rows, with their row counts. The rows of a run written before
    rows named their GPU count as measured on the GPU of its `env.json`."""
    counts: dict[str, int] = {}
    for row in rows:
        if row.gpu_name:
            counts[row.gpu_name] = counts.get(row.gpu_name, 0) + 1
    if not counts and env.get("gpu_name"):
        counts[str(env["gpu_name"])] = len(rows)
    return counts


def on_one_gpu(
    rows: list[ResultRow], env: dict[str, Any], gpu: str | None, *, where: Path, flag: str = "--gpu"
) -> tuple[list[ResultRow], dict[str, Any]]:
    """One GPU's view of a run, so that no table or figure sets rows of two GPUs side by side or
    averages them.

    Args:
        rows: the run's rows.
        env: its `env.json`.
        gpu: the GPU picked (`--gpu NAME`), or None: then the run must hold rows of one GPU at most.
        where: the run directory, for messages.
        flag: the option that picks a GPU, for messages.

    Returns:
        The rows measured on `gpu` with those measured on none (not run, or run on a CPU), and the
        environment of a node with that GPU (from `nodes`, written by a sweep through jobs), else
        `env` naming that GPU.

    Raises:
        UserError: the run mixes GPUs and none is picked, or none of its rows is of the GPU picked.
    """
    counts = gpu_counts(rows, env)
    listing = ", ".join(f"{name} ({count} rows)" for name, count in counts.items())
    if gpu is None:
        if len(counts) > 1:
            raise UserError(
                f"{where} holds rows of {len(counts)} GPUs: {listing}; pick one with {flag} NAME "
                "(rows of different GPUs are never set side by side)"
            )
        return rows, env
    if gpu not in counts:
        raise UserError(f"{flag} {gpu}: no row of {where} was measured on it (its GPUs: {listing or 'none'})")
    node = next((node for node in env.get("nodes", []) if node.get("gpu_name") == gpu), {})
    return [row for row in rows if row.gpu_name in ("", gpu)], {**env, **node, "gpu_name": gpu}


def write_spec(run_dir: Path, spec: dict[str, Any]) -> None:
    """Write `SPEC`, and the same spec as `spec_record` of the run's latest attempt in `ENV` once
    there is one (a new attempt's record gets it when it is written), so that an edit of `SPEC`
    shows (`spec_edit`)."""
    write_json(run_dir / SPEC, spec)

    def record(latest: dict[str, Any]) -> bool:
        if latest.get("spec_record") == spec:
            return False
        latest["spec_record"] = spec
        return True

    if (run_dir / ENV).is_file():
        update_env(run_dir, record)


def spec_edit(run_dir: Path, spec: dict[str, Any]) -> str | None:
    """How `spec` (the run's `SPEC` as read now) differs from the spec its latest attempt recorded
    (`spec_difference`), or None: the same, or a run that recorded none."""
    record = _latest_attempt(read_env(run_dir)).get("spec_record")
    if not isinstance(record, dict):
        return None
    return spec_difference(as_recorded(record), spec)


def spec_difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """The first field where two spec tables differ, as `key: NEW here, OLD in the run`; None if equal."""
    flat_old, flat_new = _flatten(old), _flatten(new)
    for key in sorted(set(flat_old) | set(flat_new)):
        if flat_old.get(key) != flat_new.get(key):
            return f"{key}: {_show(flat_new.get(key))} here, {_show(flat_old.get(key))} in the run"
    return None


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _show(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value)


# ----------------------------------------------------------------------------------------------
# Lock


@dataclass(frozen=True)
class LockOwner:
    """Who holds a run directory's lock."""

    pid: int
    host: str
    started_at: str

    def __str__(self) -> str:
        return f"{self.pid}@{self.host}"

    def alive(self) -> bool:
        """Whether this owner may still run: always for another host, else whether its pid lives."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class RunLock:
    """The one-writer lock of a run directory (see the module docstring).

    Args:
        run_dir: an existing directory.
        warn: receives the one-line warning when a dead owner's lock is taken over.
    """

    def __init__(self, run_dir: Path, warn: Callable[[str], None]) -> None:
        self.path = run_dir / LOCK
        self._warn = warn
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock.

        Raises:
            UserError: another sweep holds it, or the directory is not writable.
        """
        _ignore_file_size_signal()
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except IsADirectoryError:
                raise UserError(folder_for_file(self.path)) from None
            except OSError as exc:
                raise UserError(f"cannot write to {self.path.parent}: {exc.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                raise UserError(self._refusal(owner)) from None
            # A releasing owner may have removed the file between our open and our flock.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        owner = _read_owner(fd)
        me = LockOwner(os.getpid(), socket.gethostname(), datetime.now(UTC).isoformat(timespec="seconds"))
        if owner is not None and owner.pid != me.pid:
            if owner.alive():
                os.close(fd)
                raise UserError(self._refusal(owner))
            self._warn(
                f"warning: taking over the lock of {self.path.parent} from {owner}, "
                f"which started at {owner.started_at} and is no longer running"
            )
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)  # reading the owner moved past the old record: no hole of NULs
            _write_all(fd, json.dumps({"pid": me.pid, "host": me.host, "started_at": me.started_at}).encode())
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise UserError(f"cannot write {self.path}: {exc.strerror}") from None
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file and let go of the lock."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def _refusal(self, owner: LockOwner | None) -> str:
        who = f"{owner} (since {owner.started_at})" if owner else "another process"
        return f"{self.path.parent} is being written by {who}; wait for it or pick another directory"


def _read_owner(fd: int) -> LockOwner | None:
    """The owner the lock file records, or None for one no sweep wrote (the `flock` is the lock)."""
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        record = json.loads(raw)
        pid = record["pid"]
        if not (type(pid) is int and 0 < pid <= MAX_PID):  # 0, -1: kill() would signal a group
            return None
        return LockOwner(pid, str(record["host"]), str(record.get("started_at", "?")))
    except (ValueError, KeyError, TypeError):
        return None
