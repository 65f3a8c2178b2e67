"""Each case over the runs that measured it: its median by date and commit, per GPU, and the changes
beyond the noise.

A point is one `ok` row with a finite median above 0 of one run (its `started_at` date and its
commit, `git_sha`). The points of one spec, case (`Case.key`) and GPU, in date order, form a line;
each point is set against the one before it on that line by the rule `diff` gates on
(`tfla_bench.analyse.diff.change`: the ratio of the medians against the sum of both rows' noise),
so a point is flagged `slower` or `faster` exactly when `tfla-bench diff` of those two runs calls
that case so. Only the cases that two or more runs of a spec share have a history.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tfla_bench.analyse.crossgpu import COMMIT_DIGITS
from tfla_bench.analyse.diff import change, not_comparable
from tfla_bench.measure.row import ResultRow
from tfla_bench.run.console import case_params, case_shape

COLUMNS = (
    "spec",
    "kernel",
    "mode",
    "case",
    "key",
    "gpu",
    "date",
    "commit",
    "run",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "ratio",
    "noise",
    "verdict",
)
FLAGGED = ("slower", "faster")


@dataclass(frozen=True)
class RunRows:
    """One run as the history sees it: the name of its page, its spec, GPU, date, commit and rows."""

    name: str
    spec: str
    gpu: str
    date: str
    commit: str
    rows: list[ResultRow]


def commit_of(env: dict) -> str:
    """A run's commit as its first digits, or `?` when its env.json records none."""
    return str(env.get("git_sha") or "?")[:COMMIT_DIGITS]


def case_text(row: ResultRow) -> str:
    """A case without its kernel and mode: dtype, shape and params (`bfloat16 B8 T8192 H16 ...`)."""
    return f"{row.case.dtype} {case_shape(row.case)} {case_params(row.case)}".rstrip()


def history(runs: list[RunRows]) -> pd.DataFrame:
    """Every point of every case that two or more runs of its spec share (`COLUMNS`), each with its
    change from the point before it of the same GPU (`ratio`, `noise`, `verdict`; empty for the
    first); sorted by spec, kernel, mode, case, GPU and date."""
    points: dict[tuple[str, str], list[tuple[RunRows, ResultRow]]] = {}
    for run in runs:
        for row in run.rows:
            # A row that `diff` could set against another: ok, with a finite median and noise.
            if not_comparable(row, row) is None:
                points.setdefault((run.spec, row.case.key), []).append((run, row))
    records = []
    for (spec, key), found in points.items():
        if len({run.name for run, _ in found}) < 2:
            continue
        previous: dict[str, ResultRow] = {}
        for run, row in sorted(found, key=lambda pair: (pair[0].gpu, pair[0].date, pair[0].name)):
            before = previous.get(run.gpu)
            moved = change(before, row) if before is not None else None
            previous[run.gpu] = row
            records.append(
                {
                    "spec": spec,
                    "kernel": row.case.kernel,
                    "mode": row.case.mode,
                    "case": case_text(row),
                    "key": key,
                    "gpu": run.gpu,
                    "date": run.date,
                    "commit": run.commit,
                    "run": run.name,
                    "median_ms": row.median_ms,
                    "p20_ms": row.p20_ms,
                    "p80_ms": row.p80_ms,
                    "ratio": moved.ratio if moved else None,
                    "noise": moved.noise if moved else None,
                    "verdict": moved.verdict if moved else "",
                }
            )
    frame = pd.DataFrame(records, columns=list(COLUMNS))
    return frame.sort_values(["spec", "kernel", "mode", "case", "gpu", "date"], kind="stable").reset_index(
        drop=True
    )


def flagged(points: pd.DataFrame) -> pd.DataFrame:
    """The points that changed beyond the noise of both runs, the largest change first."""
    moved = points[points["verdict"].isin(FLAGGED)]
    order = (moved["ratio"].astype(float) - 1).abs().sort_values(ascending=False, kind="stable").index
    return moved.loc[order]
