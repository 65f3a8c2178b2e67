"""Measured bytes: the chosen cases of a run profiled under Nsight Compute, kept in `profile.csv`.

`tfla-bench profile RUN_DIR` (and `sweep --ncu` after its timings) runs each chosen `ok` case of
`results.csv` in a child process under ncu (`tfla_bench.measure.ncu`). The child builds the case's inputs
as the benchmark worker does, makes `WARMUP_CALLS` unprofiled calls (compilation and autotuning
happen there), then makes ONE call between `torch.cuda.profiler.start()` and `stop()`: the
forward, or the forward and backward, as the run timed it (`grad` from its spec). For every kernel
of that call ncu reports DRAM bytes read and written, its duration and its tensor-pipe
utilization; they are summed per case (the utilization weighted by duration).

`profile.csv` has the case columns of `results.csv` and `PROFILE_COLUMNS`; `results.csv` is never
rewritten, and readers join the two on the case columns (`join_profile`). ncu's own CSV of each
case stays in `<run_dir>/ncu/` with the numbers of every kernel. Per row:
`measured_bytes` = DRAM read + write, `measured_intensity` = the adapter's analytic FLOPs /
`measured_bytes`. A case that could not be profiled has a `profile_status` other than `ok` and
the reason in `profile_error` (`not_permitted`: no access to the performance counters;
`no_kernels`, `timeout`, `failed`). Each case's row is written as soon as the case is done, so a
profile that is stopped keeps the cases it finished. Profiling again replaces a case's row.

ncu replays kernels and locks clocks, so nothing here is a timing: `ncu_gpu_time_ms` only says
where the bytes were spent, and `median_ms` always comes from the timed sweep.

Against the measured roofs of the run's GPU (`env.json`, `tfla_bench.measure.roofs`), a row whose
achieved FLOP/s (analytic FLOPs / median runtime) lies above min(matmul peak, HBM bandwidth x
intensity) by more than `ROOF_TOLERANCE` is flagged: its FLOP count or its timing is wrong. The
intensity is the measured one where the case was profiled, else the model's.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.errors import UserError
from tfla_bench.measure import ncu
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.roofs import MeasuredRoofs
from tfla_bench.measure.row import CASE_COLUMNS, ResultRow
from tfla_bench.run import rundir

PROFILE_COLUMNS = (
    "profile_status",
    "profiled_kernels",
    "dram_read_bytes",
    "dram_write_bytes",
    "measured_bytes",
    "measured_intensity",
    "ncu_gpu_time_ms",
    "tensor_pipe_pct",
    "profile_error",
)
WARMUP_CALLS = 3
# ncu replays each kernel once per counter pass; the first call may autotune for minutes.
TIMEOUT_FACTOR = 3.0
ROOF_TOLERANCE = 0.05
# Model bytes / measured bytes further than this from 1 names the kernel in the report.
MODEL_OFF = 0.2


@dataclass(frozen=True)
class CaseProfile:
    """What ncu measured for one case (sums over the kernels of one call), or why it could not."""

    case: Case
    status: str
    flops: float | None = None
    kernels: int | None = None
    dram_read_bytes: float | None = None
    dram_write_bytes: float | None = None
    gpu_time_ms: float | None = None
    tensor_pipe_pct: float | None = None
    error: str = ""

    @property
    def measured_bytes(self) -> float | None:
        if self.dram_read_bytes is None or self.dram_write_bytes is None:
            return None
        return self.dram_read_bytes + self.dram_write_bytes

    @property
    def measured_intensity(self) -> float | None:
        moved = self.measured_bytes
        return self.flops / moved if self.flops and moved else None

    def cells(self) -> dict[str, Any]:
        return {
            **self.case.columns(),
            "profile_status": self.status,
            "profiled_kernels": self.kernels,
            "dram_read_bytes": self.dram_read_bytes,
            "dram_write_bytes": self.dram_write_bytes,
            "measured_bytes": self.measured_bytes,
            "measured_intensity": self.measured_intensity,
            "ncu_gpu_time_ms": self.gpu_time_ms,
            "tensor_pipe_pct": self.tensor_pipe_pct,
            "profile_error": self.error,
        }


def summarize(row: ResultRow, kernels: Sequence[ncu.KernelMetrics]) -> CaseProfile:
    """One case's profile from its kernels: bytes and durations summed, tensor pipe duration-weighted."""

    durations = _total([k.duration_ns for k in kernels])
    weighted = [
        k.tensor_pipe_pct * k.duration_ns for k in kernels if k.tensor_pipe_pct is not None and k.duration_ns
    ]
    tensor = sum(weighted) / durations if durations and len(weighted) == len(kernels) else None
    return CaseProfile(
        case=row.case,
        status="ok",
        flops=row.flops,
        kernels=len(kernels),
        dram_read_bytes=_total([k.dram_read_bytes for k in kernels]),
        dram_write_bytes=_total([k.dram_write_bytes for k in kernels]),
        gpu_time_ms=durations / 1e6 if durations is not None else None,
        tensor_pipe_pct=tensor,
        error="" if tensor is not None else "tensor-pipe utilization not reported by this ncu",
    )


