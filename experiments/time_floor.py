"""Where a sweep's measuring time went, against the least its rows' own calls could take.

python experiments/time_floor.py RUN [RUN ...]

For each run (a sweep's folder with results.csv and timings.json), per adapter: the seconds the sweep
spent on it (`timings.json`), and the floor its ok rows set at the run's own settings: the first call,
every call after it (warm-up, including a first series that a power cap cut short, the call that
measures peak memory, the timed calls) at the row's median, the idle gap after each timed call of a
case timed again from a settled GPU (`power_cap = "gaps"`, docs/timing.md), and, for a row with
energy, its series of at least `energy_s` seconds (docs/energy.md). What the floor leaves out is
what the method spends besides calls: the settle before each case, the L2 flush and spin before each
timed call, the counter's updates around each series, the inputs, the processes. Without the floor
no setting of those can bring a run below it; below it only fewer or shorter calls can.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from tfla_bench.measure.settings import BEFORE_RECORDED

GAPS_NOTE = "an idle gap after each call"


def floor_s(rows: pd.DataFrame, energy_s: float) -> pd.DataFrame:
    """Per ok row: `calls_s` (first call, warm-up, peak and timed calls, gaps) and `energy_s` (its series)."""
    call_s = rows["median_ms"] / 1e3
    calls = rows["first_call_s"].fillna(0) + (rows["warmup"].fillna(0) + 1 + rows["reps"]) * call_s
    gaps = rows["note"].fillna("").str.contains(GAPS_NOTE, regex=False)
    calls = calls + gaps * rows["reps"] * call_s
    series = rows["energy_mj"].notna() * call_s.clip(lower=energy_s)
    return pd.DataFrame({"kernel": rows["kernel"], "calls_s": calls, "energy_s": series})


def table(run: Path) -> pd.DataFrame:
    """One row per adapter: cases, measured seconds, the floor and its parts."""
    rows = pd.read_csv(run / "results.csv")
    spec = json.loads((run / "spec.json").read_text())
    spent = json.loads((run / "timings.json").read_text())
    ok = rows[rows["status"] == "ok"]
    parts = floor_s(ok, float(spec.get("energy_s", BEFORE_RECORDED["energy_s"]))).groupby("kernel").sum()
    measured = pd.Series(
        {name: entry["seconds"] for name, entry in spent["adapters"].items()}, name="measured_s"
    )
    out = parts.join(measured, how="outer").fillna(0.0)
    out.insert(0, "ok_rows", ok.groupby("kernel").size().reindex(out.index).fillna(0).astype(int))
    out["floor_s"] = out["calls_s"] + out["energy_s"]
    out["floor_share"] = out["floor_s"] / out["measured_s"].where(out["measured_s"] > 0)
    return out.sort_values("measured_s", ascending=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    for run in args.runs:
        out = table(run)
        spent = json.loads((run / "timings.json").read_text())
        total = out[["ok_rows", "calls_s", "energy_s", "floor_s", "measured_s"]].sum()
        measuring = spent["phases_s"].get("measuring", 0)
        print(
            f"{run.name}: wall {spent['wall_s']:.0f} s, measuring {measuring:.0f} s;"
            f" the adapters {total['measured_s']:.0f} s against a floor of {total['floor_s']:.0f} s"
            f" (calls {total['calls_s']:.0f} s, energy series {total['energy_s']:.0f} s) over"
            f" {int(total['ok_rows'])} ok rows"
        )
        print(out.round(2).to_string(), end="\n\n")


if __name__ == "__main__":
    main()
