"""Sweeps through a job scheduler: a run's cases sharded over jobs of one node each, through submitit.

`tfla-bench sweep SPEC --executor slurm` submits the cases to Slurm; `--executor local` runs the
same path through submitit's `LocalExecutor` on this machine (what the tests use). In order:

1. `resolve` turns the flags into `ClusterOptions`, refusing bad ones with one `UserError` line
   before anything is written. A resumed run keeps the executor and options it was submitted
   with, unless flags say otherwise.
2. `submit` splits the cases to run (every case; on `--resume` those without a finished row and
   those of a `--retry` status) round-robin into at most `--nodes` shards, and submits one
   `shard.ShardJob` per shard: one node, `--gpus-per-node` GPUs, `--time`. On Slurm the shards go
   as one job array (one sbatch). submitit keeps its scripts, pickles and the jobs' logs in
   `submitit/<round>/` of the run directory, and `jobs.json` records the submission
   (`tfla_bench.run.jobs`). A preempted or timed-out job is requeued once (`shard.ShardJob.checkpoint`).
3. `follow` (unless `--no-wait`) polls the jobs and merges their rows into `results.csv` as they
   come, with a progress bar per job state, until every job has ended; `status` polls and merges
   once.

Merging (`merge`): a row is final once it is in a shard file (one write and one fsync each; a torn
last line waits for a later merge), so each merge reads every shard file of the open rounds and
rewrites `results.csv` atomically: its own rows, then the shards' rows, the last row of a case
winning. Only the holder of the run's lock merges, so `results.csv` has one writer. A round is
closed once all its jobs ended and a last merge took their rows. The run's `env.json` is the first
node's, with every node's record under `nodes` (where `rundir.on_one_gpu` finds the record of a
GPU).

Job states (`job_state`): on Slurm, from `sacct` where the cluster keeps accounting, else from
`squeue` (both asked at most every `STATE_POLL_S`, one call each for every job), with what the
job left itself: submitit's result (`COMPLETED` or `FAILED`) and the shard's `job-end.json`
(`tfla_bench.run.shard`: cancelled, or stopped after its last requeue). A job that has left the queue
has ended, whatever it left: its marker's state, its result's, or `ENDED`; so no job stays
active once Slurm has forgotten it, and `--resume` is never refused for ever. A local job is
`RUNNING` while its controller process runs, else its result's state or `INTERRUPTED`.

What Slurm says besides the states (`SlurmPoll`) is printed by `sweep` and `status` (`say_poll`): a
query that failed, one line per poll (its state is then the last known; a failed `sacct` is asked
again at the next poll, and only sacct's own "accounting storage is disabled" turns it off), and a
job Slurm holds (the requeue hold, `BeginTime`; a user's or an admin's hold), once per hold. A sweep
that follows its jobs stops with a `RunFailed` once `squeue` has failed for `slurm_wait_s` seconds.

Rows are never stranded: a merge reads every shard file of the open rounds, and those of the closed
rounds past the rows they held when their round closed (a cancelled job may still write in its
grace time), so `status` and `--resume` merge every row a shard holds, whenever it was written.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from tfla_bench.adapters.workloads import Case
from tfla_bench.errors import RunFailed, UserError, control_char
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.envinfo import now_iso
from tfla_bench.measure.row import ResultRow
from tfla_bench.run import jobs, rundir, runner, specs
from tfla_bench.run.console import job_line, progress_bar
from tfla_bench.run.jobs import JobRecord, JobsRecord, Round
from tfla_bench.run.shard import MAX_REQUEUES, ShardJob
from tfla_bench.run.specs import Spec

EXECUTORS = ("none", "slurm", "local")
EXTRA = "pip install tfla-bench[cluster]"
DEFAULT_TIME_MIN = 60
# Seconds between merges while following jobs, and between two calls of sacct (or squeue).
POLL_S = 1.0
STATE_POLL_S = 30.0
SLURM_COMMAND_TIMEOUT_S = 60
# A job that left Slurm's queue without saying how it ended (no accounting, no result, no marker).
ENDED = "ENDED"
# How long a sweep follows its jobs while squeue fails (a controller stopped or unreachable): the
# environment variable, in seconds, else the default.
SLURM_WAIT_ENV = "TFLA_BENCH_SLURM_WAIT_S"
DEFAULT_SLURM_WAIT_S = 600.0
# Seconds between Slurm's signal and the end of a job's time: enough to stop the workers and requeue.
SIGNAL_DELAY_S = 120
# sbatch options the flags set, and those submitit sets itself (the logs go into the run directory).
_FLAG_OF = {
    "partition": "--partition",
    "time": "--time",
    "nodes": "--nodes",
    "gpus-per-node": "--gpus-per-node",
    "account": "--account",
    "constraint": "--constraint",
}
_SUBMITIT_OWNS = ("output", "error", "array", "signal", "open-mode")
# sbatch's options that may be given without a value (its manual, Slurm 22.05 to 24.11); any other
# KEY alone would reach sbatch and fail there, in sbatch's words.
_VALUELESS = frozenset(
    {
        "contiguous",
        "exclusive",
        "get-user-env",
        "hold",
        "ignore-pbs",
        "nice",
        "no-kill",
        "no-requeue",
        "overcommit",
        "oversubscribe",
        "propagate",
        "reboot",
        "requeue",
        "spread-job",
        "use-min-nodes",
        "verbose",
    }
)
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


@dataclass(frozen=True)
class ClusterFlags:
    """The scheduler flags of `sweep` as given (None or empty: not given)."""

    executor: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    constraint: str | None = None
    slurm_args: tuple[str, ...] = ()
    no_wait: bool = False


@dataclass(frozen=True)
class ClusterOptions:
    """How the jobs of a sweep are submitted.

    Attributes:
        executor: `slurm` or `local`.
        nodes: how many jobs the cases are split over, one node each.
        gpus_per_node: the GPUs of each job.
        time_min: each job's time limit in minutes.
        partition, account, constraint: Slurm's (None: the cluster's default).
        slurm_args: other sbatch options, name without dashes to value (True: an option without one).
        wait: follow the jobs until they end (`--no-wait`: submit and return).
    """

    executor: str
    nodes: int = 1
    gpus_per_node: int = 0
    time_min: int = DEFAULT_TIME_MIN
    partition: str | None = None
    account: str | None = None
    constraint: str | None = None
    slurm_args: dict[str, str | bool] = field(default_factory=dict)
    wait: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The options `jobs.json` keeps for a resume (all but `wait`)."""
        return {key: value for key, value in asdict(self).items() if key not in ("executor", "wait")}


