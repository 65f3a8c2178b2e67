"""Whether where a case's inputs lie in GPU memory changes its time: in one process, time the same case
on several fresh copies of its inputs, each kept alive so that each gets memory of its own.

python experiments/input_placement.py   (run it several times: each run is one process)

Prints, per case, the suite's median (L2 flushed, spin ahead, gradients reset before each call) on
each copy and the spread between the copies.
"""

from __future__ import annotations

import torch

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.measure import timing
from tfla_bench.measure.worker import clear_grads, grad_leaves, make_step

COPIES = 6
CASES = [
    Case("lightning2", "fwbw", "bfloat16", 2, 32768, 32, 128, 128, None),
    Case("lightning2", "fwbw", "bfloat16", 4, 16384, 32, 128, 128, None),
    Case("tfla_sig", "fw", "bfloat16", 8, 8192, 16, 128, 256, 128),
]


def medians_over_copies(case: Case, rule: timing.StopRule) -> list[float]:
    adapter = registry.get(case.kernel)
    kept, medians = [], []
    for _ in range(COPIES):
        inputs = adapter.make_inputs(case, "cuda")
        kept.append(inputs)
        leaves = grad_leaves(inputs)

        def reset(leaves: list[torch.Tensor] = leaves) -> None:
            clear_grads(leaves)

        step = make_step(adapter, inputs, case.mode, "sum")
        stats = timing.time_standalone(step, "cuda", rule=rule, warmup_calls=2, warmup_s=0.0, reset=reset)
        medians.append(stats.median_ms)
    return medians


def main() -> int:
    if not torch.cuda.is_available():
        print("error: this check needs a CUDA GPU")
        return 2
    registry.load()
    rule = timing.StopRule(rel_ci=0.005, budget_s=1.0, min_reps=10)
    for case in CASES:
        reason = registry.get(case.kernel).available()
        if reason is not None:
            print(f"{case.key}: not run: {reason}")
            continue
        medians = medians_over_copies(case, rule)
        spread = max(medians) / min(medians) - 1
        times = " ".join(f"{m:.3f}" for m in medians)
        print(f"{case.key}: {times} ms over {COPIES} copies, spread {spread:.1%}")
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
