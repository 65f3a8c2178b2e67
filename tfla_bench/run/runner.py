"""The sweep runner: every case of a spec measured in isolated worker processes, one CSV row per case.

Measurement method
------------------
Each case runs in a worker process that owns one device (`tfla_bench.measure.worker`):

1. Inputs: `torch.manual_seed(0)`, then `adapter.make_inputs(case, device)` in the library's layout
   and value ranges. The memory allocated right after is the inputs baseline.
2. First call: one call between two synchronizations, timed with `time.perf_counter`, is
   `first_call_s`. It contains Triton compilation and autotuning, cuDNN plan building and the
   imports that the adapter's `available` does not make (the worker made those before its first
   case), which is why it is kept apart from the runtime. After `--precompile N`
   (`tfla_bench.run.precompile`) the kernels are already compiled, so it should hold mostly the
   autotuner's timing runs, each config timed for `autotune_ms` (20 ms; Triton's own 100 ms,
   `timing.autotuning_budget`). Those are kept in Triton's cache directory
   (`worker.AUTOTUNE_CACHE_ENV`, recorded as `autotune_cache` in env.json): a case whose
   autotuners were timed before, in this sweep or an earlier one with the same cache, reuses
   their choice and its first call holds neither. A cache carried from another machine of the
   same GPU architecture (`tfla_bench.kernel_cache`) brings both; env.json's `kernel_cache` names
   where it was packed.
3. Warmup: untimed calls for `warmup_s` (25 ms, at least one), or exactly `warmup` calls when the
   spec fixes them (paper: 10). They also measure the host's time to queue one call.
4. Peak memory (CUDA): `torch.cuda.reset_peak_memory_stats`, one call, `max_memory_allocated` is
   `peak_memory_bytes`; minus the inputs baseline it is `peak_memory_above_inputs_bytes`. The L2
   flush buffer does not exist yet and is not counted. The paper's numbers include its 256e6-byte
   flush buffer and accumulated gradients, so they sit above ours. On CPU memory is not measured:
   the cells are empty and the row's note says so.
5. Runtime: timed calls until the stop rule of `tfla_bench.measure.timing` is met: by default until the
   median's 95% confidence interval is within +-1% (`rel_ci`) after at least 0.2 s of timed calls
   (`min_time_s`), or 1 s of timed calls (`budget_s`), at least 5 and at most 2000; or exactly
   `reps` when the spec fixes them (paper: 30). Before each, outside the timed window, every input
   gradient is set to None and, on GPU with `l2_flush` (default on, as in the paper), a buffer of
   max(2 x L2, 256e6) bytes is zeroed so the call starts with a cold L2; then a GPU spin lasting
   1.5x the host's queueing time lets the host queue the whole call before the GPU reaches it. Each
   call is bracketed by CUDA events on the current stream (GPU; with `clock = "kernels"` its span in
   the GPU's activity record instead) or `time.perf_counter` (CPU, same loop). Reported: the median
   (the headline number), p20, p80, min, the calls made (`warmup`, `reps`), the median's interval
   (`ci_rel`), why timing stopped (`stop`), and the share of calls the GPU may have waited for the
   host in (`host_gap_share`). With `cuda_graph`, one call is
   captured in a CUDA graph and its replays are timed, which removes launch overhead; the flush
   still runs before each replay, outside the graph.
6. GPU state (CUDA, with nvidia-ml-py): before anything else the worker waits, at most 1 s, for
   the GPU to leave a power cap or slowdown left by the case before (`settle_s`); then clocks,
   temperature, power and throttle reasons are read before the inputs are made and after the last
   timed call (`tfla_bench.measure.gpustate`); `throttled` flags a row measured under a power, thermal or
   hardware slowdown. A case whose power cap sets in while it is timed is timed again
   (`power_cap`: with an idle gap after each call, or back to back).
7. Energy (CUDA, with nvidia-ml-py; `energy = false` turns it off): after the timed calls, NVML's
   energy counter is read, after one of its updates, around at least 0.5 s of back-to-back calls
   without flush or spin, the device synchronized at both ends; `energy_mj` is its rise over the
   calls (the GPU's idle power included) and `tokens_per_joule` batch x seq_len over it in joules
   (`tfla_bench.measure.energy`). Where a row has none, `env.json`'s `measurement.energy.missing`
   says why.

A call is, in `fw`, the forward under `torch.no_grad()`; in `fwbw`, the forward and then the
backward from a fixed upstream gradient (`grad = "fixed"`: one `randn_like(out)` made on the
first call and reused) or from `out.sum()` (`grad = "sum"`, the sum inside the timed call, as in
the paper). Gradients are set to None before every call, never accumulated, so each call
allocates them afresh, like a training step after `zero_grad(set_to_none=True)`.
`tflops` = flops / median and `gbps` = bytes / median, from the adapter's analytic counts.

Robustness
----------
- Statuses decided here, before any worker is involved: `unavailable` (the adapter's
  `available()` reason, or "needs CUDA" for an adapter that is not CPU-capable on a machine
  without CUDA), `unsupported` (mode or dtype not supported, or the adapter's `check(case)`
  reason), `failed_check` (the adapter failed the correctness gate; not run).
- Statuses from the worker: `ok`, `oom` (CUDA out of memory, caught; the worker goes on),
  `error` (any other exception, with its last line). From the parent: `crashed` (the worker died:
  abort, segfault, LLVM assertion) and `timeout` (no result within `timeout_s`, first call
  included; the worker is killed), both with the last lines of the worker's log; `interrupted`
  (the worker was killed by a signal only someone else sends: a job's cancel, preemption or time
  limit; `--resume` runs the case again). The worker is replaced before the next case; the sweep
  goes on.
- One worker process per device and adapter, spawned, cases sent one at a time: what a library
  leaves in its process cannot change another library's times (`tfla_bench.measure.worker`). While an
  adapter measures on a GPU, spare processes for the next `SPARES_AHEAD` adapters initialize the
  device and import their libraries, and the process before exits in the background, so a switch
  seldom waits (on the CPU, where they would share the cores with the timed calls, the next
  process starts after the adapter's last case). Cases are sharded over devices by a stable hash of
  `Case.key`, so a resumed run gives every case the same device.
- The run directory and its files belong to `tfla_bench.run.rundir`: rows are appended to
  `results.csv` as they finish, one write and one fsync each; `env.json` is written before the
  first case runs; `spec.json` holds the spec for `--resume`; `timings.json` (`tfla_bench.run.phases`)
  the wall time per phase and per adapter when the sweep ends. Every row names the node (`host`)
  and, for a case a GPU measured, the GPU (`gpu_name`). Ctrl-C, or a job's preemption inside a
  sweep through jobs (`tfla_bench.run.shard`), kills the workers and keeps every row already written.
  The caller holds the directory's lock (`rundir.RunLock`), or a job its own shard directory.
- `--resume DIR` keeps every finished row and runs only the other cases. Finished means any
  status except `unavailable`, `unsupported` and `failed_check` (those cost nothing to decide
  again and may change after an install or a fix, so their rows are replaced) and `interrupted`. A case that
  crashed, hung, ran out of memory or raised keeps its row unless `--retry` names its status;
  then it runs again and its new row replaces the old one. A spec that differs from the run's
  own `spec.json` is refused unless forced (`check_run_dir`), and so is a run measured on a GPU
  resumed on a host without CUDA; a torn last row is dropped with a warning and its case runs again.
  With the run's own spec, `spec.json` stays as it was (`record_spec`).
- A write that fails (a full disk, a read-only directory) before the first row is a `UserError`
  (exit 2); after it, a `RunFailed` (exit 1). Either way every row written before stays.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import itertools
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.progress import Progress

from tfla_bench.adapters import registry
from tfla_bench.adapters.mlstm import OwnKernelAdapter
from tfla_bench.adapters.workloads import Case
from tfla_bench.errors import RunFailed, UserError, interrupted_line
from tfla_bench.measure import energy, envinfo
from tfla_bench.measure import roofs as roofs_module
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.row import ResultRow
from tfla_bench.measure.settings import as_recorded
from tfla_bench.measure.worker import (
    CrashGuard,
    Job,
    Measurement,
    Worker,
    autotune_cache_setting,
    carried_kernel_cache,
    cute_cache_dir,
)
from tfla_bench.model import roofline
from tfla_bench.model.hardware import Accelerator
from tfla_bench.run import phases, rundir
from tfla_bench.run.console import case_label, make_console, progress_bar, row_line, timing_notes
from tfla_bench.run.phases import PhaseClock
from tfla_bench.run.precompile import (
    DONE_FILE,
    PrecompileJob,
    PrecompileResult,
    PrecompileSummary,
    precompile,
)
from tfla_bench.run.specs import Spec, expand, parse_spec

# New runs land in an ignored folder; `results/runs/` holds only the runs the docs cite, moved there by hand.
RUNS_DIR = Path("runs")
# Spare worker processes kept starting ahead of the adapter that measures. With one, a spare that
# imported mamba_ssm or fla was not ready when the adapter before it ended on the H100 node:
# `mamba2_split_conv` and `gla` took 12.7 and 12.3 s in the sweep, 5.9 and 6.2 s in a shared worker.
SPARES_AHEAD = 2


@dataclass
class SweepReport:
    """What a sweep did.

    Attributes:
        run_dir: the run directory.
        rows: every row of `results.csv` after the sweep (kept rows of a resumed run included).
        decided: cases given a status without running.
        dispatched: cases sent to workers.
        kept: finished rows kept from an earlier attempt (`--resume`).
        worker_starts: worker processes started (restarts after a crash or timeout included).
    """

    run_dir: Path
    rows: list[ResultRow]
    decided: int = 0
    dispatched: int = 0
    kept: int = 0
    worker_starts: int = 0


@dataclass
class _Planned:
    """A case to run, with what the parent knows about it."""

    case: Case
    adapter: registry.Adapter
    flops: float
    bytes: float
    shard: int = 0


def default_run_dir(spec_name: str) -> Path:
    """`runs/<spec>-<YYYYmmdd-HHMMSS>` (relative to the working directory)."""
    return RUNS_DIR / f"{spec_name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def check_out_or_resume(out: Path | None, resume: Path | None) -> None:
    """A sweep writes a new run (`--out`) or continues one (`--resume`), not both."""
    if out is not None and resume is not None:
        raise UserError("give --out or --resume, not both")


def resolve_run_dir(spec_name: str, out: Path | None, resume: Path | None) -> tuple[Path, bool]:
    """The run directory, created if needed, and whether it is resumed.

    A default directory is new: made with `mkdir` (atomic), with a `-2`, `-3`, ... suffix when
    another sweep made that name first.

    Args:
        spec_name: for the default directory name.
        out: `--out`, a new (or empty) run directory.
        resume: `--resume`, an existing run directory.
    """
    check_out_or_resume(out, resume)
    if resume is not None:
        if not (resume / rundir.SPEC).is_file():
            raise UserError(f"--resume {resume}: not a run directory (no {rundir.SPEC})")
        return resume, True
    try:
        if out is not None:
            if out.exists() and not out.is_dir():
                raise UserError(f"--out {out}: exists and is not a directory")
            out.mkdir(parents=True, exist_ok=True)
            return out, False
        base = default_run_dir(spec_name)
        base.parent.mkdir(parents=True, exist_ok=True)
        for number in itertools.count(1):
            candidate = base if number == 1 else base.with_name(f"{base.name}-{number}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return candidate, False
    except OSError as exc:
        raise UserError(f"cannot create the run directory: {exc.strerror}: {exc.filename}") from None
    raise AssertionError("unreachable")


def check_run_dir(
    run_dir: Path, spec: Spec, *, resume: bool, force: bool = False, cuda: bool | None = None
) -> str | None:
    """Refuse a run directory the sweep must not write into; the spec difference `force` accepted.

    Call it holding the directory's lock, before anything is written. Both refuse a `timings.json`
    that is not a timing record, and a folder where the run keeps a file (`worker-0.log/`). A new
    run refuses a directory that holds rows, or a run's `spec.json` or `env.json`. A resumed one
    refuses a spec that differs from its `spec.json` (unless `force`), an `env.json` of a newer
    schema, a `results.csv` that cannot be repaired, and, where `cuda` is False (the sweep would run
    here, on no GPU), a run measured on a GPU: here its cases could only be marked unavailable, and
    the rows decided there without running (`unsupported` on that GPU) would be decided again.
    """
    csv_path = run_dir / rundir.RESULTS
    rundir.refuse_folders_for_files(run_dir)
    phases.read(run_dir)  # the record the sweep's own will keep under `earlier`
    if not resume:
        if rundir.read_results(csv_path).rows:
            raise UserError(
                f"{run_dir} already holds results; continue it with --resume {run_dir} or pick another --out"
            )
        records = [name for name in (rundir.SPEC, rundir.ENV) if (run_dir / name).exists()]
        if records:
            # a run stopped before its first row, or what one left: its records would be mixed with ours
            raise UserError(
                f"{run_dir} already holds a run's {' and '.join(records)}; continue it with --resume "
                f"{run_dir} or pick another --out"
            )
        return None
    rundir.read_env(run_dir)
    recorded = load_run_spec(run_dir).to_dict()
    edited = rundir.spec_edit(run_dir, recorded)
    if edited and not force:
        raise UserError(
            f"--resume {run_dir}: its {rundir.SPEC} was edited after the run wrote it, at {edited}; its "
            "rows were measured with the spec it held: undo the edit, or resume with --force to measure "
            "the rest with it"
        )
    difference = rundir.spec_difference(recorded, spec.to_dict())
    if difference and not force:
        raise UserError(
            f"--resume {run_dir}: the spec differs from the run's own at {difference} "
            "(--force mixes them deliberately)"
        )
    kept = rundir.read_results(csv_path).for_resume()
    gpus = rundir.gpu_counts(kept, rundir.read_env(run_dir)) if cuda is False else {}
    if gpus:
        raise UserError(
            f"--resume {run_dir}: it was measured on {', '.join(gpus)}, and this host has no CUDA device, "
            "where its cases could only be marked unavailable (needs CUDA): resume it on a host with a "
            "GPU; the run is left as it is"
        )
    return "; ".join(filter(None, [edited and f"{rundir.SPEC} edited at {edited}", difference])) or None


def load_run_spec(run_dir: Path) -> Spec:
    """The spec saved in a run directory (for `--resume` without a spec file)."""
    path = run_dir / rundir.SPEC
    try:
        raw = rundir.read_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected the run's spec as a JSON object, got {json.dumps(raw)[:40]}")
    return parse_spec(as_recorded(raw), str(path))


def resume_plan(
    cases: list[Case], csv_path: Path, retry: Iterable[str], console: Console
) -> tuple[list[Case], list[ResultRow], list[str]]:
    """What a resume runs and keeps: the cases without a finished row (or with a row of a status in
    `retry`), the rows kept, and the header for both. A torn last row is dropped with a warning.

    Args:
        cases: the run's cases.
        csv_path: its `results.csv`.
        retry: statuses among `tfla_bench.measure.row.RERUNNABLE_STATUSES` to run again, and
            `RETRY_BESIDE` for the rows measured beside the precompile (`measured_beside`).
        console: where the warning goes.
    """
    read = rundir.read_results(csv_path)
    existing = read.for_resume()
    if len(existing) < len(read.rows):
        console.print(
            f"[yellow]warning:[/] {csv_path}: {len(read.rows) - len(existing)} row(s) repeat an earlier "
            "row word for word; a resume keeps each once"
        )
    if read.torn:
        console.print(
            f"[yellow]warning:[/] {csv_path} line {read.skipped[-1].line}: {read.skipped[-1].reason}; "
            "dropped, that case runs again"
        )
    again = set(retry)
    beside = RETRY_BESIDE in again
    finished = {
        row.case.key
        for row in existing
        if row.finished and row.status not in again and not (beside and measured_beside(row))
    }
    cases = [case for case in cases if case.key not in finished]
    todo = {case.key for case in cases}
    kept = [row for row in existing if row.case.key not in todo]
    unknown = sorted({row.case.kernel for row in kept if registry.find(row.case.kernel) is None})
    if unknown:
        console.print(
            f"[yellow]warning:[/] {csv_path}: rows of {', '.join(unknown)}, which no adapter here knows; "
            "kept as they are, and never run again"
        )
    columns = row_schema.columns_for([*(row.case for row in kept), *cases])
    columns = [*dict.fromkeys([*read.header, *columns])] if read.header else columns
    return cases, kept, columns


# More GPUs than any node has: a `--gpus` count above it is a typo, refused before a list of it is made.
MAX_GPUS = 1024


def select_devices(gpus: str | None) -> list[str]:
    """Worker devices: every visible GPU, the first N (`--gpus N`), a list (`--gpus 0,2`), or `cpu`.

    Args:
        gpus: the `--gpus` value or None.
    """
    indices: list[int] = []
    if gpus is not None:
        try:
            if "," in gpus:
                indices = [int(part) for part in gpus.split(",") if part.strip()]
            elif 0 < int(gpus) <= MAX_GPUS:
                indices = list(range(int(gpus)))
        except ValueError:
            indices = []
        if not indices or min(indices) < 0 or len(set(indices)) != len(indices):
            raise UserError(
                f"--gpus: expected a count >= 1 or a comma list of distinct GPU indices, got {gpus!r}"
            )
    import torch

    if not torch.cuda.is_available():
        if gpus is not None:
            raise UserError("--gpus: no CUDA device is visible")
        return ["cpu"]
    count = torch.cuda.device_count()
    if gpus is None:
        return [f"cuda:{index}" for index in range(count)]
    if not all(i < count for i in indices):
        raise UserError(f"--gpus {gpus}: {count} GPU(s) visible (indices 0..{count - 1}), no repeats")
    return [f"cuda:{index}" for index in indices]


def shard_of(key: str, shards: int) -> int:
    """The worker index of a case key: a stable hash, the same in every process and every run."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % shards


