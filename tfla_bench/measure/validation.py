"""The suite's clock checked against independent clocks, on single-kernel ops.

For a device copy (an elementwise kernel that reads and writes N bytes) of 1 MB to 1 GB and a
bf16 GEMM, `validate` sets the suite's median (`tfla_bench.measure.timing`: cold L2, spin, adaptive reps),
with each of its two clocks (CUDA events, the call's span in the GPU's activity record), beside:

- Nsight Compute's `gpu__time_duration.sum` for the same kernels (`tfla_bench.measure.ncu`), profiled in
  a child process with `--clock-control none` (the GPU's own clocks, as the suite runs) and
  `--cache-control all` (caches flushed before each kernel, as the suite's L2 flush); the child
  brackets its calls with profiler start and stop, so only they are profiled;
- for ops far above the L2 size, one CUDA graph of `GRAPH_CALLS` back-to-back calls, replayed and
  timed, divided by `GRAPH_CALLS` (no launch gaps, and the L2 cannot hold the data anyway), after
  `SUSTAIN_S` of replays.

Each op is timed as the sweep's worker times a case (`suite_time`): from a settled GPU, and again
with an idle gap after each call when its power cap set in during the series (`gpustate.retime`,
the sweep's default policy), which is how ncu's lone replays run. The graph's calls run back to
back: a power-hungry op (the 8192^3 GEMM) runs them at its power cap, and the row's note gives the
clock NVML read after them.

Copies up to `CLEAN_FLUSH_MAX_MB` are timed once more with a flush that reads its buffer instead of
zeroing it (`timing.L2Flush(clean=True)`), beside the same ncu time. Every op is timed with the
kernels clock after that reading flush, the match of ncu's clean, empty cache. Two more rows show
the method's limits: an in-L2 copy timed with and without the flush (the flush must make it
slower), and a call made of many tiny kernels launched from Python, timed with and without the spin
that lets the host run ahead (`host_gap_share` says which calls the GPU waited in). A second table
splits the kernels clock's calls of small copies in two (`dispatch_split`): the GPU's gap between the
end of the spin and the copy's start, and the copy's own span. `experiments/validate_timing.py`
prints the markdown tables and writes them to a file.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tfla_bench.measure import gpustate, ncu
from tfla_bench.measure.settings import MeasureSettings

COPY_SIZES_MB = (1, 4, 16, 64, 256, 1024)
GEMM_SIZES = (4096, 8192)
# Copies up to this size are timed a second time with the flush that leaves clean lines: these are
# the sizes where the zeroing flush's dirty lines are a visible share of the copy's time.
CLEAN_FLUSH_MAX_MB = 256
# The op's data must exceed this many L2 sizes for the back-to-back graph to be a cold-cache clock.
GRAPH_MIN_L2 = 2
GRAPH_CALLS = 100
NCU_WARMUP = 3
NCU_CALLS = 10
NCU_OPTIONS = (*ncu.GPU_CLOCKS, "--cache-control", "all")
TOLERANCE = 0.02
# The sweep's default power-cap policy, which `suite_time` follows.
POWER_CAP = MeasureSettings.power_cap
# Seconds of back-to-back replays before the graph's timed ones.
SUSTAIN_S = 1.0
DEFAULT_OUT = Path("timing_validation").with_suffix(".md")
# The Python-heavy call: this many tiny kernels, each launched by the host.
TINY_KERNELS = 200
# Copies whose kernels-clock time is split into the GPU's gap after the spin and the copy's own span
# (`dispatch_split`): the sizes where the gap is a visible share of the call.
SPLIT_SIZES_MB = (1, 4, 16)
SPLIT_BATCHES, SPLIT_BATCH = 10, 40
_UNITS_MS = {
    "nsecond": 1e-6,
    "ns": 1e-6,
    "usecond": 1e-3,
    "us": 1e-3,
    "msecond": 1.0,
    "ms": 1.0,
    "second": 1e3,
}


@dataclass
class Check:
    """One row of the validation table (times in ms; None where a clock does not apply)."""

    op: str
    size: str
    method: str
    suite_ms: float
    ci_rel: float
    host_gap_share: float | None
    ncu_ms: float | None = None
    graph_ms: float | None = None
    note: str = ""

    def ratio(self, other: float | None) -> float | None:
        return self.suite_ms / other if other else None


@dataclass
class Split:
    """One op's kernels-clock calls in two parts (ns each): the GPU's gap from the end of the spin to
    the op's kernel starting, and the kernel's own span; with ncu's time of the op (ms) if known."""

    size: str
    gaps_ns: list[int]
    spans_ns: list[int]
    ncu_ms: float | None = None


