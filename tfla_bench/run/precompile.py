"""Compiling a sweep's Triton kernels in parallel processes (`sweep --precompile N`): on the CPU before
it is measured, on a GPU beside the measuring (`tfla_bench.run.runner`) and compiling only
(`compile_only`).

Triton compiles a kernel on its first call, and an autotuned kernel compiles every config it tries,
one after the other, in the calling process (fla 0.6's GLA backward has about a hundred). Triton
keeps what it compiled in its cache directory (`TRITON_CACHE_DIR`, by default `~/.triton/cache`),
which every process of the machine shares. `precompile` runs each distinct case of the sweep once,
in N worker processes, so the compiling happens N at a time and the measuring workers find it done
(beside the measuring, each adapter's first case waits for its own runs: `on_kernel_done`):

- `plan_jobs`: a case of an autotuned adapter (`Adapter.autotuned`) runs N times, once per shard;
  every other case runs once, N different cases at a time;
- `sharded_autotuning`: in shard j of N each autotuner tries only its configs j, j + N, ...; a try
  is one untimed call with a dummy timing, and its result is neither written to Triton's
  autotuning cache on disk nor kept in memory. An autotuner with no config j (fewer configs than
  shards; one config counts as none but in shard 0) and a kernel launched outside any autotuner
  are launched in shard 0 only: the other shards skip the launch, so no two processes compile the
  same kernel side by side (a skipped launch leaves its outputs unwritten, and the kernels after
  it run on them; a skipped autotuner's `best_config` is its first config, which mamba_ssm reads
  after a launch). A shard whose every config is out of the GPU's shared memory or registers
  (Triton's `OutOfResources`) is done, not failed: the sweep's autotuner skips those configs too;
- `warm_case`: inputs smaller than the case's where the adapter allows it (`Adapter.precompile`).
  Compiled Triton code depends on a shape only through constexprs and the specialization of
  integer arguments (equal to 1, divisible by 16), so the smaller case keeps that specialization:
  a batch above `MAX_BATCH` becomes `MAX_BATCH` if it is divisible by 16, a sequence above
  `MAX_SEQ_LEN` becomes `MAX_SEQ_LEN` likewise (both are multiples of 16), and a size that is not
  divisible by 16 shrinks to one that is not either. An adapter whose kernels take the batch as a
  constexpr and leave the length unspecialized (`sequence`: fla's) keeps the batch and runs
  `SEQUENCE_RUN_LEN` steps, one whose kernels take sizes as constexprs (`own`) runs the case
  itself, and one that compiles nothing into a shared cache (`none`) is not run. A case whose
  smaller shape the adapter rejects runs as it is. A kernel compiled for another
  specialization or constexpr is compiled again by the sweep, in its first call;
- `precompile`: runs the jobs and returns a `PrecompileSummary` for `env.json`. The N processes
  share the GPU: a run may allocate `MEMORY_SHARE` / N of its memory (`PrecompileJob.memory_share`),
  so a run that needs more runs out of memory alone. Such a run goes back to the end of the queue
  with twice the share, as if half the processes ran, down to one: a run starts only when the
  shares of the runs beside it on its GPU leave room for its own, and a process that would wait
  for that while more are up than the run needs leaves, so its memory goes to the larger runs
  (`_Queue`). A process that leaves is not replaced. After `worker.CRASH_REPEATS` identical
  crashes of one kernel its other runs are not made, as in the sweep, and the sweep does not run
  the cases of those runs either (`PrecompileSummary.crashed`). Any other run that fails (an
  error, out of memory, a single crash, a hung worker) is counted, logged (`precompile-<i>.log`)
  and left to the sweep, which runs and reports that case as always.

A run that finished, or failed in a way that would repeat (an error or a crash, not a lack of
memory or time), is remembered in the Triton cache directory it compiled into (`DONE_FILE`), with
the error of a kernel that kept crashing, under a fingerprint of everything its compiled code
depends on (`fingerprint`: torch, Triton and every adapter package's version, the source of our
kernels and of the job's adapter module, the tuned configs, the GPUs' compute capabilities). A later
sweep with the same cache skips those runs: their kernels are already in the cache, or would fail
again. A fresh cache directory, or a change to any of those, runs them again; should a kernel still
be missing, the sweep's first call compiles it.

The sweep measures as it does without it: the first call of an autotuned kernel still times every
config at the case's own shape, one after the other, on a GPU where nothing else runs; only the
compiling is done, so `first_call_s` is shorter. Measured on an H100: one GLA fwbw first call took
460 s without a precompile (`results/runs/fig5_consttoken-20261121-140458`), and 17-22 s at head
dims 32-256 after a 162 s precompile of all 90 cases of Fig. 17 with 14 processes
(`results/runs/fig17_headdim-20261121-162906`). For the largest cases the out-of-memory retries
compile almost one at a time: GLA fwbw at head dims 512 and 1024 took 216 s of precompile and 61 s
and 46 s of first calls (`results/runs/gla_big-20261121-165808`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.measure.worker import (
    CrashGuard,
    Failure,
    Worker,
    failure_of,
    log_outcome,
    make_step,
    triton_cache_dir,
)
from tfla_bench.run import rundir

MAX_BATCH = 16
# The share of a GPU's memory that the PyTorch allocations of its precompile processes take together;
# the rest is left to each process's CUDA context, compiled modules and library workspaces.
MEMORY_SHARE = 0.8
# The same while a sweep measures on that GPU beside them (`precompile(..., beside_measuring=True)`):
# the rest is the measuring worker's.
MEMORY_SHARE_BESIDE_MEASURING = 0.5
# The precompile processes' niceness beside a measuring worker (`os.nice`): when the cores are busy,
# the process that queues the timed calls goes first.
NICENESS_BESIDE_MEASURING = 10
MAX_SEQ_LEN = 8192
# Triton compiles an integer argument divisible by this (and one equal to 1) as its own case.
SPECIALIZATION = 16
# The sequence length of a precompile run of an adapter whose kernels take the batch as a constexpr
# and leave the length unspecialized (`precompile == "sequence"`, fla's): fla 0.6's chunk kernels
# take `T` with `do_not_specialize=['T']` and count their chunks inside (`tl.cdiv(T, BT)`), so any
# length of at least one chunk (BT = 64) compiles the same code; two chunks keep the run small,
# where 1024 steps at the sweep's batch ran out of memory beside 13 other processes.
SEQUENCE_RUN_LEN = 128
DEFAULT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class PrecompileJob:
    """One precompile run of a case, in shard `shard` of `shards` of its autotuners' configs.

    Attributes:
        case: the (smaller) case to run once.
        adapter_module: the module that registers the case's adapter (see `worker.Job`).
        shard: which slice of every autotuner's configs this run tries.
        shards: how many slices (1: all configs).
        grad: the sweep's upstream-gradient mode, so fwbw compiles the same backward.
        memory_share: the share of the GPU's memory this run's PyTorch allocations may take
            (`torch.cuda.set_per_process_memory_fraction`), set by `precompile` for the processes
            running side by side, so a run that needs more fails alone instead of taking its
            neighbours' memory.
    """

    case: Case
    adapter_module: str
    shard: int
    shards: int
    grad: str
    memory_share: float = 1.0

    def run(self, adapter: registry.Adapter, device: str) -> PrecompileResult:
        """`run_job` in the worker (`tfla_bench.measure.worker`)."""
        done = run_job(adapter, self, device)
        shard = f" shard {self.shard + 1}/{self.shards}" if self.shards > 1 else ""
        log_outcome(f"precompile {done.status}{shard} in {done.seconds:.1f} s {done.error or ''}")
        return done


@dataclass(frozen=True)
class PrecompileResult:
    """What one precompile run did: `ok`, `error`, `oom`, `crashed` or `timeout`, and how long it took.
    `retried`: it ran out of memory and runs again with fewer processes."""

    job: PrecompileJob
    status: str
    seconds: float
    error: str | None = None
    retried: bool = False


@dataclass(frozen=True)
class PrecompileSummary:
    """What `precompile` did, for `env.json`.

    Attributes:
        processes: worker processes.
        cases: distinct (smaller) cases.
        runs: precompile runs (a case of an autotuned adapter counts once per shard).
        failed: runs that did not finish; their cases compile in the sweep.
        seconds: wall time.
        retried: runs repeated with fewer processes after running out of memory (each time).
        skipped: runs not made: an earlier sweep made them into the same Triton cache (`DONE_FILE`).
        crashed: the sweep's cases (by key) whose run crashed, or was not made, for a kernel that
            kept crashing the same way (`worker.CrashGuard`), here or in an earlier sweep into the
            same cache, with that error: the sweep does not run them either.
    """

    processes: int
    cases: int
    runs: int
    failed: int
    seconds: float
    retried: int = 0
    skipped: int = 0
    crashed: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """For env.json: the counts, and `crashed` as each error with the keys of its cases."""
        record = dataclasses.asdict(self)
        by_error: dict[str, list[str]] = {}
        for key, error in sorted(self.crashed.items()):
            by_error.setdefault(error, []).append(key)
        record["crashed"] = [{"error": error, "cases": keys} for error, keys in by_error.items()]
        return record


def warm_case(adapter: registry.Adapter, case: Case) -> Case:
    """The case a precompile run uses: the case itself for an adapter whose kernels compile per shape
    (`precompile == "own"`), else batch and seq_len shrunk to at most `MAX_BATCH` and `MAX_SEQ_LEN`
    with Triton's specialization kept (`_same_specialization`), or for an adapter whose kernels take
    the batch as a constexpr and leave the length unspecialized (`precompile == "sequence"`) the
    batch kept and a multiple of `SEQUENCE_RUN_LEN` shortened to it; the case itself when the
    adapter rejects that shape."""
    if adapter.precompile == "own":
        return case
    if adapter.precompile == "sequence" and case.seq_len % SEQUENCE_RUN_LEN == 0:
        smaller = dataclasses.replace(case, seq_len=SEQUENCE_RUN_LEN)
    elif adapter.precompile == "sequence":
        smaller = dataclasses.replace(case, seq_len=_same_specialization(case.seq_len, MAX_SEQ_LEN))
    else:
        smaller = dataclasses.replace(
            case,
            batch=_same_specialization(case.batch, MAX_BATCH),
            seq_len=_same_specialization(case.seq_len, MAX_SEQ_LEN),
        )
    return smaller if adapter.check(smaller) is None else case


def _same_specialization(value: int, limit: int) -> int:
    """`value` if it is at most `limit` (a multiple of `SPECIALIZATION`), else a value up to `limit`
    that Triton specializes as it does `value`: `limit` when `value` is divisible by 16, else
    `limit - 1` (neither divisible by 16 nor 1)."""
    if value <= limit:
        return value
    return limit if value % SPECIALIZATION == 0 else limit - 1


def run_case(case: Case) -> Case | None:
    """The case of `case`'s precompile run (`warm_case`); None for an adapter with nothing to precompile."""
    adapter = registry.get(case.kernel)
    return None if adapter.precompile == "none" else warm_case(adapter, case)