def decide(
    case: Case,
    adapter: registry.Adapter,
    *,
    cuda: bool,
    unavailable: str | None,
    failed_check: dict[str, str],
) -> ResultRow | None:
    """The row of a case that is not run (unavailable, unsupported, failed the gate), else None.

    Args:
        case: the case.
        adapter: its adapter.
        cuda: whether CUDA devices are used.
        unavailable: the adapter's `available()` reason (asked once per adapter by the caller).
        failed_check: adapter name to the reason it failed the correctness gate.
    """

    def row(status: str, reason: str) -> ResultRow:
        return ResultRow(case=case, family=adapter.family, status=status, error=reason)

    if not cuda and not adapter.cpu_capable:
        return row("unavailable", "needs CUDA")
    if unavailable:
        return row("unavailable", unavailable)
    if case.mode not in adapter.modes:
        return row("unsupported", f"mode {case.mode} not supported (supports {', '.join(adapter.modes)})")
    if case.dtype not in adapter.dtypes:
        return row("unsupported", f"dtype {case.dtype} not supported (supports {', '.join(adapter.dtypes)})")
    reason = adapter.check(case)
    if reason:
        return row("unsupported", reason)
    if adapter.name in failed_check:
        return row("failed_check", failed_check[adapter.name])
    return None


