"""The isolated benchmark worker: a spawned process on one device that measures cases one after another.

The parent (`tfla_bench.run.runner`, the correctness gate of `tfla_bench.run.correctness` and
`tfla_bench.run.precompile`) talks to a worker through a pipe. The worker imports torch and initializes
CUDA, sends a `DeviceInfo`, then answers each job with what the job's own `run(adapter, device)`
returns: a job brings the work it does in the worker (a `Job` measures a case into a `Measurement`;
the gate's and precompile's jobs live in their modules), so the worker knows no job type. The sweep
gives each adapter a process of its own (`Worker.switch`), so no library's state in a process can
move another library's times: on an H100, LightningAttention-2's fwbw at 32,768 steps took 47.11
and 48.43 ms in a process shared by every adapter of Fig. 5, 5.4-7.8% less than in two sweeps of it
alone (51.12 and 51.17 ms); other GPU work before it moves it as well (docs/results-h100.md).
On a GPU, spare processes (`Worker.start_spare`) start, initialize the device and import the next
adapters' libraries while the current adapter measures. Jobs travel pickled, so their module is
imported in the worker. Its stdout and stderr go to a log file in the run directory
(`worker-<i>.log`), so messages printed by native code (an LLVM assertion, a segfault's
faulthandler trace) are kept; the parent quotes the last lines of the log when the worker dies.

Outcomes: Python exceptions are caught inside the worker (`oom` for CUDA out-of-memory, after
which the cache is emptied and the worker goes on; `error` for anything else, with the message's
last line). A worker that dies or does not answer within the case timeout is killed by the parent
and replaced before the next case (`crashed` / `timeout`); autotuners keep their choices on disk
(`AUTOTUNE_CACHE_ENV`), so a replaced worker does not time them again, and FlashAttention 4 keeps
its compiled kernels there too (`CUTE_CACHE_ENV`). A CUDA error that poisons
the context (illegal memory access, device-side assert) retires the worker after its row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import importlib
import json
import multiprocessing
import os
import platform
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.errors import UserError, exception_line
from tfla_bench.measure import energy, gpustate
from tfla_bench.measure.row import ResultRow
from tfla_bench.measure.settings import MeasureSettings

# Messages that mean the CUDA context is unusable for the rest of the process.
_FATAL_CUDA_MARKERS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "CUDA error: an illegal instruction",
)
LOG_TAIL_LINES = 8
# Consecutive identical crashes of one kernel after which its remaining cases are not run (`CrashGuard`).
CRASH_REPEATS = 2
MAX_ERROR_CHARS = 1500
STARTUP_TIMEOUT_S = 600.0
# The row's note where the method `around` gave way to a series of the case's own.
OWN_SERIES = "energy from calls of its own"
# The spins of the energy calibration (`energy.calibrate`): each short enough for the host to keep
# the GPU busy, long enough that launching them costs nothing.
CALIBRATION_SPIN_S = 1e-3
# Signals that stop a worker from outside; its case is `interrupted`, not `crashed`.
OUTSIDE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT})
# How long an interrupted sweep waits for a killed worker to be reaped.
INTERRUPT_JOIN_S = 10.0
# Triton's switch that keeps every autotuner's timings in its cache directory, keyed by the kernel, the
# GPU architecture and the tuning key, and reuses them in later processes. Workers turn it on unless
# the environment says otherwise, so a worker replaced after a crash, a second GPU's worker and a
# later sweep with the same cache do not time the same configs again (fla's kernels do this anyway).
AUTOTUNE_CACHE_ENV = "TRITON_CACHE_AUTOTUNING"
# FlashAttention 4's CuTe DSL compiles a kernel at its first call in each process and keeps it in
# memory only, unless its persistent cache is on (`flash_attn.cute.cache_utils`). The workers turn
# it on, in a folder of Triton's cache directory, so a later process of the same adapter (its long
# calls, a replaced worker, a warm sweep) loads what an earlier one compiled, and an empty Triton
# cache directory means a cold FA4 too (`cute_cache_settings`).
CUTE_CACHE_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
CUTE_CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
CUTE_CACHE_FOLDER = "flash_attention_cute_dsl"
# The manifest that `tfla_bench.kernel_cache` leaves in Triton's cache directory where it unpacked an
# archive of another machine's kernels and autotuning choices.
KERNEL_CACHE_MANIFEST = "tfla-bench-kernel-cache.json"


class WorkerJob(Protocol):
    """What a worker is sent: a case, the module registering its adapter, and the work to do."""

    case: Case
    adapter_module: str

    def run(self, adapter: Any, device: str) -> Any:
        """Do the job in the worker process with the case's adapter; the answer goes to the parent."""
        ...


