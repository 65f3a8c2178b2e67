"""Result rows: one `ResultRow` per case, written to `results.csv` as cases finish.

Columns, in order: the case columns (`Case.columns()`: kernel, mode, dtype, batch, seq_len,
num_heads, head_dim_qk, head_dim_v, chunk_size, then `param_<name>` sorted), then `METRIC_COLUMNS`.
A value that was not measured (timings of a failed case, peak memory on CPU) is an empty cell,
never zero. The header of one file is fixed, so the runner gives the writer the union of the
param columns of all cases of the run.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tfla_bench.gpustate import COLUMNS as NVML_COLUMNS
from tfla_bench.workloads import Case

CASE_COLUMNS = (
    "kernel",
    "mode",
    "dtype",
    "batch",
    "seq_len",
    "num_heads",
    "head_dim_qk",
    "head_dim_v",
    "chunk_size",
)
# The GPU's state before and after the case (`tfla_bench.gpustate`), then whether it throttled.
GPU_STATE_COLUMNS = (
    *(f"{column}_{when}" for when in ("before", "after") for column in NVML_COLUMNS),
    "throttled",
)
METRIC_COLUMNS = (
    "family",
    "status",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "min_ms",
    "first_call_s",
    "peak_memory_bytes",
    "peak_memory_above_inputs_bytes",
    "flops",
    "bytes",
    "tflops",
    "gbps",
    "device",
    "error",
    "note",
    "warmup",
    "reps",
    "ci_rel",
    "stop",
    "host_gap_share",
    *GPU_STATE_COLUMNS,
)
STATUSES = ("ok", "crashed", "oom", "timeout", "unavailable", "unsupported", "error", "failed_check")
# Statuses decided in the parent without running anything: re-deciding them is free and reflects the
# current install (a package added, the correctness gate fixed), so `--resume` does it again.
RETRYABLE_STATUSES = frozenset({"unavailable", "unsupported", "failed_check"})


@dataclass
class ResultRow:
    """Everything measured about one case.

    Attributes:
        case: the case.
        family: the adapter's family.
        status: one of `STATUSES`.
        median_ms, p20_ms, p80_ms, min_ms: runtime statistics over the timed repetitions.
        first_call_s: wall time of the first call (compile and autotune included).
        peak_memory_bytes: `max_memory_allocated` over one call (None on CPU: not measured).
        peak_memory_above_inputs_bytes: the same minus what was allocated right after `make_inputs`.
        flops, bytes: the adapter's analytic counts for one call.
        tflops, gbps: flops / median and bytes / median.
        device: where it ran (`cuda:0`, `cpu`), empty when it did not run.
        error: the reason or the last lines of the error for any status but `ok`.
        note: remarks about an `ok` row (e.g. memory not measured on CPU).
        warmup, reps: untimed and timed calls made.
        ci_rel: half-width of the median's 95% confidence interval over the median.
        stop: why timing stopped: `fixed`, `ci`, `budget` or `max` (`tfla_bench.timing.StopRule`).
        host_gap_share: share of timed calls during which the GPU may have waited for the host.
        sm_mhz_before ... throttle_after, throttled: the GPU's state (`tfla_bench.gpustate`).
    """

    case: Case
    family: str
    status: str
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    min_ms: float | None = None
    first_call_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_above_inputs_bytes: int | None = None
    flops: float | None = None
    bytes: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    device: str = ""
    error: str = ""
    note: str = ""
    warmup: int | None = None
    reps: int | None = None
    ci_rel: float | None = None
    stop: str = ""
    host_gap_share: float | None = None
    sm_mhz_before: int | None = None
    mem_mhz_before: int | None = None
    temp_c_before: int | None = None
    power_w_before: float | None = None
    throttle_before: str = ""
    sm_mhz_after: int | None = None
    mem_mhz_after: int | None = None
    temp_c_after: int | None = None
    power_w_after: float | None = None
    throttle_after: str = ""
    throttled: bool | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    @property
    def finished(self) -> bool:
        """Whether `--resume` keeps this row instead of deciding or running the case again."""
        return self.status not in RETRYABLE_STATUSES

    def to_csv(self) -> dict[str, str]:
        """The row as CSV cells (empty for None and NaN)."""
        cells = {key: _cell(value) for key, value in self.case.columns().items()}
        for name in METRIC_COLUMNS:
            cells[name] = _cell(getattr(self, name))
        return cells

    @classmethod
    def from_csv(cls, cells: dict[str, str]) -> ResultRow:
        """Parse a row written by `to_csv` (param values come back as bool, int, float or str)."""
        params = {
            key.removeprefix("param_"): parse_param(value)
            for key, value in cells.items()
            if key.startswith("param_") and value != ""
        }
        case = Case(
            kernel=cells["kernel"],
            mode=cells["mode"],
            dtype=cells["dtype"],
            batch=int(cells["batch"]),
            seq_len=int(cells["seq_len"]),
            num_heads=int(cells["num_heads"]),
            head_dim_qk=int(cells["head_dim_qk"]),
            head_dim_v=int(cells["head_dim_v"]),
            chunk_size=int(cells["chunk_size"]) if cells["chunk_size"] else None,
            params=params,
        )
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name in ("case", "family", "status"):
                continue
            text = cells.get(spec.name, "")
            if spec.type == "str":
                values[spec.name] = text
            elif text == "":
                values[spec.name] = None
            elif "bool" in spec.type:
                values[spec.name] = text == "True"
            elif "int" in spec.type:
                values[spec.name] = int(float(text))
            else:
                values[spec.name] = float(text)
        return cls(case=case, family=cells["family"], status=cells["status"], **values)


def columns_for(cases: list[Case]) -> list[str]:
    """The CSV header for a run of these cases: case columns, the union of param columns, metrics."""
    params = sorted({f"param_{name}" for case in cases for name in case.params})
    return [*CASE_COLUMNS, *params, *METRIC_COLUMNS]


class ResultWriter:
    """Appends rows to a CSV file, flushing each one so an interrupted run keeps every finished row.

    Args:
        path: the CSV file; created with `columns` as header if missing or empty.
        columns: the header (see `columns_for`); rows with other param columns are a bug.
    """

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns
        new = not path.exists() or path.stat().st_size == 0
        self._file = path.open("a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=columns, extrasaction="raise", restval="")
        if new:
            self._writer.writeheader()
            self._flush()

    def write(self, row: ResultRow) -> None:
        """Append one row and flush it to disk."""
        self._writer.writerow(row.to_csv())
        self._flush()

    def close(self) -> None:
        self._file.close()

    def _flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())


def read_header(path: Path) -> list[str]:
    """The header of a results CSV (empty if the file is missing or empty)."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return next(csv.reader(handle), [])


def read_rows(path: Path) -> list[ResultRow]:
    """Every row of a results CSV, parsed back into `ResultRow`s."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return [ResultRow.from_csv(cells) for cells in csv.DictReader(handle)]


def rewrite(path: Path, rows: list[ResultRow], columns: list[str]) -> None:
    """Replace a results CSV by `rows` under `columns` (atomically: a temporary file then a rename)."""
    tmp = path.with_suffix(".csv.tmp")
    writer = ResultWriter(tmp, columns)
    for row in rows:
        writer.write(row)
    writer.close()
    os.replace(tmp, path)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def parse_param(text: str) -> bool | int | float | str:
    """A param value from text (a CSV cell or a `--param` flag): bool, int, float or str."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text
