"""The TFLA paper's published kernel measurements, and the map from each published kernel to our adapters.

The CSVs in `results/published/` (see its README: source, GPU, method, caveats) hold one row per
published measurement; their `figure` column names the data set (e.g.
`tfla_fig5_consttoken_rerun_nh16`). `load_published(name)` returns one data set.

Each adapter names the published series it answers to (`Adapter.published`); `mappings()`
gathers them per published `kernel_name` from the registry. `UNMAPPED` lists the published
kernels we have no adapter for, with the reason.
`published_cases(df)` turns published rows into rows keyed like our `results.csv`, one per
candidate adapter, ready to be joined with a run (`tfla_bench.analyse.compare`).

Published shapes use the benchmark's conventions, which our adapters share: batch x seq_len
tokens, num_heads heads of head_dim_qk (queries, keys) and head_dim_v (values). For Mamba,
head_dim_qk is the SSM state size and head_dim_v the inner dimension per head (Mamba 1: one
"head" holding the whole inner dimension); Mamba 2 without conv shares B and C per head (groups =
heads), the fused-conv Mamba 2 uses one group, as our adapters' defaults do.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tfla_bench.adapters import registry
from tfla_bench.errors import UserError, exception_line

# The README states "one NVIDIA H100" without the variant. We assume the SXM part (989 TFLOP/s
# bf16, 3.35 TB/s), the paper's table-18 H100; this is its CUDA device name.
PUBLISHED_GPU_NAME = "NVIDIA H100 80GB HBM3"
PUBLISHED_GPU_NOTE = "NVIDIA H100 (variant not recorded; SXM assumed)"

# Every published CSV has these columns (results/published/README.md, "Columns").
PUBLISHED_COLUMNS = (
    "figure",
    "mode",
    "kernel",
    "kernel_name",
    "plot_label",
    "dtype",
    "batch_size",
    "seq_len",
    "num_heads",
    "head_dim_qk",
    "head_dim_v",
    "chunk_size",
    "runtime_ms",
    "peak_memory_bytes",
    "status",
)

# Peak memory in the published numbers includes the inputs, the accumulated .grad tensors and the
# benchmark's 256e6-byte L2-flush buffer.
PUBLISHED_MEMORY_NOTE = (
    "published peak memory includes the inputs, the gradients and a 256 MB L2-flush buffer"
)

PUBLISHED_DIR_ENV = "TFLA_BENCH_PUBLISHED_DIR"


@dataclass(frozen=True)
class KernelMapping:
    """Which of our adapters answer to one published kernel (gathered from their `PublishedSeries`).

    Attributes:
        published_kernel: the `kernel_name` in the published CSVs.
        adapters: our adapter names that run the same computation (by the series' rank: ours first,
            then the official peer).
        params: `Case.params` a run's row must carry to match (e.g. `causal=False` for the paper's
            non-causal SDPA runs). A row without the param column has the adapter's default
            (`param_default`).
        uses_chunk_size: whether the chunk size is part of the match (the mLSTM kernels). Otherwise
            a chunk size is compared only when both sides record one (Mamba 2's chunk 256).
        note: what the published kernel is and why it maps this way.
    """

    published_kernel: str
    adapters: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    uses_chunk_size: bool = False
    note: str = ""


def mappings() -> list[KernelMapping]:
    """One mapping per published kernel that a registered adapter answers to, in registry order."""
    series: dict[str, list[tuple[registry.PublishedSeries, str]]] = {}
    for adapter in registry.adapters():
        if adapter.published is not None:
            series.setdefault(adapter.published.kernel, []).append((adapter.published, adapter.name))
    result = []
    for kernel, answers in series.items():
        answers.sort(key=lambda answer: answer[0].rank)
        first = answers[0][0]
        names = tuple(name for _, name in answers)
        result.append(KernelMapping(kernel, names, dict(first.params), first.uses_chunk_size, first.note))
    return result


# Published kernels without an adapter here, with the reason.
UNMAPPED: dict[str, str] = {
    "fused_chunk_gla": "fla's fused (non-materializing) GLA has no adapter; only chunk_gla is wrapped",
    "chunkwise--native_autograd": "mlstm_kernels' PyTorch chunkwise mLSTM with autograd; not wrapped",
    "chunkwise--native_custbw": "mlstm_kernels' PyTorch chunkwise mLSTM with a custom backward; not wrapped",
    "parallel--triton_limit_headdim": "mlstm_kernels' parallel Triton kernel (head dim <= 256); not wrapped",
    "native": "mlstm_kernels' PyTorch recurrent step (generation); step kernels are not benchmarked here",
    "triton_fused": "mlstm_kernels' fused Triton recurrent step (generation); not benchmarked here",
    "fused_recurrent_gla": "fla's recurrent GLA step (generation); not benchmarked here",
    "fused_recurrent_simple_gla": "fla's recurrent simple GLA step (generation); not benchmarked here",
}


def param_default(adapter: str, name: str) -> Any:
    """The default of param `name` of the adapter called `adapter` (None: none, or not registered)."""
    found = registry.find(adapter)
    return None if found is None else found.param_defaults.get(name)


# The join keys shared by a run's results.csv and `published_cases`.
CASE_KEYS = ("kernel", "mode", "dtype", "batch", "seq_len", "num_heads", "head_dim_qk", "head_dim_v")


def mapping_for_published(kernel_name: str) -> KernelMapping | None:
    """The mapping of a published `kernel_name`, or None if no adapter answers to it."""
    for mapping in mappings():
        if mapping.published_kernel == kernel_name:
            return mapping
    return None


def mapping_for_adapter(adapter: str) -> KernelMapping | None:
    """The mapping that lists our adapter `adapter`, or None if no published kernel maps to it."""
    for mapping in mappings():
        if adapter in mapping.adapters:
            return mapping
    return None


def mapping_table() -> pd.DataFrame:
    """Every mapped and unmapped published kernel as a table (for docs, the report and the notebook)."""
    rows = [
        {
            "published_kernel": m.published_kernel,
            "adapters": ", ".join(m.adapters),
            "params": ", ".join(f"{k}={v}" for k, v in m.params.items()),
            "chunk_size_matched": m.uses_chunk_size,
            "note": m.note,
        }
        for m in mappings()
    ]
    rows += [
        {"published_kernel": k, "adapters": "", "params": "", "chunk_size_matched": False, "note": reason}
        for k, reason in UNMAPPED.items()
    ]
    return pd.DataFrame(rows)


def published_dir() -> Path:
    """The published CSVs' folder: `$TFLA_BENCH_PUBLISHED_DIR`, else `results/published` of the checkout
    holding this package (a source tree or an editable install), else the copy an installed wheel
    ships as `tfla_bench/published_data`.
    """
    override = os.environ.get(PUBLISHED_DIR_ENV)
    if override:
        return Path(override)
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent / "results" / "published"
    return checkout if checkout.is_dir() else package / "published_data"


# The words of a published row, and the cells that make its case: two rows of one case would leave
# compare to pick one.
PUBLISHED_WORDS = {
    "mode": ("fw", "fwbw"),
    "dtype": ("bfloat16", "float16", "float32"),
    "status": ("ok", "failed", "invalid_config", "not_run"),
}
CASE_KEY = [
    "figure", "mode", "kernel", "kernel_name", "dtype", "batch_size", "seq_len", "num_heads", "head_dim_qk",
    "head_dim_v", "chunk_size",
]  # fmt: skip

# The numbers of a published row: each shape a whole number from 1, and the chunk size too where
# there is one; a runtime above 0 and a peak memory from 0 where they were measured.
SHAPE_COLUMNS = ("batch_size", "seq_len", "num_heads", "head_dim_qk", "head_dim_v")


def _read_csv(path: Path) -> pd.DataFrame:
    """A published CSV, its columns, its words and its numbers checked, one row per case.

    Raises:
        UserError: a missing column, a cell that is not what its column holds, or two rows of one case,
            naming their lines.
    """
    df = _frame(path)
    missing = [c for c in PUBLISHED_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"published CSV {path} lacks columns: {', '.join(missing)}")

    def refuse(bad: pd.Series, column: str, expected: str) -> None:
        if bad.any():
            index = int(bad.to_numpy().argmax())
            cell = _frame(path, dtype=str, keep_default_na=False)[column].iloc[index]  # as the file has it
            shown = repr(cell) if cell.strip() else "empty"
            line = _line_of(path, df, index)
            raise UserError(f"published CSV {path} line {line}: {column} is {shown}; expected {expected}")

    for column, words in PUBLISHED_WORDS.items():
        refuse(~df[column].isin(words), column, f"one of {', '.join(words)}")
    refuse(df["figure"].isna() | (df["figure"].astype(str).str.strip() == ""), "figure", "a data set's name")
    for column in (*SHAPE_COLUMNS, "chunk_size", "runtime_ms", "peak_memory_bytes"):
        values = pd.to_numeric(df[column], errors="coerce")  # text that is no number: NaN, never fine
        if column in ("runtime_ms", "peak_memory_bytes"):
            runtime = column == "runtime_ms"
            fine = np.isfinite(values) & ((values > 0) if runtime else (values >= 0))
            expected = f"a finite number {'above' if runtime else 'from'} 0"
        else:
            fine = (values >= 1) & (values % 1 == 0) & (values < 2**63)
            expected = "a whole number from 1"
        if column not in SHAPE_COLUMNS:  # not measured, or a kernel without chunks: an empty cell
            fine |= df[column].isna()
            expected = f"empty or {expected}"
        refuse(~fine, column, expected)
        df[column] = values
    repeated = df.duplicated(CASE_KEY, keep=False)
    if repeated.any():
        first = int(repeated.to_numpy().argmax())
        same = df[CASE_KEY].iloc[first]
        second = next(i for i in range(first + 1, len(df)) if df[CASE_KEY].iloc[i].equals(same))
        lines = f"lines {_line_of(path, df, first)} and {_line_of(path, df, second)}"
        raise UserError(f"published CSV {path} {lines}: two rows of one case; keep one")
    return df


def _line_of(path: Path, df: pd.DataFrame, index: int) -> int:
    """The line of the file where row `index` of `df` (`_frame(path)`) starts."""
    lines = _row_lines(path)
    return lines[index] if len(lines) == len(df) else index + 2


def _frame(path: Path, **options: Any) -> pd.DataFrame:
    """`pd.read_csv(path, **options)`; a file that is no CSV is one line naming it."""
    try:
        return pd.read_csv(path, **options)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        raise UserError(f"published CSV {path} cannot be read: {exception_line(exc)}") from None


def _row_lines(path: Path) -> list[int]:
    """The line of the file where each row of `pd.read_csv(path)` starts: pandas skips blank lines and
    lines of spaces alone, and a quoted cell may span lines."""
    starts = []
    with path.open(newline="", encoding="utf-8") as file:
        reader = csv.reader(file)
        next(reader, None)
        end = reader.line_num
        for record in reader:
            if len(record) > 1 or (record and record[0].strip()):
                starts.append(end + 1)
            end = reader.line_num
    return starts


def list_published() -> dict[str, Path]:
    """Map every published data set (`figure` value) to the CSV holding it.

    Raises:
        UserError: the published folder is missing or holds no CSV, or a CSV lacks columns.
    """
    folder = published_dir()
    paths = sorted(folder.glob("*.csv")) if folder.is_dir() else []
    if not paths:
        raise UserError(f"no published CSVs in {folder} (set ${PUBLISHED_DIR_ENV} to their folder)")
    sets: dict[str, Path] = {}
    for path in paths:
        figures = _frame(path, usecols=lambda c: c == "figure")
        if "figure" not in figures.columns:
            raise UserError(f"published CSV {path} lacks columns: figure")
        for name in figures["figure"].dropna().unique():
            sets[str(name)] = path
    return sets


def load_published(name: str) -> pd.DataFrame:
    """The published data set `name`: its `figure` value, or the stem of its CSV file.

    Args:
        name: e.g. `"tfla_fig5_consttoken_rerun_nh16"` or `"tfla_fig5_consttoken"`.

    Returns:
        The rows of that data set, columns as in `PUBLISHED_COLUMNS` (and the CSV's others).

    Raises:
        UserError: unknown name (the message lists the known ones) or a CSV with missing columns.
    """
    figure, path = resolve(name)
    df = _read_csv(path)
    return df[df["figure"] == figure].reset_index(drop=True)


def resolve(name: str) -> tuple[str, Path]:
    """The `figure` value that `name` (a `figure` value or the stem of its CSV) stands for, and its CSV.

    Raises:
        UserError: unknown name (the message lists the known ones), or no published CSV at all.
    """
    sets = list_published()
    if name in sets:
        return name, sets[name]
    by_stem = {path.stem: figure for figure, path in sets.items()}
    if name in by_stem:
        return by_stem[name], sets[by_stem[name]]
    known = ", ".join(sorted(sets))
    raise UserError(f"unknown published data set {name!r}; known: {known}")


def published_cases(published: pd.DataFrame) -> pd.DataFrame:
    """Published rows as case rows of our adapters, one row per (published row, candidate adapter).

    Args:
        published: rows of `load_published`.

    Returns:
        Columns `pub_id` (the published row's index), `CASE_KEYS` with `kernel` = our adapter,
        `chunk_size` (Int64; NA where the published side has none), `match_chunk` (bool),
        `required_params` (dict), `published_kernel`, `published_label`, `published_ms`,
        `published_peak_memory_bytes`, `published_status`. Published kernels without an adapter
        are left out (see `UNMAPPED`).
    """
    by_kernel = {mapping.published_kernel: mapping for mapping in mappings()}
    rows: list[dict[str, Any]] = []
    for pub_id, row in published.iterrows():
        mapping = by_kernel.get(str(row["kernel_name"]))
        if mapping is None:
            continue
        for adapter in mapping.adapters:
            rows.append(
                {
                    "pub_id": pub_id,
                    "kernel": adapter,
                    "mode": row["mode"],
                    "dtype": row["dtype"],
                    "batch": int(row["batch_size"]),
                    "seq_len": int(row["seq_len"]),
                    "num_heads": int(row["num_heads"]),
                    "head_dim_qk": int(row["head_dim_qk"]),
                    "head_dim_v": int(row["head_dim_v"]),
                    "chunk_size": None if pd.isna(row["chunk_size"]) else int(row["chunk_size"]),
                    "match_chunk": mapping.uses_chunk_size,
                    "required_params": dict(mapping.params),
                    "published_kernel": row["kernel_name"],
                    "published_label": "" if pd.isna(row["plot_label"]) else str(row["plot_label"]),
                    "published_ms": float(row["runtime_ms"]),
                    "published_peak_memory_bytes": float(row["peak_memory_bytes"]),
                    "published_status": row["status"],
                }
            )
    columns = [
        "pub_id",
        *CASE_KEYS,
        "chunk_size",
        "match_chunk",
        "required_params",
        "published_kernel",
        "published_label",
        "published_ms",
        "published_peak_memory_bytes",
        "published_status",
    ]
    df = pd.DataFrame(rows, columns=columns)
    df["chunk_size"] = df["chunk_size"].astype("Int64")
    return df