class CrashGuard:
    """Stops re-running a kernel that keeps killing its worker the same way.

    Each crash costs a worker restart and, for a Triton kernel, a compile that ends in the same abort
    (the official xl_chunk exp kernel hits an LLVM assertion on every shape under Triton 3.6). After
    `CRASH_REPEATS` consecutive crashes of one kernel with the same error, `reason` says why its
    remaining cases are not run; any other outcome resets the count. The sweep and the precompile
    runs each keep one.

    Args:
        known: the sweep's cases (by key) whose precompile run crashed, or was not made, for a kernel
            that kept crashing there, with that kernel's error (`PrecompileSummary.crashed`): they
            are not run either.
    """

    def __init__(self, known: dict[str, str] | None = None) -> None:
        self._last: dict[str, tuple[str, int]] = {}
        self._known = dict(known or {})

    def reason(self, case: Case) -> str | None:
        """The error of `case` not run for its kernel's crashes, or None to run it."""
        if self.decided(case):
            error = self._known[case.key]
            return f"not run: the precompile's runs of this kernel kept crashing the same way: {error}"
        error = self.keeps_crashing(case.kernel)
        if error is None:
            return None
        count = self._last[case.kernel][1]
        return f"not run: the previous {count} cases of this kernel crashed the same way: {error}"

    def learn(self, known: dict[str, str]) -> None:
        """Add cases (by key) that the precompile's verdict decides, as `known` at construction."""
        self._known.update(known)

    def decided(self, case: Case) -> bool:
        """Whether the precompile's verdict decides `case` (it is not run, whatever happens before it)."""
        return case.key in self._known

    def keeps_crashing(self, kernel: str) -> str | None:
        """The error of `kernel`'s last `CRASH_REPEATS` (or more) crashes in a row, or None."""
        error, count = self._last.get(kernel, ("", 0))
        return error if count >= CRASH_REPEATS else None

    def record(self, kernel: str, status: str, error: str | None) -> None:
        """Count the outcome of a case of `kernel` that ran."""
        if status != "crashed":
            self._last.pop(kernel, None)
            return
        last_error, count = self._last.get(kernel, ("", 0))
        self._last[kernel] = (error or "", count + 1 if error == last_error else 1)