@dataclass
class Merged:
    """What a merge found.

    Attributes:
        rows: every row of `results.csv` after it.
        shard_rows: readable rows per shard directory read.
        late: whether a closed round's shard had rows written after its round closed (its
            `JobRecord.merged_rows` moved: `jobs.json` needs writing).
    """

    rows: list[ResultRow]
    shard_rows: dict[str, int]
    late: bool = False


# ----------------------------------------------------------------------------------------------
# Options


def resolve(flags: ClusterFlags, recorded: JobsRecord | None) -> ClusterOptions | None:
    """The options of a sweep through jobs, or None for a sweep in this process.

    Args:
        flags: the flags given.
        recorded: the jobs of the run being resumed, if any: its executor and options apply
            where no flag is given.

    Raises:
        UserError: an unknown executor, a flag the executor does not take, or a bad value.
    """
    executor = flags.executor
    if executor is not None and executor not in EXECUTORS:
        raise UserError(f"--executor: expected one of {', '.join(EXECUTORS)}, got {executor!r}")
    if executor is None:
        executor = recorded.executor if recorded is not None else "none"
    slurm_only = (
        ("--partition", flags.partition),
        ("--account", flags.account),
        ("--constraint", flags.constraint),
        ("--slurm-arg", flags.slurm_args or None),
    )
    if executor == "none":
        given = (
            ("--nodes", flags.nodes),
            ("--gpus-per-node", flags.gpus_per_node),
            ("--time", flags.time),
            *slurm_only,
            ("--no-wait", flags.no_wait or None),
        )
        for flag, value in given:
            if value is not None:
                raise UserError(f"{flag} needs --executor slurm or local")
        return None
    if executor == "local":
        for flag, value in slurm_only:
            if value is not None:
                raise UserError(f"{flag} needs --executor slurm")
    base = recorded.options if recorded is not None and recorded.executor == executor else {}
    nodes = flags.nodes if flags.nodes is not None else base.get("nodes", 1)
    if nodes < 1:
        raise UserError(f"--nodes: expected a number of jobs >= 1, got {nodes}")
    import torch

    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    default_gpus = 1 if executor == "slurm" or cuda_count else 0
    gpus = flags.gpus_per_node if flags.gpus_per_node is not None else base.get("gpus_per_node", default_gpus)
    if gpus < 0:
        raise UserError(f"--gpus-per-node: expected a number >= 0, got {gpus}")
    if executor == "local" and nodes * gpus > cuda_count:
        raise UserError(
            f"--executor local: {nodes} job(s) of {gpus} GPU(s) need {nodes * gpus} GPU(s); "
            f"this machine has {cuda_count}"
        )
    if executor == "slurm":
        slurm_wait_s()
    words = {
        key: _word(f"--{key}", value) if value is not None else base.get(key)
        for key, value in (
            ("partition", flags.partition),
            ("account", flags.account),
            ("constraint", flags.constraint),
        )
    }
    return ClusterOptions(
        executor=executor,
        nodes=nodes,
        gpus_per_node=gpus,
        time_min=parse_time(flags.time) if flags.time is not None else base.get("time_min", DEFAULT_TIME_MIN),
        slurm_args={**base.get("slurm_args", {}), **parse_slurm_args(flags.slurm_args)},
        wait=not flags.no_wait,
        **words,
    )


def slurm_wait_s() -> float:
    """How long a sweep follows its jobs while Slurm's queue does not answer (`SLURM_WAIT_ENV`).

    Raises:
        UserError: the variable is set to anything but a number of seconds above 0.
    """
    text = os.environ.get(SLURM_WAIT_ENV, "")
    if not text.strip():
        return DEFAULT_SLURM_WAIT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UserError(f"{SLURM_WAIT_ENV}={text!r}: expected a number of seconds above 0")
    return seconds


