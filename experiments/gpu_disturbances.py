"""What moves a case's time besides its kernel: work of other processes on the same GPU, and the
power cap.

python experiments/gpu_disturbances.py OUT   (the markdown tables; the H100's are in results/validation/)

Other processes. One process times a case the way the sweep's worker does (L2 flushed, spin ahead,
gradients reset before each call; `timing.time_standalone`) while other processes on the GPU:
- hold a CUDA context and 10 GB each, and do nothing else (`idle`);
- allocate and free 1 GB every 5 ms (`alloc churn`);
- launch one tiny kernel every millisecond (`tiny kernels`);
- exit, giving back 30 GB each (`exiting`);
- are the sweep's spare workers starting (device initialization and a library import,
  `Worker.start_spare`), or its last worker retiring (`Worker.switch`).
Each row is the median of the timed calls against the median alone, and their 80th percentile against it.

The power cap. A kernel that draws the GPU's full power meets its cap within tens of milliseconds
and runs on at a lowered SM clock, which depends on what ran before. The sweep's worker times such
a case again after its first series (`gpustate.retime`); this runs the worker's steps (settle,
first series, the second series by `power_cap`) with the sweep's stop rule, from a cool GPU (after
2 s idle) and a hot one (after 6 s of bf16 GEMMs), twice each:
- `again`: the second series at once, back to back;
- `again +1.5 s`: 1.5 s of untimed calls under the cap before it;
- `gaps` (the sweep's default): from a settled GPU, an idle gap after each call as long as the call.
The spread is the largest median of the four starts against the smallest.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.measure import gpustate, timing
from tfla_bench.measure.worker import Worker, clear_grads, grad_leaves, make_step

CONTENDED = [
    Case("lightning2", "fwbw", "bfloat16", 4, 16384, 32, 128, 128, None),
    Case("tfla_sig", "fw", "bfloat16", 8, 8192, 16, 128, 256, 128),
]
CAPPED = [
    Case("sdpa_cudnn", "fw", "bfloat16", 64, 1024, 32, 128, 128, None, {"causal": False}),
    Case("sdpa_cudnn", "fw", "bfloat16", 8, 8192, 32, 128, 128, None, {"causal": False}),
    Case("sdpa_cudnn", "fwbw", "bfloat16", 8, 8192, 32, 128, 128, None, {"causal": False}),
]
# Adapters whose spare workers start while a case is timed: a library each, and ours.
SPARES = ("gla", "mamba2", "mlstm_kernels_sig", "tfla_exp")
RULE = timing.StopRule(rel_ci=0.003, budget_s=1.0, min_reps=8, min_time_s=0.2)
SWEEP_RULE = timing.StopRule(rel_ci=0.01, budget_s=1.0, min_reps=5, min_time_s=0.2)
GiB = 2**30


def other_process(mode: str, gigabytes: float, ready, stop) -> None:
    """The work of one other process on the GPU until `stop` is set (see the module docstring)."""
    held = torch.empty(int(gigabytes * GiB), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    ready.set()
    if mode == "alloc churn":
        while not stop.is_set():
            block = torch.empty(GiB, dtype=torch.uint8, device="cuda")
            del block
            torch.cuda.empty_cache()
            time.sleep(0.005)
    elif mode == "tiny kernels":
        counter = torch.zeros(1024, device="cuda")
        while not stop.is_set():
            counter.add_(1)
            torch.cuda.synchronize()
            time.sleep(0.001)
    else:
        stop.wait()
    del held


class Timed:
    """One case's inputs and call, timed as the sweep's worker times it."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.adapter = registry.get(case.kernel)
        torch.manual_seed(0)
        self.inputs = self.adapter.make_inputs(case, "cuda")
        self.leaves = grad_leaves(self.inputs)
        self.step = make_step(self.adapter, self.inputs, case.mode, "sum")

    def reset(self) -> None:
        clear_grads(self.leaves)

    def series(self, rule: timing.StopRule = RULE) -> timing.TimingStats:
        return self.series_of(rule)()

    def series_of(self, rule: timing.StopRule) -> Callable[..., timing.TimingStats]:
        """After two warm-up calls, the series as the sweep's worker runs it (`time_calls`'s options)."""
        return timing.standalone_series(self.step, "cuda", rule=rule, warmup_calls=2, reset=self.reset)


def contention_rows(timed: Timed, spare_dir: Path) -> list[tuple[str, float, float]]:
    """(what the other processes did, median ms, 80th percentile ms) for one case."""
    context = multiprocessing.get_context("spawn")
    rows = []

    def measure(label: str) -> None:
        stats = timed.series()
        rows.append((label, stats.median_ms, stats.p80_ms))
        print(f"  {timed.case.kernel} {timed.case.mode}: {label}: {stats.median_ms:.3f} ms", flush=True)

    measure("alone")
    for mode, gigabytes, count in (
        ("idle", 10, 2),
        ("alloc churn", 5, 2),
        ("tiny kernels", 2, 1),
        ("exiting", 30, 2),
    ):
        stop = context.Event()
        readies = [context.Event() for _ in range(count)]
        processes = [context.Process(target=other_process, args=(mode, gigabytes, r, stop)) for r in readies]
        for process in processes:
            process.start()
        for ready in readies:
            ready.wait(120)
        if mode == "exiting":
            stop.set()
        measure(f"{count} other process{'es' if count > 1 else ''}: {mode}")
        stop.set()
        for process in processes:
            process.join()
    worker = Worker("cuda:0", spare_dir / f"{timed.case.kernel}.log")
    worker.launch()
    worker.wait_ready()
    available = [name for name in SPARES if registry.get(name).available() is None][:2]
    for name in available:
        worker.start_spare(name, type(registry.get(name)).__module__)
    # Three series over the spares' first seconds (the slowest is kept): their start takes seconds.
    slowest = max((timed.series() for _ in range(3)), key=lambda stats: stats.median_ms)
    rows.append(
        (f"the sweep's spare workers starting ({', '.join(available)})", slowest.median_ms, slowest.p80_ms)
    )
    worker.switch()  # the worker's process exits in the background; the first spare takes over
    measure("the sweep's last worker retiring")
    worker.stop()
    measure("alone again")
    return rows


