"""Nsight Compute (`ncu`): find it, run one program under it, and parse its CSV.

The program is profiled only between `cudaProfilerStart` and `cudaProfilerStop` (`ncu
--profile-from-start off`; in Python `torch.cuda.profiler.start()` / `stop()`), so its warm-up
(compilation, autotuning, a first call) is not profiled. ncu writes its report to a log file
(`--log-file`), away from the program's own output, as CSV of its details page in base units:

    ncu --profile-from-start off --metrics M1,M2 --csv --page details --print-units base \\
        --log-file LOG -- PROGRAM ARGS

That CSV has one line per kernel launch and metric, with the columns `"ID","Process ID",
"Process Name","Host Name","Kernel Name",...,"Metric Name","Metric Unit","Metric Value"` (found by
name, in any order); lines before its header (`==PROF==` messages, warnings) are skipped.
`tests/data/ncu_sample.csv` is such a file. Values may carry thousands separators; units other
than the base ones (`Kbyte`, `usecond`) are converted, so a file written with `--print-units auto`
parses too.

ncu replays every kernel several times to collect its counters, restoring memory in between, so its
durations are not the runtime of the timed benchmark and are never used as such. By default ncu
would also lock the GPU's clocks to base; the suite never changes a GPU's clocks, so every profile
passes `GPU_CLOCKS` (`--clock-control none`: the GPU keeps its own clocks; the bytes are the same
either way). `tfla_bench.measure.validation` profiles single-kernel ops that way with only
`gpu__time_duration`, as an independent clock to check the suite's timing against.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tfla_bench.errors import UserError

NOT_FOUND = "ncu not found on PATH: install Nsight Compute (part of the CUDA toolkit) or pass --ncu-path"
GPU_CLOCKS = ("--clock-control", "none")  # leave the GPU's clocks as they are
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
DURATION = "gpu__time_duration.sum"
# Tensor-pipe utilization as a CSV may name it, preferred first: the whole tensor pipe (newer GPUs),
# then its mma part, which on an H100 counts wgmma too (ncu 2025.3.1: 94% for a cuBLAS bf16 GEMM).
TENSOR_PIPE = (
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
)
# Only the one known on Hopper is asked for: an unknown metric costs a second run of the case.
METRICS = (DRAM_READ, DRAM_WRITE, DURATION, TENSOR_PIPE[1])
NOT_PERMITTED = "ERR_NVGPUCTRPERM"
_UNIT_SCALE = {
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "nsecond": 1.0,
    "usecond": 1e3,
    "msecond": 1e6,
    "second": 1e9,
    # without `--print-units base`, ncu 2025 spells durations short
    "ns": 1.0,
    "us": 1e3,
    "ms": 1e6,
    "s": 1e9,
    "%": 1.0,
    "": 1.0,
}
_UNKNOWN_METRIC = re.compile(r"Failed to find metric\s+'?([\w.]+)")


class NcuError(Exception):
    """ncu could not profile the program; `reason` is one line for the profile row."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class KernelMetrics:
    """The metrics of one profiled kernel launch (None where ncu did not report one).

    Attributes:
        launch_id: ncu's ID of the launch.
        name: the kernel's name.
        dram_read_bytes, dram_write_bytes: DRAM traffic.
        duration_ns: `gpu__time_duration.sum` under ncu (replayed, clocks locked).
        tensor_pipe_pct: tensor-pipe cycles active, percent of peak sustained while active.
    """

    launch_id: int
    name: str
    dram_read_bytes: float | None = None
    dram_write_bytes: float | None = None
    duration_ns: float | None = None
    tensor_pipe_pct: float | None = None


def locate(ncu_path: Path | None) -> Path | None:
    """The ncu executable: `ncu_path` when given (a `UserError` if it is not an executable file),
    else `ncu` on PATH, else None."""
    if ncu_path is not None:
        if ncu_path.is_dir():
            raise UserError(f"--ncu-path {ncu_path}: is a folder; give the ncu program")
        if not ncu_path.is_file():
            raise UserError(f"--ncu-path {ncu_path}: no such file")
        if not os.access(ncu_path, os.X_OK):
            mode = stat.S_IMODE(ncu_path.stat().st_mode)
            raise UserError(f"--ncu-path {ncu_path}: not executable (mode {mode:o}); give the ncu program")
        return ncu_path
    found = shutil.which("ncu")
    return Path(found) if found else None


def require(ncu_path: Path | None) -> Path:
    """`locate`'s executable; a `UserError` saying how to get one when there is none."""
    found = locate(ncu_path)
    if found is None:
        raise UserError(NOT_FOUND)
    return found