def parse_time(text: str) -> int:
    """`--time` in minutes (rounded up), from minutes or Slurm's `[D-]H:M:S` forms.

    Raises:
        UserError: another form, or no time at all.
    """
    match = _TIME.fullmatch(text.strip())
    if match is None:
        raise UserError(f"--time: expected minutes or D-HH:MM:SS, got {text!r}")
    days, first, second, third = (int(part) if part else 0 for part in match.groups())
    if match.group(1) is not None:
        seconds = ((days * 24 + first) * 60 + second) * 60 + third
    elif match.group(4) is not None:
        seconds = (first * 60 + second) * 60 + third
    else:
        seconds = first * 60 + second
    if seconds <= 0:
        raise UserError(f"--time: expected a positive time, got {text!r}")
    return -(-seconds // 60)


def parse_slurm_args(entries: tuple[str, ...]) -> dict[str, str | bool]:
    """`--slurm-arg KEY=VALUE` entries as sbatch options (`KEY` alone: an option without a value).

    Raises:
        UserError: a malformed entry, a value holding a control character (a newline), an option one of
            the flags sets, or one submitit sets.
    """
    options: dict[str, str | bool] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        key = key.strip().removeprefix("--").replace("_", "-")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key) or (sep and not value.strip()):
            raise UserError(f"--slurm-arg: expected KEY=VALUE with an sbatch option as KEY, got {entry!r}")
        if control_char(value) is not None:
            # a newline would end the #SBATCH line and start another line of the job's script
            raise UserError(f"--slurm-arg {key}: the value holds a control character, got {entry!r}")
        if key in _FLAG_OF:
            raise UserError(f"--slurm-arg {key}: give it as {_FLAG_OF[key]}")
        if key in _SUBMITIT_OWNS:
            raise UserError(f"--slurm-arg {key}: set by tfla-bench (the jobs' logs go to the run directory)")
        if not sep and key not in _VALUELESS:
            raise UserError(
                f"--slurm-arg {entry}: expected KEY=VALUE; sbatch takes no value only for "
                f"{', '.join(sorted(_VALUELESS))}"
            )
        options[key] = value.strip() if sep else True
    return options


def _word(flag: str, value: str) -> str:
    if not value.strip() or any(char.isspace() for char in value.strip()):
        raise UserError(f"{flag}: expected one word, got {value!r}")
    return value.strip()


def require_submitit(executor: str) -> Any:
    """The submitit module, once it is known to reach the executor's scheduler.

    Raises:
        UserError: submitit is not installed (naming the extra that installs it), or Slurm's
            commands are not on this machine.
    """
    try:
        # submitit is optional (the `cluster` extra); only sweeps through jobs need it.
        import submitit
    except ImportError:
        raise UserError(f"--executor {executor} needs submitit: {EXTRA}") from None
    if executor == "slurm" and submitit.SlurmExecutor.affinity() < 0:
        raise UserError("--executor slurm: no srun on PATH; submit from a node of a Slurm cluster")
    return submitit


def slurm_parameters(options: ClusterOptions, job_name: str) -> dict[str, Any]:
    """The parameters of `submitit.SlurmExecutor.update_parameters` for the options: one node and
    one task per job, so each job runs one shard on its node's GPUs."""
    parameters: dict[str, Any] = {
        "job_name": job_name,
        "time": options.time_min,
        "nodes": 1,
        "ntasks_per_node": 1,
        "signal_delay_s": SIGNAL_DELAY_S,
    }
    if options.gpus_per_node:
        parameters["gpus_per_node"] = options.gpus_per_node
    for key in ("partition", "account", "constraint"):
        if getattr(options, key) is not None:
            parameters[key] = getattr(options, key)
    if options.slurm_args:
        parameters["additional_parameters"] = dict(options.slurm_args)
    return parameters


def describe(options: ClusterOptions, cases: int) -> str:
    """One line saying how `cases` cases would be submitted."""
    count = min(options.nodes, cases)
    return (
        f"{cases} case(s) in {count} {options.executor} job(s) of one node, "
        f"{options.gpus_per_node} GPU(s) and {options.time_min} min each"
    )


# ----------------------------------------------------------------------------------------------
# Submitting