def log_outcome(text: str) -> None:
    """One line of the worker's log that ends a job (skipped by `summarize_log`)."""
    print(f"--- {text}".rstrip(), file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Job:
    """One case for a worker to measure.

    Attributes:
        case: what to measure.
        adapter_module: the module that registers the case's adapter, imported by the worker
            when the adapter is not registered after `registry.load()`.
        settings: how to measure.
        family: the adapter's family, for the row of a case whose worker gave no answer.
    """

    case: Case
    adapter_module: str
    settings: MeasureSettings
    family: str = ""

    def run(self, adapter: Any, device: str) -> Measurement:
        """`measure_case` in the worker."""
        result = measure_case(adapter, self.case, self.settings, device)
        log_outcome(f"{result.row.status} {result.row.error}")
        return result


@dataclass(frozen=True)
class Failure:
    """A case without a measurement: the kernel raised (`oom`, `error`; `fatal` when the process's CUDA
    context is lost), or, the parent's record of a job without an answer, the worker died
    (`crashed`), was stopped from outside (`interrupted`) or hung (`timeout`)."""

    status: str
    error: str
    fatal: bool = False


@dataclass(frozen=True)
class Measurement:
    """A worker's answer for one case: its result row as far as the worker knows it (the parent adds
    the counts, the library, the node and the GPU's name), whether the worker's CUDA context is lost
    (`fatal`), `calls_s`, the wall time from the end of the first call to the end of its energy
    (warm-up, the memory call, the timed calls with their flushes and spins, the energy series or
    the window around the timed calls), `energy`, the counter's reading that gave the row's
    energy cells (`energy.Energy`: its `missing` says why there is none; None where none was read),
    and `unsettled`, whether the row's series is still `timing.unsettled` after it was timed again.

    In the row, `warmup` and `reps` are the calls made (a case timed again counts its first series in
    `warmup`: its power cap set in, `gpustate.set_in`, or the series was `timing.unsettled`), `stop`
    why timing stopped (`tfla_bench.measure.timing`), `settle_s` the wait for the GPU to settle
    before the case (`gpustate.Monitor.settle`), the GPU-state columns the NVML cells of
    `gpustate.row_cells` (empty on CPU), and `energy_mj` and `tokens_per_joule` those of
    `energy.row_cells`.
    """

    row: ResultRow
    fatal: bool = False
    calls_s: float | None = None
    energy: energy.Energy | None = None
    unsettled: bool = False

    @property
    def energy_missing(self) -> str:
        """Why the counter gave no energy; empty when it did, or when it was not read."""
        return self.energy.missing if self.energy is not None else ""

    @classmethod
    def failed(cls, case: Case, family: str, failure: Failure, device: str) -> Measurement:
        """The answer of a case that has no measurement."""
        row = ResultRow(case=case, family=family, status=failure.status, device=device, error=failure.error)
        return cls(row, fatal=failure.fatal)


@dataclass(frozen=True)
class DeviceInfo:
    """What a worker found about its device (None fields on CPU; `no_energy`: why the device has no
    energy counter, None when it has one)."""

    device: str
    name: str
    uuid: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None
    l2_cache_bytes: int | None = None
    compute_capability: str | None = None
    flush_bytes: int | None = None
    cudnn: int | None = None
    nvml: dict[str, Any] | None = None
    no_energy: str | None = None


def measure_case(adapter: Any, case: Case, settings: MeasureSettings, device: str) -> Measurement:
    """Measure one case in this process (the worker's job; tests call it directly).

    Args:
        adapter: the registry adapter of `case.kernel`.
        case: the case.
        settings: warm-up, stop rule, L2 flush, CUDA graph, upstream-gradient mode.
        device: `cpu` or `cuda:<i>`.

    Returns:
        `ok` with timings and memory, `oom`, or `error` with the exception's last line.
    """
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import memory, timing

    try:
        with timing.autotuning_budget(settings.autotune_ms):
            result = _measure(adapter, case, settings, device)
    except Exception as exc:  # every kernel failure becomes a row; the sweep goes on
        traceback.print_exc()
        result = Measurement.failed(case, adapter.family, failure_of(exc), device)
    # Outside the except block, so the traceback (and the tensors its frames hold) is gone.
    memory.release(device)
    return result


def _measure(adapter: Any, case: Case, settings: MeasureSettings, device: str) -> Measurement:
    # torch takes seconds to import; only this path needs it.
    import torch

    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import memory, timing

    cuda = timing.is_cuda(device)
    monitor = _monitor(device)
    settle_s = monitor.settle() if monitor is not None else None
    before = monitor.read() if monitor is not None else None
    torch.manual_seed(0)
    inputs = adapter.make_inputs(case, device)
    inputs_bytes = memory.allocated_bytes(device)
    leaves = grad_leaves(inputs)
    if case.mode == "fwbw" and not leaves:
        raise RuntimeError(f"{adapter.name}.make_inputs gave no tensor with requires_grad=True for fwbw")

    def reset_grads() -> None:
        clear_grads(leaves)

    step = make_step(adapter, inputs, case.mode, settings.grad)
    reset_grads()
    first_call_s = timing.time_first_call(step, device)
    calls_began = time.perf_counter()
    warmup, queue_s = timing.warm_up(
        step, device, calls=settings.warmup, seconds=settings.warmup_s, before_each=reset_grads
    )
    reset_grads()
    peak = memory.measure_peak(step, device, inputs_bytes)

    flush = timing.L2Flush(device) if settings.l2_flush and cuda else None

    def before_each() -> None:
        reset_grads()
        if flush is not None:
            flush()

    timed = timing.capture_cuda_graph(step, before_each) if settings.cuda_graph and cuda else step
    spin = timing.Spin(device, queue_s) if cuda else None
    clock = settings.clock if cuda else "events"
    host_clock = "; timed by the host clock (the kernels clock needs CUDA)" if clock != settings.clock else ""
    series = functools.partial(
        timing.time_calls,
        timed,
        rule=_stop_rule(settings),
        device=device,
        before_each=before_each,
        spin=spin,
        clock=clock,
    )
    watch = gpustate.CapWatch(monitor, before)
    around = settings.energy and settings.energy_method == "around" and monitor is not None

    def first_series() -> tuple[Any, gpustate.Reading | None]:
        stats = series(stop_early=watch)
        return stats, monitor.read() if monitor is not None else None

    spent, energy_note = None, ""
    if around:
        sync = functools.partial(timing.synchronize, device)
        first, opened = energy.window(first_series, counter=monitor.energy_mj, sync=sync)
        if first is None:  # no counter: the window ran nothing, and a series would say the same
            first, spent, opened = first_series(), opened, None
    else:
        first, opened = first_series(), None
    first_stats, first_after = first
    at_cap: list[energy.Energy | None] = []

    def energy_at_cap() -> None:  # the series at the clock the cap set, before the settle (`retime`)
        at_cap.append(_energy(timed, reset_grads, monitor, device, first_stats.min_ms, settings.energy_s))

    capped = gpustate.retime(
        series,
        first_stats,
        monitor,
        before,
        settings.power_cap,
        watch,
        first_after,
        before_again=energy_at_cap if settings.energy else None,
    )
    stats, after, warmup = capped.stats, capped.after, warmup + capped.warmup
    unsettled = ""
    if not capped.note and timing.unsettled(stats):
        again = series()
        unsettled, warmup = timing.unsettled_note(stats, again), warmup + stats.reps
        stats, after = again, monitor.read() if monitor is not None else None
        if opened is not None:  # the window held the first series
            opened, energy_note = None, f"{OWN_SERIES}: timed again"
    if at_cap:
        spent = at_cap[0]
        energy_note = f"{OWN_SERIES}: timed again under its power cap" if opened is not None else ""
    elif opened is not None:
        spent, energy_note = _charged(opened, stats, flush, device, monitor)
    if settings.energy and spent is None:
        spent = _energy(timed, reset_grads, monitor, device, stats.min_ms, settings.energy_s)
    note = "" if cuda else "peak memory not measured on CPU" + host_clock
    if capped.note:
        note, settle_s = capped.note, (settle_s or 0.0) + capped.settle_s
    note = "; ".join(part for part in (adapter.row_note(), note, unsettled, energy_note) if part)
    calls_s = time.perf_counter() - calls_began
    cells = gpustate.row_cells(before, after) if monitor is not None else {}
    cells |= energy.row_cells(case.batch * case.seq_len, spent) if spent is not None else {}
    row = ResultRow(
        case=case,
        family=adapter.family,
        status="ok",
        first_call_s=first_call_s,
        peak_memory_bytes=peak.peak_bytes,
        peak_memory_above_inputs_bytes=peak.above_inputs_bytes,
        device=device,
        note=note,
        warmup=warmup,
        settle_s=settle_s,
        **dataclasses.asdict(stats),  # median_ms ... host_gap_share: the columns of the same names
        **{key: value for key, value in cells.items() if value is not None},
    )
    return Measurement(row, calls_s=calls_s, energy=spent, unsettled=timing.unsettled(stats))


def _stop_rule(settings: MeasureSettings) -> Any:
    """The `timing.StopRule` of the settings."""
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import timing

    return timing.StopRule(
        reps=settings.reps,
        rel_ci=settings.rel_ci,
        budget_s=settings.budget_s,
        min_time_s=settings.min_time_s,
        min_reps=settings.min_reps,
        max_reps=settings.max_reps,
    )


def _energy(
    timed: Callable[[], Any],
    reset_grads: Callable[[], None],
    monitor: gpustate.Monitor | None,
    device: str,
    fastest_ms: float,
    min_s: float,
) -> energy.Energy | None:
    """The case's energy series (`energy.measure_energy`), its idle tail charged at the worker's awake
    power (`awake_calibration`); None without a GPU monitor (the CPU)."""
    if monitor is None:
        return None
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import timing

    awake = awake_calibration(device, monitor)
    if awake.missing:
        return energy.Energy(missing=f"no awake power to take the series' idle tail off ({awake.missing})")
    return energy.measure_energy(
        timed,
        counter=monitor.energy_mj,
        sync=functools.partial(timing.synchronize, device),
        per_call_s=fastest_ms / 1e3,
        awake_w=awake.awake_w,
        before_each=reset_grads,
        min_s=min_s,
    )


def awake_calibration(device: str, monitor: gpustate.Monitor) -> energy.Calibration:
    """A calibration of `device` that holds its awake power: any the worker has, else one without
    flushes (`_calibration`)."""
    for (known, _), calibration in _CALIBRATIONS.items():
        if known == device:
            return calibration
    return _calibration(device, monitor, None)


def _charged(
    opened: energy.Energy,
    stats: Any,
    flush: Any,
    device: str,
    monitor: gpustate.Monitor,
) -> tuple[energy.Energy | None, str]:
    """The energy of the timed calls from the counter's window around them (`energy.charge`), or None
    and the row's note on why the case's energy comes from a series of its own."""
    if opened.counted_mj is None:
        return None, f"{OWN_SERIES}: {opened.missing}"
    calibration = _calibration(device, monitor, flush)
    if calibration.missing:
        return None, f"{OWN_SERIES}: no calibration ({calibration.missing})"
    # The median stands for every call: the calls' spread moves the awake power's share only.
    calls_s = stats.median_ms * stats.reps / 1e3
    flushes = stats.reps if flush is not None else 0
    spent = energy.charge(opened, stats.reps, calls_s, flushes, calibration)
    share = spent.outside_share
    if share is None or share > energy.MAX_OUTSIDE_SHARE or not (spent.per_call_mj or 0) > 0:
        shown = f"{share:.0%}" if share is not None else "all"
        return None, f"{OWN_SERIES}: flushes, spins and the idle GPU drew {shown} of the timed calls' window"
    return spent, ""


def _calibration(device: str, monitor: gpustate.Monitor, flush: Any) -> energy.Calibration:
    """The worker's energy calibration (`energy.calibrate`) for `device`, with the case's L2 flush
    (`timing.L2Flush`, the same size in every case) or without flushes: measured at the first case
    that needs it and kept for the worker's later cases once it succeeded. One that failed says why
    (the case then takes a series of its own) and is measured again at the next case."""
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import timing

    key = (device, flush is not None)
    if key in _CALIBRATIONS:
        return _CALIBRATIONS[key]
    if timing.is_cuda(device):
        spin: Callable[[], None] = timing.Spin(device, 0.0, seconds=CALIBRATION_SPIN_S)
    else:  # a CPU with a stand-in counter (the tests): the host waits instead
        spin = functools.partial(time.sleep, CALIBRATION_SPIN_S)
    try:
        calibration = energy.calibrate(
            counter=monitor.energy_mj,
            sync=functools.partial(timing.synchronize, device),
            spin=spin,
            spin_s=CALIBRATION_SPIN_S,
            flush=flush,
            gpu_seconds=functools.partial(timing.gpu_seconds, device=device),
        )
    except Exception as exc:  # the case is measured; only its energy takes the other way
        calibration = energy.Calibration(missing=f"it failed: {exception_line(exc)}")
    print(f"energy calibration on {device}: {calibration}", file=sys.stderr, flush=True)
    if not calibration.missing:
        _CALIBRATIONS[key] = calibration
    return calibration


# The worker's energy calibrations that succeeded, by device and whether its cases flush the L2.
_CALIBRATIONS: dict[tuple[str, bool], energy.Calibration] = {}

# One NVML monitor per process and device.
_monitor = functools.cache(gpustate.device_monitor)


def grad_leaves(inputs: dict[str, Any]) -> list[Any]:
    """The input tensors that take gradients: a fwbw call accumulates into their `.grad`."""
    # torch takes seconds to import; only this path needs it.
    import torch

    return [value for value in inputs.values() if isinstance(value, torch.Tensor) and value.requires_grad]


def clear_grads(leaves: list[Any]) -> None:
    """Drop the gradients of `leaves`, so the next fwbw call writes them afresh instead of adding."""
    for leaf in leaves:
        leaf.grad = None


def make_step(adapter: Any, inputs: dict[str, Any], mode: str, grad: str) -> Callable[[], None]:
    """One call of the workload: the forward, or forward + backward.

    Args:
        adapter: the adapter whose `forward(inputs)` is called.
        inputs: from `adapter.make_inputs`.
        mode: `fw` (run under `torch.no_grad`) or `fwbw`.
        grad: `fixed` (backward from one `randn_like(out)`, made on the first call and reused)
            or `sum` (`out.sum().backward()`, the sum inside the timed call as in the paper).
    """
    # torch takes seconds to import; only this path needs it.
    import torch

    if mode == "fw":

        def forward() -> None:
            with torch.no_grad():
                adapter.forward(inputs)

        return forward

    upstream: list[torch.Tensor] = []

    def forward_backward() -> None:
        out = adapter.forward(inputs)
        if grad == "sum":
            out.sum().backward()
            return
        if not upstream:
            generator = torch.Generator(device=out.device).manual_seed(1)
            upstream.append(torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=generator))
        out.backward(upstream[0])

    return forward_backward