def plan_jobs(
    cases: list[Case], processes: int, grad: str, order: list[str] | None = None
) -> list[PrecompileJob]:
    """The precompile runs for `cases`: each distinct `warm_case` once, or once per shard (`processes`
    shards) for an autotuned adapter; none for an adapter with nothing to precompile. The shards of a
    case are consecutive, so the processes work on one autotuned case together. Kernels come in
    `order` (kernels not named there last), by default the autotuned ones first (they take longest)."""
    distinct: dict[str, tuple[Case, registry.Adapter]] = {}
    for case in cases:
        warm = run_case(case)
        if warm is not None:
            distinct.setdefault(warm.key, (warm, registry.get(case.kernel)))
    if order is None:
        ranked = sorted(distinct.values(), key=lambda pair: not pair[1].autotuned)
    else:
        rank = {kernel: index for index, kernel in enumerate(order)}
        ranked = sorted(distinct.values(), key=lambda pair: rank.get(pair[0].kernel, len(rank)))
    return [
        PrecompileJob(case, type(adapter).__module__, shard, shards, grad)
        for case, adapter in ranked
        for shards in [processes if adapter.autotuned else 1]
        for shard in range(shards)
    ]


def _one_untimed_call(kernel_call: Callable[[], None], quantiles: Any = None, **_: Any) -> Any:
    """An autotuner's benchmark replaced by one call (it compiles the config) and a dummy timing."""
    kernel_call()
    return [0.0] * len(quantiles) if quantiles else 0.0