def sweep(
    spec: Spec,
    cases: list[Case],
    run_dir: Path,
    options: ClusterOptions,
    *,
    resume: bool = False,
    retry: frozenset[str] = frozenset(),
    forced: str | None = None,
    precompile: int = 0,
    roofs: bool = True,
    tune: bool | None = None,
    console: Console,
) -> list[ResultRow] | None:
    """Submit the cases and, unless `options.wait` is off, follow the jobs to the end.

    Call it holding the run's lock, after `settle` on a resumed run.

    Args:
        spec: the spec the cases come from, measurement flags applied (saved for `--resume`).
        cases: from `specs.expand`.
        run_dir: from `runner.resolve_run_dir`, checked by `runner.check_run_dir`.
        options: from `resolve`.
        resume: submit only the cases without a finished row of `run_dir`.
        retry: with `resume`, statuses whose rows are submitted again.
        forced: the spec difference a forced resume accepted.
        precompile: `--precompile N`, run in each job before it measures.
        roofs: record each node's measured roofs.
        tune: each job tunes our kernels first at its shapes without a tuned config for its GPU (None,
            the default: on a GPU).
        console: where the submission, the jobs' states and the progress go.

    Returns:
        Every row of the run once the jobs ended, or None when they were only submitted.

    Raises:
        UserError: the jobs could not be submitted (the scheduler's message is in it).
        RunFailed: jobs ended without a row for every case (their rows are kept).
    """
    record, submitted, handles = submit(
        spec,
        cases,
        run_dir,
        options,
        resume=resume,
        retry=retry,
        forced=forced,
        precompile=precompile,
        roofs=roofs,
        tune=tune,
        console=console,
    )
    if submitted is None:
        return rundir.read_results(run_dir / rundir.RESULTS).rows
    if not options.wait:
        console.print(f"`tfla-bench status {run_dir}` shows the jobs and merges their rows into results.csv")
        return None
    try:
        merged = follow(run_dir, record, submitted, handles, console)
    except KeyboardInterrupt:
        console.print(f"interrupted: running jobs go on; `tfla-bench status {run_dir}` merges their rows")
        raise
    for job in submitted.jobs:
        if job.failed:
            console.print(f"[red]{job_line(submitted, job)}[/]; log {run_dir / job.stderr}")
    runner.put_in_spec_order(run_dir / rundir.RESULTS, [case.key for case in cases], console)
    merged.rows = rundir.read_results(run_dir / rundir.RESULTS).rows
    done = {row.case.key for row in merged.rows if row.status != "interrupted"}
    missing = [case for case in cases if case.key not in done]
    if missing:
        raise RunFailed(
            f"{len(missing)} case(s) have no row, or an interrupted one: their job ended first (see "
            f"above); the rows written "
            f"are in {run_dir / rundir.RESULTS}; submit the rest with tfla-bench sweep --resume {run_dir}"
        )
    return merged.rows


def submit(
    spec: Spec,
    cases: list[Case],
    run_dir: Path,
    options: ClusterOptions,
    *,
    resume: bool,
    retry: frozenset[str],
    forced: str | None,
    precompile: int,
    roofs: bool,
    console: Console,
    tune: bool | None = None,
) -> tuple[JobsRecord, Round | None, list[Any]]:
    """Write the run's `spec.json` and `results.csv` (the rows a resume keeps), submit one job per
    shard of the cases to run, and record them in `jobs.json`. The arguments are those of `sweep`.

    Returns:
        The jobs record, the new round (None when every case has a finished row) and submitit's
        job handles.
    """
    submitit = require_submitit(options.executor)
    if options.executor == "slurm" and options.time_min * 60 <= SIGNAL_DELAY_S:
        console.print(
            f"[yellow]warning:[/] --time {options.time_min} min is within the {SIGNAL_DELAY_S} s that "
            "Slurm's requeue signal comes before a job's end: each job is signalled soon after it starts"
        )
    record = jobs.read(run_dir) or JobsRecord(options.executor, options.to_dict())
    record.executor, record.options = options.executor, options.to_dict()
    csv_path = run_dir / rundir.RESULTS
    if resume:
        todo, kept, columns = runner.resume_plan(cases, csv_path, retry, console)
    else:
        todo, kept, columns = cases, [], row_schema.columns_for(cases)
    try:
        rundir.rewrite_results(csv_path, kept, columns)
        runner.record_spec(run_dir, spec, resume=resume, forced=forced)
    except OSError as exc:
        raise UserError(f"cannot write to {run_dir}: {exc.strerror}") from None
    if kept:
        console.print(f"resuming {run_dir}: {len(kept)} finished row(s) kept")
    if not todo:
        console.print("nothing to submit: every case has a finished row")
        return record, None, []
    number = len(record.rounds) + 1
    executor = _executor(submitit, options, run_dir / rundir.submitit_dir(number), f"tfla-bench-{spec.name}")
    count = min(options.nodes, len(todo))
    shards = [tuple(todo[index::count]) for index in range(count)]
    work = [
        ShardJob(run_dir.resolve(), number, index, spec, shard, precompile, roofs, forced, tune=tune)
        for index, shard in enumerate(shards)
    ]
    handles = _submit_all(submitit, executor, options, work)
    submitted = Round(
        number,
        now_iso(),
        [
            JobRecord(
                shard.index,
                str(handle.job_id),
                len(shard.cases),
                stdout=_relative(handle.paths.stdout, run_dir),
                stderr=_relative(handle.paths.stderr, run_dir),
            )
            for shard, handle in zip(work, handles, strict=True)
        ],
        forced=forced,
    )
    record.rounds.append(submitted)
    jobs.write(run_dir, record)
    ids = ", ".join(job.job_id for job in submitted.jobs)
    console.print(f"submitted {describe(options, len(todo))}: job id(s) {ids}")
    return record, submitted, handles


def _executor(submitit: Any, options: ClusterOptions, folder: Path, job_name: str) -> Any:
    """submitit's executor for the options, writing into `folder`; requeues a job `MAX_REQUEUES` times."""
    if options.executor == "local":
        executor = submitit.LocalExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
        executor.update_parameters(
            timeout_min=options.time_min, gpus_per_node=options.gpus_per_node, signal_delay_s=SIGNAL_DELAY_S
        )
        return executor
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
    executor.update_parameters(**slurm_parameters(options, job_name))
    return executor


