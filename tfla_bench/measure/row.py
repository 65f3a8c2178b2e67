"""The row schema: one result row is the case, what the worker measured and the parent's derived
counts, each field declared once in `ResultRow`. `results.csv`'s header (`columns_for`), its writer
(`ResultRow.to_csv`) and its reader (`ResultRow.from_csv`) come from it; `tfla_bench.run.rundir` owns
the file itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from tfla_bench.adapters.workloads import DTYPES, MODES, Case, parse_bool
from tfla_bench.errors import control_char
from tfla_bench.measure.gpustate import COLUMNS as NVML_COLUMNS

CASE_COLUMNS = tuple(spec.name for spec in fields(Case) if spec.name != "params")
CASE_FIELDS = {spec.name: spec for spec in fields(Case)}
# The GPU's state before and after the case (`tfla_bench.measure.gpustate`), then whether it throttled.
GPU_STATE_COLUMNS = (
    *(f"{column}_{when}" for when in ("before", "after") for column in NVML_COLUMNS),
    "throttled",
)
STATUSES = (
    "ok",
    "crashed",
    "oom",
    "timeout",
    "unavailable",
    "unsupported",
    "error",
    "failed_check",
    "interrupted",
)
# Statuses decided in the parent without running anything: re-deciding them is free and reflects the
# current install (a package added, the correctness gate fixed), so `--resume` does it again.
RETRYABLE_STATUSES = frozenset({"unavailable", "unsupported", "failed_check"})
# A case stopped from outside (the sweep's job cancelled, preempted or out of time) says nothing about
# its kernel, so `--resume` runs it again too.
UNFINISHED_STATUSES = RETRYABLE_STATUSES | {"interrupted"}
# Statuses of cases that ran and failed: `--retry` runs them again.
RERUNNABLE_STATUSES = ("crashed", "timeout", "error", "oom")


@dataclass
class ResultRow:
    """Everything measured about one case; each field after `case` is a column of `results.csv`.

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
        note: remarks about an `ok` row (e.g. memory not measured on CPU, a case timed again once
            its power cap set in).
        warmup, reps: untimed and timed calls made (the first series of a case timed again is warm-up).
        ci_rel: half-width of the median's 95% confidence interval over the median.
        stop: why timing stopped: `fixed`, `ci`, `budget` or `max` (`tfla_bench.measure.timing.StopRule`).
        host_gap_share: share of timed calls during which the GPU may have waited for the host.
        settle_s: seconds the worker waited before the case for the GPU to leave a power cap or
            slowdown and regain its clock (`gpustate.Monitor.settle`).
        sm_mhz_before ... throttle_after, throttled: the GPU's state (`tfla_bench.measure.gpustate`).
        energy_mj: the GPU's energy per call in millijoules, from NVML's energy counter over a
            series of back-to-back calls after the timed ones, or around the timed calls
            (`energy_method`, `tfla_bench.measure.energy`); empty where there is none (`env.json`'s
            `measurement.energy` says why).
        tokens_per_joule: batch x seq_len tokens of one call / (energy_mj / 1000).
        library: the installed versions of the adapter's packages, e.g. `fla-core 0.6.0`.
        host: the node that ran or decided the case.
        gpu_name: the name of the GPU that measured it (empty on CPU and for a case not run).
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
    settle_s: float | None = None
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
    energy_mj: float | None = None
    tokens_per_joule: float | None = None
    library: str = ""
    host: str = ""
    gpu_name: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    @property
    def finished(self) -> bool:
        """Whether `--resume` keeps this row instead of deciding or running the case again."""
        return self.status not in UNFINISHED_STATUSES

    def values(self) -> dict[str, Any]:
        """The row as typed values by column (case columns, `param_*`, metrics)."""
        case = self.case.columns()
        return {**case, **{name: getattr(self, name) for name in METRIC_COLUMNS}}

    def to_csv(self) -> dict[str, str]:
        """The row as CSV cells (empty for None and NaN)."""
        return {key: cell(value) for key, value in self.values().items()}

    @classmethod
    def from_csv(cls, cells: dict[str, str]) -> ResultRow:
        """Parse a row written by `to_csv`; a metric column the cells lack takes its default.

        Raises:
            ValueError: a cell that does not parse, or an unknown status.
        """
        case = case_of(cells)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name in ("case", "family", "status") or spec.name not in cells:
                continue
            text = cells[spec.name]
            if spec.type == "str":
                values[spec.name] = text
            elif text == "":
                values[spec.name] = None
            elif "bool" in spec.type:
                flag = parse_bool(text)
                if flag is None:
                    raise ValueError(f"{spec.name}: not a bool: {text!r}")
                values[spec.name] = flag
            elif "int" in spec.type:
                values[spec.name] = _count(spec.name, text)
            else:
                values[spec.name] = _number(spec.name, text)
        row = cls(case=case, family=cells["family"], status=cells["status"], **values)
        for name in FINITE_COLUMNS:
            value = values.get(name)
            if value is not None and not math.isnan(value) and (math.isinf(value) or value < 0):
                raise ValueError(f"{name}: not a finite number of 0 or more: {text_of(cells, name)}")
            if name in TIME_COLUMNS and value is not None and value > MAX_TIME_MS:
                raise ValueError(f"{name}: more than a day, no timed call's: {text_of(cells, name)}")
        if row.status == "ok" and not (row.median_ms is not None and 0 < row.median_ms < math.inf):
            median = text_of(cells, "median_ms")
            raise ValueError(f"median_ms of an ok row: not a finite time above 0: {median}")
        return row