def command(
    ncu: Path, metrics: Sequence[str], log_file: Path, program: Sequence[str], options: Sequence[str] = ()
) -> list[str]:
    """The ncu command line that profiles `program` between profiler start and stop (`options`:
    more ncu flags, such as `--clock-control none`)."""
    return [
        str(ncu),
        "--profile-from-start",
        "off",
        "--metrics",
        ",".join(metrics),
        "--csv",
        "--page",
        "details",
        "--print-units",
        "base",
        "--log-file",
        str(log_file),
        *options,
        "--",
        *program,
    ]


def profile(
    ncu: Path,
    program: Sequence[str],
    log_file: Path,
    timeout_s: float,
    metrics: Sequence[str] = METRICS,
    options: Sequence[str] = (),
) -> list[KernelMetrics]:
    """Run `program` under ncu and return the metrics of every kernel it launched while profiling.

    Args:
        ncu: the executable (`locate`).
        program: the command line to profile; it brackets what to profile with profiler start/stop.
        log_file: where ncu writes its report (kept: the per-kernel numbers).
        timeout_s: wall-clock limit of the whole ncu run.
        metrics: what to collect (default `METRICS`); a metric this ncu does not know is dropped and
            the program run again without it.
        options: more ncu flags (`command`).

    Raises:
        NcuError: `not_permitted` (`ERR_NVGPUCTRPERM`: no access to the GPU's performance counters),
            `no_kernels` (nothing was profiled), `timeout`, or `failed` with ncu's last error line.
    """
    metrics = list(metrics)
    while True:
        log_file.unlink(missing_ok=True)
        try:
            done = subprocess.run(
                command(ncu, metrics, log_file, program, options),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise NcuError("timeout", f"ncu did not finish within {timeout_s:g} s") from None
        except OSError as exc:
            raise NcuError("failed", f"cannot run {ncu}: {exc}") from None
        log = log_file.read_text(errors="replace") if log_file.exists() else ""
        output = "\n".join((log, done.stdout, done.stderr))
        unknown = [metric for metric in _UNKNOWN_METRIC.findall(output) if metric in metrics]
        if unknown and len(unknown) < len(metrics):
            metrics = [metric for metric in metrics if metric not in unknown]
            continue
        if NOT_PERMITTED in output:
            raise NcuError(
                "not_permitted",
                f"profiling not permitted ({NOT_PERMITTED}): no access to the GPU performance counters",
            )
        kernels = parse_csv(log)
        if kernels:
            return kernels
        if done.returncode != 0:
            raise NcuError("failed", _last_error(output) or f"ncu exited with code {done.returncode}")
        raise NcuError("no_kernels", "ncu profiled no kernel between profiler start and stop")


def _last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "Error" in line]
    return (errors or lines or [""])[-1][:300]


def parse_csv(text: str) -> list[KernelMetrics]:
    """Every kernel launch in ncu's `--csv --page details` output, in launch order.

    Args:
        text: the log file (or stdout) of ncu; lines before the CSV header are skipped.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _is_header(line)), None)
    if start is None:
        return []
    launches: dict[int, dict[str, float | None]] = {}
    names: dict[int, str] = {}
    for cells in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not cells.get("ID", "").strip().isdigit():
            continue  # a trailing ==PROF== line
        launch_id = int(cells["ID"])
        names.setdefault(launch_id, cells.get("Kernel Name", ""))
        value = _number(cells.get("Metric Value", ""), cells.get("Metric Unit", ""))
        launches.setdefault(launch_id, {})[cells.get("Metric Name", "")] = value
    return [
        KernelMetrics(
            launch_id=launch_id,
            name=names[launch_id],
            dram_read_bytes=values.get(DRAM_READ),
            dram_write_bytes=values.get(DRAM_WRITE),
            duration_ns=values.get(DURATION),
            tensor_pipe_pct=next((values[m] for m in TENSOR_PIPE if values.get(m) is not None), None),
        )
        for launch_id, values in sorted(launches.items())
    ]


def _is_header(line: str) -> bool:
    cells = next(csv.reader([line]), [])
    return {"ID", "Kernel Name", "Metric Name", "Metric Value"} <= set(cells)


def _number(text: str, unit: str) -> float | None:
    """A metric value in base units (bytes, nanoseconds, percent); None for `n/a` or an unknown unit."""
    text = text.strip().replace(",", "")
    scale = _UNIT_SCALE.get(unit.strip().lower())
    try:
        return float(text) * scale if scale is not None else None
    except ValueError:
        return None