def _submit_all(submitit: Any, executor: Any, options: ClusterOptions, work: list[ShardJob]) -> list[Any]:
    """Submit every shard: on Slurm as one job array, locally one by one, each job on its own GPUs."""
    refused = (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError, OSError)
    # submitit prints a refused submission's stderr before raising it; the message is shown once, below.
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            if options.executor == "local":
                handles = []
                for shard in work:
                    first = shard.index * options.gpus_per_node
                    gpus = tuple(range(first, first + options.gpus_per_node))
                    executor.update_parameters(visible_gpus=gpus)
                    handles.append(executor.submit(shard))
                return handles
            with executor.batch():
                delayed = [executor.submit(shard) for shard in work]
            return delayed
        except refused as exc:
            message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            if options.gpus_per_node and "gres" in message.lower():
                message += "; on nodes without GPUs give --gpus-per-node 0"
            raise UserError(f"the {options.executor} submission was refused: {message}") from None


def _relative(path: Path, run_dir: Path) -> str:
    return os.path.relpath(path, run_dir.resolve())


# ----------------------------------------------------------------------------------------------
# Following


def follow(
    run_dir: Path, record: JobsRecord, submitted: Round, handles: list[Any], console: Console
) -> Merged:
    """Poll the round's jobs and merge their rows until every job has ended, then close the round.

    Prints a line when a job changes state, and keeps a progress bar of the round's rows and one of
    the jobs in each state.
    """
    progress = progress_bar(console)
    rows_task = progress.add_task("rows", total=sum(job.cases for job in submitted.jobs))
    state_tasks: dict[str, Any] = {}
    last_poll = float("-inf")
    seen: dict[str, SlurmSeen] = {}
    watch = _Watch(run_dir)
    with progress:
        while True:
            if record.executor == "slurm" and time.monotonic() - last_poll >= STATE_POLL_S:
                last_poll = time.monotonic()
                seen = watch.poll([job.job_id for job in submitted.jobs if not job.ended], progress.console)
            before = [(job.state, job.host) for job in submitted.jobs]
            for job in _refresh(record.executor, run_dir, submitted, handles, seen):
                progress.console.print(job_line(submitted, job))
            merged = merge(run_dir, record)
            if merged.late or before != [(job.state, job.host) for job in submitted.jobs]:
                jobs.write(run_dir, record)
            written = sum(merged.shard_rows.get(submitted.shard(job), 0) for job in submitted.jobs)
            progress.update(rows_task, completed=written)
            states = Counter(job.state.lower() for job in submitted.jobs)
            for state in sorted({*states, *state_tasks}):
                if state not in state_tasks:
                    state_tasks[state] = progress.add_task(f"jobs {state}", total=len(submitted.jobs))
                progress.update(state_tasks[state], completed=states.get(state, 0))
            if all(job.ended for job in submitted.jobs):
                break
            time.sleep(POLL_S)
    return close(run_dir, record, submitted)


def close(run_dir: Path, record: JobsRecord, ended: Round) -> Merged:
    """Merge the rows of a round whose jobs all ended, and mark it closed, noting how many rows each
    shard held then (a later merge takes only the rows after those)."""
    merged = merge(run_dir, record)
    for job in ended.jobs:
        job.merged_rows = merged.shard_rows.get(ended.shard(job), 0)
    ended.closed = True
    jobs.write(run_dir, record)
    return merged


def settle(run_dir: Path) -> None:
    """Before a resume: close the rounds whose jobs all ended; refuse while a job may still write rows.

    Raises:
        UserError: a job of the run is pending or running.
    """
    record = jobs.read(run_dir)
    if record is None:
        return
    if not record.open_rounds():
        if merge(run_dir, record).late:
            jobs.write(run_dir, record)
        return
    poll = _refresh_open(record, run_dir)
    jobs.write(run_dir, record)
    active = [job for one in record.open_rounds() for job in one.jobs if not job.ended]
    if active:
        listed = ", ".join(f"{job.job_id} {job.state}" for job in active)
        unanswered = "".join(f"; {command} failed: {message}" for command, message in poll.failed.items())
        raise UserError(
            f"{len(active)} job(s) of {run_dir} may still write rows ({listed}{unanswered}); "
            f"wait for them or cancel them (`tfla-bench status {run_dir}`)"
        )
    for one in record.open_rounds():
        close(run_dir, record, one)


def status(run_dir: Path, console: Console) -> tuple[JobsRecord, dict[str, int], bool]:
    """Poll the jobs of the open rounds and, unless a sweep holds the run's lock, merge every row the
    shards hold.

    Returns:
        The jobs record, the readable rows per shard directory, and whether the rows were merged.

    Raises:
        UserError: the run never submitted a job.
    """
    record = jobs.read(run_dir)
    if record is None:
        raise UserError(f"{run_dir} has no {rundir.JOBS}: its cases were not submitted as jobs")
    say_poll(_refresh_open(record, run_dir), console, {})
    merged = True
    lock = rundir.RunLock(run_dir, warn=lambda line: console.print(line))
    try:
        lock.acquire()
    except UserError as exc:
        console.print(f"[yellow]rows not merged:[/] {exc}")
        merged = False
    else:
        try:
            for one in record.open_rounds():
                if all(job.ended for job in one.jobs):
                    close(run_dir, record, one)
            merge(run_dir, record)
            jobs.write(run_dir, record)
        finally:
            lock.release()
    shard_rows = {
        one.shard(job): len(rundir.read_results(run_dir / one.shard(job) / rundir.RESULTS).rows)
        for one, job in record.jobs()
    }
    return record, shard_rows, merged