def is_fatal_cuda_error(message: str) -> bool:
    """Whether an error message means the process's CUDA context is unusable from now on."""
    return any(marker in message for marker in _FATAL_CUDA_MARKERS)


def failure_of(exc: BaseException) -> Failure:
    """A kernel's exception as a `Failure`: `oom` or `error` (fatal when CUDA is lost), with the
    exception's type and last message line."""
    # torch takes seconds to import; only this path needs it.
    import torch

    message = str(exc)
    detail = exception_line(exc)[:MAX_ERROR_CHARS]
    # CPU allocations fail as MemoryError, or as torch's "DefaultCPUAllocator: can't allocate memory".
    lowered = message.lower()
    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError) or any(
        words in lowered for words in ("out of memory", "can't allocate memory")
    ):
        return Failure("oom", detail)
    return Failure("error", detail, fatal=is_fatal_cuda_error(message))


def _device_info(device: str) -> DeviceInfo:

    # torch takes seconds to import; only this path needs it.
    import torch

    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import timing

    if not timing.is_cuda(device):
        name = platform.processor() or platform.machine() or "cpu"
        return DeviceInfo(device=device, name=name, no_energy=energy.unavailable(None))
    props = torch.cuda.get_device_properties(device)
    return DeviceInfo(
        device=device,
        name=props.name,
        uuid=f"GPU-{props.uuid}" if getattr(props, "uuid", None) else None,  # as nvidia-smi -L names it
        sm_count=props.multi_processor_count,
        memory_bytes=props.total_memory,
        l2_cache_bytes=props.L2_cache_size,
        compute_capability=f"{props.major}.{props.minor}",
        flush_bytes=max(2 * props.L2_cache_size, timing.MIN_FLUSH_BYTES),
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        nvml=_monitor(device).limits(),
        no_energy=energy.unavailable(_monitor(device)),
    )