def plan(
    cases: list[Case],
    *,
    cuda: bool,
    failed_check: dict[str, str] | None = None,
    clock: PhaseClock | None = None,
) -> tuple[list[ResultRow], list[_Planned]]:
    """Split cases into rows decided now and cases to run (with their analytic counts); with `clock`,
    the seconds spent on each adapter's cases go to its `plan_s`. Whether each adapter can run here
    is asked first, for all of them at once (`registry.availability`)."""
    failed_check = failed_check or {}
    reasons = registry.availability(list({case.kernel: registry.get(case.kernel) for case in cases}.values()))
    decided, to_run = [], []
    for case in cases:
        began = time.monotonic()
        adapter = registry.get(case.kernel)
        row = decide(case, adapter, cuda=cuda, unavailable=reasons[adapter.name], failed_check=failed_check)
        if clock is not None:
            clock.add_plan(adapter.name, time.monotonic() - began)
        if row is not None:
            decided.append(row)
        else:
            to_run.append(
                _Planned(case, adapter, adapter.flops(case, case.mode), adapter.bytes(case, case.mode))
            )
    return decided, to_run


def sweep_notes(cases: list[Case], *, cuda: bool) -> list[str]:
    """What a reader of the sweep's output must know before its numbers: without CUDA, which
    adapters run at all; each adapter's `row_note` (its timings are no speed claim), once."""
    names = sorted({case.kernel for case in cases})
    lines = []
    if not cuda and names:  # a resume with nothing left to run has nothing to say of what runs
        cpu_names = [name for name in names if registry.get(name).cpu_capable]
        others = [name for name in names if name not in cpu_names]
        line = f"no CUDA device: only CPU-capable adapters run ({', '.join(cpu_names) or 'none here'})"
        if others:
            line += "; the others get status unavailable (needs CUDA)"
        interpretable = [name for name in others if isinstance(registry.get(name), OwnKernelAdapter)]
        if interpretable:
            line += f"; TRITON_INTERPRET=1 runs {', '.join(interpretable)} in Triton's CPU interpreter"
        lines.append(line)
    return lines + [f"{line} (said in their rows' note)" for line in timing_notes(names)]


