"""One sweep on two GPUs, case by case, against the roofline model (`tfla-bench compare-gpus RUN_A RUN_B`).

Rows match by case (`Case.key`, as `diff` matches them). For a case `ok` in both runs the measured
speed-up of B over A is runtime_A / runtime_B (above 1: B is faster). The model predicts it from
the case's FLOPs F and bytes M (the analytic counts of the kernel's adapter, recorded in each row)
and each GPU's roofs: the roofline time t = max(F / peak, M / bandwidth) on each GPU
(`tfla_bench.model.roofline.runtime_ms_lower`), and the predicted speed-up t_A / t_B. A case below
both ridges (memory-bound on both) is predicted at the bandwidth ratio bandwidth_B / bandwidth_A, one
above both at the peak ratio peak_B / peak_A, and one between them at the ratio of its memory time on
one GPU to its compute time on the other.

Roofs: each run's measured roofs (`env.json` `roofs`, written by the sweep from `tfla-bench roofs`:
dense bf16 matmul and HBM copy) where it recorded them for its GPU, else the data sheet of its GPU
(`tfla_bench.model.hardware`); `roofs="datasheet"` takes the data sheets for both, `"measured"`
refuses a run without measured roofs. Both peaks are dense 16-bit matrix peaks, so a case in
another dtype gets no prediction, nor does a case whose row carries no positive FLOP and byte
counts (a kernel the model has no counts for). Such cases are kept and counted with the reason.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tfla_bench.analyse.diff import display, env_warnings, noise, settings_warnings
from tfla_bench.errors import UserError
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.roofs import from_env
from tfla_bench.measure.row import ResultRow
from tfla_bench.model.hardware import detect_accelerator
from tfla_bench.model.roofline import Estimate
from tfla_bench.plots.base import DATASHEET, MEASURED, Roof
from tfla_bench.run import rundir
from tfla_bench.run.console import case_params

# Where the roofs come from: each run's measured ones if it has them, else its GPU's data sheet.
AUTO = "auto"
ROOF_CHOICES = (AUTO, MEASURED, DATASHEET)
# The model's peaks and the measured matmul roof are dense bf16 matrix peaks; fp16 runs at the same
# rate on every GPU of the model's table. Other dtypes have no peak in the model.
MATRIX_PEAK_DTYPES = ("bfloat16", "float16")
COMMIT_DIGITS = 7
ROW_COLUMNS = (
    *row_schema.CASE_COLUMNS,
    "params",
    "family",
    "a_ms",
    "b_ms",
    "measured_speedup",
    "noise",
    "a_flops",
    "a_bytes",
    "b_flops",
    "b_bytes",
    "a_roofline_ms",
    "b_roofline_ms",
    "a_bound",
    "b_bound",
    "predicted_speedup",
    "measured_over_predicted",
    "no_prediction",
)
# The order of a kernel's table, and the columns it shows beside the case, with their headings.
SORT_COLUMNS = ["kernel", "mode", "seq_len", "dtype", "head_dim_v", "head_dim_qk", "chunk_size", "params"]
DETAIL_COLUMNS = (
    "params",
    "a_ms",
    "b_ms",
    "measured_speedup",
    "predicted_speedup",
    "measured_over_predicted",
    "a_bound",
    "b_bound",
    "no_prediction",
)
DETAIL_NAMES = {
    "a_ms": "A ms",
    "b_ms": "B ms",
    "measured_speedup": "measured",
    "predicted_speedup": "predicted",
    "measured_over_predicted": "measured / predicted",
    "a_bound": "bound on A",
    "b_bound": "bound on B",
    "no_prediction": "no prediction",
}
SUMMARY_COLUMNS = (
    "kernel",
    "mode",
    "cases",
    "predicted",
    "measured",
    "measured min",
    "measured max",
    "measured / predicted",
    "bound on A",
    "bound on B",
    "no prediction",
)


@dataclass(frozen=True)
class GpuSide:
    """One run as the comparison sees it: its GPU and the roofs its prediction takes.

    Attributes:
        run_dir: the run directory.
        gpu_name: the GPU its env.json names.
        roof: the peak FLOP/s and HBM bandwidth used, measured or from the data sheet (`Roof.source`).
        note: why the run's measured roofs were not taken although `roofs` allowed them, or empty.
    """

    run_dir: Path
    gpu_name: str
    roof: Roof
    note: str = ""

    def describe(self) -> str:
        """`<GPU>, <where the roofs come from>: <peak> TFLOP/s, <bandwidth> TB/s, ridge <I> FLOP/B`."""
        acc = self.roof.accelerator
        where = (
            "measured roofs (env.json)"
            if self.roof.source == MEASURED
            else f"data-sheet roofs ({acc.display_name})"
        )
        note = f" ({self.note})" if self.note else ""
        return (
            f"{self.gpu_name}, {where}: {acc.peak_flops_per_s / 1e12:.0f} TFLOP/s, "
            f"{acc.bandwidth_bytes_per_s / 1e12:.2f} TB/s, "
            f"ridge {acc.intensity_flops_per_byte:.0f} FLOP/B{note}"
        )

    def to_json(self) -> dict[str, Any]:
        acc = self.roof.accelerator
        return {
            "run": str(self.run_dir),
            "gpu_name": self.gpu_name,
            "roofs": self.roof.source,
            "roofs_label": acc.display_name,
            "peak_flops_per_s": acc.peak_flops_per_s,
            "bandwidth_bytes_per_s": acc.bandwidth_bytes_per_s,
            "ridge_flops_per_byte": acc.intensity_flops_per_byte,
            "note": self.note,
        }


@dataclass
class GpuComparison:
    """Run B against run A, measured and predicted.

    Attributes:
        a, b: the two runs.
        rows: one row per case ok in both runs (`ROW_COLUMNS`); `predicted_speedup` is NaN where
            `no_prediction` gives the reason.
        not_ok: cases in both runs that are not ok in A or B (no speed-up measured).
        only_a, only_b: cases in one run only.
        warnings: the same GPU twice, library versions or measurement settings that differ, counts
            that differ between the runs.
    """

    a: GpuSide
    b: GpuSide
    rows: pd.DataFrame
    not_ok: int
    only_a: int
    only_b: int
    warnings: list[str] = field(default_factory=list)

    def no_prediction(self) -> dict[str, int]:
        """The cases without a prediction, counted per reason."""
        reasons = self.rows["no_prediction"]
        return {str(reason): int(count) for reason, count in reasons[reasons != ""].value_counts().items()}

    def to_json(self) -> dict[str, Any]:
        def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
            return json.loads(frame.to_json(orient="records"))

        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "cases": len(self.rows),
            "predicted": int(self.rows["predicted_speedup"].notna().sum()),
            "no_prediction": self.no_prediction(),
            "not_ok_in_a_or_b": self.not_ok,
            "only_a": self.only_a,
            "only_b": self.only_b,
            "summary": records(summarize(self.rows)),
            "rows": records(self.rows),
            "warnings": self.warnings,
        }


def side_roof(env: dict[str, Any], gpu_name: str, roofs: str, where: Path) -> tuple[Roof, str]:
    """The roofs of a run's GPU that `roofs` asks for, and why measured ones were passed over (or "").

    Raises:
        UserError: `roofs` is not one of `ROOF_CHOICES`; `measured` for a run that recorded none for
            its GPU; no measured roofs and a GPU the model's table does not know.
    """
    if roofs not in ROOF_CHOICES:
        raise UserError(f"--roofs must be one of {', '.join(ROOF_CHOICES)}, got {roofs!r}")
    measured = from_env(env)
    note = ""
    if measured is not None and measured.gpu_name != gpu_name:
        note = f"its env.json's measured roofs are of {measured.gpu_name}"
        measured = None
    if roofs == MEASURED and measured is None:
        raise UserError(f"--roofs measured: {where} recorded no measured roofs of {gpu_name}")
    if measured is not None and roofs != DATASHEET:
        return Roof(measured.accelerator(), MEASURED), ""
    sheet = detect_accelerator(gpu_name)
    if sheet is None:
        raise UserError(
            f"{where}: GPU {gpu_name!r} is not in the model's table and the run recorded no measured "
            "roofs of it; no roofline to predict from"
        )
    return Roof(sheet), note or ("no measured roofs in its env.json" if roofs == AUTO else "")


def load_side(
    run_dir: Path, gpu: str | None, flag: str, roofs: str
) -> tuple[GpuSide, dict[str, ResultRow], dict[str, Any]]:
    """A run's GPU and roofs, its rows by case key and its env.json, as the view of one GPU
    (`rundir.on_one_gpu`: `gpu`, picked by `flag`, or the run's only one).

    Raises:
        UserError: not a run directory, two different rows of one case, a run that names no GPU, or
            the roofs `side_roof` refuses.
    """
    run_dir = Path(run_dir)
    path = rundir.require_results(run_dir)
    if not (run_dir / rundir.ENV).is_file():
        raise UserError(f"{run_dir}: no {rundir.ENV}, so no GPU to compare")
    read = rundir.read_results(path)
    if read.skipped:
        print(f"warning: {read.warning()}", file=sys.stderr)
    rows, env = rundir.on_one_gpu(
        read.one_per_case(), rundir.read_env(run_dir), gpu, where=run_dir, flag=flag
    )
    gpu_name = env.get("gpu_name")
    if not gpu_name:
        raise UserError(f"{run_dir}: its env.json names no GPU (gpu_name); a run on a CPU has no roofline")
    roof, note = side_roof(env, str(gpu_name), roofs, run_dir)
    return GpuSide(run_dir, str(gpu_name), roof, note), {row.case.key: row for row in rows}, env


def compare_gpus(
    run_a: Path, run_b: Path, roofs: str = AUTO, gpu_a: str | None = None, gpu_b: str | None = None
) -> GpuComparison:
    """Run B against run A: measured speed-up and the model's prediction per case ok in both.

    Args:
        run_a, run_b: run directories, usually of one spec on two GPUs.
        roofs: `auto`, `measured` or `datasheet` (module docstring).
        gpu_a, gpu_b: the GPU whose rows to take, for a run that mixes GPUs.

    Raises:
        UserError: a run that cannot be read or has no GPU or roofs, or no case ok in both runs.
    """
    side_a, rows_a, env_a = load_side(run_a, gpu_a, "--gpu-a", roofs)
    side_b, rows_b, env_b = load_side(run_b, gpu_b, "--gpu-b", roofs)
    shared = [key for key in rows_a if key in rows_b]
    ok = [key for key in shared if _measured(rows_a[key]) and _measured(rows_b[key])]
    if not ok:
        raise UserError(
            f"no case is ok in both {run_a} and {run_b} ({len(shared)} shared case(s), "
            f"{len(rows_a)} in A, {len(rows_b)} in B)"
        )
    pairs = [(rows_a[key], rows_b[key]) for key in ok]
    records = [_case_record(row_a, row_b, side_a.roof, side_b.roof) for row_a, row_b in pairs]
    table = pd.DataFrame(records, columns=list(ROW_COLUMNS))
    table["chunk_size"] = table["chunk_size"].astype("Int64")
    return GpuComparison(
        a=side_a,
        b=side_b,
        rows=table,
        not_ok=len(shared) - len(ok),
        only_a=sum(key not in rows_b for key in rows_a),
        only_b=sum(key not in rows_a for key in rows_b),
        warnings=_warnings(side_a, side_b, env_a, env_b, pairs),
    )


def _measured(row: ResultRow) -> bool:
    median = row.median_ms
    return row.status == "ok" and median is not None and math.isfinite(median) and median > 0


def _counts(row: ResultRow) -> tuple[float, float] | None:
    """The row's FLOPs and bytes when both are positive numbers."""
    values = (row.flops, row.bytes)
    if all(value is not None and math.isfinite(value) and value > 0 for value in values):
        return float(row.flops), float(row.bytes)
    return None


def _case_record(a: ResultRow, b: ResultRow, roof_a: Roof, roof_b: Roof) -> dict[str, Any]:
    spread = noise(a) + noise(b)
    record: dict[str, Any] = {
        **{column: getattr(a.case, column) for column in row_schema.CASE_COLUMNS},
        "params": case_params(a.case),
        "family": a.family,
        "a_ms": a.median_ms,
        "b_ms": b.median_ms,
        "measured_speedup": a.median_ms / b.median_ms,
        "noise": spread if math.isfinite(spread) else math.nan,
    }
    counts_a, counts_b = _counts(a), _counts(b)
    record.update(a_flops=a.flops, a_bytes=a.bytes, b_flops=b.flops, b_bytes=b.bytes, no_prediction="")
    if a.case.dtype not in MATRIX_PEAK_DTYPES:
        record["no_prediction"] = f"no {a.case.dtype} peak in the model (16-bit matrix peaks only)"
    elif counts_a is None or counts_b is None:
        record["no_prediction"] = "no FLOP and byte counts for this kernel"
    if record["no_prediction"]:
        return record
    on_a = Estimate(*counts_a, roof_a.accelerator)
    on_b = Estimate(*counts_b, roof_b.accelerator)
    predicted = on_a.runtime_ms_lower / on_b.runtime_ms_lower
    record.update(
        a_roofline_ms=on_a.runtime_ms_lower,
        b_roofline_ms=on_b.runtime_ms_lower,
        a_bound=on_a.bound,
        b_bound=on_b.bound,
        predicted_speedup=predicted,
        measured_over_predicted=record["measured_speedup"] / predicted,
    )
    return record


def _warnings(
    a: GpuSide,
    b: GpuSide,
    env_a: dict[str, Any],
    env_b: dict[str, Any],
    pairs: list[tuple[ResultRow, ResultRow]],
) -> list[str]:
    """What besides the GPU differs between the runs (or that the GPU does not): the driver and the
    stack, the commit, the compared kernels' libraries, the measurement settings, a case's counts."""
    found = []
    if a.gpu_name == b.gpu_name:
        found.append(f"both runs measured on {a.gpu_name}: the model predicts 1 unless their roofs differ")
    # The GPU is meant to differ here, and only the packages of the compared kernels matter (below).
    unrelated = {"gpu_name": None, "packages": None}
    found += env_warnings({**env_a, **unrelated}, {**env_b, **unrelated})
    commits = [str(env.get("git_sha") or "not recorded")[:COMMIT_DIGITS] for env in (env_a, env_b)]
    if commits[0] != commits[1]:
        found.append(
            f"commit differs: A {commits[0]}, B {commits[1]} (our kernels and their tuned configs may differ)"
        )
    libraries = {row_a.case.kernel: (row_a.library, row_b.library) for row_a, row_b in pairs}
    found += [
        f"library of {kernel} differs: A {lib_a or 'not recorded'}, B {lib_b or 'not recorded'}"
        for kernel, (lib_a, lib_b) in sorted(libraries.items())
        if lib_a != lib_b
    ]
    found += settings_warnings(a.run_dir, b.run_dir)
    recounted = sum(_counts(row_a) != _counts(row_b) for row_a, row_b in pairs)
    if recounted:
        found.append(
            f"{recounted} case(s) recorded other FLOP or byte counts in A and B (counts that depend on "
            "the kernel's config on each GPU); each GPU's roofline time takes its own run's counts"
        )
    return found


def _bounds(values: pd.Series) -> str:
    """`memory`, `compute`, or both with their counts (`memory 3, compute 2`)."""
    counts = values.dropna().value_counts()
    if len(counts) == 1:
        return str(counts.index[0])
    return ", ".join(f"{bound} {int(n)}" for bound, n in sorted(counts.items()))


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per kernel and mode: the cases, the medians of the predicted and the measured speed-up, the
    measured range, the median of measured / predicted, where the model puts them on each GPU, and
    the cases without a prediction."""
    records = []
    for (kernel, mode), group in rows.groupby(["kernel", "mode"], sort=True):
        predicted = group.dropna(subset=["predicted_speedup"])
        records.append(
            {
                "kernel": kernel,
                "mode": mode,
                "cases": len(group),
                "predicted": predicted["predicted_speedup"].median(),
                "measured": group["measured_speedup"].median(),
                "measured min": group["measured_speedup"].min(),
                "measured max": group["measured_speedup"].max(),
                "measured / predicted": predicted["measured_over_predicted"].median(),
                "bound on A": _bounds(group["a_bound"]),
                "bound on B": _bounds(group["b_bound"]),
                "no prediction": len(group) - len(predicted),
            }
        )
    return pd.DataFrame(records, columns=list(SUMMARY_COLUMNS))


def kernel_tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """One display table per kernel (`diff.display`: the shape in one cell), its cases by mode,
    sequence length and the rest of the shape: the two runtimes, the measured and predicted
    speed-up, their ratio and the bound on each GPU; the params and why a case has no prediction
    where any case has them."""
    tables = {}
    for kernel, group in rows.sort_values(SORT_COLUMNS).groupby("kernel", sort=True):
        shown = [c for c in DETAIL_COLUMNS if c not in ("params", "no_prediction") or (group[c] != "").any()]
        table = display(group[[*row_schema.CASE_COLUMNS, *shown]]).drop(columns="kernel")
        tables[str(kernel)] = table.rename(columns=DETAIL_NAMES).reset_index(drop=True)
    return tables