class _NoConfigHere(Exception):
    """An autotuner has no config in this shard (raised inside `sharded_autotuning` only)."""


@contextmanager
def sharded_autotuning(shard: int, shards: int) -> Iterator[None]:
    """Within the block, every Triton autotuner of this process tries only its configs `shard`,
    `shard + shards`, ..., calls each once without timing it, writes nothing to the autotuning cache
    on disk and forgets its choice after each call; an autotuner with none of them, and in a shard
    other than 0 every kernel launched outside an autotuner, is not launched (module docstring).
    Restores Triton on exit.

    Args:
        shard: which slice, 0 <= shard < shards.
        shards: how many slices.
    """
    # Triton loads only where our kernels or an autotuner are touched.
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    names = ("run", "prune_configs", "check_disk_cache", "do_bench")
    originals = {name: Autotuner.__dict__[name] for name in names}
    plain_runs = {cls: cls.__dict__["run"] for cls in (JITFunction, InterpretedFunction)}
    tuning = threading.local()  # how many autotuner calls this thread is inside

    def prune_configs(self: Autotuner, kwargs: dict[str, Any]) -> list[Any]:
        configs = originals["prune_configs"](self, kwargs)[shard::shards]
        if not configs:
            raise _NoConfigHere
        return configs

    def run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
        self.cache.clear()  # a choice made from dummy timings must not outlive the call
        # A launch not made still names a config: callers read it (mamba_ssm sizes buffers by it).
        if len(self.configs) == 1 and shard != 0:
            self.best_config = self.configs[0]
            return None
        tuning.depth = getattr(tuning, "depth", 0) + 1
        try:
            return originals["run"](self, *args, **kwargs)
        except _NoConfigHere:
            self.nargs, self.best_config = None, self.configs[0]
            return None
        finally:
            tuning.depth -= 1

    def check_disk_cache(
        self: Autotuner, tuning_key: Any, configs: Any, bench_fn: Callable[[], None]
    ) -> bool:
        bench_fn()
        return False

    def plain_run(original: Callable[..., Any]) -> Callable[..., Any]:
        def run_in_shard_0(self: Any, *args: Any, **kwargs: Any) -> Any:
            if shard != 0 and not getattr(tuning, "depth", 0):
                return None
            return original(self, *args, **kwargs)

        return run_in_shard_0

    patches: dict[Any, dict[str, Any]] = {
        Autotuner: {
            "run": run,
            "prune_configs": prune_configs,
            "check_disk_cache": check_disk_cache,
            "do_bench": property(lambda self: _one_untimed_call),
        },
        **{cls: {"run": plain_run(original)} for cls, original in plain_runs.items()},
    }
    saved = [(cls, name, cls.__dict__[name]) for cls, methods in patches.items() for name in methods]
    for cls, methods in patches.items():
        for name, patch in methods.items():
            setattr(cls, name, patch)
    try:
        yield
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


@contextmanager
def compile_only() -> Iterator[None]:
    """Within the block, launching a Triton kernel compiles it (into the cache) and does not run it:
    every `JITFunction.run` gets `warmup=True`, Triton's own compile-ahead path, inside an autotuner
    too. The GPU then runs only the torch work around the kernels (making the inputs, the adapter's
    own tensor ops), so precompile processes take little of a GPU that a sweep measures on. A
    kernel's outputs stay unwritten, as a skipped launch of another shard leaves them. Restores
    Triton on exit."""
    # Triton loads only where our kernels or an autotuner are touched.
    from triton.runtime.jit import JITFunction

    original = JITFunction.__dict__["run"]

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["warmup"] = True
        return original(self, *args, **kwargs)

    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original


def run_job(adapter: registry.Adapter, job: PrecompileJob, device: str) -> PrecompileResult:
    """Run one precompile job in this process (the worker's side; tests call it directly): on a GPU
    compiling only (`compile_only`), under Triton's interpreter running the kernels."""
    # torch takes seconds to import; only this path needs it.
    import torch

    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import memory, timing

    start = time.perf_counter()
    status, error = "ok", None
    cuda = timing.is_cuda(device)
    try:
        if cuda:
            torch.cuda.set_per_process_memory_fraction(job.memory_share, device)
        with compile_only() if cuda else contextlib.nullcontext(), sharded_autotuning(job.shard, job.shards):
            inputs = adapter.make_inputs(job.case, device)
            make_step(adapter, inputs, job.case.mode, job.grad)()
            if cuda:
                torch.cuda.synchronize(device)
    except Exception as exc:  # the sweep runs this case again and reports what happens there
        traceback.print_exc()
        if job.shards > 1 and _out_of_resources(exc):
            # Every config of this shard needs more shared memory or registers than the GPU has.
            # The sweep's autotuner skips such configs, so this shard had nothing to compile.
            print(f"shard {job.shard + 1}/{job.shards}: its configs do not fit this GPU; none to compile")
        else:
            failed = failure_of(exc)
            status, error = failed.status, failed.error
    memory.release(device)
    return PrecompileResult(job, status, time.perf_counter() - start, error)