def run_sweep(
    spec: Spec,
    cases: list[Case],
    run_dir: Path,
    *,
    resume: bool = False,
    retry: Iterable[str] = (),
    forced: str | None = None,
    devices: list[str] | None = None,
    failed_check: dict[str, str] | None = None,
    precompile_processes: int = 0,
    roofs: bool = False,
    tune: bool | None = None,
    console: Console | None = None,
    clock: PhaseClock | None = None,
) -> SweepReport:
    """Measure `cases` and write `results.csv`, `env.json` and `spec.json` into `run_dir`.

    Args:
        spec: the spec the cases come from (saved for `--resume`; its measurement settings apply).
        cases: from `specs.expand`.
        run_dir: from `resolve_run_dir`, checked by `check_run_dir`.
        resume: keep the finished rows already in `run_dir` and run only the other cases.
        retry: statuses among `tfla_bench.measure.row.RERUNNABLE_STATUSES` whose rows a resume runs again and
            replaces.
        forced: the difference from the run's own spec that `--force` accepted (kept in env.json).
        devices: worker devices (`select_devices`); default: every visible GPU, or `cpu`.
        failed_check: adapter names that failed the correctness gate, with the reason; their cases
            get status `failed_check` without running.
        precompile_processes: with N > 0, compile the cases' kernels in N processes, first on the
            CPU and beside the measuring on a GPU (`tfla_bench.run.precompile`, `measuring_order`;
            what it did goes to `env.json` under `precompile`).
        roofs: on CUDA, record the GPU's measured roofs in `env.json` under `roofs`, loaded, or
            measured when none are saved, by a child process that runs beside the plan
            (`tfla_bench.measure.roofs`).
        tune: on CUDA, first tune our kernels at every shape to run that has no tuned config for
            this GPU (`tfla_bench.measure.tuning.tune_missing`, into the user's tuned-config file);
            None (the default) does so too, and says nothing on a CPU, where True gets a note.
        console: where progress goes (default: stderr).
        clock: the command's `PhaseClock` (a gate before the sweep is in it); default one started
            here. Written as `timings.json` when the sweep ends, interrupted or not.

    Returns:
        A `SweepReport`. Ctrl-C kills the workers and re-raises `KeyboardInterrupt` after the rows
        written so far are safely on disk.

    Raises:
        UserError: the directory cannot be written before the first row.
        RunFailed: a write failed after the sweep started (every earlier row is kept).
    """
    console = console or make_console(stderr=True)
    clock = clock or PhaseClock()
    devices = devices or select_devices(None)
    cuda = devices[0] != "cpu"
    csv_path = run_dir / rundir.RESULTS
    # the spec's order, for rows a resume keeps of cases another selection (-k, --seq-len) ran too
    order = list(dict.fromkeys([case.key for case in expand(spec)] + [case.key for case in cases]))
    kept: list[ResultRow] = []
    columns = row_schema.columns_for(cases)
    if resume:
        cases, kept, columns = resume_plan(cases, csv_path, retry, console)
    writer = _start_results(run_dir, spec, kept, columns, resume=resume, forced=forced)
    for line in sweep_notes(cases, cuda=cuda):
        console.print(f"[bold]note:[/] {line}")
    decided, to_run, roofs_child = _plan_beside_roofs(cases, devices[0], roofs, failed_check, clock)
    report = SweepReport(
        run_dir=run_dir, rows=[], decided=len(decided), dispatched=len(to_run), kept=len(kept)
    )
    sweep = _Sweep(spec, run_dir, devices, writer, console, clock, socket.gethostname(), forced)
    try:
        report.worker_starts = sweep.run(decided, to_run, len(kept), roofs_child, precompile_processes, tune)
    except OSError as exc:
        raise RunFailed(
            f"writing to {run_dir} failed ({exc.strerror}); the {len(kept) + writer.written} row(s) "
            f"written before are kept; continue with --resume {run_dir}"
        ) from None
    finally:
        writer.close()
        # timings.json is secondary: failing to write it must not hide how the run itself ended.
        with contextlib.suppress(OSError):
            clock.write(run_dir)
    put_in_spec_order(csv_path, order, console)
    report.rows = rundir.read_results(csv_path).rows
    return report


def put_in_spec_order(csv_path: Path, order: list[str], console: Console) -> None:
    """Rows come as their cases finish and a resume's after the kept ones; the finished run lists
    them in its spec's order, each line as written. A failure leaves every row where it was."""
    try:
        rundir.order_results(csv_path, order)
    except OSError as exc:
        console.print(f"[yellow]warning:[/] {csv_path} keeps its rows in the order they came: {exc.strerror}")


def _plan_beside_roofs(
    cases: list[Case], device: str, roofs: bool, failed_check: dict[str, str] | None, clock: PhaseClock
) -> tuple[list[ResultRow], list[_Planned], subprocess.Popen | None]:
    """The plan, with the roofs' child process (GPU work) started first, so that it runs while the
    plan imports the adapters' libraries (host work); the child is cancelled if the plan fails."""
    cuda = device != "cpu"
    roofs_child = roofs_module.start_for_sweep(device) if roofs and cuda else None
    try:
        with clock.phase("plan"):
            decided, to_run = plan(cases, cuda=cuda, failed_check=failed_check, clock=clock)
    except BaseException:
        if roofs_child is not None:
            roofs_module.cancel(roofs_child)
        raise
    return decided, to_run, roofs_child


def record_spec(run_dir: Path, spec: Spec, *, resume: bool, forced: str | None) -> None:
    """Write the run's `spec.json`, but for a resume that measures with the run's own spec: that file
    stays as it is, byte for byte (a spec of an older version gains no setting it did not name)."""
    if not resume or forced:
        rundir.write_spec(run_dir, spec.to_dict())


