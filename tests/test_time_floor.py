"""`experiments/time_floor.py`: a sweep's measuring time against the least its rows' own calls take."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "experiments" / "time_floor.py"
RUNS = REPO / "results" / "runs"


@pytest.fixture(scope="module")
def time_floor():
    spec = importlib.util.spec_from_file_location("time_floor", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_row_s_floor_counts_its_calls_its_gaps_and_its_series(time_floor):
    rows = pd.DataFrame(
        {
            "kernel": ["a", "b", "c"],
            "median_ms": [2.0, 100.0, 2.0],
            "first_call_s": [0.5, 0.1, 0.5],
            "warmup": [9.0, 2.0, 9.0],
            "reps": [100.0, 5.0, 100.0],
            "note": ["", "timed again from a settled GPU, an idle gap after each call", ""],
            "energy_mj": [1.0, 2.0, None],
        }
    )
    floor = time_floor.floor_s(rows, energy_s=0.25)
    # a: 0.5 s + (9 + 1 + 100) calls of 2 ms; b: 0.1 s + 8 calls of 0.1 s and 5 gaps as long.
    assert floor["calls_s"].round(6).tolist() == [0.72, 1.4, 0.72]
    # The series lasts at least 0.25 s, or one call; a row without energy ran none.
    assert floor["energy_s"].tolist() == [0.25, 0.25, 0.0]


def test_no_committed_fig5_run_took_less_than_its_floor(time_floor):
    # From 2026-12-03 on: the runs before charged energy by a window with no series of its own
    # (`-beside`), or were stopped part way and resumed (their timings hold the resume only).
    runs = [
        run for run in sorted(RUNS.glob("fig5_consttoken-*-h200*")) if run.name.split("-")[1] >= "20261203"
    ]
    assert len(runs) >= 10
    for run in runs:
        table = time_floor.table(run)
        measured = table[table["measured_s"] > 0]
        assert (measured["floor_s"] <= measured["measured_s"]).all(), run.name


def test_it_prints_a_summary_per_run():
    run = RUNS / "fig5_consttoken-20261204-h200-warm"
    out = subprocess.run(
        [sys.executable, str(TOOL), str(run)], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith(f"{run.name}: wall 239 s") and "floor of 152 s" in out and "tfla_sig" in out
