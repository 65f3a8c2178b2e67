"""Set a measured run beside the paper's published numbers.

A run directory (`runs/<spec>-<timestamp>/`) holds `results.csv` (one row per case) and
`env.json`. `load_run` reads both; `compare_run` joins the rows with a published data set on
kernel (through `tfla_bench.analyse.published.mappings`), mode, dtype, batch, seq_len, heads, head dims
and chunk size, and gives the ratio measured / published of the median runtime and of the peak
memory. Rows of either side without a counterpart are kept, each with the reason.

With `normalize="roofline"` each side's runtime is also divided by its own GPU's roofline bound
for that case, max(FLOPs / peak, bytes / bandwidth) with the row's analytic FLOPs and bytes, so
a run on an H200 can be set beside the paper's H100 numbers: a normalized ratio of 1 means the
same fraction of the hardware limit. The published GPU is taken as an H100 SXM (the README does
not record the variant).

Peak memory is compared as recorded: the published numbers include the inputs, the gradients and
the benchmark's 256 MB L2-flush buffer; ours include what the runner's settings allocate.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from tfla_bench.analyse.published import (
    CASE_KEYS,
    PUBLISHED_GPU_NAME,
    PUBLISHED_GPU_NOTE,
    UNMAPPED,
    load_published,
    mapping_for_adapter,
    mapping_for_published,
    param_default,
    published_cases,
)
from tfla_bench.errors import UserError
from tfla_bench.model.hardware import Accelerator, detect_accelerator
from tfla_bench.model.roofline import runtime_ms_lower
from tfla_bench.run import rundir
from tfla_bench.run.profiling import join_profile
from tfla_bench.run.rundir import RunGpu

NORMALIZE_CHOICES = ("none", "roofline")
SHAPE_COLUMNS = ("batch", "seq_len", "num_heads", "head_dim_qk", "head_dim_v", "chunk_size")
SHORT_NAMES = {
    "batch": "B",
    "seq_len": "T",
    "num_heads": "H",
    "head_dim_qk": "Dqk",
    "head_dim_v": "Dv",
    "chunk_size": "L",
}


@dataclass
class Run:
    """One run directory: its result rows and its environment.

    Attributes:
        run_dir: the directory.
        results: the readable rows of `results.csv`, one per case (`chunk_size` as nullable Int64,
            `param_*` values as bool, int, float or str, empty text cells as NaN), joined with the
            Nsight Compute columns of `profile.csv` where the run has one (`tfla_bench.run.profiling`).
        env: `env.json` (gpu_name, spec, published, packages, measurement, ...).
        gpu: the run's GPU and its accelerator in the model, resolved once from `env.json`.
        skipped: the warning about unreadable rows of `results.csv`, or None when every row read.
    """

    run_dir: Path
    results: pd.DataFrame
    env: dict[str, Any]
    gpu: RunGpu
    skipped: str | None = None

    @property
    def gpu_name(self) -> str:
        return self.gpu.name

    @property
    def spec(self) -> str:
        return str(self.env.get("spec") or self.run_dir.name)

    @property
    def published(self) -> str | None:
        return self.env.get("published") or None


def param_columns(df: pd.DataFrame) -> list[str]:
    """The `param_*` columns of a results frame, sorted."""
    return sorted(c for c in df.columns if c.startswith("param_"))


def load_run(run_dir: Path | str, gpu: str | None = None, flag: str = "--gpu") -> Run:
    """Read a run directory's `results.csv` and `env.json` (through `tfla_bench.run.rundir`), as the view
    of one GPU (`rundir.on_one_gpu`): rows measured on different GPUs never meet in one table.

    Rows that cannot be read (a torn last line, garbage) are left out, and one warning line on
    stderr says how many and why.

    Args:
        run_dir: a directory written by `tfla-bench sweep` / `run`.
        gpu: keep the rows of this GPU (and the rows of no GPU); None for a run of one GPU.
        flag: the option that picks the GPU, for messages.

    Raises:
        UserError: the directory, `results.csv` or `env.json` is missing, the CSV has no readable
            rows or a header that is not a results header, it holds two different rows of one case,
            env.json is not JSON, or the run mixes GPUs and `gpu` picks none of them.
    """
    run_dir = Path(run_dir)
    results_path = rundir.require_results(run_dir)
    read = rundir.read_results(results_path)
    if not read.header:
        raise UserError(f"{results_path} is empty")
    if not read.rows:
        raise UserError(f"{results_path} has no readable result rows")
    if not (run_dir / rundir.ENV).is_file():
        raise UserError(f"{run_dir} has no {rundir.ENV}")
    env = rundir.read_env(run_dir)
    skipped = read.warning()
    for line in ([skipped] if skipped else []) + rundir.record_warnings(run_dir):
        print(f"warning: {line}", file=sys.stderr)
    rows = read.one_per_case()
    rows, env = rundir.on_one_gpu(rows, env, gpu, where=run_dir, flag=flag)
    results = pd.DataFrame.from_records([row.values() for row in rows])
    results["chunk_size"] = pd.to_numeric(results["chunk_size"], errors="coerce").astype("Int64")
    for column in ("median_ms", "peak_memory_bytes", "flops", "bytes"):
        results[column] = pd.to_numeric(results[column], errors="coerce").astype(float)
    for column in ("device", "error", "note"):
        results[column] = results[column].mask(results[column] == "")
    for column in param_columns(results):
        results[column] = results[column].astype(object)
    results = join_profile(results, run_dir)
    return Run(run_dir=run_dir, results=results, env=env, gpu=rundir.run_gpu(env), skipped=skipped)


def resolve_published_name(run: Run, name: str | None) -> str | None:
    """The published data set to use: `name` if given (`"none"` for none), else the run's env.json field."""
    if name is None:
        return run.published
    if name.strip().lower() == "none":
        return None
    return name