def _total(values: list[float | None]) -> float | None:
    """The sum, or None when a kernel lacks the value (a partial sum would understate the case)."""
    known = [value for value in values if value is not None]
    return sum(known) if len(known) == len(values) else None


def select_rows(
    rows: Sequence[ResultRow],
    kernels: Sequence[str] = (),
    seq_lens: Sequence[int] = (),
    modes: Sequence[str] = (),
) -> list[ResultRow]:
    """The `ok` rows of a run that match every given filter (an empty filter matches all).

    Raises:
        UserError: a kernel or length the run has no row of (naming those it has), or no `ok` row
            matches.
    """
    for flag, given, held in (
        ("--kernel", kernels, {row.case.kernel for row in rows}),
        ("--seq-len", seq_lens, {row.case.seq_len for row in rows}),
    ):
        foreign = [value for value in given if value not in held]
        if foreign:
            known = ", ".join(str(value) for value in sorted(held))
            raise UserError(f"{flag} {foreign[0]}: the run has no row of it (its rows: {known or 'none'})")
    chosen = [
        row
        for row in rows
        if row.status == "ok"
        and (not kernels or row.case.kernel in kernels)
        and (not seq_lens or row.case.seq_len in seq_lens)
        and (not modes or row.case.mode in modes)
    ]
    if not chosen:
        raise UserError("no ok row of the run matches the chosen kernels, seq_lens and modes")
    return chosen


def profile_rows(
    run_dir: Path,
    rows: Sequence[ResultRow],
    executable: Path,
    *,
    grad_of: Callable[[str], str],
    module_of: Callable[[str], str],
    timeout_s: float,
    on_profile: Callable[[CaseProfile], None] = lambda profile: None,
) -> list[CaseProfile]:
    """Profile `rows` one by one under ncu, merging each case's row into `<run_dir>/profile.csv` as it
    finishes.

    Args:
        run_dir: the run directory.
        rows: `ok` rows of its `results.csv` (`select_rows`).
        executable: the ncu to run (`ncu.require`).
        grad_of: kernel name -> the upstream-gradient mode the run timed it with.
        module_of: kernel name -> the module that registers its adapter (for the child).
        timeout_s: the run's case timeout; ncu gets `TIMEOUT_FACTOR` times it per case.
        on_profile: called with each case's profile as it finishes.

    Returns:
        One `CaseProfile` per row. Without permission to profile, every row says why (ncu is asked
        once); a case that fails says why and the others go on.
    """
    refused: tuple[str, str] | None = None
    profiles: list[CaseProfile] = []
    earlier = _profiled(run_dir)
    for row in rows:
        if refused is not None:
            profile = CaseProfile(row.case, refused[0], flops=row.flops, error=refused[1])
        else:
            log_file = run_dir / rundir.NCU / f"{_slug(row.case.key)}.csv"
            log_file.parent.mkdir(parents=True, exist_ok=True)
            grad, module = grad_of(row.case.kernel), module_of(row.case.kernel)
            # ncu writes a report of its own beside the one an earlier profile left, which only a
            # profile that succeeds replaces.
            fresh_log = log_file.with_name(f".{log_file.name}.{os.getpid()}.tmp")
            try:
                profile = _profile_one(executable, row, grad, module, fresh_log, timeout_s)
                if profile.status == "ok":
                    os.replace(fresh_log, log_file)
            finally:
                fresh_log.unlink(missing_ok=True)
            if profile.status == "not_permitted":
                refused = (profile.status, profile.error)
        if profile.status != "ok" and row.case.key in earlier:
            profile = dataclasses.replace(profile, error=f"{profile.error}; its earlier profile is kept")
        else:
            # Each case's row is kept as soon as it is known: a profile stopped later loses none of it.
            write_profiles(run_dir, [profile])
        profiles.append(profile)
        on_profile(profile)
    return profiles


def _profiled(run_dir: Path) -> set[str]:
    """The cases that `profile.csv` holds an ok profile of."""
    old = _read_profile(run_dir / rundir.PROFILE)
    if old is None:
        return set()
    records = old.to_dict("records")
    return {row_schema.case_of(cells).key for cells in records if cells["profile_status"] == "ok"}


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9=.-]+", "_", key).strip("_")


