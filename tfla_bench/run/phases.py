"""Where a sweep's time went: `timings.json` in the run directory.

`PhaseClock` measures the sweep's wall time from the command's start, the time of each phase
(`gate`: the correctness gate of `--check`; `plan`: asking each adapter whether it runs here
(importing its library) and checking each case; `roofs`: the GPU's measured roofs; `precompile`;
`workers`: starting the workers and writing env.json; `measuring`: every case, first calls
included; `profile`: Nsight Compute after the sweep) and, within measuring, each
adapter's seconds and cases, the part of them spent in first calls (`first_call_s`: compiling
and autotuning), the part from there to the end of the energy series (`calls_s`: warm-up, the
memory call, the timed calls with their L2 flushes and spins, the energy series of
`tfla_bench.measure.energy`; the rest is making inputs, reading NVML, freeing memory and passing
the row), its precompile runs' seconds (`precompile_s`, summed over the
processes, which run side by side) and its share of the plan (`plan_s`: asking it whether it runs
here, which imports its library, and checking its cases; an adapter whose cases were all decided
without running has this alone). With several GPUs the per-adapter seconds add up over the
workers, so they may exceed the measuring phase. The sweep writes the record after every row as
well as at its end, so a sweep that is killed leaves its time up to its last row. A resumed run
keeps the earlier attempts under `earlier`. A `timings.json` that cannot be written (a full disk)
is removed with a warning rather than left behind out of date.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tfla_bench.errors import UserError
from tfla_bench.run import rundir


class PhaseClock:
    """Wall time of a sweep, per phase and per adapter; starts when made."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self.phases: dict[str, float] = {}
        self.adapters: dict[str, dict[str, float]] = {}
        self._running: dict[str, float] = {}
        self.beside: set[str] = set()
        self._earlier: list[dict[str, Any]] | None = None
        self._warned = False

    @contextmanager
    def phase(self, name: str, beside: bool = False) -> Iterator[None]:
        """Add the time spent inside the block to phase `name`; `beside`: a phase that runs beside
        the others (the precompile beside the measuring), left out of `outside_s`."""
        if beside:
            self.beside.add(name)
        self._running[name] = began = time.monotonic()
        try:
            yield
        finally:
            del self._running[name]
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - began

    def add_phase(self, name: str, seconds: float) -> None:
        """Add `seconds` to phase `name` (time that several threads may spend at once: waiting),
        which lies within another phase."""
        self.beside.add(name)
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def add_case(
        self,
        adapter: str,
        seconds: float,
        first_call_s: float | None = None,
        calls_s: float | None = None,
    ) -> None:
        """Count one case of `adapter` that took `seconds` (from sending it to having its row), of
        which `first_call_s` in its first call and `calls_s` in the calls after it (None: a case
        that failed before them)."""
        entry = self._entry(adapter)
        entry["seconds"] += seconds
        entry["cases"] += 1
        entry["first_call_s"] += first_call_s or 0.0
        entry["calls_s"] += calls_s or 0.0

    def add_precompile(self, adapter: str, seconds: float) -> None:
        """Count one precompile run of a case of `adapter` that took `seconds`."""
        self._entry(adapter)["precompile_s"] += seconds

    def add_plan(self, adapter: str, seconds: float) -> None:
        """Count `seconds` of the plan spent on `adapter` (its availability, a case's checks)."""
        self._entry(adapter)["plan_s"] += seconds

    def _entry(self, adapter: str) -> dict[str, float]:
        return self.adapters.setdefault(
            adapter,
            {
                "seconds": 0.0,
                "cases": 0,
                "first_call_s": 0.0,
                "calls_s": 0.0,
                "precompile_s": 0.0,
                "plan_s": 0.0,
            },
        )

    def to_dict(self) -> dict[str, Any]:
        """The record so far; a phase still running counts up to now."""
        now = time.monotonic()
        phases = dict(self.phases)
        for name, began in self._running.items():
            phases[name] = phases.get(name, 0.0) + now - began
        return {
            "wall_s": round(now - self._start, 3),
            "phases_s": {name: round(seconds, 3) for name, seconds in phases.items()},
            "beside": sorted(self.beside),
            "adapters": {
                name: {
                    "seconds": round(entry["seconds"], 3),
                    "cases": int(entry["cases"]),
                    "first_call_s": round(entry["first_call_s"], 3),
                    "calls_s": round(entry["calls_s"], 3),
                    "precompile_s": round(entry["precompile_s"], 3),
                    "plan_s": round(entry["plan_s"], 3),
                }
                for name, entry in sorted(self.adapters.items(), key=lambda item: -item[1]["seconds"])
            },
        }

    def write(self, run_dir: Path) -> None:
        """Write `timings.json`, keeping an earlier attempt's record (a resumed run) under `earlier`;
        this clock's own earlier writes are replaced.

        A write that fails (a full disk) removes the file it could not replace, so that no record
        older than the rows stays behind looking current, and says so once on stderr; the sweep
        goes on, and a later write that fits puts the whole record (the earlier attempts too) back.
        """
        if self._earlier is None:
            previous = read(run_dir)
            self._earlier = [] if previous is None else [*previous.pop("earlier", []), previous]
        record = self.to_dict()
        if self._earlier:
            record["earlier"] = self._earlier
        path = run_dir / rundir.TIMINGS
        try:
            rundir.write_json(path, record)
        except OSError as exc:
            self._unwritten(path, exc)

    def _unwritten(self, path: Path, exc: OSError) -> None:
        try:
            path.unlink(missing_ok=True)
            outcome = "removed the older one, which no longer matched the rows"
        except OSError as again:
            outcome = f"the older one stays and is out of date (cannot remove it: {again.strerror})"
        if not self._warned:
            self._warned = True
            print(f"warning: cannot write {path} ({exc.strerror}); {outcome}", file=sys.stderr)