METRIC_COLUMNS = tuple(spec.name for spec in fields(ResultRow) if spec.name != "case")
# Columns whose value, where given, is a finite number of 0 or more (the tables and plots divide and
# scale by them); `ci_rel` may be inf (fewer than six timed calls), the other times of a row that did
# not run are empty.
FINITE_COLUMNS = ("median_ms", "p20_ms", "p80_ms", "min_ms", "flops", "bytes", "peak_memory_bytes")
REQUIRED_COLUMNS = (*CASE_COLUMNS, "family", "status", "median_ms")
# A time above a day is no call a sweep timed (1e308 would overflow the plots' scales).
TIME_COLUMNS = ("median_ms", "p20_ms", "p80_ms", "min_ms")
MAX_TIME_MS = 86_400_000.0
# An integer cell lies in [-INT64, INT64): the tables read it as a signed 64-bit integer.
INT64 = 2**63


def columns_for(cases: list[Case]) -> list[str]:
    """The CSV header for a run of these cases: case columns, the union of param columns, metrics."""
    params = sorted({f"param_{name}" for case in cases for name in case.params})
    return [*CASE_COLUMNS, *params, *METRIC_COLUMNS]


def parse_param(text: str) -> bool | int | float | str:
    """A param value from text (a CSV cell or a `--param` flag): bool, int, float or str."""
    flag = parse_bool(text)
    if flag is not None:
        return flag
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def case_of(cells: dict[str, str]) -> Case:
    """The case that a line's case and `param_*` cells name (of `results.csv`, or of a file keyed
    like it).

    Raises:
        ValueError, KeyError: a cell that does not parse, or a missing case column.
    """
    params = {
        key.removeprefix("param_"): parse_param(value)
        for key, value in cells.items()
        if key.startswith("param_") and value != ""
    }
    values = {}
    for name in CASE_COLUMNS:
        try:
            values[name] = _case_cell(name, cells[name])
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return Case(**values, params=params)


def _case_cell(name: str, text: str) -> str | int | None:
    """A cell of the case's columns: a kernel name, a mode of `MODES`, a dtype of `DTYPES`, else a
    size from 1 (or None where the field defaults to None and the cell is empty), as a sweep writes.

    Raises:
        ValueError: any other cell.
    """
    spec = CASE_FIELDS[name]
    choices = {"mode": MODES, "dtype": DTYPES}.get(name)
    if choices is not None and text not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
    if spec.type in (str, "str"):
        if not text.strip() or control_char(text) is not None:
            raise ValueError(f"expected a name, got {text!r}")
        return text
    if text == "" and spec.default is None:
        return None
    number = _int(text)
    if number < 1:
        raise ValueError(f"expected a size from 1, got {text!r}")
    return number


def _int(text: str) -> int:
    """An integer cell; `128.0` too (a table tool may write integers of a column with gaps as floats),
    within a signed 64-bit integer (the tables read it as one)."""
    try:
        number = int(text)
    except ValueError:
        value = float(text)
        if not value.is_integer():  # nan and inf too
            raise ValueError(f"not an integer: {text!r}") from None
        number = int(value)
    if not -INT64 <= number < INT64:
        raise ValueError(f"not a 64-bit integer: {text!r}")
    return number


def _count(name: str, text: str) -> int:
    """An integer metric cell (a byte count, a clock, calls): a finite number within a signed 64-bit
    integer, its fraction dropped."""
    value = _number(name, text)
    if not -INT64 <= value < INT64:  # nan and inf too
        raise ValueError(f"{name}: not a 64-bit integer: {text!r}")
    return int(value)


def _number(name: str, text: str) -> float:
    """A number cell (nan and inf parse)."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name}: not a number: {text!r}") from None


def text_of(cells: dict[str, str], name: str) -> str:
    """A cell's text as the file holds it, quoted."""
    return repr(cells.get(name, ""))


def cell(value: Any) -> str:
    """A value as the run directory's CSV files write it: empty for None and NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)