def _adapter_for(job: WorkerJob) -> Any:
    """The adapter of a job's case, importing the job's `adapter_module` when it is not registered."""

    try:
        return registry.get(job.case.kernel)
    except UserError:
        importlib.import_module(job.adapter_module)
        return registry.get(job.case.kernel)


def _preload(kernel: str, module: str) -> None:
    """Import an adapter's library ahead of its first case; a failure is the first case's to report."""

    try:
        try:
            adapter = registry.get(kernel)
        except UserError:
            importlib.import_module(module)
            adapter = registry.get(kernel)
        adapter.available()
    except Exception:  # the case itself runs the same code and reports what fails
        traceback.print_exc()


def autotune_cache_setting() -> str:
    """The value of `AUTOTUNE_CACHE_ENV` that the workers run with: the environment's, else "1"."""
    return os.environ.get(AUTOTUNE_CACHE_ENV, "1")


def triton_cache_dir() -> Path:
    """The directory Triton compiles into: `TRITON_CACHE_DIR`, else Triton's default."""
    # Triton loads only where our kernels or an autotuner are touched.
    from triton import knobs

    return Path(knobs.cache.dir)


def carried_kernel_cache() -> dict | None:
    """The manifest of the kernel cache carried into Triton's cache directory (`kernel_cache`), which
    a sweep records in env.json: where its kernels and autotuning choices were made. None: none was."""
    try:
        return json.loads((triton_cache_dir() / KERNEL_CACHE_MANIFEST).read_text())
    except (ImportError, OSError, ValueError):
        return None