def unmeasured(run_dir: Path) -> int:
    """How many of the run's cases (its spec and selection) have no row, or an `interrupted` one:
    those `--resume` measures (it also decides `unavailable` and `unsupported` ones again, at no cost)."""
    spec = runner.load_run_spec(run_dir)
    only, seq_lens = rundir.read_selection(run_dir)
    cases = [case for case in specs.expand(spec, only) if not seq_lens or case.seq_len in seq_lens]
    rows = rundir.read_results(run_dir / rundir.RESULTS).rows
    done = {row.case.key for row in rows if row.status != "interrupted"}
    return sum(case.key not in done for case in cases)


def _refresh_open(record: JobsRecord, run_dir: Path) -> SlurmPoll:
    """Poll the jobs of every open round (on Slurm one sacct and one squeue call for all of them);
    returns what Slurm said."""
    open_rounds = record.open_rounds()
    poll = SlurmPoll()
    if not open_rounds:
        return poll
    submitit = require_submitit(record.executor)
    kind = submitit.SlurmJob if record.executor == "slurm" else submitit.LocalJob
    if record.executor == "slurm":
        poll = poll_slurm([job.job_id for one in open_rounds for job in one.jobs if not job.ended])
    for one in open_rounds:
        folder = run_dir.resolve() / rundir.submitit_dir(one.number)
        handles = [kind(folder=folder, job_id=job.job_id) for job in one.jobs]
        _refresh(record.executor, run_dir, one, handles, poll.seen)
    return poll


@dataclass
class _Watch:
    """What following a round keeps between its polls of Slurm: the holds said, and since when
    squeue has failed."""

    run_dir: Path
    holds: dict[str, str] = field(default_factory=dict)
    unanswered_since: float | None = None

    def poll(self, job_ids: list[str], console: Console) -> dict[str, SlurmSeen]:
        """Poll Slurm about the jobs and say what it found amiss (`say_poll`).

        Raises:
            RunFailed: squeue has failed for `slurm_wait_s` seconds.
        """
        now = time.monotonic()
        poll = poll_slurm(job_ids)
        say_poll(poll, console, self.holds)
        if "squeue" not in poll.failed:
            self.unanswered_since = None
        elif self.unanswered_since is None:
            self.unanswered_since = now
        elif now - self.unanswered_since >= slurm_wait_s():
            raise RunFailed(
                f"Slurm's queue has not answered for {now - self.unanswered_since:.0f} s "
                f"(squeue: {poll.failed['squeue']}); the jobs may still run and write rows: "
                f"`tfla-bench status {self.run_dir}` merges them once it answers "
                f"({SLURM_WAIT_ENV} sets this wait)"
            )
        return poll.seen


def say_poll(poll: SlurmPoll, console: Console, holds: dict[str, str]) -> None:
    """Print what a poll found amiss: each query that failed, one line per poll; each job Slurm
    holds, once per hold (`holds`: those printed before, updated here)."""
    for command, message in poll.failed.items():
        console.print(f"[yellow]warning:[/] {command} failed: {message}; the jobs' states are the last known")
    for job_id, why in poll.held.items():
        if holds.get(job_id) != why:
            console.print(f"job {job_id}: {why}")
    holds.clear()
    holds.update(poll.held)


def _refresh(
    executor: str, run_dir: Path, one: Round, handles: list[Any], seen: dict[str, SlurmSeen]
) -> list[JobRecord]:
    """Update the state, host and error of a round's jobs that had not ended; return those whose state
    changed.

    Args:
        seen: on Slurm, what its last poll said of each job (`poll_slurm`); a job it lacks keeps its
            state until the job leaves a result.
    """
    changed = []
    for job, handle in zip(one.jobs, handles, strict=True):
        if job.ended:
            continue
        shard = run_dir / one.shard(job)
        # The scheduler's view first (`seen` was asked before this): a job writes its result before
        # it ends, so a result looked for after it is there whenever the job has ended normally.
        if executor == "slurm":
            state, error = job_state(seen.get(job.job_id), _result(handle), _marker(shard), job.state)
        else:
            state, error = _local_state(handle)
        host = job.host or _host(shard)
        if state != job.state:
            changed.append(job)
        job.state, job.error, job.host = state, error, host
    return changed


@dataclass(frozen=True)
class SlurmSeen:
    """What Slurm said of one job in a poll.

    Attributes:
        accounted: its state in `sacct` (None: no accounting, or no record of it yet).
        queued: its state in `squeue` ("" when it is not in the queue; None when squeue could not
            be asked).
    """

    accounted: str | None
    queued: str | None


