"""The few facts a reader of a run comes for, computed once for the report's opening section.

- `what_ran`: the spec, kernels, modes, lengths and dtypes, the GPU, and how many rows ran;
- `fastest_per_length`: per shape (one row per sequence length in a Fig. 5 sweep) the fastest
  kernel of each mode, its time and the runner-up;
- `ours_against_official`: each of our kernels against the official kernel that answers to the
  same published series (`KernelMapping.adapters`: ours first, the official peer next), as the
  median ratio over the shapes both ran, each at its fastest chunk size;
- `findings`: what needs the reader's attention, each with what to check or run.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tfla_bench.adapters.registry import NO_SPEED_CLAIM
from tfla_bench.analyse.compare import SHORT_NAMES, Run
from tfla_bench.analyse.published import mappings
from tfla_bench.measure import row as row_schema
from tfla_bench.run.profiling import MODEL_OFF, bytes_by_kernel

# The columns that make one measured shape, whichever kernel or chunk size ran it.
SHAPE = ["mode", "dtype", "batch", "seq_len", "num_heads", "head_dim_qk", "head_dim_v"]


@dataclass(frozen=True)
class Finding:
    """Something in a run that needs the reader's attention, and what to do about it."""

    what: str
    todo: str


def _ok(results: pd.DataFrame) -> pd.DataFrame:
    return results[(results["status"] == "ok") & (results["median_ms"] > 0)]


def _no_speed_claim(results: pd.DataFrame) -> pd.Series:
    """The rows whose note says their time is no speed claim (a kernel run in Triton's interpreter)."""
    if "note" not in results:
        return pd.Series(False, index=results.index)
    return results["note"].fillna("").astype(str).str.contains(NO_SPEED_CLAIM, regex=False)


def _timed(results: pd.DataFrame) -> pd.DataFrame:
    """The ok rows whose times may be set against each other: not those that are no speed claim."""
    ok = _ok(results)
    return ok[~_no_speed_claim(ok)]


def _span(values: pd.Series) -> str:
    found = sorted(int(v) for v in values.dropna().unique())
    if not found:
        return "none"
    return str(found[0]) if len(found) == 1 else f"{found[0]}–{found[-1]} ({len(found)} lengths)"


def what_ran(run: Run, gpu: str) -> str:
    """One sentence: the spec, its kernels, modes, lengths and dtypes, the GPU, and how many rows ran."""
    results = run.results
    ran = int((results["status"] == "ok").sum())
    modes = " and ".join(sorted(results["mode"].unique()))
    dtypes = ", ".join(sorted(results["dtype"].unique()))
    return (
        f"{run.spec}: {results['kernel'].nunique()} kernels, {modes}, sequence length "
        f"{_span(results['seq_len'])}, {dtypes}, on {gpu}; {ran} of {len(results)} rows ran."
    )


def _shape_columns(ok: pd.DataFrame) -> list[str]:
    """The columns that tell one compared shape from another: mode, dtype, batch and sequence length,
    and a head count or head dim only where one kernel ran several (Fig. 17's head-dim sweep). Each
    kernel family of Fig. 5 runs its own heads and head dims at the same embedding: one shape."""
    within = ok.groupby("kernel")[SHAPE[4:]].nunique().max()
    return [*SHAPE[:4], *(c for c in SHAPE[4:] if within[c] > 1)]


def _best_per_kernel(ok: pd.DataFrame, shape: list[str]) -> pd.DataFrame:
    """Each kernel's fastest row per shape (over its chunk sizes and params)."""
    return ok.sort_values("median_ms", kind="stable").drop_duplicates([*shape, "kernel"])