def _start_results(
    run_dir: Path, spec: Spec, kept: list[ResultRow], columns: list[str], *, resume: bool, forced: str | None
) -> rundir.RowWriter:
    """`results.csv` with the kept rows (a fresh run starts a fresh file: an earlier attempt may have
    left a header and no rows) and `spec.json` (`record_spec`); the writer of the rows to come."""
    csv_path = run_dir / rundir.RESULTS
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        rundir.rewrite_results(csv_path, kept, columns)
        record_spec(run_dir, spec, resume=resume, forced=forced)
        return rundir.RowWriter(csv_path, columns)
    except OSError as exc:
        raise UserError(f"cannot write to {run_dir}: {exc.strerror}") from None


@dataclass
class _Sweep:
    """What the phases after the plan share: roofs, precompile, workers and measuring."""

    spec: Spec
    run_dir: Path
    devices: list[str]
    writer: rundir.RowWriter
    console: Console
    clock: PhaseClock
    host: str
    forced: str | None

    def run(
        self,
        decided: list[ResultRow],
        to_run: list[_Planned],
        kept: int,
        roofs_child: subprocess.Popen | None,
        precompile_processes: int,
        tune: bool | None = None,
    ) -> int:
        """Write the decided rows, then measure `to_run`; the worker processes started."""
        console, clock, devices = self.console, self.clock, self.devices
        for row in decided:
            self.writer.write(dataclasses.replace(row, host=self.host))
        if kept:
            console.print(f"resuming {self.run_dir}: {kept} finished row(s) kept")
        if decided:
            console.print(f"{len(decided)} case(s) not run (unavailable, unsupported or failed check)")
        measured_roofs = None
        if roofs_child is not None and to_run:
            with clock.phase("roofs"):
                measured_roofs = _roofs(devices[0], roofs_child, console)
        elif roofs_child is not None:
            roofs_module.cancel(roofs_child)
        cuda = devices[0] != "cpu"
        if tune and not cuda:
            console.print(
                "[bold]note:[/] --tune times kernels on a GPU; this CPU run uses the configs as they are"
            )
        elif tune is not False and cuda and to_run:
            with clock.phase("tune"):
                _tune([planned.case for planned in to_run], devices[0], precompile_processes, console)
        precompiled = compiling = None
        if precompile_processes > 0 and to_run and compile_beside(cuda):
            # Compiling goes on beside the measuring: the adapters with nothing to compile measure first.
            to_run = measuring_order(to_run, measured_roofs)
            progress = progress_bar(console, eta=True)
            compiling = _Compiling(self, to_run, precompile_processes, progress)
        elif precompile_processes > 0 and to_run:
            with clock.phase("precompile"):
                precompiled = _precompile(
                    to_run, precompile_processes, devices, self.run_dir, self.spec, console, clock
                )
        try:
            with clock.phase("workers"):
                workers = _start_workers(
                    devices,
                    to_run,
                    self.run_dir,
                    self.spec,
                    cuda,
                    console,
                    precompiled,
                    measured_roofs,
                    self.forced,
                )
            try:
                with clock.phase("measuring"):
                    sides = _Sides(precompiled, compiling)
                    _Dispatch(self.spec, self.writer, console, clock, self.host, sides).run(to_run, workers)
            finally:
                for worker in workers:
                    worker.stop()
        finally:
            if compiling is not None:
                compiling.end(self.run_dir)
        return sum(worker.starts for worker in workers)


def compile_beside(cuda: bool) -> bool:
    """Whether the precompile runs beside the measuring: on a GPU, where the measuring needs one core
    and the GPU, and compiling needs the other cores; on the CPU the timed calls need the cores."""
    return cuda


def measuring_order(to_run: list[_Planned], roofs: dict | None = None) -> list[_Planned]:
    """The cases in the order a sweep that compiles beside its measuring takes them: the adapters with
    nothing to precompile first, then those without an autotuner, then the autotuned ones (they
    compile longest), then the long calls of every adapter (`long_call`), each group in spec order.
    The order is the same whether or not the Triton cache holds the kernels already, so a warm run
    measures in the same order as a cold one.

    The long calls come last because the precompile has ended by then: the last group before them
    waits for its kernels' runs, and those are the precompile's last. A call shares the GPU with the
    precompile processes' torch work as long as it runs, so on an H200 `sdpa` calls of 50-800 ms took
    2.5-5.3% longer beside it than after it, while the median of many short calls kept clear of it
    (`results/runs/fig5_consttoken-20261202-h200-beside-warm/diff_vs_beside.csv`)."""

    known = roofs is not None and "error" not in roofs
    accelerator = roofs_module.MeasuredRoofs.from_dict(roofs).accelerator() if known else None

    def group(planned: _Planned) -> int:
        adapter = planned.adapter
        if accelerator is not None and long_call(planned, accelerator):
            return 3
        return 0 if adapter.precompile == "none" else 2 if adapter.autotuned else 1

    return sorted(to_run, key=group)


def long_call(planned: _Planned, accelerator: Accelerator) -> bool:
    """Whether the model puts one call of the case at `LONG_CALL_S` or longer at `accelerator`'s
    roofs (the GPU's measured ones)."""
    return roofline.runtime_ms_lower(planned.flops, planned.bytes, accelerator) / 1e3 >= LONG_CALL_S


class _Compiling:
    """The precompile of a GPU sweep, running in a thread beside the measuring
    (`precompile.precompile(..., beside_measuring=True)`, compile-only): each adapter's first case
    waits (`wait`) until none of its runs is left, and learns then which of its cases the precompile's
    crashes decide. `end` stops what is left, waits for the thread and writes the summary into the
    latest attempt's env.json (`precompile`)."""

    def __init__(self, sweep: _Sweep, to_run: list[_Planned], processes: int, progress: Progress) -> None:
        self.progress = progress
        self.changed = threading.Condition()
        self.ready: dict[str, dict[str, str]] = {}
        self.finished = False
        self.summary: PrecompileSummary | None = None
        self.stop = threading.Event()
        order = list(dict.fromkeys(planned.case.kernel for planned in to_run))
        self.kernels = len(order)
        # Triton and our kernels' configs (which import it) are imported by the thread and by the
        # workers' start at once otherwise: Python then finds a deadlock in the two threads' import
        # locks and fails one of them (the sweep with a traceback, or the precompile).
        from tfla_bench.kernels import config  # noqa: F401

        self.thread = threading.Thread(target=self._run, args=(sweep, to_run, processes, order), daemon=True)
        self.thread.start()

    def _run(self, sweep: _Sweep, to_run: list[_Planned], processes: int, order: list[str]) -> None:
        try:
            with sweep.clock.phase("precompile", beside=True):
                self.summary = _precompile(
                    to_run,
                    processes,
                    sweep.devices,
                    sweep.run_dir,
                    sweep.spec,
                    sweep.console,
                    sweep.clock,
                    beside=self,
                    order=order,
                )
        except Exception as exc:  # the sweep goes on: its first calls compile what is missing
            self.progress.console.print(
                f"[yellow]precompile stopped: {exc}[/] (the sweep compiles in its first calls)"
            )
        finally:
            with self.changed:
                self.finished = True
                self.changed.notify_all()

    def kernel_done(self, kernel: str, crashed: dict[str, str]) -> None:
        with self.changed:
            self.ready[kernel] = crashed
            self.changed.notify_all()

    @property
    def running(self) -> bool:
        """Whether runs are left: some kernel's compiling is not done."""
        with self.changed:
            return not self.finished and len(self.ready) < self.kernels

    def wait(self, kernel: str | None, stop: threading.Event) -> tuple[dict[str, str], float]:
        """Wait until `kernel`'s runs are done (None: every run), or the precompile ended, or `stop`;
        the kernel's crashed cases and the seconds waited."""
        began = time.monotonic()
        with self.changed:
            while not self.finished and not stop.is_set() and (kernel is None or kernel not in self.ready):
                self.changed.wait(0.2)
            crashed = self.ready.get(kernel, {}) if kernel is not None else {}
        return crashed, time.monotonic() - began

    def end(self, run_dir: Path) -> None:
        self.stop.set()
        self.thread.join()
        if self.summary is not None:
            record = self.summary.to_dict()
            # env.json is secondary to the rows: failing to write it must not fail the sweep.
            with contextlib.suppress(OSError):
                rundir.update_env(run_dir, lambda env: env.update(precompile=record) is None)