def job_state(
    seen: SlurmSeen | None, result: tuple[str, str] | None, marker: str | None, previous: str
) -> tuple[str, str]:
    """A Slurm job's state and, for one that failed, the last line of its error.

    Args:
        seen: what Slurm said of it (None: not asked yet).
        result: what submitit's result says (`COMPLETED` or `FAILED`, with the error), None without one.
        marker: the state its shard's `job-end.json` records (cancelled, or stopped after its last
            requeue), None without one.
        previous: the state last recorded.
    """
    if result is not None and result[0] == "FAILED" and marker is not None:
        result = (marker, result[1])  # it raised because it was stopped: submitit's way to end a job
    error = result[1] if result is not None else ""
    said = seen.accounted or seen.queued if seen is not None else None
    if said:
        said = said.split()[0].upper()  # `CANCELLED by 0`
        if said in jobs.ACTIVE_STATES:
            # A job writes its result just before it ends: it is done with its rows.
            return result if result is not None else (said, "")
        if said == jobs.COMPLETED and result is not None:
            return result
        if said == "FAILED" and marker is not None:
            return marker, error
        return said, error
    if seen is not None and seen.queued == "":
        # Gone from the queue, with no record of how it ended: it ended, as it says itself if it can.
        if marker is not None:
            return marker, error
        if result is not None:
            return result
        return ENDED, "left Slurm's queue without a result (cancelled, killed or out of time; no accounting)"
    return result if result is not None else (previous, "")


@dataclass
class SlurmPoll:
    """What one poll of Slurm said.

    Attributes:
        seen: each job's `SlurmSeen`.
        failed: the queries that failed (`sacct`, `squeue`), each with Slurm's message in one line.
        held: the pending jobs Slurm holds, each with why and until when, in one line.
    """

    seen: dict[str, SlurmSeen] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)


_accounting = True
# sacct's words on a cluster without accounting: asking again is useless, unlike after a failure.
_NO_ACCOUNTING = "accounting storage is disabled"
# squeue's reasons for a pending job that waits for a time or a release rather than for resources.
_REQUEUE_HOLD = "BeginTime"
_HELD = "JobHeld"


def poll_slurm(job_ids: list[str]) -> SlurmPoll:
    """Ask `sacct` (unless the cluster keeps no accounting) and `squeue` about jobs, one call each;
    by job id, array tasks as `<array>_<index>`. A query that fails is in `SlurmPoll.failed` and
    asked again at the next poll."""
    global _accounting
    poll = SlurmPoll()
    if not job_ids:
        return poll
    arrays = ",".join(sorted({job_id.split("_")[0] for job_id in job_ids}))
    accounted: dict[str, dict[str, str]] = {}
    if _accounting:
        done = _run_slurm(
            ["sacct", "--parsable2", "--allocations", "--format=JobID,State", f"--jobs={arrays}"]
        )
        if isinstance(done, str) or done.returncode != 0:
            message = done if isinstance(done, str) else _said(done)
            if isinstance(done, _NotInstalled) or _NO_ACCOUNTING in message.lower():
                _accounting = False
            else:
                poll.failed["sacct"] = message
        else:
            accounted = _table(done.stdout)
    done = _run_slurm(
        ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T|%r|%S", f"--jobs={arrays}"]
    )
    queued: dict[str, dict[str, str]] | None = None
    if not isinstance(done, str) and done.returncode == 0:
        queued = _table("JobID|State|Reason|StartTime\n" + done.stdout)
    elif not isinstance(done, str) and "invalid job id" in done.stderr.lower():
        queued = {}  # one id asked and Slurm has forgotten it (of several, squeue lists those it knows)
    else:
        poll.failed["squeue"] = done if isinstance(done, str) else _said(done)
    for job_id in job_ids:
        in_queue = None if queued is None else queued.get(job_id, {})
        poll.seen[job_id] = SlurmSeen(
            accounted.get(job_id, {}).get("State") if _accounting else None,
            None if in_queue is None else in_queue.get("State", ""),
        )
        if in_queue and (why := _hold(in_queue)):
            poll.held[job_id] = why
    return poll


def _hold(queued: dict[str, str]) -> str | None:
    """Why Slurm holds a pending job back, in one line, or None when it does not."""
    reason, start = queued.get("Reason", ""), queued.get("StartTime", "")
    if queued.get("State") != "PENDING":
        return None
    if reason == _REQUEUE_HOLD:
        until = f" until {start}" if start[:1].isdigit() else ""
        return (
            f"held by Slurm{until} ({reason}): a requeued job waits about two minutes before it may "
            "start again"
        )
    if reason.startswith(_HELD):
        return f"held by Slurm ({reason}): it starts once released (scontrol release)"
    return None


def _run_slurm(command: list[str]) -> subprocess.CompletedProcess | str:
    """A Slurm command's outcome, or why it could not run or did not answer in time."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=SLURM_COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        return _NotInstalled(f"{command[0]} is not installed here")
    except OSError as exc:
        return f"{command[0]} could not run: {exc.strerror}"
    except subprocess.TimeoutExpired:
        return f"no answer within {SLURM_COMMAND_TIMEOUT_S} s"


class _NotInstalled(str):
    """A command missing from this machine: for `sacct`, a cluster without accounting."""


def _said(done: subprocess.CompletedProcess) -> str:
    """A failed Slurm command's message in one line."""
    lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return "; ".join(lines[:2]) or f"exit code {done.returncode}"


def _table(text: str) -> dict[str, dict[str, str]]:
    """Fields by job id from `|`-separated lines under a header line (a pending array's range counted
    for each task)."""
    # submitit is optional (the `cluster` extra); only sweeps through jobs need it.
    from submitit.slurm.slurm import SlurmInfoWatcher

    return SlurmInfoWatcher().read_info(text)


