"""Timing one callable: one loop for GPU and CPU, with CUDA events or `time.perf_counter` as the clock.

`time_calls` runs `before_each` (L2 flush, resetting gradients) outside the timed window, then
marks the clock, calls the function and marks again. On CUDA the marks are events recorded on the
current stream and read after one synchronize at the end, so host overhead between calls does not
serialize the GPU; on CPU the marks are host timestamps, as CPU ops return when they are done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# The paper's (and triton.testing's) flush buffer: 256e6 bytes, at least twice any current L2.
MIN_FLUSH_BYTES = 256_000_000


@dataclass(frozen=True)
class TimingStats:
    """Runtime statistics over `reps` timed calls, in milliseconds."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    reps: int


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


def summarize(times_ms: list[float]) -> TimingStats:
    """Median, p20, p80 and min of per-call times."""
    return TimingStats(
        median_ms=percentile(times_ms, 50),
        p20_ms=percentile(times_ms, 20),
        p80_ms=percentile(times_ms, 80),
        min_ms=min(times_ms),
        reps=len(times_ms),
    )


def time_first_call(fn: Callable[[], Any], device: str) -> float:
    """Wall time in seconds of one call, synchronized on both sides (compile and autotune included)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def time_calls(
    fn: Callable[[], Any],
    *,
    reps: int,
    device: str,
    before_each: Callable[[], None] | None = None,
) -> TimingStats:
    """Time `reps` calls of `fn`, each preceded by an untimed `before_each()`.

    Args:
        fn: the call to time (a kernel launch, forward + backward, or a CUDA graph replay).
        reps: number of timed calls, >= 1.
        device: `cpu` or a CUDA device; picks CUDA events or `time.perf_counter`.
        before_each: work to do before each call outside the timed window.

    Returns:
        `TimingStats` over the `reps` calls.
    """
    cuda = is_cuda(device)
    marks: list[tuple[Any, Any]] = []
    synchronize(device)
    for _ in range(reps):
        if before_each is not None:
            before_each()
        start = _mark(cuda)
        fn()
        end = _mark(cuda)
        marks.append((start, end))
    synchronize(device)
    if cuda:
        times_ms = [start.elapsed_time(end) for start, end in marks]
    else:
        times_ms = [(end - start) * 1e3 for start, end in marks]
    return summarize(times_ms)


def _mark(cuda: bool) -> Any:
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


class L2Flush:
    """Zeroes a buffer of max(2 x L2 size, 256e6 bytes) so every timed call starts with a cold L2.

    Args:
        device: a CUDA device.
    """

    def __init__(self, device: str) -> None:
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        self.size_bytes = max(2 * l2_bytes, MIN_FLUSH_BYTES)
        self.buffer = torch.empty(self.size_bytes, dtype=torch.int8, device=device)

    def __call__(self) -> None:
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