def _profile_one(
    executable: Path, row: ResultRow, grad: str, module: str, log_file: Path, timeout_s: float
) -> CaseProfile:
    device = row.device if row.device.startswith("cuda") else "cuda:0"
    program = [
        sys.executable,
        "-m",
        "tfla_bench.run.profiling",
        device,
        grad,
        module,
        json.dumps(dataclasses.asdict(row.case)),
    ]
    try:
        kernels = ncu.profile(
            executable, program, log_file, timeout_s * TIMEOUT_FACTOR, options=ncu.GPU_CLOCKS
        )
    except ncu.NcuError as exc:
        return CaseProfile(row.case, exc.status, flops=row.flops, error=exc.reason)
    return summarize(row, kernels)


def write_profiles(run_dir: Path, profiles: Sequence[CaseProfile]) -> Path:
    """Merge `profiles` into `profile.csv` (a case profiled again replaces its row), atomically.

    The case columns are `CASE_COLUMNS` and the `param_*` columns of the profiled cases; readers
    join on them (`join_profile`).
    """
    path = run_dir / rundir.PROFILE
    fresh = {profile.case.key: profile.cells() for profile in profiles}
    old = _read_profile(path)
    if old is None:
        old = pd.DataFrame()
    kept = [cells for cells in old.to_dict("records") if row_schema.case_of(cells).key not in fresh]
    params = {c for c in old.columns if c.startswith("param_")}
    params |= {c for cells in fresh.values() for c in cells if c.startswith("param_")}
    columns = [*CASE_COLUMNS, *sorted(params), *PROFILE_COLUMNS]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(kept)
    writer.writerows({k: row_schema.cell(v) for k, v in cells.items()} for cells in fresh.values())
    rundir.write_atomic(path, buffer.getvalue())
    return path