def _result(handle: Any) -> tuple[str, str] | None:
    """What the job's submitit result says: `COMPLETED`, or `FAILED` with the last line of its error."""
    if not handle.paths.result_pickle.exists():
        return None
    # submitit is optional (the `cluster` extra); only sweeps through jobs need it.
    import submitit.core.utils

    try:
        outcome, value = submitit.core.utils.pickle_load(handle.paths.result_pickle)
    except (OSError, EOFError):  # still being moved into place
        return None
    if outcome == "success":
        return jobs.COMPLETED, ""
    lines = [line.strip() for line in str(value).splitlines() if line.strip()]
    return "FAILED", lines[-1] if lines else "failed"


def _marker(shard: Path) -> str | None:
    """The state a shard's `job-end.json` records, if the job wrote one."""
    try:
        return str(json.loads((shard / rundir.JOB_END).read_text())["state"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _local_state(handle: Any) -> tuple[str, str]:
    """A local job's state: its result's, else whether its controller process runs."""
    live = handle.state
    if live == "NO PROCESS AND NO RESULT":  # a job this process did not submit
        live = "RUNNING" if _local_job_alive(handle.job_id) else "INTERRUPTED"
    result = _result(handle)
    if result is not None:
        return result
    if live == "FINISHED":  # a local job whose process ended without writing its result
        return "FAILED", "the job's process ended without a result"
    return live, ""


def _local_job_alive(job_id: str) -> bool:
    """Whether a local job's controller (its process id is the job id) still runs: a live process,
    not a zombie, still submitit's (the id may have been reused)."""
    proc = Path("/proc") / job_id
    try:
        stat = (proc / "stat").read_text()
        command = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z" and b"submitit" in command


def _host(shard: Path) -> str:
    """The node a shard ran on, from its `env.json` once the job wrote it."""
    try:
        return str(rundir.read_env(shard).get("host") or "")
    except UserError:
        return ""


# ----------------------------------------------------------------------------------------------
# Merging


def merge(run_dir: Path, record: JobsRecord) -> Merged:
    """Merge the rows of the shard files into `results.csv` and their nodes' records into `env.json`.
    Call it holding the run's lock, and write `jobs.json` when `Merged.late` says so.

    `results.csv` is rewritten atomically, and only when the shards add something: its rows, then
    each open round's readable rows and each closed round's rows written after it closed, round by
    round (a torn last line is left for the next merge), the last row of a case replacing an earlier
    one, so no case appears twice. A closed round's older rows are not read again: a later round, or
    a resume in this process, may have replaced them.
    """
    csv_path = run_dir / rundir.RESULTS
    read = rundir.read_results(csv_path)
    rows = {row.case.key: row for row in read.rows}
    columns = list(read.header)
    shard_rows: dict[str, int] = {}
    late = False
    for one in record.rounds:
        for job in one.jobs:
            path = run_dir / one.shard(job) / rundir.RESULTS
            if one.closed and not path.is_file():
                continue
            shard = rundir.read_results(path)
            shard_rows[one.shard(job)] = len(shard.rows)
            new = shard.rows[job.merged_rows :] if one.closed else shard.rows
            if one.closed and new:
                job.merged_rows, late = len(shard.rows), True
            if new:
                columns += [column for column in shard.header if column not in columns]
            rows.update((row.case.key, row) for row in new if _replaces(rows.get(row.case.key), row))
    merged = list(rows.values())
    if [row.to_csv() for row in merged] != [row.to_csv() for row in read.rows] or columns != read.header:
        rundir.rewrite_results(csv_path, merged, columns)
    _merge_env(run_dir, record)
    return Merged(merged, shard_rows, late)


def _replaces(held: ResultRow | None, row: ResultRow) -> bool:
    """Whether a shard's row takes the place of the row `results.csv` holds for its case: a
    finished row stays as it is (a resume submits only cases without one; what replaces it is an
    earlier round's late row or a file edited meanwhile)."""
    return held is None or not held.finished or held.to_csv() == row.to_csv()


def _merge_env(run_dir: Path, record: JobsRecord) -> None:
    """Add the records of nodes not seen yet to the run's `env.json` (the first node's heads it), in
    the order of their jobs however the jobs finished."""
    env = rundir.read_env(run_dir)
    nodes = list(env.get("nodes", []))
    seen = {node.get("shard") for node in nodes}
    added = False
    for one in record.open_rounds():
        for job in one.jobs:
            shard = one.shard(job)
            if shard in seen or not (run_dir / shard / rundir.ENV).is_file():
                continue
            node = {key: value for key, value in rundir.read_env(run_dir / shard).items() if key != "resumed"}
            env = env or dict(node)
            if one.forced is not None:
                env["forced_spec_difference"] = one.forced
            nodes.append({**node, "shard": shard, "job_id": job.job_id})
            added = True
    if added:
        order = {one.shard(job): n for n, (one, job) in enumerate(record.jobs())}
        nodes.sort(key=lambda node: order.get(node.get("shard"), len(order)))
        env.update(nodes=nodes, executor=record.executor, results_schema=rundir.SCHEMA_VERSION)
        rundir.write_json(run_dir / rundir.ENV, env)