def per_call(kernel_ms: list[float], calls: int) -> list[float]:
    """Kernel times grouped into `calls` consecutive calls of equally many kernels, summed per call."""
    if calls <= 0 or not kernel_ms or len(kernel_ms) % calls:
        raise ValueError(f"{len(kernel_ms)} kernel times do not split into {calls} calls")
    size = len(kernel_ms) // calls
    return [sum(kernel_ms[i : i + size]) for i in range(0, len(kernel_ms), size)]


def markdown(checks: list[Check], gpu: str) -> str:
    """The validation table, in markdown."""

    def ms(value: float | None) -> str:
        return "" if value is None else f"{value:.4g}"

    def ratio(value: float | None) -> str:
        if value is None:
            return ""
        mark = "" if abs(value - 1) <= TOLERANCE else " ✗"
        return f"{value:.3f}{mark}"

    lines = [
        f"Timing validation on {gpu} (suite: median, cold L2, adaptive reps; ✗: more than "
        f"{TOLERANCE:.0%} apart)",
        "",
        "| op | size | clock, flush | suite ms | ±CI | host gaps | ncu ms | suite/ncu | graph/100 ms | "
        "suite/graph | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for check in checks:
        gaps = "" if check.host_gap_share is None else f"{check.host_gap_share:.0%}"
        lines.append(
            f"| {check.op} | {check.size} | {check.method} | {ms(check.suite_ms)} | {check.ci_rel:.2%} | "
            f"{gaps} | "
            f"{ms(check.ncu_ms)} | {ratio(check.ratio(check.ncu_ms))} | {ms(check.graph_ms)} | "
            f"{ratio(check.ratio(check.graph_ms))} | {check.note} |"
        )
    return "\n".join(lines) + "\n"


def split_markdown(splits: list[Split]) -> str:
    """The table of `dispatch_split`s, in us at the 20th / 50th / 80th percentile."""
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure.timing import percentile

    def cell(values: list[float]) -> str:
        return " / ".join(f"{percentile(values, q) / 1e3:.2f}" for q in (20, 50, 80))

    calls = SPLIT_BATCHES * SPLIT_BATCH
    lines = [
        f"The kernels clock of a small copy in parts ({calls} calls after the reading flush; us at the "
        "20th / 50th / 80th percentile)",
        "",
        "| copy | gap after the spin | copy's own span | sum: the kernels clock | ncu |",
        "|---|---|---|---|---:|",
    ]
    for split in splits:
        sums = [gap + span for gap, span in zip(split.gaps_ns, split.spans_ns, strict=True)]
        ncu_us = "" if split.ncu_ms is None else f"{split.ncu_ms * 1e3:.2f}"
        cells = (cell(split.gaps_ns), cell(split.spans_ns), cell(sums))
        lines.append(f"| {split.size} | {' | '.join(cells)} | {ncu_us} |")
    return "\n".join(lines) + "\n"


def make_op(op: str, size: int, device: str) -> tuple[Callable[[], None], int]:
    """The op's call and the bytes its data takes: `copy` of `size` bytes, `gemm` of size^3 in bf16,
    `tiny` (TINY_KERNELS one-element adds launched from Python)."""
    # torch takes seconds to import; only this path needs it.
    import torch

    if op == "copy":
        source = torch.randn(size // 4, device=device)
        target = torch.empty_like(source)
        return (lambda: torch.neg(source, out=target)), 2 * size
    if op == "gemm":
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        out = torch.empty_like(a)
        return (lambda: torch.mm(a, b, out=out)), 3 * size * size * 2
    if op == "tiny":
        x = torch.zeros(1, device=device)

        def many() -> None:
            for _ in range(TINY_KERNELS):
                x.add_(1)

        return many, 4
    raise ValueError(f"unknown op {op!r}")


def suite_time(
    fn: Callable[[], None],
    device: str,
    *,
    monitor: gpustate.Monitor | None = None,
    flush: bool = True,
    spin: bool = True,
    clean_flush: bool = False,
    clock: str = "events",
) -> gpustate.Retimed:
    """The suite's measurement of `fn`, as the worker does it: a first call, the GPU settled
    (`monitor`), warm-up and a series (`timing.standalone_series`), and the series again by the
    sweep's default power-cap policy if the cap set in (`gpustate.retime`); `clean_flush` reads the
    flush buffer instead of zeroing it."""
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import timing

    timing.time_first_call(fn, device)
    if monitor is not None:
        monitor.settle()
    before = monitor.read() if monitor is not None else None
    series = timing.standalone_series(
        fn, device, flush=flush, clean_flush=clean_flush, spin=spin, clock=clock
    )
    return gpustate.retime(series, series(), monitor, before, POWER_CAP)


def dispatch_split(fn: Callable[[], None], device: str) -> tuple[list[int], list[int]]:
    """Per call of `fn` (one kernel), timed as the kernels clock times it after the reading flush: the
    GPU's gap from the end of the spin to the kernel's start, and the kernel's own span, in ns."""
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import timing

    _, queue_s = timing.warm_up(fn, device, calls=None, seconds=0.025)
    flush, spin = timing.L2Flush(device, clean=True), timing.Spin(device, queue_s)
    gaps, spans = [], []
    for _ in range(SPLIT_BATCHES):
        record = timing.KernelRecord()
        for _ in range(SPLIT_BATCH):
            flush()
            spin()
            fn()
        timing.synchronize(device)
        ordered = sorted(record.activities(), key=lambda activity: activity[1])
        for before, (name, start, end) in zip(ordered, ordered[1:], strict=False):
            if timing.MARKER_KERNEL in before[0] and timing.MARKER_KERNEL not in name:
                gaps.append(start - before[2])
                spans.append(end - start)
    return gaps, spans


def method(clock: str, flush: bool = True, clean_flush: bool = False) -> str:
    """The table's `clock, flush` cell."""
    return f"{clock}, " + ("no flush" if not flush else "reading" if clean_flush else "zeroing")


def graph_time(fn: Callable[[], None], replays: int = 10) -> float:
    """Median over `replays` of one CUDA graph of GRAPH_CALLS back-to-back calls, per call, in ms,
    after `SUSTAIN_S` of replays (a power-hungry op is under its power cap throughout)."""

    # torch takes seconds to import; only this path needs it.
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    began = time.perf_counter()
    while True:
        graph.replay()
        torch.cuda.synchronize()
        if time.perf_counter() - began >= SUSTAIN_S:
            break
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / GRAPH_CALLS)
    return statistics.median(times)


def ncu_time(op: str, size: int, executable: Path, log_file: Path) -> float:
    """Median per-call `gpu__time_duration` of the op under Nsight Compute, in ms (a child process)."""
    program = [sys.executable, "-m", "tfla_bench.measure.validation", "child", op, str(size)]
    kernels = ncu.profile(
        executable, program, log_file, timeout_s=600, metrics=[ncu.DURATION], options=NCU_OPTIONS
    )
    durations = [kernel.duration_ns / 1e6 for kernel in kernels if kernel.duration_ns is not None]
    return statistics.median(per_call(durations, NCU_CALLS))


def child(op: str, size: int) -> None:
    """The process ncu profiles: warm-up calls, then NCU_CALLS calls between profiler start and stop."""
    # torch takes seconds to import; only this path needs it.
    import torch

    fn, _ = make_op(op, size, "cuda")
    for _ in range(NCU_WARMUP):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(NCU_CALLS):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def validate(device: str = "cuda", ncu_path: Path | None = None) -> list[Check]:
    """Every row of the validation table (the ncu column when `ncu_path` or `ncu` on PATH is found)."""

    # torch takes seconds to import; only this path needs it.
    import torch

    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    monitor = gpustate.device_monitor(device)
    executable = ncu.locate(ncu_path)
    log_dir = Path(tempfile.mkdtemp(prefix="tfla-validate-"))
    checks = []
    ops = [("copy", mb << 20, f"{mb} MB") for mb in COPY_SIZES_MB]
    ops += [("gemm", n, f"{n}^3 bf16") for n in GEMM_SIZES]
    for op, size, label in ops:
        fn, data = make_op(op, size, device)
        ncu_ms, ncu_note = None, ""
        if executable is not None:
            try:
                ncu_ms = ncu_time(op, size, executable, log_dir / f"{op}-{size}.csv")
            except ncu.NcuError as exc:
                ncu_note = f"ncu {exc.status}: {exc.reason}"
        graph_ms, graph_note = None, ""
        if data >= GRAPH_MIN_L2 * l2:
            graph_ms = graph_time(fn)
            after = monitor.read() if monitor is not None else None
            if after is not None and after.throttled:
                graph_note = f"graph under {after.throttle} (SM {after.sm_mhz} MHz)"
        settings = [("events", False)]
        if op == "copy" and size <= CLEAN_FLUSH_MAX_MB << 20:
            settings.append(("events", True))
        settings.append(("kernels", True))
        for clock, clean in settings:
            timed = suite_time(fn, device, monitor=monitor, clean_flush=clean, clock=clock)
            stats = timed.stats
            retimed = "power cap: timed again, idle gaps" if timed.note else ""
            note = "; ".join(x for x in (ncu_note, retimed, graph_note) if x)
            checks.append(
                Check(
                    op, label, method(clock, clean_flush=clean), stats.median_ms, stats.ci_rel,
                    stats.host_gap_share, ncu_ms, graph_ms, note,
                )
            )  # fmt: skip
    in_l2 = 4 << 20
    fn, _ = make_op("copy", in_l2, device)
    for flush in (True, False):
        stats = suite_time(fn, device, monitor=monitor, flush=flush, clock="kernels").stats
        note = "L2 flushed before each call" if flush else "no flush: data stays in L2"
        checks.append(
            Check(
                "copy", "4 MB", method("kernels", flush), stats.median_ms, stats.ci_rel, stats.host_gap_share,
                note=note,
            )
        )  # fmt: skip
    fn, _ = make_op("tiny", 0, device)
    graph = graph_time(fn)
    for clock, spin in (("events", True), ("events", False), ("kernels", True)):
        stats = suite_time(fn, device, monitor=monitor, flush=False, spin=spin, clock=clock).stats
        note = f"{TINY_KERNELS} kernels from Python; " + ("spin ahead" if spin else "no spin")
        checks.append(
            Check(
                "tiny", "4 B", method(clock, flush=False), stats.median_ms, stats.ci_rel,
                stats.host_gap_share, None, graph, note,
            )
        )  # fmt: skip
    return checks


def main(argv: list[str] | None = None) -> int:
    """`validate_timing.py [OUT]`: print the markdown table and write it to OUT (default
    `DEFAULT_OUT`);
    `child OP SIZE`: the process Nsight Compute profiles."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["child"]:
        child(args[1], int(args[2]))
        return 0
    # torch takes seconds to import; only this path needs it.
    import torch

    if not torch.cuda.is_available():
        print("error: the timing validation needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args[0]) if args else DEFAULT_OUT
    checks = validate()
    ncu_ms = {check.size: check.ncu_ms for check in checks if check.op == "copy" and check.ncu_ms}
    splits = []
    for mb in SPLIT_SIZES_MB:
        fn, _ = make_op("copy", mb << 20, "cuda")
        splits.append(Split(f"{mb} MB", *dispatch_split(fn, "cuda"), ncu_ms.get(f"{mb} MB")))
    table = markdown(checks, torch.cuda.get_device_name()) + "\n" + split_markdown(splits)
    print(table)
    out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
