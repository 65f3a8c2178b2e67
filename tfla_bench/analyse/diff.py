"""Two runs of the suite side by side (`tfla-bench diff RUN_A RUN_B`): did anything get slower?

Rows match by case: kernel, mode, dtype, batch, seq_len, heads, head dims, chunk size and params
(`Case.key`). For a case that is `ok` in both runs the ratio is B / A of the medians, and its
noise is the sum of the two runs' relative uncertainties of their medians: `ci_rel` (the
median's 95% interval) where the row has a finite one, else half the p20..p80 spread over the
median (runs timed with fixed reps before `ci_rel` existed), plus the spread between the two runs
(`run_spread`). The verdict is `same` when |ratio - 1| is within that noise, else `faster` or
`slower`.

The spread between the runs is what a case's own calls cannot show: a busy CPU, or a GPU whose
clocks differ from one run to the next, moves every case by more than its interval. It is taken
across both runs, from the cases themselves: three robust standard deviations (1.4826 x the median
absolute deviation) of log(B / A) over the cases ok in both and not throttled. A regression in a
few kernels leaves the median of the other cases where it was, so it still stands out; two runs of
one sweep on a loaded 2-core CPU differ by tens of percent everywhere, and their gate stays quiet.
Below `MIN_SPREAD_CASES` cases the spread is 0 (too few to tell the machine from the code). The
regression gate (`slower_than`) leaves out throttled cases: their time is the power cap's.

A case that is not `ok` in both runs, or whose median is not a finite number above 0, or whose noise
is not finite, is `not comparable`, and its `reason` says why (its two statuses are in the row too).
Per kernel and mode the summary is the geometric mean of the ratios. Cases in one run only are
listed apart, and a different GPU, library version or measurement setting (spec.json: the stop rule,
the L2 flush, the clock, the power-cap policy) between the runs is a warning. A run whose env.json
names a newer results schema is refused, as `compare`, `plot` and `report` refuse it.

The agreement (the shares of cases within 2% and 5%, the largest deviation) is given over all
cases ok in both, per pair of devices (A's, B's) when either run spread its cases over several
GPUs (each GPU's rows against the other run's), and without the cases that either run measured under a power,
thermal or hardware slowdown (`throttled`): a GPU at its power cap runs at lower clocks for as
long as the cap holds, which moves a median by more than the timing's own noise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from tfla_bench.errors import UserError
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.row import ResultRow
from tfla_bench.measure.settings import MeasureSettings, as_recorded
from tfla_bench.plots.base import DPI, MAX_ASPECT, new_figure
from tfla_bench.plots.runs import MODE_TITLES, set_log2_x
from tfla_bench.plots.style import row_style
from tfla_bench.run import rundir

# env.json facts that make two runs' numbers differ for reasons other than the code.
ENV_FACTS = ("gpu_name", "driver", "cuda", "cudnn", "torch", "triton")
# spec.json's settings that change what a row's time means (a case's time limit does not).
MEASURE_SETTINGS = tuple(f.name for f in dataclasses.fields(MeasureSettings) if f.name != "timeout_s")
NOT_COMPARABLE = "not comparable"
VERDICTS = ("faster", "slower", "same", NOT_COMPARABLE)
# The plot's x axis: the first of these case columns that varies between the matched rows.
X_COLUMNS = ("seq_len", "head_dim_v", "chunk_size")
# Fewer cases than this say too little about the spread between two runs (`run_spread`).
MIN_SPREAD_CASES = 10
# What a hollow marker on the plot means.
HOLLOW = "throttled in A or B"
# Labelled ratios on the plot's log y axis.
RATIO_TICKS = (0.1, 0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0)
ROW_COLUMNS = (
    *row_schema.CASE_COLUMNS,
    "params",
    "status_a",
    "status_b",
    "a_ms",
    "b_ms",
    "ratio",
    "noise",
    "verdict",
    "reason",
    "device_a",
    "device_b",
    "throttled",
)


@dataclass
class RunDiff:
    """The comparison of run B with run A.

    Attributes:
        rows: one row per case in both runs (`ROW_COLUMNS`).
        summary: per kernel and mode: matched ok cases, the geometric mean of B/A, and verdict counts.
        only_a, only_b: cases found in one run only (case columns and status).
        warnings: differences between the runs' GPUs, library versions or measurement settings.
    """

    rows: pd.DataFrame
    summary: pd.DataFrame
    only_a: pd.DataFrame
    only_b: pd.DataFrame
    warnings: list[str] = field(default_factory=list)

    def slower_than(self, threshold_pct: float) -> pd.DataFrame:
        """Rows judged slower (beyond their noise) by more than `threshold_pct` percent, but for the
        throttled ones (a power cap's time, not the code's)."""
        rows = self.rows
        slower = (rows["verdict"] == "slower") & (rows["ratio"] > 1 + threshold_pct / 100)
        return rows[slower & (rows["throttled"] != True)]  # noqa: E712 (None: not recorded)

    def changed(self, threshold_pct: float | None = None) -> pd.DataFrame:
        """Rows judged faster or slower beyond their noise, and (given `threshold_pct`) by more than
        that many percent either way; the largest changes first."""
        rows = self.rows[self.rows["verdict"].isin(("faster", "slower"))]
        if threshold_pct is not None:
            rows = rows[(rows["ratio"] - 1).abs() > threshold_pct / 100]
        order = (rows["ratio"] - 1).abs().sort_values(ascending=False, kind="stable").index
        return rows.loc[order]

    def mattering(self) -> pd.DataFrame:
        """The rows a reader looks at first: the changes beyond the noise (`changed`), then the
        cases that could not be compared."""
        return pd.concat([self.changed(), self.rows[self.rows["verdict"] == NOT_COMPARABLE]])

    def agreement(self) -> dict[str, float | int]:
        """How closely the runs agree over the cases ok in both (`agreement_of`)."""
        return agreement_of(self.rows)

    def agreement_by_device(self) -> dict[str, dict[str, float | int]]:
        """`agreement_of` per pair of devices (A's, B's), when either run spread its cases over several
        devices (empty otherwise)."""
        rows = self.rows.dropna(subset=["ratio"])
        devices_a, devices_b = set(rows["device_a"]), set(rows["device_b"])
        if len(devices_a) < 2 and len(devices_b) < 2:
            return {}
        return {
            f"{device_a} in A, {device_b} in B": agreement_of(group)
            for (device_a, device_b), group in rows.groupby(["device_a", "device_b"], sort=True)
        }

    def agreement_unthrottled(self) -> dict[str, float | int] | None:
        """`agreement_of` over the cases that neither run measured while the GPU was throttled; None
        when no case was."""
        rows = self.rows.dropna(subset=["ratio"])
        throttled = rows["throttled"].fillna(False).astype(bool)
        return agreement_of(rows[~throttled]) if throttled.any() else None

    def to_json(self) -> dict[str, Any]:
        def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
            return json.loads(frame.to_json(orient="records"))

        return {
            "agreement": self.agreement(),
            "agreement_by_device": self.agreement_by_device(),
            "agreement_unthrottled": self.agreement_unthrottled(),
            "rows": records(self.rows),
            "summary": records(self.summary),
            "only_a": records(self.only_a),
            "only_b": records(self.only_b),
            "warnings": self.warnings,
        }


def agreement_of(rows: pd.DataFrame) -> dict[str, float | int]:
    """How closely two runs agree over the matched rows ok in both: their count, the shares within 2%
    and 5% (|B/A - 1|), and the largest deviation (the repeatability of a run measured twice)."""
    deviation = (rows["ratio"].dropna() - 1).abs()
    count = len(deviation)
    return {
        "cases": count,
        "within_2pct": float((deviation <= 0.02).mean()) if count else math.nan,
        "within_5pct": float((deviation <= 0.05).mean()) if count else math.nan,
        "max_deviation": float(deviation.max()) if count else math.nan,
    }


def load(run_dir: Path, gpu: str | None = None) -> tuple[list[ResultRow], dict[str, Any]]:
    """A run directory's rows and env.json (an empty env when it has none), as the view of one GPU
    (`rundir.on_one_gpu`: `gpu`, or the run's only one)."""
    run_dir = Path(run_dir)
    path = rundir.require_results(run_dir)
    read = rundir.read_results(path)
    for line in ([read.warning()] if read.skipped else []) + rundir.record_warnings(run_dir):
        print(f"warning: {line}", file=sys.stderr)
    # As `compare`, `plot` and `report` do, a newer schema or an unreadable env.json is refused.
    env = rundir.read_env(run_dir)
    return rundir.on_one_gpu(read.one_per_case(), env, gpu, where=run_dir)


def noise(row: ResultRow) -> float:
    """The relative uncertainty of a row's median: `ci_rel` if finite, else half its p20..p80 spread
    (NaN when that is not finite: a p20 or p80 of inf)."""
    if row.ci_rel is not None and math.isfinite(row.ci_rel):
        return row.ci_rel
    if row.p20_ms is None or row.p80_ms is None or not row.median_ms:
        return 0.0
    spread = (row.p80_ms - row.p20_ms) / 2 / row.median_ms
    return spread if math.isfinite(spread) else math.nan


def not_comparable(a: ResultRow, b: ResultRow) -> str | None:
    """Why the medians of two rows of one case cannot be set against each other, or None."""
    statuses = [f"{row.status} in {name}" for name, row in (("A", a), ("B", b)) if row.status != "ok"]
    if statuses:
        return ", ".join(statuses)
    for name, row in (("A", a), ("B", b)):
        median = row.median_ms
        if median is None or not math.isfinite(median) or median <= 0:
            shown = "missing" if median is None else f"{median:g} ms"
            return f"median of {name} is {shown}, not a finite time above 0"
        if not math.isfinite(noise(row)):
            return f"noise of {name} is not finite (p20 {row.p20_ms:g} ms, p80 {row.p80_ms:g} ms)"
    return None


def verdict(ratio: float, noise_rel: float) -> str:
    """`same` when the change is within the noise, else `faster` (ratio < 1) or `slower`."""
    if abs(ratio - 1) <= noise_rel:
        return "same"
    return "faster" if ratio < 1 else "slower"


@dataclass(frozen=True)
class Change:
    """Row B of a case against row A: the ratio B / A of their medians, its noise (the sum of both
    rows' `noise`), the verdict, and why the rows are `not comparable` (empty when they are)."""

    ratio: float
    noise: float
    verdict: str
    reason: str = ""


def change(a: ResultRow, b: ResultRow) -> Change:
    """B against A by the rule `diff` gates on (module docstring); every view of two runs asks this."""
    reason = not_comparable(a, b)
    ratio = math.nan if reason is not None else b.median_ms / a.median_ms
    if reason is None and not (math.isfinite(ratio) and ratio > 0):
        reason = f"B / A = {b.median_ms:g} / {a.median_ms:g} is not a finite ratio above 0"
    if reason is not None:
        return Change(math.nan, math.nan, NOT_COMPARABLE, reason)
    spread = noise(a) + noise(b)
    return Change(ratio, spread, verdict(ratio, spread))


def diff_runs(run_a: Path, run_b: Path, gpu: str | None = None) -> RunDiff:
    """Compare run B with run A (the rows of `gpu` in each, for runs that mix GPUs); a `UserError`
    when no case is in both."""
    rows_a, env_a = load(run_a, gpu)
    rows_b, env_b = load(run_b, gpu)
    by_key_a = {row.case.key: row for row in rows_a}
    by_key_b = {row.case.key: row for row in rows_b}
    common = [key for key in by_key_a if key in by_key_b]
    if not common:
        raise UserError(f"no case of {run_b} matches a case of {run_a}")
    records = [_compare(by_key_a[key], by_key_b[key]) for key in common]
    table = pd.DataFrame(records, columns=list(ROW_COLUMNS))
    compared = table["verdict"] != NOT_COMPARABLE
    if compared.any():
        noise_rel = table.loc[compared, "noise"] + run_spread(table)
        table.loc[compared, "noise"] = noise_rel
        table.loc[compared, "verdict"] = [
            verdict(ratio, spread)
            for ratio, spread in zip(table.loc[compared, "ratio"], noise_rel, strict=True)
        ]
    only_a = _cases([row for key, row in by_key_a.items() if key not in by_key_b])
    only_b = _cases([row for key, row in by_key_b.items() if key not in by_key_a])
    warnings = env_warnings(env_a, env_b) + settings_warnings(run_a, run_b)
    return RunDiff(table, summarize(table), only_a, only_b, warnings)


def run_spread(table: pd.DataFrame) -> float:
    """The relative change between two runs that every case may show (module docstring): three
    robust standard deviations of log(B / A) over the cases ok in both and not throttled; 0 below
    `MIN_SPREAD_CASES` of them."""
    steady = table[(table["verdict"] != NOT_COMPARABLE) & (table["throttled"] != True)]  # noqa: E712
    if len(steady) < MIN_SPREAD_CASES:
        return 0.0
    logs = steady["ratio"].astype(float).map(math.log)
    deviation = (logs - logs.median()).abs().median()
    return math.expm1(3 * 1.4826 * deviation)


def _compare(a: ResultRow, b: ResultRow) -> dict[str, Any]:
    flags = [row.throttled for row in (a, b) if row.throttled is not None]
    record = {
        **_case_cells(a),
        "status_a": a.status,
        "status_b": b.status,
        "device_a": a.device,
        "device_b": b.device,
        "throttled": any(flags) if flags else None,
    }
    record.update(a_ms=a.median_ms, b_ms=b.median_ms)
    found = change(a, b)
    record.update(ratio=found.ratio, noise=found.noise, verdict=found.verdict, reason=found.reason)
    return record


def _case_cells(row: ResultRow) -> dict[str, Any]:
    cells = {column: getattr(row.case, column) for column in row_schema.CASE_COLUMNS}
    cells["params"] = " ".join(f"{k}={v}" for k, v in sorted(row.case.params.items()))
    return cells


def display(frame: pd.DataFrame) -> pd.DataFrame:
    """A table for the terminal: the shape columns folded into one `shape` cell."""
    chunk = frame["chunk_size"].map(lambda value: "" if pd.isna(value) else f" L{int(value)}")
    shape = (
        "B"
        + frame["batch"].astype(str)
        + " T"
        + frame["seq_len"].astype(str)
        + " H"
        + frame["num_heads"].astype(str)
        + " Dqk"
        + frame["head_dim_qk"].astype(str)
        + " Dv"
        + frame["head_dim_v"].astype(str)
        + chunk
    )
    rest = [column for column in frame.columns if column not in row_schema.CASE_COLUMNS[3:]]
    return frame[rest].assign(shape=shape)[[*rest[:3], "shape", *rest[3:]]]


def _cases(rows: list[ResultRow]) -> pd.DataFrame:
    columns = [*row_schema.CASE_COLUMNS, "params", "status"]
    return pd.DataFrame([{**_case_cells(row), "status": row.status} for row in rows], columns=columns)


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per kernel and mode: ok cases in both runs, the geometric mean of B/A and the verdict counts."""
    records = []
    for (kernel, mode), group in table.groupby(["kernel", "mode"], sort=True):
        ratios = group["ratio"].dropna()
        counts = group["verdict"].value_counts()
        records.append(
            {
                "kernel": kernel,
                "mode": mode,
                "cases": len(ratios),
                "geomean_ratio": math.exp(ratios.map(math.log).mean()) if len(ratios) else math.nan,
                **{name: int(counts.get(name, 0)) for name in VERDICTS},
            }
        )
    return pd.DataFrame(records, columns=["kernel", "mode", "cases", "geomean_ratio", *VERDICTS])


def env_warnings(env_a: dict[str, Any], env_b: dict[str, Any]) -> list[str]:
    """One line per GPU or library fact (env.json, its `packages` included) that differs between runs."""
    facts_a = {**{k: env_a.get(k) for k in ENV_FACTS}, **(env_a.get("packages") or {})}
    facts_b = {**{k: env_b.get(k) for k in ENV_FACTS}, **(env_b.get("packages") or {})}
    return [
        f"{name} differs: A {facts_a.get(name)}, B {facts_b.get(name)}"
        for name in dict.fromkeys([*facts_a, *facts_b])
        if name != "tfla-bench" and facts_a.get(name) != facts_b.get(name)
    ]


def settings_warnings(run_a: Path, run_b: Path) -> list[str]:
    """One line per measurement setting of spec.json (`MeasureSettings`) that differs between
    the runs; a setting one run's spec.json does not record is "not recorded"."""
    recorded = []
    for run_dir in (run_a, run_b):
        try:
            recorded.append(json.loads((Path(run_dir) / rundir.SPEC).read_text()))
        except (OSError, ValueError):
            return []  # a run without a readable spec.json: nothing to compare
        if not isinstance(recorded[-1], dict):
            return []  # nor one whose spec.json holds no spec
    spec_a, spec_b = (as_recorded(spec) for spec in recorded)
    return [
        f"measurement setting {name} differs: A {spec_a.get(name, 'not recorded')}, "
        f"B {spec_b.get(name, 'not recorded')}"
        for name in MEASURE_SETTINGS
        if (name in spec_a or name in spec_b) and spec_a.get(name) != spec_b.get(name)
    ]


def ratio_figure(run_diff: RunDiff, title: str) -> Figure:
    """B/A per matched ok case: one panel per mode, log y, each kernel in its own style
    (`tfla_bench.plots.style`), hollow where either run was throttled, the legend outside the
    panels; x is the first of seq_len, head_dim_v and chunk_size that takes more than one value
    (seq_len if none does)."""
    ok = run_diff.rows.dropna(subset=["ratio"])
    x = next((column for column in X_COLUMNS if ok[column].nunique() > 1), X_COLUMNS[0])
    modes = [mode for mode in MODE_TITLES if mode in set(ok["mode"])] or ["fw"]
    width = 5.5 * len(modes) + 2.0
    fig = new_figure(width, max(4.8, width / MAX_ASPECT))
    fig.set_dpi(DPI)
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    entries: dict[str, Any] = {}  # the legend: one filled marker per kernel
    for ax, mode in zip(axes, modes, strict=True):
        rows = ok[(ok["mode"] == mode) & ok[x].notna()]
        for kernel, group in rows.groupby("kernel", sort=True):
            family = str(group["family"].iloc[0]) if "family" in group else ""
            style = row_style(kernel, family)
            slowed = group["throttled"].fillna(False).astype(bool)
            for part, hollow in ((group[~slowed], False), (group[slowed], True)):
                if len(part):
                    ax.errorbar(
                        part[x].astype(float),
                        part["ratio"],
                        yerr=part["noise"] * part["ratio"],
                        fmt=style.marker,
                        color=style.color,
                        markerfacecolor="none" if hollow else style.color,
                        alpha=0.85,
                        capsize=2,
                    )
            entries.setdefault(kernel, Line2D([], [], marker=style.marker, color=style.color, ls=""))
        ax.axhline(1.0, color="#555", linewidth=1)
        ax.set_yscale("log")
        if len(rows):
            set_log2_x(ax, sorted(set(rows[x].astype(float))))
            low = min(rows["ratio"].min() / 1.05, 0.95)
            high = max(rows["ratio"].max() * 1.05, 1.05)
            ax.set_ylim(low, high)
            ticks = [tick for tick in RATIO_TICKS if low <= tick <= high]
            ax.set_yticks(ticks, labels=[f"{tick:g}" for tick in ticks])
            ax.minorticks_off()
        ax.set_title(MODE_TITLES.get(mode, mode))
        ax.set_xlabel(f"{x.replace('_', ' ')} [{'elements' if x == 'head_dim_v' else 'tokens'}]")
        ax.set_ylabel("runtime B / A (below 1: B faster)")
        ax.grid(True, which="both", alpha=0.3)
    entries = dict(sorted(entries.items()))
    if ok["throttled"].fillna(False).astype(bool).any():
        entries[f"hollow: {HOLLOW}"] = Line2D([], [], marker="o", color="#555", markerfacecolor="none", ls="")
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside right center", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig
