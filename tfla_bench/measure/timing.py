"""Timing one callable: one loop for GPU and CPU, with CUDA events or `time.perf_counter` as the clock.

How many calls are timed
------------------------
`StopRule` decides when a series of per-call times is long enough. With `reps` set it stops after
exactly that many calls (`fixed`, the paper's method). Otherwise it is adaptive: it stops as soon
as the 95% confidence interval of the median is within +-`rel_ci` of the median (`ci`) and
`min_time_s` of measuring is spent, or when `budget_s` of measuring is spent (`budget`), or at
`max_reps` (`max`), never before `min_reps`. The minimum time makes a short kernel's median one
over a fifth of a second (the sweep's default), not over its first few calls: a kernel that draws
an H100's full power slowed down within tens of milliseconds (its power cap), and a median over its
first six calls would depend on where the stop fell.
The interval is distribution-free: the order statistics x(l) and x(n+1-l), with l the largest
index such that a Binomial(n, 1/2) count falls below l with probability at most 2.5%
(`median_ci`). It needs no assumption on the shape of the timing distribution, and it is finite
from n = 6 on. Warm-up runs by time as well: calls until `warmup_s` has passed, at least one.

What one timed call contains
----------------------------
`time_calls` runs `before_each` (L2 flush, resetting gradients) outside the timed window. On CUDA
it then queues a spin kernel (`torch.cuda._sleep`) that keeps the GPU busy while the host queues
the start event, the call and the end event, so the GPU finds the whole call queued when it
reaches the start event and the host's launch gaps stay outside the window. After queueing the
end event the host asks whether the GPU has already passed the start event: if it has, the GPU
may have waited for the host inside the window, and the call counts towards `host_gap_share`.
The events are read after one synchronize per batch of calls. On CPU the marks are host
timestamps, as CPU ops return when they are done.

The clock (`clock`)
-------------------
`events` (the default) takes each call's time from the CUDA events around it. They bracket the
call's kernels but also the GPU's handling of the two event records, about 2.5 us on an H100: no
share of a millisecond kernel, but most of a microsecond one. `kernels` reads the GPU's own record
of what ran (CUPTI activity records, through `torch.profiler`): a call's time runs from the end of
the kernel before it (the spin, or a marker kernel `torch.cuda._sleep(0)`), when the GPU was free
to start the call, to the end of its last kernel, copy or memset. That holds the dispatch of its
first kernel (about 1 us) and the GPU's gaps between its kernels, as a back-to-back sequence of
calls would; no event is recorded. A marker kernel after each call closes it in the record. A
call counts towards `host_gap_share` when the GPU sat idle inside it for more than `HOST_WAIT_NS`.
On an H100 80GB HBM3 the span of a copy was 0.980-1.017 of Nsight Compute's `gpu__time_duration`
from 16 MB to 1 GiB in five runs, and 0.908-0.983 at 1 and 4 MB: the copy's own span is steady, but
the GPU's gap between the end of the spin and the copy's start is 1.1-1.4 us in one series and
2.0-2.3 us in another (`results/validation/timing-h100-20261126.md`, docs/timing.md;
`tfla_bench.measure.validation`).

Library autotuners
------------------
A Triton autotuner (in fla and Mamba 2; LightningAttention-2 and the official mLSTM chunkwise
kernels have none) times every config on its first call at a new tuning key with
`triton.testing.do_bench`: 25 ms of warm-up and 100 ms of timed calls per config, the L2 cleared
before each. `autotuning_budget` shortens that for the autotuners that bring no benchmark of their
own (`autotune_ms` of the spec): they still time every config at the case's own shape on an
otherwise idle GPU, over `autotune_ms` ms after `autotune_ms / 4` ms of warm-up, at least one call
each.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from tfla_bench.measure.settings import CLOCKS

# The paper's (and triton.testing's) flush buffer: 256e6 bytes, at least twice any current L2.
MIN_FLUSH_BYTES = 256_000_000
# The spin before each timed call lasts this many times the host's time to queue one call, plus
# SPIN_EXTRA_S; capped, since a call that synchronizes inside cannot be helped by any lead.
SPIN_FACTOR = 1.5
SPIN_EXTRA_S = 20e-6
SPIN_MAX_S = 2e-3
# A batch of timed calls between two reads of the events is at most this share of the budget.
BATCH_BUDGET_SHARE = 0.1
# The kernel of `torch.cuda._sleep`, which delimits the calls in the kernel clock's record.
MARKER_KERNEL = "spin_kernel"
# The stop of a series that `time_calls(stop_early=...)` ended, and the longest a batch of calls then
# runs between two of its checks.
STOPPED_EARLY = "stopped_early"
EARLY_CHECK_S = 0.05
# An idle GPU inside a call for longer than this waited for the host (the kernels clock): the GPU's
# own dispatch of a queued kernel took 1.0-1.5 us on an H100.
HOST_WAIT_NS = 5_000
# A series that its time budget stopped with the median's 95% interval wider than +-this was
# disturbed, not merely noisy (`unsettled`): of 114 such series with a finite interval in the
# committed runs, the three above 10% came from sweeps that compiled beside their measuring (one a
# first series, two the second series of a case timed again under its power cap); the next widest
# was 9.6% (docs/timing.md).
UNSETTLED_CI = 0.1


@dataclass(frozen=True)
class StopRule:
    """When a series of timed calls is long enough (see the module docstring).

    Attributes:
        reps: a fixed number of timed calls, or None for the adaptive rule.
        rel_ci: the adaptive target: the median's 95% confidence interval within +-rel_ci.
        budget_s: measuring time after which the adaptive rule stops anyway.
        min_time_s: measuring time before the interval may stop the adaptive rule.
        min_reps: the fewest timed calls of the adaptive rule.
        max_reps: the most timed calls of the adaptive rule.
    """

    reps: int | None = None
    rel_ci: float = 0.01
    budget_s: float = 1.0
    min_time_s: float = 0.0
    min_reps: int = 5
    max_reps: int = 2000

    def reason(self, times_ms: list[float], elapsed_s: float) -> str | None:
        """Why to stop after `times_ms` and `elapsed_s` of measuring (`fixed`, `ci`, `max`, `budget`),
        or None to go on."""
        count = len(times_ms)
        if self.reps is not None:
            return "fixed" if count >= self.reps else None
        if count < self.min_reps:
            return None
        if elapsed_s >= self.min_time_s and ci_rel(times_ms) <= self.rel_ci:
            return "ci"
        if count >= self.max_reps:
            return "max"
        if elapsed_s >= self.budget_s:
            return "budget"
        return None

    def next_batch(self, count: int, elapsed_s: float) -> int:
        """How many calls to time before the rule is asked again."""
        if self.reps is not None:
            return self.reps - count
        if count < self.min_reps:
            return self.min_reps - count
        per_call_s = elapsed_s / count if count else self.budget_s
        by_budget = int(BATCH_BUDGET_SHARE * self.budget_s / per_call_s) if per_call_s > 0 else count
        return max(1, min(self.max_reps - count, max(count // 4, 1), max(by_budget, 1)))


@dataclass(frozen=True)
class TimingStats:
    """Runtime statistics over `reps` timed calls, in milliseconds.

    Attributes:
        median_ms, p20_ms, p80_ms, min_ms: over the timed calls.
        reps: timed calls.
        ci_rel: half-width of the median's 95% confidence interval over the median (inf below 6 calls).
        stop: why timing stopped: `fixed`, `ci`, `budget` or `max`.
        host_gap_share: share of the calls during which the GPU may have waited for the host
            (None on CPU, where the clock is the host's).
    """

    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    reps: int
    ci_rel: float = math.inf
    stop: str = "fixed"
    host_gap_share: float | None = None


def is_cuda(device: str) -> bool:
    """Whether `device` (`cpu`, `cuda`, `cuda:1`) is a CUDA device."""
    return device.startswith("cuda")


def synchronize(device: str) -> None:
    """Wait for all work queued on `device` (a no-op on CPU)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median_ci(values: list[float]) -> tuple[float, float]:
    """The distribution-free 95% confidence interval of the median: (x(l), x(n+1-l)), 1-based order
    statistics, with l the largest index where P(Binomial(n, 1/2) < l) <= 0.025; (-inf, inf) when
    no such l exists (n < 6)."""
    count = len(values)
    # Exact integer arithmetic: P(B < l) <= 1/40  <=>  40 * sum_{i<l} C(n, i) <= 2^n.
    total, below, index = 2**count, 0, 0
    while index < count and 40 * (below + math.comb(count, index)) <= total:
        below += math.comb(count, index)
        index += 1
    if index == 0:
        return -math.inf, math.inf
    ordered = sorted(values)
    return ordered[index - 1], ordered[count - index]


def ci_rel(values: list[float]) -> float:
    """Half-width of `median_ci` over the median: the larger distance of a bound to the median."""
    low, high = median_ci(values)
    middle = percentile(values, 50)
    if math.isinf(low) or middle <= 0:
        return math.inf
    return max(middle - low, high - middle) / middle


def summarize(times_ms: list[float], stop: str = "fixed", host_gap_share: float | None = None) -> TimingStats:
    """Median, p20, p80, min and the median's confidence interval of per-call times."""
    return TimingStats(
        median_ms=percentile(times_ms, 50),
        p20_ms=percentile(times_ms, 20),
        p80_ms=percentile(times_ms, 80),
        min_ms=min(times_ms),
        reps=len(times_ms),
        ci_rel=ci_rel(times_ms),
        stop=stop,
        host_gap_share=host_gap_share,
    )


def unsettled(stats: TimingStats, limit: float = UNSETTLED_CI) -> bool:
    """Whether a series (its stats, or a row that holds them) ran out of its time budget with the
    median's 95% interval wider than +-`limit`: something else used the device meanwhile, and the
    worker times the case again (`runner.BESIDE_UNSETTLED_CI`: the sweep measures it after its
    precompile)."""
    return stats.stop == "budget" and math.isfinite(stats.ci_rel) and stats.ci_rel > limit


def unsettled_note(first: TimingStats, again: TimingStats) -> str:
    """The row's note for a case timed again because its first series was `unsettled`."""
    note = (
        f"timed again: its first {first.reps} calls ran out of their time budget with the median's"
        f" 95% interval at +-{first.ci_rel:.0%}"
    )
    if unsettled(again):
        note += f"; unsettled again (+-{again.ci_rel:.0%})"
    return note


def time_first_call(fn: Callable[[], Any], device: str) -> float:
    """Wall time in seconds of one call, synchronized on both sides (compile and autotune included)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def warm_up(
    fn: Callable[[], Any],
    device: str,
    *,
    calls: int | None,
    seconds: float,
    before_each: Callable[[], None] | None = None,
) -> tuple[int, float]:
    """Untimed calls: exactly `calls`, or (None) until `seconds` of wall time have passed, at least one.

    Returns:
        The number of calls and the host's median time to queue one call, in seconds (what the
        spin before each timed call has to cover).
    """
    queue_s: list[float] = []
    start = time.perf_counter()
    while True:
        if calls is not None and len(queue_s) >= calls:
            break
        if calls is None and queue_s and time.perf_counter() - start >= seconds:
            break
        if before_each is not None:
            before_each()
        began = time.perf_counter()
        fn()
        queue_s.append(time.perf_counter() - began)
        synchronize(device)
    return len(queue_s), percentile(queue_s, 50) if queue_s else 0.0


def time_calls(
    fn: Callable[[], Any],
    *,
    rule: StopRule,
    device: str,
    before_each: Callable[[], None] | None = None,
    spin: Callable[[], None] | None = None,
    clock: str = "events",
    idle_gap: float = 0.0,
    stop_early: Callable[[], bool] | None = None,
) -> TimingStats:
    """Time calls of `fn` until `rule` says stop, each preceded by an untimed `before_each()`.

    Args:
        fn: the call to time (a kernel launch, forward + backward, or a CUDA graph replay).
        rule: how many calls (`StopRule`).
        device: `cpu` or a CUDA device; picks CUDA events or `time.perf_counter`.
        before_each: work to do before each call outside the timed window.
        spin: (CUDA) queues GPU work that gives the host a lead over the GPU (see `Spin`).
        clock: (CUDA) `events` or `kernels` (the module docstring).
        idle_gap: before each call after the first, leave the device idle for this many times the
            time of the call before it (one call per batch; the gaps count towards the rule's
            measuring time; none after the last call, so what follows sees the GPU as it ended).
        stop_early: asked after each batch of calls; True ends the series there, with the stop
            `STOPPED_EARLY` (the worker asks whether the GPU's power cap set in: the series is then
            timed again, `gpustate.retime`). Batches then last at most `EARLY_CHECK_S` after the
            first, which is one call, so a series of long calls stops one call after the cap.

    Returns:
        `TimingStats` over the timed calls.

    Raises:
        ValueError: an unknown clock, or the kernel clock without CUDA.
    """
    cuda = is_cuda(device)
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "kernels" and not cuda:
        raise ValueError("the kernels clock reads the GPU's activity record: it needs a CUDA device")
    times_ms: list[float] = []
    gaps = 0
    synchronize(device)
    start_s = time.perf_counter()
    record_s = 0.0  # starting and reading the kernel clock's record: not measuring time
    while True:
        elapsed_s = time.perf_counter() - start_s - record_s
        stop = rule.reason(times_ms, elapsed_s)
        if stop is not None:
            break
        if idle_gap > 0 and times_ms:
            time.sleep(idle_gap * times_ms[-1] / 1e3)
        marks: list[tuple[Any, Any]] = []
        began = time.perf_counter()
        record = KernelRecord() if clock == "kernels" else None
        record_s += time.perf_counter() - began
        batch = 1 if idle_gap > 0 else rule.next_batch(len(times_ms), elapsed_s)
        if stop_early is not None:
            batch = min(batch, _checked_batch(times_ms))
        for _ in range(batch):
            if before_each is not None:
                before_each()
            if spin is not None:
                spin()
            elif record is not None:
                record.marker()
            if record is not None:  # the record delimits the call: no event in the stream
                fn()
                record.marker()
                continue
            start = _mark(cuda)
            fn()
            end = _mark(cuda)
            if cuda and start.query():
                gaps += 1
            marks.append((start, end))
        synchronize(device)
        if record is not None:
            began = time.perf_counter()
            calls = record.calls(batch)
            record_s += time.perf_counter() - began
            times_ms += [call_ns / 1e6 for call_ns, _ in calls]
            gaps += sum(waited for _, waited in calls)
        elif cuda:
            times_ms += [start.elapsed_time(end) for start, end in marks]
        else:
            times_ms += [(end - start) * 1e3 for start, end in marks]
        if stop_early is not None and stop_early():
            stop = STOPPED_EARLY
            break
    return summarize(times_ms, stop, gaps / len(times_ms) if cuda else None)


def _checked_batch(times_ms: list[float]) -> int:
    """The most calls in a batch of a series that `stop_early` may end: one first, then as many as
    the calls so far say fit in `EARLY_CHECK_S`."""
    if not times_ms:
        return 1
    per_call_s = percentile(times_ms, 50) / 1e3
    return max(1, int(EARLY_CHECK_S / per_call_s)) if per_call_s > 0 else len(times_ms)


def split_calls(activities: list[tuple[str, int, int]], calls: int) -> list[tuple[int, bool]]:
    """Each call's time in ns from the activity record of a batch of `calls` calls, from the end of
    the marker before it to the end of its last activity, and whether the GPU sat idle for more than
    `HOST_WAIT_NS` inside that window (waiting for the host to queue the call's next kernel).

    Args:
        activities: `(name, start_ns, end_ns)` of every kernel, copy and memset of the batch, the
            marker kernels (`MARKER_KERNEL`) included: one before and one after each call.
        calls: the number of calls.

    Raises:
        RuntimeError: the record does not hold two markers per call, or a call ran nothing.
    """
    ordered = sorted(activities, key=lambda activity: activity[1])
    markers = [index for index, (name, _, _) in enumerate(ordered) if MARKER_KERNEL in name]
    if len(markers) != 2 * calls:
        raise RuntimeError(
            f"the kernels clock found {len(markers)} marker kernels for {calls} calls (2 each): the "
            "activity record lost some, or the timed call itself launches torch.cuda._sleep"
        )
    results = []
    for lead, close in zip(markers[::2], markers[1::2], strict=True):
        inside = ordered[lead + 1 : close]
        if not inside:
            raise RuntimeError("the kernels clock found a call that ran no kernel, copy or memset on the GPU")
        begin = reach = ordered[lead][2]
        waited = False
        for _, start, end in inside:
            waited = waited or start - reach > HOST_WAIT_NS
            reach = max(reach, end)
        results.append((reach - begin, waited))
    return results


class KernelRecord:
    """The GPU's activity record of a batch of calls (`torch.profiler` with CUDA activities, which
    reads CUPTI), from construction until `calls`."""

    def __init__(self) -> None:
        # torch takes seconds to import; only this path needs it.
        from torch.profiler import ProfilerActivity, profile

        self._profile = profile(activities=[ProfilerActivity.CUDA])
        self._profile.start()

    @staticmethod
    def marker() -> None:
        """Queue the marker kernel that delimits the calls."""
        torch.cuda._sleep(0)

    def activities(self) -> list[tuple[str, int, int]]:
        """Stop recording (after the caller's synchronize): `(name, start_ns, end_ns)` of every kernel,
        copy and memset recorded, the markers included."""
        self._profile.stop()
        return [
            (event.name(), event.start_ns(), event.end_ns())
            for event in self._profile.profiler.kineto_results.events()
            if event.device_type() == torch.autograd.DeviceType.CUDA and not event.is_user_annotation()
        ]

    def calls(self, calls: int) -> list[tuple[int, bool]]:
        """Stop recording (after the caller's synchronize): `split_calls` of the record."""
        return split_calls(self.activities(), calls)


def standalone_series(
    fn: Callable[[], Any],
    device: str,
    *,
    rule: StopRule | None = None,
    warmup_calls: int | None = None,
    warmup_s: float = 0.025,
    flush: bool = True,
    clean_flush: bool = False,
    spin: bool = True,
    reset: Callable[[], None] | None = None,
    clock: str = "events",
) -> Callable[..., TimingStats]:
    """The suite's timing of `fn` outside a sweep's worker (the validation, the config search, the
    launch-overhead table): warm-up (`warm_up`) now, and the series to run, `time_calls` with `reset`
    and, on CUDA with `flush`, the L2 flush (`L2Flush`, `clean_flush`) before each call and the spin
    ahead of it. The series takes `time_calls`'s keyword arguments (`idle_gap`); each run of it
    times a new series.

    Args:
        fn: the call to time.
        device: `cpu` or a CUDA device.
        rule: when to stop (default: the adaptive `StopRule()`).
        warmup_calls, warmup_s: `warm_up`'s count, or its seconds when the count is None.
        flush, clean_flush: flush the L2 before each call (CUDA), reading the buffer with `clean_flush`.
        spin: queue the spin ahead of each call (CUDA).
        reset: state reset before each call (gradients to None), warm-up included.
        clock: (CUDA) `events` or `kernels` (the module docstring).
    """
    cuda = is_cuda(device)
    _, queue_s = warm_up(fn, device, calls=warmup_calls, seconds=warmup_s, before_each=reset)
    l2 = L2Flush(device, clean=clean_flush) if flush and cuda else None

    def before_each() -> None:
        if reset is not None:
            reset()
        if l2 is not None:
            l2()

    return functools.partial(
        time_calls,
        fn,
        rule=rule or StopRule(),
        device=device,
        before_each=before_each,
        spin=Spin(device, queue_s) if spin and cuda else None,
        clock=clock,
    )


def time_standalone(
    fn: Callable[[], Any], device: str, *, idle_gap: float = 0.0, **options: Any
) -> TimingStats:
    """One series of `standalone_series(fn, device, **options)`, with `time_calls`'s `idle_gap`."""
    return standalone_series(fn, device, **options)(idle_gap=idle_gap)


@contextmanager
def autotuning_budget(rep_ms: float | None) -> Iterator[None]:
    """Within the block, every Triton autotuner without its own benchmark times each config for
    `rep_ms` ms after `rep_ms / 4` ms of warm-up (Triton's own: 100 and 25). None changes nothing;
    so does a machine without Triton. Restores Triton on exit.
    """
    try:
        # Triton loads only where our kernels or an autotuner are touched.
        from triton import testing
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        yield
        return
    if rep_ms is None:
        yield
        return
    original = Autotuner.__dict__["do_bench"]
    bench = functools.partial(testing.do_bench, warmup=rep_ms / 4, rep=rep_ms)
    # A property is a data descriptor, so it also wins over a benchmark cached on an instance.
    Autotuner.do_bench = property(lambda self: self._do_bench or bench)
    try:
        yield
    finally:
        Autotuner.do_bench = original


@contextmanager
def first_config_only() -> Iterator[None]:
    """Within the block, every Triton autotuner runs the first of its configs that survives its own
    pruning and compiles for the call, and times none: a correctness check needs one right output,
    not the fastest config, and a library's autotuner can spend a minute compiling all of them.
    Nothing is kept in the autotuner's cache, in memory or on disk. Restores Triton on exit."""
    try:
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.errors import OutOfResources
    except ImportError:
        yield
        return
    original = Autotuner.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        configs = self.configs
        if len(configs) < 2:
            return original(self, *args, **kwargs)
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        candidates = self.prune_configs(kwargs)
        try:
            for index, config in enumerate(candidates):
                self.configs = [config]
                try:
                    return original(self, *args, **kwargs)
                except OutOfResources:
                    if index == len(candidates) - 1:
                        raise
        finally:
            self.configs = configs

    Autotuner.run = run
    try:
        yield
    finally:
        Autotuner.run = original


def _mark(cuda: bool) -> Any:
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


class Spin:
    """A GPU busy-wait (`torch.cuda._sleep`) long enough for the host to queue one call ahead of the GPU.

    Args:
        device: a CUDA device (current).
        queue_s: the host's time to queue one call (from `warm_up`).
        seconds: the spin's length instead (the energy's calibration, `gpu_seconds`).
    """

    def __init__(self, device: str, queue_s: float, seconds: float | None = None) -> None:
        synchronize(device)
        probe_cycles = 1_000_000
        start = _mark(True)
        torch.cuda._sleep(probe_cycles)
        end = _mark(True)
        synchronize(device)
        cycles_per_s = probe_cycles / max(start.elapsed_time(end) / 1e3, 1e-9)
        self.seconds = min(SPIN_FACTOR * queue_s + SPIN_EXTRA_S, SPIN_MAX_S) if seconds is None else seconds
        self.cycles = int(self.seconds * cycles_per_s)

    def __call__(self) -> None:
        torch.cuda._sleep(self.cycles)


def gpu_seconds(fn: Callable[[], Any], calls: int, device: str) -> float:
    """The seconds on the device of `calls` back-to-back calls of `fn`: between two CUDA events
    (synchronized at the end), or the host's clock on CPU."""
    cuda = is_cuda(device)
    start = _mark(cuda)
    for _ in range(calls):
        fn()
    end = _mark(cuda)
    synchronize(device)
    return start.elapsed_time(end) / 1e3 if cuda else end - start


class L2Flush:
    """Zeroes (with `clean`: reads) a buffer of max(2 x L2 size, 256e6 bytes) so every timed call
    starts with a cold L2.

    Zeroing leaves the L2 full of the buffer's dirty lines, which the timed call's misses write back
    to DRAM. With `clean` the buffer is read instead (summed), so the lines left behind are clean and
    the previous call's dirty lines are written back during the flush; `tfla_bench.measure.validation` times
    both against Nsight Compute, whose cache control leaves a clean, empty cache.

    Args:
        device: a CUDA device.
        clean: read the buffer rather than write it.
    """

    def __init__(self, device: str, clean: bool = False) -> None:
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        self.size_bytes = max(2 * l2_bytes, MIN_FLUSH_BYTES)
        self.buffer = torch.empty(self.size_bytes, dtype=torch.int8, device=device)
        self.clean = clean
        self._words = self.buffer[: self.size_bytes // 4 * 4].view(torch.int32)
        self._sum = torch.zeros((), dtype=torch.int64, device=device)

    def __call__(self) -> None:
        if self.clean:
            torch.sum(self._words, dim=0, dtype=torch.int64, out=self._sum)
        else:
            self.buffer.zero_()


def capture_cuda_graph(
    fn: Callable[[], Any], before_each: Callable[[], None], warmup_calls: int = 3
) -> Callable[[], None]:
    """Capture one call of `fn` in a CUDA graph and return its replay.

    The calls before capture run on a side stream, as capture requires; `before_each` (resetting
    gradients to None) runs before each of them and before the capture, so a captured backward
    writes fresh gradient buffers on every replay instead of accumulating.

    Args:
        fn: the call to capture (forward, or forward + backward).
        before_each: state reset before each call.
        warmup_calls: eager calls on the side stream before capture.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup_calls):
            before_each()
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    before_each()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
