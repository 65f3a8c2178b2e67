"""The suite's clock checked against independent clocks, on single-kernel ops.

For a device copy (an elementwise kernel that reads and writes N bytes) of 1 MB to 1 GB and a
bf16 GEMM, `validate` sets the suite's median (`tfla_bench.timing`: cold L2, spin, CUDA events,
adaptive reps) beside:

- Nsight Compute's `gpu__time_duration.sum` for the same kernels, profiled in a child process
  with `--clock-control none` (the GPU's own clocks, as the suite runs) and `--cache-control all`
  (caches flushed before each kernel, as the suite's L2 flush); the child marks its timed calls
  with an NVTX range, so only they are profiled;
- for ops far above the L2 size, one CUDA graph of `GRAPH_CALLS` back-to-back calls, replayed and
  timed, divided by `GRAPH_CALLS` (no launch gaps, and the L2 cannot hold the data anyway).

Two more rows show the method's limits: an in-L2 copy timed with and without the flush (the
flush must make it slower), and a call made of many tiny kernels launched from Python, timed
with and without the spin that lets the host run ahead (`host_gap_share` says which calls the
GPU waited in). `experiments/validate_timing.py` prints the markdown table and writes it to a file.
"""

from __future__ import annotations

import csv
import io
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

COPY_SIZES_MB = (1, 4, 16, 64, 256, 1024)
GEMM_SIZES = (4096, 8192)
# The op's data must exceed this many L2 sizes for the back-to-back graph to be a cold-cache clock.
GRAPH_MIN_L2 = 2
GRAPH_CALLS = 100
NCU_WARMUP = 3
NCU_CALLS = 10
NVTX_RANGE = "timed"
TOLERANCE = 0.02
DEFAULT_OUT = Path("timing_validation").with_suffix(".md")
# The Python-heavy call: this many tiny kernels, each launched by the host.
TINY_KERNELS = 200
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
    suite_ms: float
    ci_rel: float
    host_gap_share: float | None
    ncu_ms: float | None = None
    graph_ms: float | None = None
    note: str = ""

    def ratio(self, other: float | None) -> float | None:
        return self.suite_ms / other if other else None


def parse_ncu_csv(text: str, metric: str = "gpu__time_duration.sum") -> list[float]:
    """The metric's values in ms, one per profiled kernel in launch order, from `ncu --csv` output.

    Reads both layouts ncu writes: the details page (one row per kernel and metric, with `Metric
    Name`, `Metric Unit` and `Metric Value` columns) and `--page raw` (one column per metric, a
    units row under the header). Lines before the header (`==PROF==` messages) are skipped;
    thousands separators are dropped.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no ncu CSV header (a line starting with "ID") in the output')
    table = [line for line in lines[start:] if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(table))))
    header, body = rows[0], [row for row in rows[1:] if row]
    if "Metric Name" in header:
        name, unit, value = (header.index(key) for key in ("Metric Name", "Metric Unit", "Metric Value"))
        return [_ms(row[value], row[unit]) for row in body if row[name] == metric]
    if metric not in header:
        raise ValueError(f"ncu CSV has no column {metric}")
    column = header.index(metric)
    units, kernels = body[0], body[1:]
    return [_ms(row[column], units[column]) for row in kernels]


def _ms(value: str, unit: str) -> float:
    if unit not in _UNITS_MS:
        raise ValueError(f"unknown ncu time unit {unit!r}")
    return float(value.replace(",", "")) * _UNITS_MS[unit]


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
        "| op | size | suite ms | ±CI | host gaps | ncu ms | suite/ncu | graph/100 ms | suite/graph | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for check in checks:
        gaps = "" if check.host_gap_share is None else f"{check.host_gap_share:.0%}"
        lines.append(
            f"| {check.op} | {check.size} | {ms(check.suite_ms)} | {check.ci_rel:.2%} | {gaps} | "
            f"{ms(check.ncu_ms)} | {ratio(check.ratio(check.ncu_ms))} | {ms(check.graph_ms)} | "
            f"{ratio(check.ratio(check.graph_ms))} | {check.note} |"
        )
    return "\n".join(lines) + "\n"


def make_op(op: str, size: int, device: str) -> tuple[Callable[[], None], int]:
    """The op's call and the bytes its data takes: `copy` of `size` bytes, `gemm` of size^3 in bf16,
    `tiny` (TINY_KERNELS one-element adds launched from Python)."""
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


def suite_time(fn: Callable[[], None], device: str, *, flush: bool = True, spin: bool = True):
    """The suite's measurement of `fn`, as the worker does it (`TimingStats`)."""
    from tfla_bench import timing

    timing.time_first_call(fn, device)
    _, queue_s = timing.warm_up(fn, device, calls=None, seconds=0.025)
    l2 = timing.L2Flush(device) if flush else None
    return timing.time_calls(
        fn,
        rule=timing.StopRule(),
        device=device,
        before_each=l2,
        spin=timing.Spin(device, queue_s) if spin else None,
    )