def read(run_dir: Path) -> dict[str, Any] | None:
    """The run's `timings.json`, or None when the run has none.

    Raises:
        UserError: the file is there but is not readable JSON, or not a record `PhaseClock` writes
            (its earlier attempts included).
    """
    path = Path(run_dir) / rundir.TIMINGS
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if isinstance(record, dict) and not isinstance(record.get("earlier", []), list):
        problem: str | None = "`earlier` is not a list"
    else:
        attempts = [record, *record.get("earlier", [])] if isinstance(record, dict) else [record]
        problem = next(filter(None, map(_attempt_problem, attempts)), None)
    if problem is not None:
        raise UserError(f"{path} is not a sweep's timing record ({problem}); move it away to go on")
    return record


def _is_seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _attempt_problem(attempt: Any) -> str | None:
    """What makes `attempt` other than one attempt's record (`PhaseClock.to_dict`), or None."""
    if not isinstance(attempt, dict):
        return f"an attempt is {type(attempt).__name__}, not an object"
    if not _is_seconds(attempt.get("wall_s")):
        return "no finite `wall_s`"
    phases = attempt.get("phases_s")
    if not isinstance(phases, dict) or not all(_is_seconds(v) for v in phases.values()):
        return "`phases_s` is not an object of finite seconds"
    beside = attempt.get("beside", [])
    if not isinstance(beside, list) or not all(isinstance(name, str) for name in beside):
        return "`beside` is not a list of phase names"
    adapters = attempt.get("adapters")
    if not isinstance(adapters, dict):
        return "`adapters` is not an object"
    for name, entry in adapters.items():
        if not isinstance(entry, dict) or not all(_is_seconds(entry.get(k)) for k in ("seconds", "cases")):
            return f"adapter {name!r} has no finite `seconds` and `cases`"
    return None


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per phase, then per adapter (seconds, cases and share of the wall time), then the total.

    A resumed run has one such block per attempt, oldest first, each row naming its `attempt`, and a
    last row with the wall time of all attempts together.
    """
    attempts = [*record.get("earlier", []), record]
    if len(attempts) == 1:
        return _attempt_rows(record)
    table = [
        {"attempt": number, **row}
        for number, attempt in enumerate(attempts, start=1)
        for row in _attempt_rows(attempt)
    ]
    total = sum(attempt["wall_s"] for attempt in attempts)
    table.append({"attempt": "all", "part": "wall", "seconds": round(total, 3), "cases": None, "share": 1.0})
    return table


def outside_s(record: dict[str, Any]) -> float:
    """The seconds of a record's wall time in no phase: reading the spec, the devices, the run
    directory, stopping the workers. The phases that ran beside the others (`beside`) are left out:
    a record written before it was kept leaves out the precompile wait and, where the phases add up
    to more than the wall time, the precompile."""
    phases = record["phases_s"]
    beside = record.get("beside")
    if beside is None:
        beside = ["precompile_wait"]
        if sum(v for k, v in phases.items() if k not in beside) > record["wall_s"]:
            beside.append("precompile")
    return record["wall_s"] - sum(v for k, v in phases.items() if k not in beside)


def _attempt_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    wall = record["wall_s"] or 1.0
    table = [
        {"part": f"phase {name}", "seconds": seconds, "cases": None, "share": seconds / wall}
        for name, seconds in record["phases_s"].items()
    ]
    outside = outside_s(record)
    table.append(
        {"part": "outside the phases", "seconds": round(outside, 3), "cases": None, "share": outside / wall}
    )
    table += [
        {
            "part": f"adapter {name}",
            "seconds": entry["seconds"],
            "cases": entry["cases"],
            "share": entry["seconds"] / wall,
            "first_call_s": entry.get("first_call_s"),
            "calls_s": entry.get("calls_s"),
            "precompile_s": entry.get("precompile_s"),
            "plan_s": entry.get("plan_s"),
        }
        for name, entry in record["adapters"].items()
    ]
    table.append({"part": "wall", "seconds": record["wall_s"], "cases": None, "share": 1.0})
    return table