def heat(seconds: float) -> None:
    """bf16 GEMMs for `seconds`."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def capped_median(timed: Timed, monitor: gpustate.Monitor, policy: str) -> tuple[float, int | None]:
    """The case's median under one power-cap policy (the module docstring) and the SM clock after."""
    monitor.settle()
    before = monitor.read()
    series = timed.series_of(SWEEP_RULE)
    first = series()
    if policy == "again +1.5 s":

        def held_series(**options) -> timing.TimingStats:
            timing.warm_up(timed.step, "cuda", calls=None, seconds=1.5, before_each=timed.reset)
            return series(**options)

        capped = gpustate.retime(held_series, first, monitor, before, "again")
    else:
        capped = gpustate.retime(series, first, monitor, before, policy)
    return capped.stats.median_ms, capped.after.sm_mhz if capped.after else None


def capped_rows(timed: Timed, monitor: gpustate.Monitor) -> list[tuple[str, list[float], list[int | None]]]:
    rows = []
    for policy in ("again", "again +1.5 s", "gaps"):
        medians, clocks = [], []
        for _ in range(2):
            for heat_s in (0.0, 6.0):
                if heat_s:
                    heat(heat_s)
                else:
                    time.sleep(2.0)
                median, clock = capped_median(timed, monitor, policy)
                medians.append(median)
                clocks.append(clock)
        rows.append((policy, medians, clocks))
        print(f"  {label(timed.case)}: {policy}: " + " ".join(f"{m:.3f}" for m in medians), flush=True)
    return rows


def label(case: Case) -> str:
    """A case as a table cell (its key holds `|`)."""
    shape = f"{case.num_heads}x{case.head_dim_qk}/{case.head_dim_v}"
    return f"{case.kernel} {case.mode} B{case.batch} T{case.seq_len} {shape}"


def markdown(contention: dict[str, list | str], capped: dict[str, list | str], device: str) -> str:
    def table(title: str, columns: list[str], cases: dict[str, list | str], cells) -> list[str]:
        lines = ["", title, "", "| case | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for key, rows in cases.items():
            if isinstance(rows, str):
                lines.append(f"| {key} | not run: {rows} |" + " |" * (len(columns) - 1))
            else:
                lines += [f"| {key} | " + " | ".join(row) + " |" for row in cells(rows)]
        return lines

    def contended(rows: list) -> list[list[str]]:
        alone = rows[0][1]
        return [[what, f"{m:.3f}", f"{m / alone:.3f}", f"{p80 / alone:.3f}"] for what, m, p80 in rows]

    def policies(rows: list) -> list[list[str]]:
        return [
            [policy, ", ".join(f"{m:.3f}" for m in medians), ", ".join(str(c) for c in clocks)]
            + [f"{max(medians) / min(medians) - 1:.1%}"]
            for policy, medians, clocks in rows
        ]

    command = "`python experiments/gpu_disturbances.py OUT`"
    lines = [f"What moves a case's time on {device} (torch {torch.__version__}); {command}"]
    lines += table(
        "Other processes on the GPU while one case is timed:",
        ["other processes", "median ms", "median / alone", "p80 / alone"],
        contention,
        contended,
    )
    lines += table(
        "Power-capped cases: median ms from a cool start, a hot start, a cool and a hot start again "
        "(SM MHz after each):",
        ["policy", "medians ms", "SM MHz", "spread"],
        capped,
        policies,
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the markdown file to write")
    out = parser.parse_args(argv).out
    if not torch.cuda.is_available():
        print("error: this measurement needs a CUDA GPU", file=sys.stderr)
        return 2
    if out.is_dir():
        print(f"error: {out} is a folder; give the path of the markdown file to write", file=sys.stderr)
        return 2
    registry.load()
    torch.cuda.set_device(0)
    monitor = gpustate.device_monitor("cuda:0")
    contention: dict[str, list | str] = {}
    capped: dict[str, list | str] = {}
    with tempfile.TemporaryDirectory() as spare_dir:
        for case in CONTENDED:
            reason = registry.get(case.kernel).available()
            contention[label(case)] = reason if reason else contention_rows(Timed(case), Path(spare_dir))
            torch.cuda.empty_cache()
    for case in CAPPED:
        reason = registry.get(case.kernel).available() or monitor.note
        capped[label(case)] = reason if reason else capped_rows(Timed(case), monitor)
        torch.cuda.empty_cache()
    table = markdown(contention, capped, torch.cuda.get_device_name())
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