def fastest_per_length(results: pd.DataFrame) -> pd.DataFrame:
    """Per shape, the fastest kernel of each mode, its median time and the runner-up with its slowdown.

    Returns:
        One row per shape (`_shape_columns`) without the mode: the shape values that vary in the
        run (`T` always, e.g. `B` in a constant-token sweep), then per mode `<mode>: fastest`,
        `<mode>: ms` and `<mode>: next` (`fa4 ×1.15`: the runner-up takes 1.15 times as long).
        Empty when no row ran.
    """
    ok = _timed(results)
    if ok.empty:
        return pd.DataFrame()
    shape = _shape_columns(ok)
    best = _best_per_kernel(ok, shape)
    shown = ["seq_len", *(c for c in shape[1:] if c != "seq_len" and best[c].nunique() > 1)]
    rows: dict[tuple, dict[str, object]] = {}
    for key, group in best.groupby([*shown, "mode"], sort=True):
        *values, mode = key
        ranked = group.sort_values("median_ms", kind="stable")
        first = ranked.iloc[0]
        names = {SHORT_NAMES.get(c, c): v for c, v in zip(shown, values, strict=True)}
        entry = rows.setdefault(tuple(values), names)
        entry[f"{mode}: fastest"] = first["kernel"]
        entry[f"{mode}: ms"] = first["median_ms"]
        if len(ranked) > 1:
            second = ranked.iloc[1]
            entry[f"{mode}: next"] = f"{second['kernel']} ×{second['median_ms'] / first['median_ms']:.2f}"
    return pd.DataFrame(list(rows.values()))


def own_kernels() -> dict[str, tuple[str, ...]]:
    """Our kernels with the official kernels that answer to the same published series."""
    return {m.adapters[0]: m.adapters[1:] for m in mappings() if len(m.adapters) > 1}


def _status_note(rows: pd.DataFrame) -> str:
    counts = rows.loc[rows["status"] != "ok", "status"].value_counts()
    return ", ".join(f"{status} ×{n}" for status, n in sorted(counts.items()))


def ours_against_official(results: pd.DataFrame) -> pd.DataFrame:
    """Each of our kernels in the run against each official peer in it, per mode.

    Returns:
        Columns `ours`, `official`, `mode`, `shapes` (both ran), `median ours / official`, `min`,
        `max` (< 1: ours is faster) and `note` (the statuses of a side that did not run).
    """
    columns = ["ours", "official", "mode", "shapes", "median ours / official", "min", "max", "note"]
    ok = _timed(results)
    shape = _shape_columns(ok) if not ok.empty else SHAPE
    best = _best_per_kernel(ok, shape)
    present = set(results["kernel"])
    rows = []
    for ours, peers in own_kernels().items():
        for peer in (p for p in peers if ours in present and p in present):
            for mode in sorted(results.loc[results["kernel"].isin([ours, peer]), "mode"].unique()):
                mine, theirs = (best[(best["kernel"] == k) & (best["mode"] == mode)] for k in (ours, peer))
                both = mine.merge(theirs, on=shape, suffixes=("", "_peer"))
                ratio = both["median_ms"] / both["median_ms_peer"]
                sides = results[results["kernel"].isin([ours, peer]) & (results["mode"] == mode)]
                note = "; ".join(
                    f"{k}: {text}"
                    for k in (ours, peer)
                    if (text := _status_note(sides[sides["kernel"] == k]))
                )
                stats = (ratio.median(), ratio.min(), ratio.max()) if len(ratio) else (None,) * 3
                rows.append((ours, peer, mode, len(ratio), *stats, note))
    return pd.DataFrame(rows, columns=columns)


def _kernels_modes(rows: pd.DataFrame) -> str:
    counts = rows.groupby(["kernel", "mode"], sort=True).size()
    return ", ".join(f"{kernel} {mode} ×{n}" for (kernel, mode), n in counts.items())


def _not_run(run: Run) -> Finding | None:
    failed = run.results[run.results["status"] != "ok"]
    if failed.empty:
        return None
    counts = failed["status"].value_counts()
    statuses = ", ".join(f"{status} ×{n}" for status, n in sorted(counts.items()))
    todo = "'Rows that did not run' gives each reason once."
    if "unavailable" in counts:
        todo += " `tfla-bench list` names how to install each unavailable kernel."
    rerun = sorted(set(counts.index) & set(row_schema.RERUNNABLE_STATUSES))
    if rerun:
        todo += f" `tfla-bench sweep --resume {run.run_dir} --retry {','.join(rerun)}` runs those rows again."
    return Finding(f"{len(failed)} of {len(run.results)} rows did not run ({statuses}).", todo)


