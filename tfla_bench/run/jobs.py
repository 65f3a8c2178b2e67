"""The record of a run's jobs (`jobs.json`): what each submission to a job scheduler sent where.

A sweep through jobs (`tfla_bench.run.cluster`) splits the cases of a run over jobs of one node each.
Each submission is a round: its number, when it was sent, the spec difference a forced resume
accepted, and its jobs. A job holds one shard of the round's cases: its index, the scheduler's job
id, how many cases it holds, the state last seen, the node it ran on, the last line of its error,
and its two logs (paths relative to the run directory). A round is open until every job of it has
ended and its rows are merged into `results.csv`; the shard files of a closed round are never read
again.

The executor (`slurm` or `local`) and the options of the latest submission are kept, so that
`sweep --resume` submits the same way unless told otherwise. The file is written whole
(`rundir.write_json`) by the one process that holds the run's lock; anyone may read it (`report`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tfla_bench.errors import UserError
from tfla_bench.run import rundir

COMPLETED = "COMPLETED"
# States of a job that may still write rows: Slurm's (as sacct names them; a preempted job is
# requeued), and ours for a job just submitted or whose state the scheduler does not know yet.
ACTIVE_STATES = frozenset(
    {
        "SUBMITTED",
        "UNKNOWN",
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SUSPENDED",
        "STAGE_OUT",
        "SIGNALING",
        "PREEMPTED",
    }
)


@dataclass
class JobRecord:
    """One job: a shard of a round's cases.

    Attributes:
        index: the shard's index in its round.
        job_id: the scheduler's id (Slurm's, or the local controller's process id).
        cases: how many cases the shard holds.
        state: the state last seen (`ACTIVE_STATES`, `COMPLETED`, or how it ended: `FAILED`,
            `TIMEOUT`, `CANCELLED`, `INTERRUPTED`, `ENDED` (it left Slurm's queue saying nothing), ...).
        host: the node it ran on, once known.
        error: the last line of its error, for a job that failed.
        stdout, stderr: its logs, relative to the run directory.
        merged_rows: the rows its shard file held when its round closed (a merge takes only those
            written later).
    """

    index: int
    job_id: str
    cases: int
    state: str = "SUBMITTED"
    host: str = ""
    error: str = ""
    stdout: str = ""
    stderr: str = ""
    merged_rows: int = 0

    @property
    def ended(self) -> bool:
        """Whether the job will write no more rows."""
        return self.state not in ACTIVE_STATES

    @property
    def failed(self) -> bool:
        """Whether it ended any way but completing."""
        return self.ended and self.state != COMPLETED


@dataclass
class Round:
    """One submission.

    Attributes:
        number: 1 for the first submission of the run, then 2, 3, ...
        submitted_at: when, ISO 8601.
        jobs: its jobs, by shard index.
        forced: the spec difference a forced resume accepted, if any.
        closed: whether every job ended and its rows are merged.
    """

    number: int
    submitted_at: str
    jobs: list[JobRecord]
    forced: str | None = None
    closed: bool = False

    def shard(self, job: JobRecord) -> str:
        """The job's shard directory, relative to the run directory."""
        return rundir.shard_dir(self.number, job.index)


@dataclass
class JobsRecord:
    """Every submission of a run.

    Attributes:
        executor: `slurm` or `local`, of the latest submission.
        options: its scheduler options (`cluster.ClusterOptions` as a dict).
        rounds: the submissions, oldest first.
    """

    executor: str
    options: dict[str, Any]
    rounds: list[Round] = field(default_factory=list)

    def open_rounds(self) -> list[Round]:
        """The rounds whose rows are not all merged yet."""
        return [one for one in self.rounds if not one.closed]

    def jobs(self) -> list[tuple[Round, JobRecord]]:
        """Every job, with its round, oldest first."""
        return [(one, job) for one in self.rounds for job in one.jobs]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> JobsRecord:
        """Parse what `to_dict` wrote.

        Raises:
            KeyError, TypeError: a record of another shape.
        """
        rounds = [
            Round(**{**one, "jobs": [_typed(JobRecord(**job)) for job in one["jobs"]]})
            for one in raw["rounds"]
        ]
        return _typed(
            cls(executor=raw["executor"], options=raw["options"], rounds=[_typed(r) for r in rounds])
        )


# The values each annotation of these records takes (`_typed`).
_ANNOTATIONS = {
    "int": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "str": lambda value: isinstance(value, str),
    "bool": lambda value: isinstance(value, bool),
    "str | None": lambda value: value is None or isinstance(value, str),
    "dict[str, Any]": lambda value: isinstance(value, dict),
    "list[JobRecord]": lambda value: isinstance(value, list),
    "list[Round]": lambda value: isinstance(value, list),
}


def _typed(record: Any) -> Any:
    """`record` if each field holds a value of its annotation; a TypeError naming the first that does not."""
    for spec in fields(record):
        value = getattr(record, spec.name)
        if not _ANNOTATIONS[str(spec.type)](value):
            raise TypeError(f"{spec.name}: expected {spec.type}, got {json.dumps(value)[:40]}")
    return record


def read(run_dir: Path) -> JobsRecord | None:
    """The run's `jobs.json`, or None for a run that never submitted a job.

    Raises:
        UserError: the file is not a jobs record.
    """
    path = run_dir / rundir.JOBS
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    try:
        return JobsRecord.from_dict(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path} is not a jobs record ({exc})") from None


def write(run_dir: Path, record: JobsRecord) -> None:
    """Write the run's `jobs.json` atomically."""
    rundir.write_json(run_dir / rundir.JOBS, record.to_dict())
