"""Whether the adapters of a sweep run here, asked of all of them at once (the sweep's `plan` phase).

`Adapter.available()` imports the adapter's library (fla, mamba_ssm, flash-attn's CUDA extensions,
FlashAttention-4's CUTLASS DSL, ...). One after the other in the sweep's process, these imports
took 17.1 s of the Fig. 5 sweep on an H100 node (`results/runs/fig5_consttoken-20261126-080239`).
On CUDA, `availability` asks each adapter in a worker process of its own, all at once, so the
imports overlap; and an import that crashes or hangs costs its adapter, not the sweep: a check
that kills its worker or gives no answer within `TIMEOUT_S` makes the adapter unavailable, with
what happened as the reason. Each worker writes `plan-<i>.log` in the run directory.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfla_bench import registry, rundir
from tfla_bench.worker import Failure, Worker, log_outcome
from tfla_bench.workloads import Case

TIMEOUT_S = 300.0


@dataclass(frozen=True)
class AvailabilityJob:
    """Ask the adapter of `case` whether it runs on the worker's machine (`Adapter.available`)."""

    case: Case
    adapter_module: str

    def run(self, adapter: registry.Adapter, device: str) -> str | None:
        reason = adapter.available()
        log_outcome(f"available: {reason or 'yes'}")
        return reason


def availability(
    cases: list[Case],
    devices: list[str],
    log_dir: Path,
    timeout_s: float = TIMEOUT_S,
    in_workers: bool | None = None,
) -> dict[str, str | None]:
    """Why the adapter of each kernel in `cases` cannot run here, or None, by kernel name.

    With `in_workers` (default: on CUDA with more than one adapter), each adapter is asked in a
    worker of its own (spread round-robin over `devices`, logs in `log_dir`), all at once, each
    given `timeout_s` to answer; otherwise in this process.
    """
    first: dict[str, Case] = {}
    for case in cases:
        first.setdefault(case.kernel, case)
    adapters = {name: registry.get(name) for name in first}
    if in_workers is None:
        in_workers = devices[0] != "cpu" and len(adapters) > 1
    if not in_workers:
        return {name: adapter.available() for name, adapter in adapters.items()}
    reasons: dict[str, str | None] = {}

    def ask(index: int, name: str) -> None:
        worker = Worker(devices[index % len(devices)], log_dir / rundir.plan_log(index))
        try:
            job = AvailabilityJob(first[name], type(adapters[name]).__module__)
            answer: Any = worker.call(job, timeout_s)
        finally:
            worker.stop()
        if isinstance(answer, Failure):
            outcome = "crashed" if answer.status == "crashed" else "gave no answer"
            answer = f"its availability check {outcome}: {answer.error}"
        reasons[name] = answer

    threads = [
        threading.Thread(target=ask, args=(index, name), daemon=True) for index, name in enumerate(adapters)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {name: reasons[name] for name in adapters}