def _tune(cases: list[Case], device: str, processes: int, console: Console) -> None:
    """The `tune` phase: our kernels tuned at the shapes without a config for this GPU."""
    # imports torch and Triton, which only a sweep that tunes needs in this process.
    from tfla_bench.kernels import config as kernel_config
    from tfla_bench.measure import tuning

    entries = tuning.tune_missing(cases, device, processes or 8, console.print)
    if entries:
        console.print(f"{len(entries)} tuned config(s) added to {kernel_config.user_tuned_file()}")


def _precompile(
    to_run: list[_Planned],
    processes: int,
    devices: list[str],
    run_dir: Path,
    spec: Spec,
    console: Console,
    clock: PhaseClock,
    *,
    beside: _Compiling | None = None,
    order: list[str] | None = None,
) -> PrecompileSummary:
    """`precompile.precompile` on the cases about to run, with a progress bar (beside the measuring:
    a task of the measuring's bar, each kernel's completion told to `beside`); failures get one line;
    each run's seconds go to `clock` under its adapter."""
    progress = beside.progress if beside is not None else progress_bar(console, transient=True)
    task = progress.add_task(f"precompile ({processes} processes)", total=None)

    def done(result: PrecompileResult) -> None:
        clock.add_precompile(result.job.case.kernel, result.seconds)
        if result.status != "ok" and not result.retried:
            shard = f" shard {result.job.shard + 1}/{result.job.shards}" if result.job.shards > 1 else ""
            then = "" if result.status == "crashed" else " (the sweep runs this case as usual)"
            progress.console.print(
                f"[yellow]precompile {result.status}[/] {result.job.case.key}{shard}: {result.error}{then}"
            )
        progress.advance(task)

    total = 0

    def start(runs: int) -> None:
        nonlocal total
        total += runs
        progress.update(task, total=total)

    told: set[int] = set()

    def retry(job: PrecompileJob, processes: int) -> None:
        if processes not in told:  # one line per share, not per run
            told.add(processes)
            progress.console.print(
                f"precompile: runs that ran out of memory run again at the end of the queue, each with "
                f"{job.memory_share:.0%} of the memory (the first: {job.case.key})"
            )

    with progress if beside is None else contextlib.nullcontext():
        summary = precompile(
            [planned.case for planned in to_run],
            processes,
            devices,
            run_dir,
            grad=spec.measurement.grad,
            timeout_s=spec.measurement.timeout_s,
            order=order,
            beside_measuring=beside is not None,
            stop=beside.stop if beside is not None else None,
            on_start=start,
            on_result=done,
            on_retry=retry,
            on_kernel_done=beside.kernel_done if beside is not None else None,
        )
    if beside is not None:
        progress.remove_task(task)
        console = progress.console
    retried = f", {summary.retried} retried after running out of memory" if summary.retried else ""
    skipped = (
        f"; {summary.skipped} run(s) skipped, made into this Triton cache by an earlier sweep"
        if summary.skipped
        else ""
    )
    if summary.runs == 0 and summary.skipped:
        console.print(
            f"precompile: nothing to compile, the {summary.skipped} run(s) of its {summary.cases} case(s) "
            f"were made into this Triton cache by an earlier sweep ({DONE_FILE})"
        )
        _tell_crashed(summary, to_run, console)
        return summary
    console.print(
        f"precompiled {summary.cases} case(s) in {summary.runs} run(s) with {summary.processes} "
        f"process(es): {summary.seconds:.1f} s, {summary.failed} failed{retried}{skipped}"
    )
    _tell_crashed(summary, to_run, console)
    return summary


def _tell_crashed(summary: PrecompileSummary, to_run: list[_Planned], console: Console) -> None:
    """One line per kernel whose cases the sweep will not run, since it kept crashing in the precompile."""
    kernels = collections.Counter(p.case.kernel for p in to_run if p.case.key in summary.crashed)
    for kernel, count in sorted(kernels.items()):
        console.print(
            f"[yellow]precompile: {kernel} kept crashing the same way; the sweep does not run its {count} "
            "case(s)[/] (their rows say why)"
        )


def _roofs(device: str, child: subprocess.Popen, console: Console) -> dict:
    """The measured roofs of `device`'s GPU for env.json (saved ones, else measured now by `child`),
    with one line."""
    console.print(
        "measured roofs: the saved ones of this GPU and driver, or measured now (`tfla-bench roofs`)"
    )
    record = roofs_module.for_sweep(device, child)
    if "error" in record:
        console.print(f"[yellow]measured roofs: {record['error']}[/] (the sweep goes on without them)")
    else:
        console.print(
            f"measured roofs: {record['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s bf16 matmul, "
            f"{record['hbm_bytes_per_s'] / 1e12:.2f} TB/s HBM, {record['l2_bytes_per_s'] / 1e12:.2f} TB/s L2"
        )
    return record


