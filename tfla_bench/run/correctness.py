"""The correctness gate: every available adapter's forward output against a PyTorch reference.

For each adapter the gate builds one small forward case (`adapter.gate_shape`), makes the
adapter's inputs, runs `adapter.forward` and `adapter.reference` on the same inputs and compares.
The references of every family live in `tfla_bench.kernels.reference` (softmax attention, the decay
linear-attention recurrence behind GLA, Mamba and LightningAttention-2, the mLSTM formulations);
each adapter maps its library's inputs onto one.

References compute in float64 from the very tensors the kernel gets, so the error measures the
kernel's arithmetic and not the rounding of its inputs.

Error measure: `max_rel_error = max|out - ref| / max|ref|`, the largest deviation relative to the
reference's largest magnitude. It does not blow up where the output crosses zero (an elementwise
relative error would) and it catches any element that is wrong by a fraction of the output scale.

Tolerances (`TOLERANCES`, by input dtype): the kernels accumulate in fp32 but round intermediate
tiles (attention probabilities, chunk states, intra-chunk scores) and the output to the input dtype.
One bf16 rounding is a relative error of at most 2^-8 ~ 0.004 per element (torch's bf16 math-SDPA
lands at ~2.5e-3 on the attention gate case); a few such roundings along the computation, partly
averaging out, stay inside 2e-2, while a wrong gate convention, a missing scale or a dropped
chunk-state contribution gives errors of order 1. fp16 rounds at 2^-11; 1e-2 leaves room for the
larger dynamic range of unnormalized linear attention. fp32 inputs still meet TF32 tensor-core
matmuls in the Triton kernels (also ~2^-11 per product, accumulated over the head dim): 5e-3.

The kernels run in a worker process of `tfla_bench.measure.worker` with a per-adapter timeout
(`isolate=True`, the default): one process for all adapters, replaced after a crash, a hang or a
CUDA error that poisons its context. A kernel that aborts the process (the official mLSTMexp
xl_chunk kernel hits an LLVM assertion on Triton 3.6) or hangs in autotuning yields a `crashed` /
`timeout` result that quotes the worker's last output, and the gate goes on. On a GPU the adapters
are shared among several such workers (`gate_processes`), since what a gate spends is mostly
compiling on the host; results keep the registry's order. A third party's autotuner runs only its
first config that compiles (`timing.first_config_only`): one right output is what the gate needs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.errors import exception_line
from tfla_bench.measure.worker import Failure, Worker, is_fatal_cuda_error, log_outcome
from tfla_bench.run import rundir

if TYPE_CHECKING:
    import torch

    from tfla_bench.adapters.registry import Adapter

TOLERANCES: dict[str, float] = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 5e-3}
DEFAULT_TIMEOUT_S = 900.0
# Gate workers side by side on a GPU: more only crowd the host cores that compile their kernels.
MAX_GATE_PROCESSES = 8

# Statuses of a gate result. `passed` is True/False for "ok" and False for "error", "crashed" and
# "timeout" (an available adapter that cannot produce a checked output fails the gate); None for
# adapters the gate could not run ("unavailable", "unsupported") or could not compare ("no_reference").
# Not the statuses of a results row (`tfla_bench.run.row_schema.STATUSES`): a gate "ok" means compared
# (passed or not), a gate has no "oom" and no "failed_check", a row has no "no_reference".
GATE_STATUSES = ("ok", "error", "crashed", "timeout", "unavailable", "unsupported", "no_reference")
# The reasons of an `unavailable` verdict that come from the gate's device, not from `available()`.
NO_CUDA = "CUDA not available"
NEEDS_CUDA = "needs a CUDA GPU"


@dataclass(frozen=True)
class GateResult:
    """The gate's verdict on one adapter.

    Attributes:
        name: adapter name.
        status: one of `GATE_STATUSES` (a gate verdict, not a result row's status).
        max_rel_error: `max|out - ref| / max|ref|` when compared, else None.
        tolerance: the bound `max_rel_error` must not exceed, else None.
        passed: True/False when the adapter ran; None when it could not run or has no reference.
        reason: why it did not run or fail (unavailable reason, exception's last line), else None.
        seconds: wall time the gate spent on the adapter (compile and autotune included), else None.
    """

    name: str
    status: str
    max_rel_error: float | None
    tolerance: float | None
    passed: bool | None
    reason: str | None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.status not in GATE_STATUSES:
            raise ValueError(f"unknown gate status {self.status!r}")


def max_relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """`max|out - ref| / max|ref|` in float64; NaN if `out` has NaN or infinities.

    Args:
        out: the kernel's output.
        ref: the reference, same shape.
    """
    # torch takes seconds to import; only this path needs it.
    import torch

    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(device=out64.device, dtype=torch.float64)
    if not torch.isfinite(out64).all():
        return math.nan
    scale = ref64.abs().max().item()
    return (out64 - ref64).abs().max().item() / max(scale, torch.finfo(torch.float64).tiny)


def gate_dtype(adapter: Adapter) -> str:
    """The dtype the gate runs an adapter in: bfloat16 (the benchmarks' dtype) where it runs here, else
    float32 (Triton's interpreter), else the adapter's first."""
    runnable = [dtype for dtype in adapter.dtypes if adapter.dtype_reason(dtype) is None] or adapter.dtypes
    preferred = [dtype for dtype in ("bfloat16", "float32") if dtype in runnable]
    return (preferred or list(runnable))[0]


def gate_case(adapter: Adapter, dtype: str | None = None) -> Case:
    """The small forward case the gate runs for `adapter` (its `gate_shape`)."""
    sizes = dataclasses.asdict(adapter.gate_shape)
    if not adapter.uses_chunk_size:
        sizes["chunk_size"] = None
    return Case(kernel=adapter.name, mode="fw", dtype=dtype or gate_dtype(adapter), **sizes)


def _skipped(name: str, status: str, reason: str | None) -> GateResult:
    return GateResult(
        name=name, status=status, max_rel_error=None, tolerance=None, passed=None, reason=reason
    )


def _failed(name: str, status: str, reason: str) -> GateResult:
    return GateResult(
        name=name, status=status, max_rel_error=None, tolerance=None, passed=False, reason=reason
    )


def _preflight(adapter: Adapter, case: Case, device: str) -> GateResult | None:
    """The result that says why the gate cannot run `case`, or None. Asked where the kernel would
    run (a gate worker, when isolated), so that the library is imported once, there."""
    # torch takes seconds to import; only this path needs it.
    import torch

    reason = registry.available_reason(adapter)
    if reason is not None:
        return _skipped(adapter.name, "unavailable", reason)
    if device.startswith("cuda") and not torch.cuda.is_available():
        return _skipped(adapter.name, "unavailable", NO_CUDA)
    if device == "cpu" and not adapter.cpu_capable:
        return _skipped(adapter.name, "unavailable", NEEDS_CUDA)
    if case.dtype not in adapter.dtypes:
        return _skipped(adapter.name, "unsupported", f"dtype {case.dtype} not supported")
    reason = adapter.check(case)
    if reason is not None:
        return _skipped(adapter.name, "unsupported", reason)
    return None


def verdict(adapter: Adapter, case: Case, device: str) -> GateResult:
    """Why the gate cannot run `case`, or `compare`'s verdict on it, in this process."""
    return _preflight(adapter, case, device) or compare(adapter, case, device)


def compare(adapter: Adapter, case: Case, device: str) -> GateResult:
    """Run `adapter` on `case` in this process and compare its forward output with its reference.

    Args:
        adapter: the adapter.
        case: a forward case it supports (see `gate_case`).
        device: `cuda`, `cuda:<i>` or `cpu`.
    """
    # torch takes seconds to import; only this path needs it.
    import torch

    tolerance = TOLERANCES[case.dtype]
    try:
        inputs = adapter.make_inputs(case, device)
        with torch.no_grad():
            out = adapter.forward(inputs)
            ref = adapter.reference(inputs)
        if ref is None:
            return _skipped(adapter.name, "no_reference", "the adapter has no reference")
        error = max_relative_error(out, ref)
    except Exception as exc:  # any kernel failure is the gate's finding, not a crash of the gate
        traceback.print_exc()
        return _failed(adapter.name, "error", exception_line(exc))
    passed = error <= tolerance  # False for NaN
    if passed:
        reason = None
    elif math.isnan(error):
        reason = "the output has NaN or Inf values"
    else:
        reason = f"max relative error {error:.3g} exceeds {tolerance:g}"
    return GateResult(
        name=adapter.name, status="ok", max_rel_error=error, tolerance=tolerance, passed=passed, reason=reason
    )


@dataclass(frozen=True)
class GateJob:
    """One gate case for a worker (`tfla_bench.measure.worker`): `compare` on `case` there."""

    case: Case
    adapter_module: str

    def run(self, adapter: Adapter, device: str) -> GateResult:
        from tfla_bench.measure.timing import first_config_only

        with first_config_only():
            result = verdict(adapter, self.case, device)
        log_outcome(f"gate {result.status} {result.reason or ''}")
        return result


def _worker_device(device: str) -> str:
    return "cuda:0" if device == "cuda" else device


@contextmanager
def gate_worker(device: str, log_path: Path | None = None) -> Iterator[Worker]:
    """A worker process for gate jobs (`tfla_bench.measure.worker`), stopped on exit.

    Args:
        device: `cuda`, `cuda:<i>` or `cpu`.
        log_path: the worker's stdout/stderr (kept, e.g. `check.log` in a run directory); default a
            temporary file, removed on exit. A crashed adapter's reason quotes its last lines.
    """
    with tempfile.TemporaryDirectory(prefix="tfla-bench-gate-") as scratch:
        worker = Worker(_worker_device(device), log_path or Path(scratch) / "gate-worker.log")
        try:
            yield worker
        finally:
            worker.stop()


def _isolated(adapter: Adapter, case: Case, worker: Worker, timeout_s: float) -> GateResult:
    answer = worker.call(GateJob(case=case, adapter_module=type(adapter).__module__), timeout_s)
    if isinstance(answer, Failure):
        return _failed(adapter.name, answer.status, answer.error)
    if answer.status == "error" and is_fatal_cuda_error(answer.reason or ""):
        worker.stop()  # the CUDA context is lost; the next adapter gets a fresh worker
    return answer


def gate_adapter(
    adapter: Adapter,
    device: str,
    *,
    dtype: str | None = None,
    isolate: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    worker: Worker | None = None,
) -> GateResult:
    """The gate's verdict on one adapter.

    Args:
        adapter: the adapter.
        device: `cuda`, `cuda:<i>` or `cpu`.
        dtype: input dtype; default bfloat16 where the adapter runs it here (`gate_dtype`).
        isolate: run the kernel in a worker process (survives aborts and hangs).
        timeout_s: with `isolate`, the time the kernel gets (first-call autotuning included).
        worker: with `isolate`, the worker to use (kept for the next adapter); default a fresh one.
    """
    case = gate_case(adapter, dtype)
    if not isolate:
        return verdict(adapter, case, device)
    if worker is not None:
        return _isolated(adapter, case, worker, timeout_s)
    with gate_worker(device) as own:
        return _isolated(adapter, case, own, timeout_s)


def gate_processes(device: str, adapters: int) -> int:
    """How many gate workers check adapters side by side: on a GPU one per two host cores, at most
    `MAX_GATE_PROCESSES`; on the CPU one, since the kernels themselves then need the cores."""
    if device == "cpu":
        return 1
    return max(1, min(adapters, MAX_GATE_PROCESSES, (os.cpu_count() or 2) // 2))


def run_gate(
    adapter_names: list[str] | None,
    device: str,
    *,
    dtype: str | None = None,
    isolate: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    log_path: Path | None = None,
    processes: int | None = None,
    on_start: Callable[[str], None] | None = None,
    on_result: Callable[[GateResult], None] | None = None,
) -> list[GateResult]:
    """Run the gate for the named adapters (all registered adapters when None); results in registry order.

    Args:
        adapter_names: adapter names; an unknown name is a `UserError`.
        device: `cuda`, `cuda:<i>` or `cpu`.
        dtype: input dtype for every adapter; default `gate_dtype` of each.
        isolate: run the kernels in worker processes, each replaced after a crash or a timeout.
        timeout_s: per-adapter time limit with `isolate`.
        log_path: with `isolate`, keep the first worker's output here and the others' beside it
            (`check-1.log`, ...).
        processes: with `isolate`, the workers that check adapters side by side; default
            `gate_processes`.
        on_start: called with each adapter's name before it runs (progress display).
        on_result: called with each result as soon as it is known.

    Returns:
        One `GateResult` per adapter, with its `seconds`.
    """
    chosen = [registry.get(name) for name in adapter_names] if adapter_names else registry.adapters()
    workers = 1 if not isolate else processes or gate_processes(device, len(chosen))
    todo: queue.SimpleQueue[tuple[int, Adapter]] = queue.SimpleQueue()
    for item in enumerate(chosen):
        todo.put(item)
    results: dict[int, GateResult] = {}
    raised: list[BaseException] = []
    lock = threading.Lock()

    def serve_or_keep(index: int) -> None:
        try:
            serve(index)
        except BaseException as exc:  # a bug in one worker's thread: raised again in the caller's
            raised.append(exc)

    def serve(index: int) -> None:
        log = None if log_path is None or index == 0 else log_path.with_stem(f"{log_path.stem}-{index}")
        with gate_worker(device, log or log_path) if isolate else _no_worker() as worker:
            while True:
                try:
                    position, adapter = todo.get_nowait()
                except queue.Empty:
                    return
                if on_start is not None:
                    with lock:
                        on_start(adapter.name)
                start = time.perf_counter()
                result = gate_adapter(
                    adapter, device, dtype=dtype, isolate=isolate, timeout_s=timeout_s, worker=worker
                )
                result = dataclasses.replace(result, seconds=time.perf_counter() - start)
                with lock:
                    results[position] = result
                    if on_result is not None:
                        on_result(result)

    threads = [
        threading.Thread(target=serve_or_keep, args=(index,), daemon=True) for index in range(1, workers)
    ]
    for thread in threads:
        thread.start()
    serve(0)
    for thread in threads:
        thread.join()
    if raised:
        raise raised[0]
    return [results[position] for position in range(len(chosen))]


@contextmanager
def _no_worker() -> Iterator[None]:
    yield None


def failed_names(results: list[GateResult]) -> set[str]:
    """Names of the adapters that ran and failed the gate (`passed is False`)."""
    return {result.name for result in results if result.passed is False}


def answers_availability(device: str) -> bool:
    """Whether a gate on `device` asks `available_reason` where `registry.availability` does (the CPU
    or the first GPU), so what it learns can go into the availability cache."""
    return device in ("cpu", "cuda", "cuda:0")


def available_reasons(results: list[GateResult], device: str) -> dict[str, str | None]:
    """What the gate learned of each adapter's `available_reason` (by name), where its workers asked
    it as `registry.availability` does (on the CPU or the first GPU): None where the gate went past
    the question (it compared, or stopped at the case or the reference), the reason where it stopped
    there. A crash or a timeout, which may have come while asking, and a device's own reason leave the
    answer unknown, and the adapter out."""
    if not answers_availability(device):
        return {}
    reasons: dict[str, str | None] = {}
    for result in results:
        if result.status in ("ok", "error", "unsupported", "no_reference"):
            reasons[result.name] = None
        elif result.status == "unavailable" and result.reason not in (NO_CUDA, NEEDS_CUDA):
            reasons[result.name] = result.reason
    return reasons


def json_row(result: GateResult) -> dict[str, object]:
    """`result` as a JSON-ready dict (a non-finite error becomes None; the reason says why)."""
    row = dataclasses.asdict(result)
    error = row["max_rel_error"]
    if isinstance(error, float) and not math.isfinite(error):
        row["max_rel_error"] = None
    return row


def write_gate(path: Path, results: list[GateResult], device_name: str) -> Path:
    """Write the gate's results (`{"device": ..., "results": [...]}`) to `path`, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_json(path, {"device": device_name, "results": [json_row(r) for r in results]})
    return path
