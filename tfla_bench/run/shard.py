"""One job of a sweep through a job scheduler: a shard of the run's cases, measured on the job's node.

`ShardJob` is what `tfla_bench.run.cluster` submits (submitit pickles it) and what runs inside the job:
`runner.run_sweep` on every GPU the scheduler gave the job, with the isolated workers of any sweep,
into the shard's own run directory `shards/<round>-<index>/` inside the shared run directory. So
the job's rows go to its own shard file (`results.csv` there), one write and one fsync each, and
no two jobs ever write one file; the sweep that submitted it merges them. `--precompile N` runs
there, once per node, before anything is measured.

Preemption and the end of a job's time: Slurm signals the job first, and submitit then calls
`checkpoint`, which hands back the same shard marked as requeued; submitit requeues the job. The
requeued job resumes its shard directory: the rows it finished stay, and only the other cases run.
A second signal is not requeued: the job ends with its rows kept, and `sweep --resume` submits the
cases it did not finish.

A cancel (`scancel`: SIGTERM to every process of the job) stops the shard at once: its workers are
killed, the case in progress gets no row (or an `interrupted` one), and no further case starts in
the grace time before Slurm's SIGKILL. Both ends write `job-end.json` into the shard directory, so
the job's end is known where the scheduler keeps no record of it (no accounting).

This module runs in the job: it imports no module that submits jobs. Loading it is light (no torch):
submitit unpickles the job before it installs its signal handlers, and a requeue signal that lands
in that window ends the job instead of requeueing it.
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfla_bench.adapters.workloads import Case
from tfla_bench.run import rundir
from tfla_bench.run.specs import Spec

# Times a job is requeued after it was preempted or ran out of time.
MAX_REQUEUES = 1
# What `job-end.json` says: the job was cancelled, or stopped after its last requeue.
CANCELLED = "CANCELLED"
STOPPED = "INTERRUPTED"


@dataclass(frozen=True)
class ShardJob:
    """A shard of a run's cases, to measure in one job on one node.

    Attributes:
        run_dir: the shared run directory (absolute).
        round_number: the submission the job belongs to.
        index: the shard's index in it.
        spec: the run's spec, measurement flags applied.
        cases: the shard's cases.
        precompile: `--precompile N`: compile the shard's kernels in N processes first.
        roofs: record the node's measured roofs in its `env.json`.
        forced: the spec difference a forced resume accepted (kept in the shard's `env.json`).
        requeued: how many times the job was requeued already.
        tune: tune our kernels first at the shard's shapes without a tuned config for the GPU (None,
            the default: on a GPU).
    """

    run_dir: Path
    round_number: int
    index: int
    spec: Spec
    cases: tuple[Case, ...]
    precompile: int = 0
    roofs: bool = True
    forced: str | None = None
    requeued: int = 0
    tune: bool | None = None

    @property
    def directory(self) -> Path:
        """The shard's run directory."""
        return self.run_dir / rundir.shard_dir(self.round_number, self.index)

    def __call__(self) -> dict[str, int]:
        """Measure the shard (resuming it when a requeued job finds its rows); return the counts of
        `runner.SweepReport`."""
        # Heavy (torch): imported once submitit's signal handlers are in place (see the module's doc).
        from tfla_bench.run import runner

        directory = self.directory
        # submitit only logs a SIGTERM and goes on; the job would then start case after case until
        # Slurm's SIGKILL, each worker of them dying of it.
        previous = signal.signal(signal.SIGTERM, self._cancelled)
        try:
            report = runner.run_sweep(
                self.spec,
                list(self.cases),
                directory,
                resume=(directory / rundir.SPEC).is_file(),
                forced=self.forced,
                devices=runner.select_devices(None),
                precompile_processes=self.precompile,
                roofs=self.roofs,
                tune=self.tune,
            )
        finally:
            signal.signal(signal.SIGTERM, previous)
        return {
            "rows": len(report.rows),
            "dispatched": report.dispatched,
            "decided": report.decided,
            "kept": report.kept,
        }

    def checkpoint(self) -> Any:
        """What submitit requeues after a preemption or timeout: this shard, once; None after that
        (submitit then ends the job without requeueing it)."""
        if self.requeued >= MAX_REQUEUES:
            self.write_end(STOPPED)
            return None
        # submitit is optional (the `cluster` extra); only a job that requeues needs it.
        from submitit.core.utils import DelayedSubmission

        return DelayedSubmission(dataclasses.replace(self, requeued=self.requeued + 1))

    def write_end(self, state: str) -> None:
        """Record in the shard directory that the job ended this way (`job-end.json`)."""
        # Heavy (torch), and loaded by now: the job ends after `__call__` started.
        from tfla_bench.measure.envinfo import now_iso

        self.directory.mkdir(parents=True, exist_ok=True)
        rundir.write_json(self.directory / rundir.JOB_END, {"state": state, "at": now_iso()})

    def _cancelled(self, signum: int, frame: Any) -> None:
        self.write_end(CANCELLED)
        # Raised in the main thread: the sweep kills its workers and keeps every row written.
        raise SystemExit(128 + signum)