@dataclass
class Comparison:
    """A run joined with a published data set.

    Attributes:
        published_name: the data set (`figure` value).
        measured_gpu: the run's GPU (env.json `gpu_name`).
        published_gpu: the paper's GPU, as stated by the published README.
        normalize: `"none"` or `"roofline"`.
        matched: one row per run row with a published counterpart: `row_id` (the row's index in
            `Run.results`), the run's columns, `published_row` (the row's index in the data set),
            `status`, `published_kernel`, `published_label`, `published_status`, `measured_ms`,
            `published_ms`, `runtime_ratio`, `measured_peak_memory_bytes`,
            `published_peak_memory_bytes`, `memory_ratio`, `flops`, `bytes`; with roofline
            normalization also `measured_bound_ms`, `published_bound_ms`, `measured_normalized`,
            `published_normalized`, `normalized_ratio`.
        measured_only: run rows without a counterpart, with `row_id` and `reason`.
        published_only: published rows no run row matched, with `published_row` and `reason`.
        measured_accelerator: the model's spec of the run's GPU (None if unknown).
        published_accelerator: the model's spec of the paper's GPU.
    """

    published_name: str
    measured_gpu: str
    published_gpu: str
    normalize: str
    matched: pd.DataFrame
    measured_only: pd.DataFrame
    published_only: pd.DataFrame
    measured_accelerator: Accelerator | None
    published_accelerator: Accelerator | None

    def plain(self) -> Comparison:
        """The comparison without its roofline-normalized columns, as `normalize="none"` gives it."""
        matched = self.matched.drop(columns=[c for c in _NORMALIZED_COLUMNS if c in self.matched])
        return replace(self, normalize="none", matched=matched)


def _ratio(numerator: float, denominator: float) -> float:
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator <= 0:
        return math.nan
    return numerator / denominator


def _measured_param(row: Mapping[str, Any], adapter: str, name: str) -> Any:
    value = row.get(f"param_{name}")
    if value is not None and not pd.isna(value):
        return value
    return param_default(adapter, name)


def _chunk_fits(measured: Any, published: Any, match_chunk: bool) -> bool:
    measured_na, published_na = pd.isna(measured), pd.isna(published)
    if match_chunk:
        return not measured_na and not published_na and int(measured) == int(published)
    return measured_na or published_na or int(measured) == int(published)