def _out_of_resources(exc: BaseException) -> bool:
    """Whether `exc` is Triton's refusal of a config that does not fit the GPU's resources."""
    # Triton loads only where our kernels or an autotuner are touched.
    from triton.runtime.errors import OutOfResources

    return isinstance(exc, OutOfResources)


def precompile(
    cases: list[Case],
    processes: int,
    devices: list[str],
    log_dir: Path,
    *,
    grad: str = "sum",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    order: list[str] | None = None,
    beside_measuring: bool = False,
    stop: threading.Event | None = None,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[PrecompileResult], None] | None = None,
    on_retry: Callable[[PrecompileJob, int], None] | None = None,
    on_kernel_done: Callable[[str, dict[str, str]], None] | None = None,
) -> PrecompileSummary:
    """Run `cases` once each (smaller, sharded: see the module docstring) in `processes` workers.

    Args:
        cases: the cases the sweep is about to measure.
        processes: worker processes (at least 1), spread round-robin over `devices`.
        devices: `cpu` or `cuda:<i>` devices.
        log_dir: where each worker writes `precompile-<i>.log`.
        grad: the sweep's upstream-gradient mode.
        timeout_s: per run; a worker that hangs longer is killed and replaced.
        order: kernels in the order to compile them (the order the sweep measures them in); by
            default the autotuned ones first, as they take longest.
        beside_measuring: a sweep measures on the same GPUs meanwhile: the processes take
            `MEMORY_SHARE_BESIDE_MEASURING` of the memory and run at `NICENESS_BESIDE_MEASURING`.
        stop: set from another thread to end the runs under way (their workers are interrupted) and
            start no more.
        on_start: called once with the number of runs, and with 1 for each run made again (progress).
        on_result: called with each run's result as it finishes (retried ones too).
        on_retry: called with a run that ran out of memory and the number of processes whose share
            of the memory it runs again with.
        on_kernel_done: called once per kernel of `cases`, as soon as none of its runs is left, with
            its cases (by key) that the sweep does not run because the kernel kept crashing
            (`PrecompileSummary.crashed`, that kernel's part); at once for a kernel with no run left.
    """
    start = time.monotonic()
    planned = plan_jobs(cases, processes, grad, order)
    done_file = DoneFile(devices)
    jobs = [job for job in planned if not done_file.has(job)]
    if on_start is not None:
        on_start(len(jobs))
    width = max(1, min(processes, len(jobs)))
    kernels = _KernelsLeft(cases, planned, jobs, done_file, on_kernel_done)

    def retry(job: PrecompileJob, processes: int) -> None:
        if on_start is not None:
            on_start(1)
        if on_retry is not None:
            on_retry(job, processes)

    crashes = CrashGuard()

    def finished(result: PrecompileResult) -> None:
        if on_result is not None:
            on_result(result)
        if not result.retried:
            kernels.finished(result, crashes)

    total = MEMORY_SHARE_BESIDE_MEASURING if beside_measuring else MEMORY_SHARE
    todo = _Queue(jobs, width, devices, retry, total, order if beside_measuring else None)
    niceness = NICENESS_BESIDE_MEASURING if beside_measuring else 0
    results = (
        _run_jobs(todo, width, devices, log_dir, timeout_s, crashes, finished, niceness, stop) if jobs else []
    )
    # A run that failed for lack of memory or time may pass another time; any other outcome repeats.
    done_file.add(result.job for result in results if result.status not in ("oom", "timeout"))
    for result in results:
        error = crashes.keeps_crashing(result.job.case.kernel)
        if result.status == "crashed" and error is not None:
            done_file.crashes[done_file.job_id(result.job)] = error
    done_file.save()
    crashed = _crashed_cases(cases, planned, done_file)
    kernels.rest(crashed)
    return PrecompileSummary(
        processes=width if jobs else 0,
        cases=len({job.case.key for job in planned}),
        runs=len(jobs),
        failed=sum(result.status != "ok" and not result.retried for result in results),
        seconds=time.monotonic() - start,
        retried=sum(result.retried for result in results),
        skipped=len(planned) - len(jobs),
        crashed=crashed,
    )