def _start_workers(
    devices: list[str],
    to_run: list[_Planned],
    run_dir: Path,
    spec: Spec,
    cuda: bool,
    console: Console,
    precompiled: PrecompileSummary | None = None,
    measured_roofs: dict | None = None,
    forced: str | None = None,
) -> list[Worker]:
    """Launch one worker per device that has cases, then write `env.json` with every one's device facts
    (and what `precompile` did and the measured roofs, if any, and the spec difference a resume
    was forced over)."""
    from tfla_bench.kernels import config as kernel_config

    for planned in to_run:
        planned.shard = shard_of(planned.case.key, len(devices))
    used = sorted({planned.shard for planned in to_run})
    workers = [Worker(device, run_dir / rundir.worker_log(index)) for index, device in enumerate(devices)]
    for index in used:
        workers[index].launch()
    failures = {index: workers[index].wait_ready() for index in used}
    for index, failure in failures.items():
        if failure:
            console.print(f"[red]worker {index} ({devices[index]}): {failure}[/]")
    infos = [workers[index].info for index in used if workers[index].info is not None]
    info = infos[0] if infos else None
    measurement = {
        **dataclasses.asdict(spec.measurement),
        "clock": "cuda_events" if cuda else "time.perf_counter",
        "memory": "torch.cuda.max_memory_allocated" if cuda else "not measured on CPU",
        "flush_bytes": info.flush_bytes if info and spec.measurement.l2_flush else None,
        "autotune_cache": autotune_cache_setting(),
        "cute_cache": cute_cache_dir(),
        "kernel_cache": carried_kernel_cache(),
        "kernel_configs": kernel_config.tuned_source(),
        # The setting's value, the method and why there is no energy, where a device says so already.
        "energy": energy.env_record(
            spec.measurement.energy,
            next((i.no_energy for i in infos if i.no_energy), None),
            spec.measurement.energy_method,
            spec.measurement.energy_s,
        ),
    }
    env = envinfo.collect(spec, devices, infos, measurement)
    if precompiled is not None:
        env["precompile"] = precompiled.to_dict()
    if measured_roofs is not None:
        env["roofs"] = measured_roofs
    if forced is not None:
        env["forced_spec_difference"] = forced
    env["spec_record"] = spec.to_dict()  # what spec.json held: `--resume` refuses an edit of it
    previous = rundir.read_env(run_dir)
    if previous:
        previous.setdefault("resumed", []).append(env)
        env = previous
    env["results_schema"] = rundir.SCHEMA_VERSION
    rundir.write_json(run_dir / rundir.ENV, env)
    return workers


class _Sides(NamedTuple):
    """What ran before or beside the measuring: the precompile's summary (run first), or the
    precompile running beside it (`compiling`); both None without a precompile."""

    precompiled: PrecompileSummary | None
    compiling: _Compiling | None


class _Dispatch:
    """The state the shards' threads share: one lock around the crash guard, the clock, the row
    writer and the progress bar; the stop flag; the first bug a thread met; the precompile beside
    the measuring, if any (`compiling`)."""

    def __init__(
        self,
        spec: Spec,
        writer: rundir.RowWriter,
        console: Console,
        clock: PhaseClock,
        host: str,
        sides: _Sides,
    ) -> None:
        self.spec, self.writer, self.console, self.clock, self.host = spec, writer, console, clock, host
        # A case whose kernel kept crashing in the precompile is not run.
        precompiled, self.compiling = sides
        self.crashes = CrashGuard(precompiled.crashed if precompiled is not None else None)
        self.energy_told = False
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        compiling = self.compiling
        self.progress = compiling.progress if compiling is not None else progress_bar(console, eta=True)
        self.task = self.progress.add_task("starting", total=None)

    def run(self, to_run: list[_Planned], workers: list[Worker]) -> None:
        """Serve each worker's shard in a thread and write rows as they come, each naming `host` and,
        for a case that ran on a GPU, the worker's GPU. Ctrl-C, or a job's cancel, preemption or
        time-limit handler (`tfla_bench.run.shard`, submitit's) raising from inside the wait ends
        the sweep."""
        if not to_run:
            return
        self.progress.update(self.task, total=len(to_run))
        shards = {index: [p for p in to_run if p.shard == index] for index in range(len(workers))}
        threads = [
            threading.Thread(target=self.serve, args=(workers[index], shard), daemon=True)
            for index, shard in shards.items()
            if shard
        ]
        with self.progress:
            for thread in threads:
                thread.start()
            try:
                while any(thread.is_alive() for thread in threads):
                    for thread in threads:
                        thread.join(0.2)
            except BaseException:
                self.stop.set()
                for worker in workers:
                    worker.interrupt()
                if self.compiling is not None:
                    self.compiling.stop.set()
                for thread in threads:
                    thread.join(15)
                line = interrupted_line(f"rows written so far are kept in {self.writer.path}")
                self.console.print(line, markup=False, highlight=False)
                raise
        if self.errors:
            raise self.errors[0]

    def serve(self, worker: Worker, shard: list[_Planned]) -> None:
        """Measure one shard's cases in order on `worker`, one process per adapter.

        Each adapter measures in a process of its own; on a GPU the processes of the next
        SPARES_AHEAD adapters start while it measures (`Worker.start_spare`). On the CPU they would
        take the cores that the timed calls run on. An adapter whose every case the precompile's
        verdict decides gets no process. With the precompile beside the measuring, an adapter's
        first case waits for its compiling, and a case that runs out of memory while the precompile
        still holds its share, or whose timing the precompile's work left unsettled, is measured
        again once the precompile has ended.
        """
        try:
            ahead = SPARES_AHEAD if worker.device.startswith("cuda") else 0
            order = list(dict.fromkeys(p.case.kernel for p in shard if not self.crashes.decided(p.case)))
            modules = {planned.case.kernel: type(planned.adapter).__module__ for planned in shard}
            current, started = None, 1  # the first adapter runs in the worker's own process
            compiled: set[str] = set()
            later: list[_Planned] = []
            for planned in shard:
                if self.stop.is_set():
                    return
                self.wait_for_compiling(planned.case.kernel, compiled)
                with self.lock:
                    self.progress.update(self.task, description=case_label(planned.case))
                    crashed = self.crashes.reason(planned.case)
                if crashed is None and planned.case.kernel != current:
                    if current is not None:
                        worker.switch()
                    current = planned.case.kernel
                    position = order.index(current) if current in order else len(order)
                    started = max(started, position + 1)  # without a spare it starts afresh
                    while started < min(position + 1 + ahead, len(order)):
                        worker.start_spare(order[started], modules[order[started]])
                        started += 1
                row = self.measure(worker, planned, crashed)
                if row is None:
                    return  # interrupted: the worker was killed under us, this is not the kernel's fault
                if row is _HELD:
                    later.append(planned)
                    continue
                self.write(row)
            if later and self.compiling is not None:
                self.wait_for_compiling(None, compiled)
                current = None
                for planned in later:
                    if self.stop.is_set():
                        return
                    if planned.case.kernel != current:
                        worker.switch()
                        current = planned.case.kernel
                    row = self.measure(worker, planned, None)
                    if row is None:
                        return
                    self.write(row)
        except BaseException as exc:  # a bug: stop the sweep and re-raise it in the main thread
            self.errors.append(exc)
            self.stop.set()

    def wait_for_compiling(self, kernel: str | None, compiled: set[str]) -> None:
        """Wait for the precompile beside the measuring to finish `kernel` (None: everything), once per
        kernel, and learn which of its cases it decides; the wait counts as the `precompile_wait`
        phase."""
        if self.compiling is None or kernel in compiled:
            return
        compiled.add(kernel or "")
        with self.lock:
            self.progress.update(self.task, description=f"waiting for the precompile of {kernel or 'all'}")
        crashed, waited = self.compiling.wait(kernel, self.stop)
        with self.lock:
            self.crashes.learn(crashed)
            self.clock.add_phase("precompile_wait", waited)

    def measure(self, worker: Worker, planned: _Planned, crashed: str | None) -> ResultRow | object | None:
        """The row of one case: `crashed` without running when the crash guard says so; None when the
        sweep was stopped while it ran; `_HELD` for a case that ran out of memory, or whose timing
        stayed unsettled (`Measurement.unsettled`, or `unsettled_beside`), while the precompile
        beside it still had runs left: nothing is recorded, it runs again later."""
        if crashed is not None:
            return ResultRow(planned.case, planned.adapter.family, "crashed", error=crashed, host=self.host)
        settings = self.spec.measurement_for(planned.adapter)
        compiling = self.compiling
        beside = compiling is not None and compiling.running
        # The energy counter is the whole GPU's: beside the precompile it would count its work too.
        no_energy = beside and settings.energy
        if no_energy:
            settings = dataclasses.replace(settings, energy=False)
        job = Job(planned.case, type(planned.adapter).__module__, settings, planned.adapter.family)
        began = time.monotonic()
        measurement = worker.run(job)
        if self.stop.is_set():
            return None
        held = measurement.row.status == "oom" or measurement.unsettled
        held = held or (beside and unsettled_beside(measurement.row))
        if held and compiling is not None and compiling.running:
            return _HELD
        row = _row(planned, measurement, self.host, _gpu_name(worker))
        if beside and row.status == "ok":
            note = BESIDE_NO_ENERGY_NOTE if no_energy else BESIDE_NOTE
            row = dataclasses.replace(row, note="; ".join(filter(None, (row.note, note))))
        with self.lock:
            missing = BESIDE_NO_ENERGY if no_energy and row.status == "ok" else measurement.energy_missing
            if missing:
                self.tell_energy_missing(f"{missing} (first: {row.case.key})")
            self.crashes.record(row.case.kernel, row.status, row.error)
            self.clock.add_case(
                planned.case.kernel,
                time.monotonic() - began,
                measurement.row.first_call_s,
                measurement.calls_s,
            )
        return row

    def tell_energy_missing(self, reason: str) -> None:
        """Say in `env.json` why a row has no energy, once: the first reason stays (the lock is held)."""
        if self.energy_told:
            return
        self.energy_told = True
        # env.json is secondary to the rows: failing to write it must not stop the sweep.
        with contextlib.suppress(OSError):
            rundir.update_env(self.writer.path.parent, lambda env: energy.tell_missing(env, reason))

    def write(self, row: ResultRow) -> None:
        with self.lock:
            # Before the row, so a run stopped right after a row has that row's time too;
            # timings.json is secondary: failing to write it must not stop the sweep.
            with contextlib.suppress(OSError):
                self.clock.write(self.writer.path.parent)
            self.writer.write(row)
            self.progress.console.print(row_line(row))
            self.progress.advance(self.task)