def _describe_miss(row: Mapping[str, Any], candidates: list[dict[str, Any]]) -> str:
    """Why a run row matched no published row, given the candidates that share its kernel, mode and shape."""
    adapter = row["kernel"]
    mapping = mapping_for_adapter(adapter)
    if mapping is None:
        return f"no published kernel maps to adapter {adapter!r}"
    if not candidates:
        return f"no published {mapping.published_kernel} row at this mode/dtype/shape"
    published_chunks = [candidate["published_chunk_size"] for candidate in candidates]
    fitting = [_chunk_fits(row["chunk_size"], c, mapping.uses_chunk_size) for c in published_chunks]
    if not any(fitting):
        sizes = ", ".join(str(int(c)) for c in sorted({c for c in published_chunks if not pd.isna(c)}))
        return f"no published row at chunk size {row['chunk_size']} (published: {sizes})"
    wanted = ", ".join(f"{k}={v}" for k, v in mapping.params.items())
    got = ", ".join(f"{k}={_measured_param(row, adapter, k)}" for k in mapping.params)
    return f"params differ: published {wanted}, run {got}"


def compare_run(run: Run, published_name: str, normalize: str = "none") -> Comparison:
    """Join a run's rows with the published data set `published_name`.

    Args:
        run: from `load_run`.
        published_name: a `figure` value of the published CSVs (or a CSV stem).
        normalize: `"none"`, or `"roofline"` to add each side's runtime divided by its GPU's
            roofline bound (`runtime_ms_lower` of the row's FLOPs and bytes).

    Raises:
        UserError: unknown data set or normalize value; roofline normalization for a GPU the
            model does not know.
    """
    if normalize not in NORMALIZE_CHOICES:
        raise UserError(f"--normalize must be one of {', '.join(NORMALIZE_CHOICES)}, got {normalize!r}")
    published = load_published(published_name)
    measured_acc = run.gpu.accelerator
    published_acc = detect_accelerator(PUBLISHED_GPU_NAME)
    if normalize == "roofline" and measured_acc is None:
        raise UserError(
            f"cannot normalize by the roofline: GPU {run.gpu_name!r} is not in the model's accelerator table"
        )
    results = run.results.reset_index(drop=True)
    accelerators = (measured_acc, published_acc) if normalize == "roofline" else None
    matched, measured_only = _match_rows(results, published, accelerators)
    used = {int(row["published_row"]) for row in matched}
    matched_columns = ["row_id", *results.columns, *_PUBLISHED_SIDE]
    if normalize == "roofline":
        matched_columns += list(_NORMALIZED_COLUMNS)
    return Comparison(
        published_name=published_name,
        measured_gpu=run.gpu_name,
        published_gpu=PUBLISHED_GPU_NOTE,
        normalize=normalize,
        matched=pd.DataFrame(matched, columns=matched_columns),
        measured_only=pd.DataFrame(measured_only, columns=["row_id", *results.columns, "reason"]),
        published_only=_published_only(published, used, set(results["kernel"])),
        measured_accelerator=measured_acc,
        published_accelerator=published_acc,
    )


# The columns a matched row adds to the run's columns, before any normalized ones.
_PUBLISHED_SIDE = (
    "published_row",
    "published_kernel",
    "published_label",
    "published_status",
    "measured_ms",
    "published_ms",
    "runtime_ratio",
    "measured_peak_memory_bytes",
    "published_peak_memory_bytes",
    "memory_ratio",
)


def _fitting(row: Mapping[str, Any], candidates: list[dict[str, Any]]) -> list[int]:
    """The positions in `candidates` (the published rows that share a run row's kernel, mode and
    shape) of those whose chunk size and params fit it."""
    return [
        position
        for position, candidate in enumerate(candidates)
        if _chunk_fits(row["chunk_size"], candidate["published_chunk_size"], candidate["match_chunk"])
        and all(_measured_param(row, row["kernel"], k) == v for k, v in candidate["required_params"].items())
    ]