def _crashed_cases(cases: list[Case], planned: list[PrecompileJob], done_file: DoneFile) -> dict[str, str]:
    """The sweep's cases (by key) whose run crashed, or was not made, for a kernel that kept crashing,
    with its error, as `done_file` records them."""
    crashed_runs = {job.case.key: error for job in planned if (error := done_file.crash(job)) is not None}
    return _of_runs(cases, crashed_runs)


def _of_runs(cases: list[Case], crashed_runs: dict[str, str]) -> dict[str, str]:
    """The sweep's cases (by key) whose run (of a smaller case that compiles the same code) is among
    `crashed_runs` (by the run case's key), with that run's error."""
    return {
        case.key: crashed_runs[warm.key]
        for case in cases
        if (warm := run_case(case)) is not None and warm.key in crashed_runs
    }


class _KernelsLeft:
    """How many runs of each kernel are left, to tell `on_kernel_done` of each kernel once its last run
    finished, with its crashed cases (`precompile`'s argument)."""

    def __init__(
        self,
        cases: list[Case],
        planned: list[PrecompileJob],
        jobs: list[PrecompileJob],
        done_file: DoneFile,
        on_done: Callable[[str, dict[str, str]], None] | None,
    ) -> None:
        self.cases, self.planned, self.done_file, self.on_done = cases, planned, done_file, on_done
        self.left = collections.Counter(job.case.kernel for job in jobs)
        self.runs: dict[str, list[PrecompileResult]] = collections.defaultdict(list)
        self.told: set[str] = set()
        # Kernels with nothing to run now: only an earlier sweep's verdict can decide their cases.
        for kernel in dict.fromkeys(case.kernel for case in cases):
            if not self.left[kernel]:
                self._tell(kernel, _crashed_cases(self._of(kernel), planned, done_file))

    def finished(self, result: PrecompileResult, crashes: CrashGuard) -> None:
        """A run's final result (not one that goes back to the queue)."""
        kernel = result.job.case.kernel
        self.runs[kernel].append(result)
        self.left[kernel] -= 1
        if self.left[kernel]:
            return
        # Every run of the kernel is in, so whether it kept crashing is settled, as at the end.
        error = crashes.keeps_crashing(kernel)
        crashed_runs = {
            r.job.case.key: error for r in self.runs[kernel] if error is not None and r.status == "crashed"
        }
        earlier = _crashed_cases(self._of(kernel), self.planned, self.done_file)
        self._tell(kernel, earlier | _of_runs(self._of(kernel), crashed_runs))

    def rest(self, crashed: dict[str, str]) -> None:
        """Tell every kernel not told yet (its runs were stopped), from the final verdict."""
        for kernel in dict.fromkeys(case.kernel for case in self.cases):
            self._tell(kernel, {c.key: crashed[c.key] for c in self._of(kernel) if c.key in crashed})

    def _of(self, kernel: str) -> list[Case]:
        return [case for case in self.cases if case.kernel == kernel]

    def _tell(self, kernel: str, crashed: dict[str, str]) -> None:
        if kernel in self.told:
            return
        self.told.add(kernel)
        if self.on_done is not None:
            self.on_done(kernel, crashed)


DONE_FILE = "tfla-bench-precompiled.json"
# How many fingerprints the done file keeps (the newest), so it does not grow without bound.
MAX_FINGERPRINTS = 8