def graph_time(fn: Callable[[], None], replays: int = 10) -> float:
    """Median over `replays` of one CUDA graph of GRAPH_CALLS back-to-back calls, per call, in ms."""
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
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / GRAPH_CALLS)
    return statistics.median(times)


def ncu_time(op: str, size: int, ncu: str = "ncu") -> float:
    """Median per-call `gpu__time_duration` of the op under Nsight Compute, in ms (a child process)."""
    command = [
        ncu,
        "--clock-control", "none",
        "--cache-control", "all",
        "--metrics", "gpu__time_duration.sum",
        "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
        "--csv",
        sys.executable, "-m", "tfla_bench.validation", "child", op, str(size),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"ncu exited with {done.returncode}: {' | '.join(tail)}")
    return statistics.median(per_call(parse_ncu_csv(done.stdout), NCU_CALLS))


def child(op: str, size: int) -> None:
    """The process ncu profiles: warm-up calls, then NCU_CALLS calls inside the NVTX range."""
    import torch

    fn, _ = make_op(op, size, "cuda")
    for _ in range(NCU_WARMUP):
        fn()
    torch.cuda.synchronize()
    for _ in range(NCU_CALLS):
        torch.cuda.nvtx.range_push(NVTX_RANGE)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def validate(device: str = "cuda", ncu: str | None = "ncu") -> list[Check]:
    """Every row of the validation table (ncu rows only when `ncu` is found on PATH)."""
    import torch

    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    ncu_path = shutil.which(ncu) if ncu else None
    checks = []
    ops = [("copy", mb << 20, f"{mb} MB") for mb in COPY_SIZES_MB]
    ops += [("gemm", n, f"{n}^3 bf16") for n in GEMM_SIZES]
    for op, size, label in ops:
        fn, data = make_op(op, size, device)
        stats = suite_time(fn, device)
        check = Check(op, label, stats.median_ms, stats.ci_rel, stats.host_gap_share)
        if data >= GRAPH_MIN_L2 * l2:
            check.graph_ms = graph_time(fn)
        if ncu_path:
            check.ncu_ms = ncu_time(op, size, ncu_path)
        checks.append(check)
    in_l2 = 4 << 20
    fn, _ = make_op("copy", in_l2, device)
    for flush in (True, False):
        stats = suite_time(fn, device, flush=flush)
        note = "L2 flushed before each call" if flush else "no flush: data stays in L2"
        checks.append(Check("copy", "4 MB", stats.median_ms, stats.ci_rel, stats.host_gap_share, note=note))
    fn, _ = make_op("tiny", 0, device)
    graph = graph_time(fn)
    for spin in (True, False):
        stats = suite_time(fn, device, flush=False, spin=spin)
        note = f"{TINY_KERNELS} kernels from Python; " + ("spin ahead" if spin else "no spin")
        checks.append(
            Check(
                "tiny", "4 B", stats.median_ms, stats.ci_rel, stats.host_gap_share, graph_ms=graph, note=note
            )
        )
    return checks


def main(argv: list[str] | None = None) -> int:
    """`validate_timing.py [OUT]`: print the markdown table and write it to OUT (default
    `DEFAULT_OUT`);
    `child OP SIZE`: the process Nsight Compute profiles."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["child"]:
        child(args[1], int(args[2]))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("error: the timing validation needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args[0]) if args else DEFAULT_OUT
    table = markdown(validate(), torch.cuda.get_device_name())
    print(table)
    out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