def _match_rows(
    results: pd.DataFrame, published: pd.DataFrame, accelerators: tuple[Accelerator, Accelerator] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each run row as a matched entry (exactly one published row fits it) or a run-only one with
    the reason; `accelerators` (the run's and the paper's) add the roofline-normalized columns."""
    keyed = results.assign(row_id=results.index)
    cases = published_cases(published).rename(columns={"chunk_size": "published_chunk_size"})
    candidates = keyed.merge(cases, on=list(CASE_KEYS), how="inner")
    # Plain dicts: a pandas row per run row (or a frame of its candidates), read cell by cell, took
    # most of a report's comparison.
    by_row: dict[Any, list[dict[str, Any]]] = {}
    for candidate in candidates.to_dict("records"):
        by_row.setdefault(candidate["row_id"], []).append(candidate)
    matched: list[dict[str, Any]] = []
    measured_only: list[dict[str, Any]] = []
    for row_id, row in zip(keyed.index, keyed[list(results.columns)].to_dict("records"), strict=True):
        group = by_row.get(row_id, [])
        fits = _fitting(row, group)
        record = {"row_id": row_id, **row}
        if len(fits) != 1:
            reason = (
                f"ambiguous: {len(fits)} published rows match" if len(fits) else _describe_miss(row, group)
            )
            measured_only.append({**record, "reason": reason})
            continue
        matched.append({**record, **_published_side(row, group[fits[0]], accelerators)})
    return matched, measured_only


def _published_side(
    row: Mapping[str, Any], pub: Mapping[str, Any], accelerators: tuple[Accelerator, Accelerator] | None
) -> dict[str, Any]:
    """The published row's values beside a run row, and the ratios (NaN unless both sides are ok)."""
    ok = row["status"] == "ok" and pub["published_status"] == "ok"
    measured_ms, published_ms = float(row["median_ms"]), float(pub["published_ms"])
    measured_mem = float(row["peak_memory_bytes"])
    published_mem = float(pub["published_peak_memory_bytes"])
    entry = {
        "published_row": int(pub["pub_id"]),
        "published_kernel": pub["published_kernel"],
        "published_label": pub["published_label"],
        "published_status": pub["published_status"],
        "measured_ms": measured_ms,
        "published_ms": published_ms,
        "runtime_ratio": _ratio(measured_ms, published_ms) if ok else math.nan,
        "measured_peak_memory_bytes": measured_mem,
        "published_peak_memory_bytes": published_mem,
        "memory_ratio": _ratio(measured_mem, published_mem) if ok else math.nan,
    }
    if accelerators is not None:
        entry.update(_normalized(row, measured_ms, published_ms, *accelerators, ok))
    return entry


def _published_only(published: pd.DataFrame, used: set[int], run_kernels: set[str]) -> pd.DataFrame:
    """The published rows no run row matched, each with the reason."""
    rows = []
    for pub_id, pub in published.iterrows():
        if pub_id in used:
            continue
        mapping = mapping_for_published(str(pub["kernel_name"]))
        if mapping is None:
            reason = UNMAPPED.get(str(pub["kernel_name"]), "no adapter maps to this published kernel")
            reason = f"no adapter: {reason}"
        elif any(a in run_kernels for a in mapping.adapters):
            reason = (
                f"the run has no case at this mode/shape/chunk size (adapters: {', '.join(mapping.adapters)})"
            )
        else:
            reason = f"adapter not in the run ({', '.join(mapping.adapters)})"
        rows.append({"published_row": pub_id, **pub.to_dict(), "reason": reason})
    return pd.DataFrame(rows, columns=["published_row", *published.columns, "reason"])


_NORMALIZED_COLUMNS = (
    "measured_bound_ms",
    "published_bound_ms",
    "measured_normalized",
    "published_normalized",
    "normalized_ratio",
)


def _normalized(
    row: Mapping[str, Any],
    measured_ms: float,
    published_ms: float,
    measured_acc: Accelerator,
    published_acc: Accelerator,
    ok: bool,
) -> dict[str, float]:
    flops, moved = float(row["flops"]), float(row["bytes"])
    if not (math.isfinite(flops) and math.isfinite(moved)) or flops <= 0 or moved <= 0:
        return dict.fromkeys(_NORMALIZED_COLUMNS, math.nan)
    measured_bound = runtime_ms_lower(flops, moved, measured_acc)
    published_bound = runtime_ms_lower(flops, moved, published_acc)
    measured_norm = _ratio(measured_ms, measured_bound) if ok else math.nan
    published_norm = _ratio(published_ms, published_bound) if ok else math.nan
    return {
        "measured_bound_ms": measured_bound,
        "published_bound_ms": published_bound,
        "measured_normalized": measured_norm,
        "published_normalized": published_norm,
        "normalized_ratio": _ratio(measured_norm, published_norm),
    }


# A matched row matters when its ratio lies this far (relative) from its kernel's median ratio.
MATTERS_BAND = 0.10
SUMMARY_COLUMNS = (
    "kernel",
    "mode",
    "rows",
    "compared",
    "median ratio",
    "min",
    "max",
    "furthest from 1",
    "not compared",
)


def _shape_label(row: pd.Series, columns: list[str]) -> str:
    return " ".join(f"{SHORT_NAMES[c]}{int(row[c])}" for c in columns if not pd.isna(row[c]))


def _varying(frame: pd.DataFrame) -> list[str]:
    """The shape columns whose values differ between the frame's rows (the sequence length always)."""
    return [c for c in SHAPE_COLUMNS if c == "seq_len" or frame[c].nunique(dropna=True) > 1]


def _not_compared(group: pd.DataFrame) -> str:
    """Why rows have no ratio: each side's status other than ok, with its count (`run crashed ×8`)."""
    parts = []
    for side, column in (("run", "status"), ("paper", "published_status")):
        counts = group.loc[group[column] != "ok", column].value_counts(sort=False)
        parts += [f"{side} {status} ×{n}" for status, n in sorted(counts.items())]
    return ", ".join(parts)


def _summary_row(group: pd.DataFrame, normalized: bool) -> dict[str, Any]:
    ratios = group["runtime_ratio"].dropna()
    entry: dict[str, Any] = {
        "rows": len(group),
        "compared": len(ratios),
        "not compared": _not_compared(group),
    }
    if len(ratios):
        far = group.loc[ratios.map(math.log).abs().idxmax()]
        entry.update(
            {
                "median ratio": ratios.median(),
                "min": ratios.min(),
                "max": ratios.max(),
                "furthest from 1": f"{_shape_label(far, _varying(group))}: {far['runtime_ratio']:.3g}",
            }
        )
    if normalized:
        entry["median normalized"] = group["normalized_ratio"].median()
    return entry


def comparison_summary(comparison: Comparison, kernels: set[str] | None = None) -> pd.DataFrame:
    """One row per kernel and mode of the matched rows: the runtime ratio run / published at a glance.

    Args:
        comparison: from `compare_run`.
        kernels: keep these kernels only; None for all.

    Returns:
        `SUMMARY_COLUMNS`: `rows` matched, `compared` (both sides ran), the median, lowest and
        highest ratio over those, the row furthest from 1 (the shape values that vary within the
        kernel's rows, and its ratio: `B1 T65536: 0.374`), and why the other rows have no ratio
        (`run crashed ×8`); with roofline normalization also `median normalized`.
    """
    matched = comparison.matched
    if kernels is not None:
        matched = matched[matched["kernel"].isin(kernels)]
    normalized = comparison.normalize == "roofline"
    columns = [*SUMMARY_COLUMNS, *(["median normalized"] if normalized else [])]
    rows = [
        {"kernel": kernel, "mode": mode, **_summary_row(group, normalized)}
        for (kernel, mode), group in matched.groupby(["kernel", "mode"], sort=True)
    ]
    return pd.DataFrame(rows, columns=columns)


def rows_that_matter(comparison: Comparison, band: float = MATTERS_BAND) -> Comparison:
    """The comparison with only the matched rows a reader should look at past the summary: those whose
    ratio lies more than `band` (relative) from the median ratio of their kernel and mode, and those
    without a ratio where other rows of their kernel and mode have one (a kernel that never ran is
    said once, by the summary's `not compared`)."""
    matched = comparison.matched
    if matched.empty:
        return comparison
    by_kernel = matched.groupby(["kernel", "mode"])["runtime_ratio"]
    ratio = matched["runtime_ratio"]
    off = ((ratio / by_kernel.transform("median")) - 1).abs() > band
    missing = ratio.isna() & (by_kernel.transform("count") > 0)
    return replace(comparison, matched=matched[off | missing])


def comparison_tables(comparison: Comparison) -> dict[str, pd.DataFrame]:
    """The matched rows as display tables, one per mode, sorted by kernel and shape.

    Columns: kernel, B, T, H, Dqk, Dv, L, status, ms (run), ms (paper), ms ratio, GB (run),
    GB (paper), GB ratio; with roofline normalization also the normalized runtimes (runtime /
    roofline bound of each side's GPU) and their ratio.
    """
    tables: dict[str, pd.DataFrame] = {}
    matched = comparison.matched
    for mode in sorted(matched["mode"].unique()) if not matched.empty else []:
        rows = matched[matched["mode"] == mode].sort_values(["kernel", *SHAPE_COLUMNS])
        table = pd.DataFrame(
            {
                "kernel": rows["kernel"],
                "B": rows["batch"],
                "T": rows["seq_len"],
                "H": rows["num_heads"],
                "Dqk": rows["head_dim_qk"],
                "Dv": rows["head_dim_v"],
                "L": rows["chunk_size"],
                "status": rows["status"].where(
                    rows["published_status"] == "ok", rows["status"] + " / paper " + rows["published_status"]
                ),
                "ms (run)": rows["measured_ms"],
                "ms (paper)": rows["published_ms"],
                "ms ratio": rows["runtime_ratio"],
                "GB (run)": rows["measured_peak_memory_bytes"] / 1e9,
                "GB (paper)": rows["published_peak_memory_bytes"] / 1e9,
                "GB ratio": rows["memory_ratio"],
            }
        )
        if comparison.normalize == "roofline":
            table["ms/bound (run)"] = rows["measured_normalized"]
            table["ms/bound (paper)"] = rows["published_normalized"]
            table["normalized ratio"] = rows["normalized_ratio"]
        tables[mode] = table.reset_index(drop=True)
    return tables


def comparison_frame(comparison: Comparison) -> pd.DataFrame:
    """Every row of the comparison in one frame with a `match` column: matched, run_only or published_only."""
    published_only = comparison.published_only.rename(
        columns={
            "kernel": "published_kernel_column",
            "kernel_name": "published_kernel",
            "plot_label": "published_label",
            "batch_size": "batch",
            "runtime_ms": "published_ms",
            "peak_memory_bytes": "published_peak_memory_bytes",
            "status": "published_status",
        }
    )
    frames = [
        comparison.matched.assign(match="matched"),
        comparison.measured_only.assign(match="run_only"),
        published_only.assign(match="published_only"),
    ]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["match"])
    combined = pd.concat(frames, ignore_index=True)
    if "row_id" in combined:
        combined["row_id"] = combined["row_id"].astype("Int64")
    return combined


