"""The host's share of one call: how long Python takes to queue it, and what that costs when calls
are timed one at a time.

python experiments/launch_overhead.py OUT   (the markdown table; the H100's is in results/kernels/)

For each kernel at the Fig. 5 shape of its family (B8, 16 heads, Dqk 128, Dv 256, T 8192; chunk 128,
limit_chunk 64), fw and fwbw, on one CUDA GPU:
- `kernels`: GPU kernels one call launches (torch.profiler), torch's own ops included;
- `queue us`: median host time to queue one call of a run of back-to-back calls, as a sweep queues
  them (the launch path of one call; a call that synchronizes inside shows its GPU time here);
- `bursts us`: the lowest and highest median of the 10 bursts of 20 calls that `queue us` pools:
  how much the host's own speed moved while the same code ran;
- `after sync us`: median host time to queue one call right after a synchronization, while the GPU
  is busy with a spin: the same code from a thread that has just waited, which on the H100 node
  takes several times longer and varies from run to run;
- `gpu ms`: the suite's median (CUDA events, cold L2, spin ahead of the call);
- `sync ms`: median wall time of a call between two synchronizations, as a script that times each
  call with `time.perf_counter` sees it;
- `sync - gpu`: what the host adds when every call starts from an idle GPU.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.measure import timing
from tfla_bench.measure.worker import clear_grads, grad_leaves, make_step

KERNELS = {
    "tfla_sig": 128,
    "tfla_exp": 128,
    "limit_chunk": 64,
    "mlstm_kernels_sig": 128,
    "mlstm_kernels_limit": 64,
}
SPIN_CYCLES = 50_000_000  # tens of milliseconds of GPU spin: the host never waits inside a call
CALLS = 30
BURSTS, BURST = 10, 20  # back-to-back calls: 10 runs of 20


def kernels_per_call(step) -> int:
    """GPU kernels launched by one call, counted by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(event.device_type == torch.autograd.DeviceType.CUDA for event in prof.events())


def queue_us(step, reset) -> tuple[float, float, float]:
    """Median host time (us) of one call among back-to-back calls, the GPU busy with a spin first,
    and the lowest and highest median of one burst."""
    times, bursts = [], []
    for _ in range(BURSTS):
        torch.cuda.synchronize()
        torch.cuda._sleep(SPIN_CYCLES)
        burst = []
        for _ in range(BURST):
            reset()
            began = time.perf_counter()
            step()
            burst.append((time.perf_counter() - began) * 1e6)
        times += burst
        bursts.append(timing.percentile(burst, 50))
    torch.cuda.synchronize()
    return timing.percentile(times, 50), min(bursts), max(bursts)


def after_sync_us(step, reset) -> float:
    """Median host time (us) to queue one call right after a synchronization, the GPU busy with a spin."""
    times = []
    for _ in range(CALLS):
        reset()
        torch.cuda.synchronize()
        torch.cuda._sleep(SPIN_CYCLES)
        began = time.perf_counter()
        step()
        times.append((time.perf_counter() - began) * 1e6)
        torch.cuda.synchronize()
    return timing.percentile(times, 50)


def sync_ms(step, reset, flush) -> float:
    """Median wall time (ms) of a call between two synchronizations, the L2 flushed before it."""
    times = []
    for _ in range(CALLS):
        reset()
        flush()
        torch.cuda.synchronize()
        began = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - began) * 1e3)
    return timing.percentile(times, 50)


def measure(name: str, chunk: int, mode: str) -> dict:
    adapter = registry.get(name)
    reason = adapter.available()
    if reason:
        return {"kernel": name, "mode": mode, "note": reason}
    case = Case(name, mode, "bfloat16", 8, 8192, 16, 128, 256, chunk)
    torch.manual_seed(0)
    inputs = adapter.make_inputs(case, "cuda")
    leaves = grad_leaves(inputs)

    def reset() -> None:
        clear_grads(leaves)

    step = make_step(adapter, inputs, mode, "sum")
    flush = timing.L2Flush("cuda")
    for _ in range(3):  # compile, autotune, warm up
        reset()
        step()
    gpu = timing.time_standalone(step, "cuda", warmup_calls=5, warmup_s=0.0, reset=reset)
    queue, fastest, slowest = queue_us(step, reset)
    row = {
        "kernel": name,
        "mode": mode,
        "kernels": kernels_per_call(lambda: (reset(), step())),
        "queue us": queue,
        "bursts us": f"{fastest:.0f}-{slowest:.0f}",
        "after sync us": after_sync_us(step, reset),
        "gpu ms": gpu.median_ms,
        "sync ms": sync_ms(step, reset, flush),
    }
    row["sync - gpu us"] = (row["sync ms"] - row["gpu ms"]) * 1e3
    return row


def markdown(rows: list[dict]) -> str:
    head = ["kernel", "mode", "kernels", "queue us", "bursts us", "after sync us", "gpu ms", "sync ms"]
    head.append("sync - gpu us")
    lines = [
        f"Host launch path on {torch.cuda.get_device_name()} (bf16, B8 NH16 T8192 Dqk128 Dv256; "
        f"torch {torch.__version__})",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        if "note" in row:
            lines.append(f"| {row['kernel']} | {row['mode']} | {row['note']} |")
            continue
        cells = [row["kernel"], row["mode"], str(row["kernels"])]
        cells += [f"{row['queue us']:.0f}", row["bursts us"], f"{row['after sync us']:.0f}"]
        cells += [f"{row['gpu ms']:.3f}", f"{row['sync ms']:.3f}"]
        cells.append(f"{row['sync - gpu us']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python experiments/launch_overhead.py OUT", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: the launch-overhead measurement needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(argv[0])
    rows = [measure(name, chunk, mode) for name, chunk in KERNELS.items() for mode in ("fw", "fwbw")]
    table = markdown(rows)
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