def above_roof(run: Run, table: pd.DataFrame) -> Finding | None:
    """The finding for points above the measured roof (`roof_check`'s `above_roof` rows of `table`)."""
    above = table[table["above_roof"]]
    if above.empty:
        return None
    excess = (above["achieved_flops_per_s"] / above["roof_flops_per_s"]).max() - 1
    kernels = sorted(above["kernel"].unique())
    modes = ",".join(sorted(above["mode"].unique()))
    by_model = (above["intensity_basis"] == "model").any()
    first = (
        f"`tfla-bench profile {run.run_dir} -k {','.join(kernels)} --mode {modes}` places them by the DRAM "
        "bytes ncu measures (the model's bytes may count traffic the kernel keeps in L2 or shared memory); "
        "a point still above the roof then has a FLOP count too high in its adapter's flops() (check it "
        "against `tfla-bench model flops`) or a timing that stops before the GPU is done."
        if by_model
        else "ncu's bytes place them, so the FLOP count in the adapter's flops() is too high (check it "
        "against `tfla-bench model flops`) or the timing stops before the GPU is done."
    )
    return Finding(
        f"{len(above)} point(s) lie above the measured roof, by up to {excess:.0%}: {_kernels_modes(above)}.",
        first,
    )


def _throttled(run: Run) -> Finding | None:
    results = run.results
    if "throttled" not in results:
        return None
    slowed = results[(results["status"] == "ok") & (results["throttled"].astype(str).str.lower() == "true")]
    if slowed.empty:
        return None
    return Finding(
        f"{len(slowed)} row(s) were measured while the GPU throttled (power cap or slowdown, from NVML): "
        f"{_kernels_modes(slowed)}.",
        "Their times may be slow: ringed in the runtime figures. Check the GPU's power limit and cooling "
        "(`nvidia-smi -q -d PERFORMANCE`), measure them again in a new sweep, and "
        "`tfla-bench diff` the two runs.",
    )


def _interpreted(run: Run) -> Finding | None:
    rows = _ok(run.results)
    rows = rows[_no_speed_claim(rows)]
    if rows.empty:
        return None
    note = str(rows["note"].iloc[0])
    return Finding(
        f"{len(rows)} row(s) carry no speed claim ({note}): {_kernels_modes(rows)}.",
        "They are left out of the fastest kernels above; a run on a GPU measures their speed.",
    )


def _model_off(table: pd.DataFrame) -> Finding | None:
    summary = bytes_by_kernel(table)
    off = summary[summary["model_off"]] if not summary.empty else summary
    if off.empty:
        return None
    names = ", ".join(
        f"{k} {m} ({r:.2f})" for k, m, r in zip(off["kernel"], off["mode"], off["median"], strict=True)
    )
    return Finding(
        f"The model's bytes differ from ncu's by more than {MODEL_OFF:.0%} (model / measured): {names}.",
        "Check the adapter's bytes() against what the kernel reads and writes; the roofline places "
        "these kernels by ncu's bytes meanwhile.",
    )


def findings(run: Run, roof_table: pd.DataFrame) -> list[Finding]:
    """What needs the reader's attention in a run, each with what to do.

    Args:
        run: from `load_run`.
        roof_table: `roof_check` of the run's rows and its measured roofs.
    """
    found = [_not_run(run), _interpreted(run), above_roof(run, roof_table), _throttled(run)]
    found.append(_model_off(roof_table))
    if run.skipped:
        found.append(
            Finding(
                run.skipped,
                f"They were left out; `tfla-bench sweep --resume {run.run_dir}` measures their cases again.",
            )
        )
    return [f for f in found if f is not None]


def most_often_fastest(fastest: pd.DataFrame) -> str:
    """One sentence from `fastest_per_length`: per mode, the kernel fastest at the most shapes."""
    parts = []
    for column in (c for c in fastest.columns if c.endswith(": fastest")):
        counts = fastest[column].value_counts()
        mode = column.removesuffix(": fastest")
        parts.append(f"{mode}: {counts.index[0]} at {counts.iloc[0]} of {counts.sum()}")
    return f"Fastest most often: {'; '.join(parts)}."


def ours_first(summary: pd.DataFrame, ours: dict[str, tuple[str, ...]]) -> pd.DataFrame:
    """The rows of `summary` (a `kernel` column) for our kernels, each followed by its official peers,
    so a pair reads as adjacent lines; all rows when the run has none of ours."""
    order = [name for own, peers in ours.items() for name in (own, *peers)]
    mine = summary[summary["kernel"].isin(order)]
    if mine.empty:
        return summary
    rank = mine["kernel"].map(order.index)
    return mine.assign(_rank=rank).sort_values(["_rank", "mode"], kind="stable").drop(columns="_rank")