def comparison_json(comparison: Comparison) -> dict[str, Any]:
    """The comparison as a JSON-serializable dict (NaN becomes null)."""

    def records(df: pd.DataFrame) -> list[dict[str, Any]]:
        return json.loads(df.to_json(orient="records"))

    def accelerator(acc: Accelerator | None) -> dict[str, Any] | None:
        if acc is None:
            return None
        return {
            "name": acc.name,
            "peak_flops_per_s": acc.peak_flops_per_s,
            "bandwidth_bytes_per_s": acc.bandwidth_bytes_per_s,
        }

    return {
        "published": comparison.published_name,
        "measured_gpu": comparison.measured_gpu,
        "published_gpu": comparison.published_gpu,
        "measured_accelerator": accelerator(comparison.measured_accelerator),
        "published_accelerator": accelerator(comparison.published_accelerator),
        "normalize": comparison.normalize,
        "matched": records(comparison.matched),
        "run_only": records(comparison.measured_only),
        "published_only": records(comparison.published_only),
    }


def published_only_summary(comparison: Comparison) -> pd.DataFrame:
    """Published rows no run row matched, counted per published kernel and reason."""
    only = comparison.published_only
    if only.empty:
        return pd.DataFrame(columns=["kernel_name", "mode", "rows", "reason"])
    return (
        only.groupby(["kernel_name", "mode", "reason"], dropna=False)
        .size()
        .reset_index(name="rows")[["kernel_name", "mode", "rows", "reason"]]
    )