def fingerprint(devices: list[str]) -> str:
    """A digest of what the compiled code of every precompile run depends on, besides the job itself:
    torch, Triton and the adapters' package versions, the source of our kernels and their tuned
    configs, the devices' compute capabilities, and whether Triton interprets (CPU)."""
    # torch takes seconds to import; only this path needs it.
    import torch

    # imports torch at import time, which only this path needs.
    from tfla_bench.kernels import config as kernel_config
    from tfla_bench.measure import envinfo

    capabilities = [
        "cpu" if device == "cpu" else ".".join(map(str, torch.cuda.get_device_capability(device)))
        for device in devices
    ]
    kernels_dir = Path(kernel_config.__file__).parent
    facts = {
        "torch": torch.__version__,
        "packages": {name: envinfo.installed_version(name) for name in envinfo.recorded_packages()},
        "kernels": _source_digest(sorted(kernels_dir.rglob("*.py"))),
        "tuned": repr(sorted(kernel_config.TUNED_CONFIGS.items(), key=str)),
        "devices": capabilities,
        "interpret": os.environ.get("TRITON_INTERPRET", ""),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _source_digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _module_digest(name: str) -> str:
    """The digest of a loaded module's source file (empty for a module without one)."""
    source = getattr(sys.modules.get(name), "__file__", None)
    return _source_digest([Path(source)]) if source else ""


class DoneFile:
    """The precompile runs finished into this Triton cache directory under the current fingerprint,
    and the error of each that crashed for a kernel that kept crashing (`crashes`).

    A run is named by its case, shard and upstream-gradient mode, and by a digest of its adapter
    module's source. Reading or writing the file never fails a sweep: an unreadable file is an
    empty one, and a write that fails is skipped (the next sweep then runs the jobs again).
    """

    def __init__(self, devices: list[str]) -> None:
        self.path = triton_cache_dir() / DONE_FILE
        self.fingerprint = fingerprint(devices)
        try:
            self.record: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.record = {}
        if not isinstance(self.record, dict):
            self.record = {}
        entry = self.record.get(self.fingerprint)
        if isinstance(entry, list):  # the format before crashes were kept
            entry = {"done": entry}
        if not isinstance(entry, dict):
            entry = {}
        self.done = set(entry.get("done", []))
        crashes = entry.get("crashed", {})
        self.crashes: dict[str, str] = crashes if isinstance(crashes, dict) else {}

    def job_id(self, job: PrecompileJob) -> str:
        digest = _module_digest(job.adapter_module)
        return f"{job.case.key}#{job.shard}/{job.shards}#{job.grad}#{digest}"

    def has(self, job: PrecompileJob) -> bool:
        return self.job_id(job) in self.done

    def crash(self, job: PrecompileJob) -> str | None:
        """The error of `job`'s kernel if the job crashed (or was not made) as that kernel kept crashing."""
        return self.crashes.get(self.job_id(job))

    def add(self, jobs: Any) -> None:
        self.done.update(self.job_id(job) for job in jobs)

    def save(self) -> None:
        record = {key: value for key, value in self.record.items() if key != self.fingerprint}
        record[self.fingerprint] = {"done": sorted(self.done), "crashed": dict(sorted(self.crashes.items()))}
        record = dict(list(record.items())[-MAX_FINGERPRINTS:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            rundir.write_json(self.path, record)
        except OSError:
            pass


def memory_share(processes: int, devices: list[str], total: float = MEMORY_SHARE) -> float:
    """The share of its GPU's memory each of `processes` precompile processes, spread round-robin over
    `devices`, may allocate: `total` over the processes per GPU (1 on CPU, where it is not used)."""
    if devices[0] == "cpu":
        return 1.0
    return total / _per_gpu(processes, devices)


def _per_gpu(processes: int, devices: list[str]) -> int:
    """How many of `processes`, spread round-robin over `devices`, the first device gets."""
    return -(-processes // len(devices))


class _Queue:
    """The runs left, handed to the worker threads one at a time, so that the runs on a GPU never
    hold more than its memory share (`MEMORY_SHARE`) together.

    A run made as one of w processes holds 1/w of its GPU's budget, w counted per GPU
    (`memory_share`); one that ran out of memory goes back (`finish`) to the end of the queue as one
    of half as many, down to one, so the larger runs come after the others, as they would in rounds
    of fewer processes, but start as soon as there is room. A worker waits while the run at the
    front does not fit beside the runs on its GPU, so a large run is never passed over, and while
    the queue is empty but runs are still under way, which may come back. A worker that would wait
    while more processes are up on its GPU than the run at the front is one of leaves (`take`
    returns None): every process holds memory of its own besides its share (its CUDA context and
    loaded modules, about 2 GB on an H100 in the Fig. 5 sweep), which the larger runs need.

    With `order` (kernels in the order a sweep beside the precompile measures them), a run goes back
    behind the waiting runs of its own kernel and those before it, not to the end: the sweep waits
    for each kernel's last run, and a large run of its next kernel queued behind every autotuner's
    shards kept it waiting (an H200's Fig. 17 sweep, its `tfla_exp` run at head dim 1024 sent back
    for memory, was still waiting for it when stopped 100 s later).
    """

    def __init__(
        self,
        jobs: list[PrecompileJob],
        processes: int,
        devices: list[str],
        on_retry: Callable[[PrecompileJob, int], None],
        total: float = MEMORY_SHARE,
        order: list[str] | None = None,
    ) -> None:
        self.devices, self.on_retry, self.total = devices, on_retry, total
        self.rank = {kernel: index for index, kernel in enumerate(order)} if order is not None else None
        self.waiting: collections.deque[tuple[PrecompileJob, int]] = collections.deque(
            (dataclasses.replace(job, memory_share=memory_share(processes, devices, total)), processes)
            for job in jobs
        )
        self.held = dict.fromkeys(devices, 0.0)  # of each GPU's budget, by the runs under way
        # worker i runs on devices[i % len(devices)]
        self.up = {device: len(range(index, processes, len(devices))) for index, device in enumerate(devices)}
        self.running = 0
        self.stopped = False
        self.changed = threading.Condition()

    def take(self, device: str) -> tuple[PrecompileJob, int] | None:
        """The next run for a worker on `device` and its width, once it fits; None when all are done
        or the worker is to leave."""
        with self.changed:
            while True:
                if self.stopped or (not self.waiting and not self.running):
                    return None
                if self.waiting:
                    job, processes = self.waiting[0]
                    part = 1.0 / _per_gpu(processes, self.devices)
                    if self.held[device] + part <= 1.0 + 1e-9:
                        self.waiting.popleft()
                        self.held[device] += part
                        self.running += 1
                        return job, processes
                    if self.up[device] > _per_gpu(processes, self.devices):
                        self.up[device] -= 1
                        self.changed.notify_all()
                        return None
                self.changed.wait()

    def finish(self, device: str, job: PrecompileJob, processes: int, out_of_memory: bool) -> bool:
        """A run is over; one that ran out of memory with more than one process's share goes back
        with twice the share. Returns whether it went back."""
        with self.changed:
            self.held[device] -= 1.0 / _per_gpu(processes, self.devices)
            self.running -= 1
            again = out_of_memory and processes > 1 and not self.stopped
            if again:
                fewer = max(1, processes // 2)
                job = dataclasses.replace(job, memory_share=memory_share(fewer, self.devices, self.total))
                self.waiting.insert(self._place(job), (job, fewer))
                self.on_retry(job, fewer)
            self.changed.notify_all()
            return again

    def _place(self, job: PrecompileJob) -> int:
        """Where a run that goes back waits: at the end, or with `order` before the first waiting run
        of a kernel measured later."""
        if self.rank is None:
            return len(self.waiting)
        last = len(self.rank)
        rank = self.rank.get(job.case.kernel, last)
        later = (
            i
            for i, (waiting, _) in enumerate(self.waiting)
            if self.rank.get(waiting.case.kernel, last) > rank
        )
        return next(later, len(self.waiting))

    def stop(self) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify_all()


def _run_jobs(
    todo: _Queue,
    processes: int,
    devices: list[str],
    log_dir: Path,
    timeout_s: float,
    crashes: CrashGuard,
    on_result: Callable[[PrecompileResult], None] | None,
    niceness: int = 0,
    stop: threading.Event | None = None,
) -> list[PrecompileResult]:
    """Run the jobs of `todo` in `processes` workers at `niceness`; out-of-memory results that go back
    to the queue are marked retried. A job of a kernel that `crashes` says keeps crashing is not run
    (status `crashed`). `stop`, once set, ends it as Ctrl-C does."""
    results: list[PrecompileResult] = []
    lock = threading.Lock()

    def serve(worker: Worker) -> None:
        try:
            while (taken := todo.take(worker.device)) is not None:
                job, width = taken
                with lock:
                    crashed = crashes.reason(job.case)
                begun = time.monotonic()
                if crashed is not None:
                    answer = PrecompileResult(job, "crashed", 0.0, crashed)
                else:
                    answer = worker.call(job, timeout_s)
                if isinstance(answer, Failure):
                    answer = PrecompileResult(job, answer.status, time.monotonic() - begun, answer.error)
                if todo.finish(worker.device, job, width, answer.status == "oom"):
                    answer = dataclasses.replace(answer, retried=True)
                if todo.stopped:
                    return
                with lock:
                    if crashed is None:
                        crashes.record(job.case.kernel, answer.status, answer.error)
                    results.append(answer)
                    if on_result is not None:
                        on_result(answer)
        finally:
            worker.stop()

    workers = [
        Worker(devices[index % len(devices)], log_dir / rundir.precompile_log(index), niceness)
        for index in range(processes)
    ]
    threads = [threading.Thread(target=serve, args=(worker,), daemon=True) for worker in workers]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
                if stop is not None and stop.is_set():
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        todo.stop()
        for worker in workers:
            worker.interrupt()
        if stop is not None and stop.is_set():
            return results
        raise
    return results