def cute_cache_settings() -> dict[str, str]:
    """The environment of FlashAttention 4's persistent CuTe DSL cache that the workers run with: on
    (`CUTE_CACHE_ENV`), in `CUTE_CACHE_FOLDER` of Triton's cache directory (`CUTE_CACHE_DIR_ENV`),
    where the environment does not say otherwise; nothing without Triton."""
    settings = {CUTE_CACHE_ENV: os.environ.get(CUTE_CACHE_ENV, "1")}
    if CUTE_CACHE_DIR_ENV in os.environ:
        return settings | {CUTE_CACHE_DIR_ENV: os.environ[CUTE_CACHE_DIR_ENV]}
    try:
        return settings | {CUTE_CACHE_DIR_ENV: str(triton_cache_dir() / CUTE_CACHE_FOLDER)}
    except ImportError:
        return {}


def cute_cache_dir() -> str | None:
    """Where the workers keep FlashAttention 4's compiled kernels (env.json's `cute_cache`); None
    when its persistent cache is off."""
    settings = cute_cache_settings()
    return settings.get(CUTE_CACHE_DIR_ENV) if settings.get(CUTE_CACHE_ENV) == "1" else None


def worker_main(
    conn: Connection,
    device: str,
    log_path: str,
    preload: tuple[str, str] | None = None,
    niceness: int = 0,
) -> None:
    """Entry point of the worker process: redirect output to the log, then serve jobs until told to stop.

    `preload`: an adapter's name and module, whose library is imported (`available`) before the
    worker says it is ready. `niceness`: added to the process's niceness (`os.nice`) first.
    """
    if niceness:
        os.nice(niceness)
    os.environ[AUTOTUNE_CACHE_ENV] = autotune_cache_setting()
    # Stays open for the process's lifetime: it backs file descriptors 1 and 2.
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    # Ctrl-C in the terminal reaches the whole process group, and Slurm's preemption or time-limit
    # signal every process of the job: the parent decides and kills us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    # Blocked since the parent started this process (`_interrupt_held`); one pending is now ignored.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    faulthandler.enable()
    # Skipped by `summarize_log`: a spare writes it while another process's case runs.
    log_outcome(f"worker pid {os.getpid()} on {device}")

    # torch takes seconds to import; only this path needs it.
    import torch

    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import timing

    registry.load()
    if timing.is_cuda(device):
        # Before any adapter's library loads (FA4 runs on a GPU only); finding Triton's cache
        # directory imports Triton.
        os.environ.update(cute_cache_settings())
        torch.cuda.set_device(device)
    info = _device_info(device)
    if preload is not None:
        _preload(*preload)
    conn.send(("ready", info))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        print(f"--- case {job.case.key}", file=sys.stderr, flush=True)
        conn.send(("result", job.run(_adapter_for(job), device)))