def _read_profile(path: Path) -> pd.DataFrame | None:
    """`profile.csv` as text cells (empty cells stay empty), or None when the run has none.

    Raises:
        UserError: the file is not a profile record: not CSV, a column missing, or a line whose case
            cells no sweep writes.
    """
    if not path.exists():
        return None

    def refuse(what: str) -> UserError:
        return UserError(f"{path}: not a profile record ({what}); remove it and profile the run again")

    try:
        profile = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except (OSError, ValueError) as exc:  # pandas' parser and empty-file errors are ValueErrors
        raise refuse(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    missing = [c for c in (*CASE_COLUMNS, *PROFILE_COLUMNS) if c not in profile.columns]
    if missing:
        raise refuse(f"lacks {', '.join(missing)}")
    for line, cells in enumerate(profile.to_dict("records"), start=2):
        try:
            row_schema.case_of(cells)
        except (ValueError, KeyError) as exc:
            raise refuse(f"line {line}: {exc}") from None
    return profile


def _is_case_column(name: str) -> bool:
    return name in CASE_COLUMNS or name.startswith("param_")


def join_profile(frame: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """`frame` (rows of `results.csv`) with the `PROFILE_COLUMNS` of `profile.csv` where it exists.

    Rows without a profile get empty (NaN) profile cells; without `profile.csv` the frame is
    returned as it is.
    """
    profile = _read_profile(Path(run_dir) / rundir.PROFILE)
    if profile is None:
        return frame
    columns = [c for c in frame.columns if _is_case_column(c)]
    missing = [c for c in columns if c not in profile.columns]
    for column in missing:
        profile[column] = ""
    keyed = profile.assign(_case=_keys(profile, columns))[["_case", *PROFILE_COLUMNS]].drop_duplicates(
        "_case", keep="last"
    )
    for column in PROFILE_COLUMNS:
        if column not in ("profile_status", "profile_error"):
            keyed[column] = pd.to_numeric(keyed[column], errors="coerce")
    joined = frame.assign(_case=_keys(frame, columns)).merge(keyed, on="_case", how="left")
    return joined.drop(columns="_case").set_axis(frame.index)


def _keys(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    return [
        "|".join(_key_cell(value) for value in values) for values in frame[columns].itertuples(index=False)
    ]


def _key_cell(value: Any) -> str:
    """One value as the same text whether read as a string, a number, a boolean or a missing cell."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)) or value == "":
        return ""
    parsed = row_schema.parse_param(value) if isinstance(value, str) else value
    if isinstance(parsed, bool):
        return str(parsed).lower()
    if isinstance(parsed, float) and parsed.is_integer():
        return str(int(parsed))
    return str(parsed)


def roof_flops_per_s(intensity: float, roofs: MeasuredRoofs) -> float:
    """The measured roof at an intensity: min(matmul peak, HBM bandwidth x intensity)."""
    return min(roofs.matmul_flops_per_s, roofs.hbm_bytes_per_s * intensity)


def roof_check(frame: pd.DataFrame, roofs: MeasuredRoofs | None) -> pd.DataFrame:
    """Every `ok` row with FLOPs, bytes and a runtime, placed on the roofline, and whether it lies
    above the measured roof.

    Args:
        frame: rows of `results.csv`, joined with `profile.csv` (`join_profile`) or not.
        roofs: the run's measured roofs, or None (then nothing is flagged).

    Returns:
        The case columns with `flops`, `bytes` (the model's), `measured_bytes`, `model_intensity`,
        `measured_intensity`, `bytes_ratio` (model / measured), `achieved_flops_per_s`,
        `intensity_basis` (`measured` or `model`), `roof_flops_per_s` and `above_roof`.
    """
    rows = frame[
        (frame["status"] == "ok") & (frame["median_ms"] > 0) & (frame["flops"] > 0) & (frame["bytes"] > 0)
    ]
    table = rows[[c for c in rows.columns if _is_case_column(c)] + ["median_ms", "flops", "bytes"]].copy()
    measured = rows["measured_bytes"] if "measured_bytes" in rows else pd.Series(math.nan, index=rows.index)
    ok = rows["profile_status"].eq("ok") if "profile_status" in rows else pd.Series(False, index=rows.index)
    table["measured_bytes"] = measured.where(ok & (measured > 0))
    table["model_intensity"] = table["flops"] / table["bytes"]
    table["measured_intensity"] = table["flops"] / table["measured_bytes"]
    table["bytes_ratio"] = table["bytes"] / table["measured_bytes"]
    table["achieved_flops_per_s"] = table["flops"] / (table["median_ms"] * 1e-3)
    profiled = table["measured_intensity"].notna()
    table["intensity_basis"] = profiled.map({True: "measured", False: "model"})
    intensity = table["measured_intensity"].where(profiled, table["model_intensity"])
    if roofs is None:
        table["roof_flops_per_s"] = math.nan
        table["above_roof"] = False
    else:
        table["roof_flops_per_s"] = [roof_flops_per_s(i, roofs) for i in intensity]
        table["above_roof"] = table["achieved_flops_per_s"] > table["roof_flops_per_s"] * (1 + ROOF_TOLERANCE)
    return table.reset_index(drop=True)


def bytes_by_kernel(table: pd.DataFrame) -> pd.DataFrame:
    """Model bytes / measured bytes per kernel and mode over its profiled rows (median, min, max), and
    whether the model is off by more than `MODEL_OFF`."""
    profiled = table[table["bytes_ratio"].notna()]
    columns = ["kernel", "mode", "cases", "median", "min", "max", "model_off"]
    if profiled.empty:
        return pd.DataFrame(columns=columns)
    grouped = profiled.groupby(["kernel", "mode"])["bytes_ratio"]
    summary = grouped.agg(cases="count", median="median", min="min", max="max").reset_index()
    summary["model_off"] = (summary["median"] - 1).abs() > MODEL_OFF
    return summary[columns]


def profile_failures(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows that were chosen for profiling but not profiled, grouped by reason."""
    if "profile_status" not in frame:
        return pd.DataFrame(columns=["profile_status", "profile_error", "rows", "kernels"])
    failed = frame[frame["profile_status"].notna() & (frame["profile_status"] != "ok")]
    grouped = failed.groupby(["profile_status", "profile_error"])["kernel"]
    return grouped.agg(rows="count", kernels=lambda k: ", ".join(sorted(set(k)))).reset_index()


def _child(device: str, grad: str, module: str, case_json: str) -> None:
    """Run one case under the profiler: warm-up calls unprofiled, then one call between start and stop."""
    # torch takes seconds to import; only this path needs it.
    import torch

    # imports torch at import time, which only this path needs.
    from tfla_bench.measure.worker import clear_grads, grad_leaves, make_step

    registry.load()
    case = Case(**json.loads(case_json))
    try:
        adapter = registry.get(case.kernel)
    except UserError:
        importlib.import_module(module)
        adapter = registry.get(case.kernel)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    inputs = adapter.make_inputs(case, device)
    leaves = grad_leaves(inputs)
    step = make_step(adapter, inputs, case.mode, grad)
    for _ in range(WARMUP_CALLS):
        clear_grads(leaves)
        step()
    clear_grads(leaves)
    torch.cuda.synchronize(device)
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize(device)
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    _child(*sys.argv[1:5])