# A call the model puts at this long or longer is measured after the precompile (`measuring_order`):
# the calls of 50 ms or more that took longer beside it on an H200 had model times from 20 ms up.
LONG_CALL_S = 0.02
# The note of a row measured while the precompile compiled beside it: its processes' torch work
# shares the GPU (on an H200, long attention calls measured so took 2.5-5.3% longer than warm).
BESIDE_NOTE = "measured beside the precompile"
# A resume's `--retry` of this word measures again every row measured beside the precompile: it gets
# its energy, and a long call its time from a GPU that runs nothing else.
RETRY_BESIDE = "beside"
RETRY_CHOICES = (*row_schema.RERUNNABLE_STATUSES, RETRY_BESIDE)
# Such a row has no energy: NVML's counter is the GPU's, and it would charge the precompile's work
# to the calls (on an H200 up to twice the energy of the same call measured warm).
BESIDE_NO_ENERGY = "measured beside the precompile, whose GPU work the energy counter would count too"
BESIDE_NO_ENERGY_NOTE = f"{BESIDE_NOTE}, so without energy (the counter would count its GPU work too)"
# A series measured beside the precompile that ran out of its time budget with the median's 95%
# interval wider than +-this is measured again after the precompile, a narrower bound than the
# worker's `timing.UNSETTLED_CI`: only short calls are measured beside it (`LONG_CALL_S`), and of
# the 12 such series in the runs committed before this bound 9 were wider than +-3%, up to +-9.8%
# (`tfla_sig` fwbw at 65,536 steps in `fig5_consttoken-20261205-h200-side`: 8.98 ms against 6.14 ms
# measured after).
BESIDE_UNSETTLED_CI = 0.03
# `_Dispatch.measure`'s answer for a case that runs again after the precompile.
_HELD = object()


def unsettled_beside(row: ResultRow) -> bool:
    """Whether an ok row measured beside the precompile is to be measured again after it: its series
    ran out of its time budget with the median's interval wider than +-`BESIDE_UNSETTLED_CI`."""
    # imports torch at import time; a sweep measuring beside its precompile has it already.
    from tfla_bench.measure import timing

    return row.status == "ok" and row.ci_rel is not None and timing.unsettled(row, BESIDE_UNSETTLED_CI)


def _gpu_name(worker: Worker) -> str:
    """The name of the worker's GPU; empty on CPU."""
    info = worker.info
    return info.name if info is not None and info.device.startswith("cuda") else ""


def _row(planned: _Planned, measurement: Measurement, host: str, gpu_name: str) -> ResultRow:
    """The result row of a measured case: the worker's row, with what the parent knows added (the
    counts and rates, the library, the node and the GPU that measured it)."""
    row = measurement.row
    median_s = row.median_ms / 1e3 if row.median_ms else None
    return dataclasses.replace(
        row,
        family=planned.adapter.family,
        flops=planned.flops,
        bytes=planned.bytes,
        tflops=planned.flops / median_s / 1e12 if median_s else None,
        gbps=planned.bytes / median_s / 1e9 if median_s else None,
        library=planned.adapter.library(),
        host=host,
        gpu_name=gpu_name if row.device.startswith("cuda") else "",
    )


def case_fates(cases: list[Case], *, cuda: bool, kept: Iterable[ResultRow] = ()) -> dict[str, str]:
    """What the sweep would do without running, per case key: keep a resume's finished row (`kept:
    STATUS`), or decide `status: reason`."""
    fates = {row.case.key: f"kept: {row.status}" for row in kept}
    decided, _ = plan([case for case in cases if case.key not in fates], cuda=cuda)
    return fates | {row.case.key: f"{row.status}: {row.error}" for row in decided}


def measured_beside(row: ResultRow) -> bool:
    """Whether an ok row was measured beside the precompile (its note says so)."""
    return row.status == "ok" and BESIDE_NOTE in (row.note or "")