class Worker:
    """The parent's handle on one worker process; restarts it after a crash or a timeout, and replaces
    it by a fresh one (`switch`), the oldest spare when one was started (`start_spare`).

    Args:
        device: `cpu` or `cuda:<i>`.
        log_path: file receiving the worker's stdout and stderr (appended across restarts).
        niceness: added to each process's niceness (a precompile process beside a measuring one).
    """

    def __init__(self, device: str, log_path: Path, niceness: int = 0) -> None:
        self.device = device
        self.log_path = log_path
        self.niceness = niceness
        self.info: DeviceInfo | None = None
        self.starts = 0
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._ready = False
        self._spares: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        self._retiring: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def launch(self) -> None:
        """Start the process without waiting for it to be ready."""
        self._process, self._conn = self._spawn(None)
        self._ready = False

    def start_spare(self, kernel: str, module: str) -> None:
        """Start a process for a later `switch` to go on in (the spares in the order started): it
        initializes the device and imports the library of the adapter `kernel` (registered by
        `module`) while this one measures."""
        self._spares.append(self._spawn((kernel, module)))

    def switch(self) -> None:
        """Ask the process to exit and go on in the spare (or in a fresh process at the next call)
        without waiting for the exit: the spare is ready, and the old process's teardown needs no GPU
        time. `stop` reaps it, killing it if it has not exited."""
        self._reap()
        with self._lock:
            old = (self._process, self._conn) if self._process is not None else None
            self._process, self._conn = self._spares.pop(0) if self._spares else (None, None)
            self._ready = False
        if old is not None:
            _ask_to_exit(old[1])
            self._retiring.append(old)

    def _spawn(self, preload: tuple[str, str] | None) -> tuple[Any, Connection]:
        context = multiprocessing.get_context("spawn")
        parent_conn, child_conn = context.Pipe()
        process = context.Process(
            target=worker_main,
            args=(child_conn, self.device, str(self.log_path), preload, self.niceness),
            daemon=True,
        )
        try:
            with _interrupt_held():
                process.start()
        except BaseException:  # the Ctrl-C held meanwhile: the new process has nobody to serve
            process.kill()
            process.join(INTERRUPT_JOIN_S)
            raise
        # Without the parent's copy of the child's end, the pipe reports EOF when the worker dies.
        child_conn.close()
        self.starts += 1
        return process, parent_conn

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> str | None:
        """Wait for the worker's `DeviceInfo`; returns None, or why the worker did not start."""
        offset = self._log_size()
        outcome = self._receive(timeout_s)
        if isinstance(outcome, tuple) and outcome[0] == "ready":
            self.info = outcome[1]
            self._ready = True
            return None
        reason = "did not start within the timeout" if outcome == "timeout" else self._death()
        self.kill()
        return _join(f"worker failed to start ({reason})", self._tail(offset))

    def run(self, job: Job) -> Measurement:
        """Measure one job, (re)starting the worker if needed; a death or hang becomes a `Measurement`."""
        answer = self.call(job, job.settings.timeout_s)
        if isinstance(answer, Failure):
            return Measurement.failed(job.case, job.family, answer, self.device)
        if answer.fatal:
            self._stop_process()
        return answer

    def call(self, job: WorkerJob, timeout_s: float) -> Any:
        """Send one job and return the worker's answer, or a `Failure` when the worker did not start,
        died (`crashed`, with the last lines of its log) or gave no answer within `timeout_s`
        (`timeout`; the worker is killed). A later call starts a fresh worker."""
        if not self.alive:
            self.launch()
        if not self._ready:
            failure = self.wait_ready()
            if failure is not None:
                return Failure("crashed", failure[:MAX_ERROR_CHARS])
        offset = self._log_size()
        assert self._conn is not None
        try:
            self._conn.send(job)
        except (BrokenPipeError, OSError):
            pass  # the worker is gone; _receive reports how it died
        outcome = self._receive(timeout_s)
        if isinstance(outcome, tuple) and outcome[0] == "result":
            return outcome[1]
        if outcome == "timeout":
            self.kill()
            error = f"no result after {timeout_s:g} s, worker killed"
            return Failure("timeout", _join(error, self._tail(offset)))
        death, outside = self._death(), self._killed_from_outside()
        self.kill()
        if outside:
            return Failure("interrupted", f"{death}: stopped from outside, not by the kernel")
        return Failure("crashed", _join(death, self._tail(offset)))

    def stop(self) -> None:
        """Ask the worker to exit, and kill it if it does not; kill the spares. Safe while the thread
        serving the worker kills it (after a Ctrl-C): the pipe and process are read once, and a pipe
        closed meanwhile is a worker already gone."""
        self._stop_process()
        self._kill_spares()
        self._reap(wait_s=10)

    def _reap(self, wait_s: float = 0.0) -> None:
        """Forget the processes that `switch` asked to exit once they have; after `wait_s`, kill them."""
        still = []
        for process, conn in self._retiring:
            process.join(wait_s)
            if process.is_alive() and not wait_s:
                still.append((process, conn))
            else:
                _end(process, conn)
        self._retiring = still

    def _stop_process(self) -> None:
        with self._lock:
            conn, process = self._conn, self._process
        if conn is not None and process is not None and process.is_alive():
            _ask_to_exit(conn)
            process.join(10)
        self.kill()

    def kill(self) -> None:
        """Kill the worker process (if any) and forget it."""
        with self._lock:
            if self._process is not None and self._conn is not None:
                _end(self._process, self._conn)
            self._process, self._conn = None, None

    def interrupt(self) -> None:
        """Kill the process and the spare only (safe from another thread): the thread serving this
        worker sees it die and returns; its pipe is closed later by `stop` or `kill` in that thread.
        Waits for the processes to be reaped, so no worker outlives an interrupted sweep."""
        others = [process for process, _ in (*self._spares, *self._retiring)]
        for process in (self._process, *others):
            if process is not None and process.is_alive():
                process.kill()
                process.join(INTERRUPT_JOIN_S)

    def _kill_spares(self) -> None:
        spares, self._spares = self._spares, []
        for process, conn in spares:
            _end(process, conn)

    def _receive(self, timeout_s: float) -> tuple[str, Any] | str:
        """A message, or `timeout`, or `died`."""
        assert self._process is not None and self._conn is not None
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            ready = wait([self._conn, self._process.sentinel], timeout=remaining)
            if self._conn in ready:
                try:
                    return self._conn.recv()
                except (EOFError, OSError):
                    return "died"
            if self._process.sentinel in ready:
                # The result may have been sent just before a clean exit; drain it first.
                if self._conn.poll(0):
                    continue
                return "died"

    def _death(self) -> str:
        assert self._process is not None
        self._process.join(5)
        code = self._process.exitcode
        if code is None:
            return "worker stopped answering"
        if code < 0:
            try:
                return f"worker died ({signal.Signals(-code).name})"
            except ValueError:
                return f"worker died (signal {-code})"
        return f"worker exited with code {code}"

    def _killed_from_outside(self) -> bool:
        """Whether the worker died of a signal that only someone else sends: a job's cancel (SIGTERM),
        its preemption or time-limit signal (SIGUSR2), a hang-up. A kernel's crash is an abort, a
        segfault, a bus error or the OOM killer's SIGKILL."""
        code = self._process.exitcode if self._process is not None else None
        return code is not None and -code in OUTSIDE_SIGNALS

    def _log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def _tail(self, offset: int) -> str:
        """The last lines the worker wrote since `offset`, joined with ` | `."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", errors="replace")
        return summarize_log(text)


@contextlib.contextmanager
def _interrupt_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) while a worker process starts; let it act after.

    The new process inherits SIGINT blocked, until `worker_main` ignores it: a Ctrl-C that reaches the
    process group while Python starts there is not a KeyboardInterrupt traceback in the sweep's
    output. In the parent, a Ctrl-C between the spawn and the write of the process's start-up data
    used to leave the process an EOFError traceback instead; here the handler that was set acts once
    the data is written (signal handlers run in the main thread: another thread's start is not
    interrupted, and only blocks the signal for its process).
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    held: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum)) if main else None
    try:
        yield
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C left pending reaches `previous`
        if held:
            signal.raise_signal(signal.SIGINT)


def _ask_to_exit(conn: Connection) -> None:
    """Send a worker the message that ends its loop (nothing when its pipe is already closed)."""
    try:
        conn.send(None)
    except (BrokenPipeError, OSError):
        pass  # the worker is already gone


def _end(process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
    """Kill `process` if it still runs, reap it and close its pipe."""
    if process.is_alive():
        process.kill()
    process.join(10)
    conn.close()


def summarize_log(text: str) -> str:
    """The last lines of a worker's output, joined with ` | `, for the error cell of a dead worker.

    A faulthandler dump (after an abort or a segfault) is reduced to its first line and the
    crashing thread's innermost frame; the lines printed before it (an LLVM assertion, the
    library's last message) are kept.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("--- ")]
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    if fatal is not None:
        dump = lines[fatal + 1 :]
        current = next((i for i, line in enumerate(dump) if line.startswith("Current thread")), 0)
        frames = [line for line in dump[current:] if line.startswith("File ")]
        lines = [*lines[:fatal][-LOG_TAIL_LINES:], lines[fatal], *frames[:1]]
    return " | ".join(lines[-LOG_TAIL_LINES - 2 :])[-MAX_ERROR_CHARS:]


def _join(head: str, tail: str) -> str:
    return f"{head}: {tail}" if tail else head
