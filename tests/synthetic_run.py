"""Synthetic run directories for the analysis tests: results.csv and env.json in the runner's schema.

The numbers are made up but plausible: runtimes are a published median times a known factor (so a
test can check the ratio it expects), or derived from the analytic FLOPs at a fixed fraction of an
H100's peak. Statuses include crashed, unavailable and unsupported rows, as a real sweep has.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from tfla_bench.measure import row as row_schema
from tfla_bench.model.counts import (
    ATTENTION_BACKWARD,
    LINEAR_RNN_BACKWARD,
    attention_bytes,
    attention_flops,
    mlstm_bytes,
    mlstm_flops,
)

REPO = Path(__file__).resolve().parent.parent
PUBLISHED = REPO / "results" / "published"
H100_NAME = "NVIDIA H100 80GB HBM3"

# The factors a test can check: runtime of the run / published runtime, per adapter.
RUNTIME_FACTOR = {"tfla_sig": 0.9, "tfla_exp": 1.1, "limit_chunk": 1.25, "sdpa_cudnn": 0.8, "mamba2": 1.5}
MEMORY_FACTOR = 0.95

# The runner's CSV schema (case columns, then metrics), without param_* columns.
SCHEMA = [*row_schema.CASE_COLUMNS, *row_schema.METRIC_COLUMNS]

FAMILIES = {
    "tfla_sig": "mlstm",
    "tfla_exp": "mlstm",
    "limit_chunk": "mlstm",
    "mlstm_kernels_sig": "mlstm",
    "mlstm_kernels_exp": "mlstm",
    "sdpa_cudnn": "attention",
    "sdpa_flash": "attention",
    "fa3": "attention",
    "mamba2": "mamba2",
    "lightning2": "lightning",
    "gla": "gla",
}
GATES = {
    "tfla_sig": "sig",
    "mlstm_kernels_sig": "sig",
    "tfla_exp": "exp",
    "mlstm_kernels_exp": "exp",
    "limit_chunk": "exp",
}


def counts(
    kernel: str, mode: str, batch: int, seq_len: int, heads: int, dqk: int, dv: int, chunk, causal=True
):
    """Analytic FLOPs and bytes of one call, as an adapter would report them."""
    if kernel in GATES:
        fw_flops = mlstm_flops(
            GATES[kernel], "chunkwise", seq_len=seq_len, chunk_size=chunk, head_dim_qk=dqk, head_dim_v=dv
        )
        fw_bytes = mlstm_bytes(
            GATES[kernel], "chunkwise", seq_len=seq_len, chunk_size=chunk, head_dim_qk=dqk, head_dim_v=dv
        )
        backward = LINEAR_RNN_BACKWARD
    else:
        fw_flops = attention_flops(
            seq_len=seq_len, head_dim_qk=dqk, head_dim_v=dv, causal_factor=0.5 if causal else 1.0
        )
        fw_bytes = attention_bytes(seq_len=seq_len, head_dim_qk=dqk, head_dim_v=dv)
        backward = ATTENTION_BACKWARD
    scale = batch * heads
    return backward.total_flops(fw_flops, mode) * scale, backward.total_bytes(fw_bytes, mode) * scale


def row(
    kernel: str,
    mode: str,
    *,
    batch: int,
    seq_len: int,
    num_heads: int,
    head_dim_qk: int,
    head_dim_v: int,
    chunk_size: int | None = None,
    status: str = "ok",
    median_ms: float = math.nan,
    peak_memory_bytes: float = math.nan,
    params: dict[str, Any] | None = None,
    error: str = "",
) -> dict[str, Any]:
    """One results.csv row; FLOPs and bytes from the model, derived metrics from the runtime."""
    params = params or {}
    causal = params.get("causal", True)
    flops, moved = counts(
        kernel, mode, batch, seq_len, num_heads, head_dim_qk, head_dim_v, chunk_size, causal
    )
    ok = status == "ok"
    median = median_ms if ok else math.nan
    record = {
        "kernel": kernel,
        "mode": mode,
        "dtype": "bfloat16",
        "batch": batch,
        "seq_len": seq_len,
        "num_heads": num_heads,
        "head_dim_qk": head_dim_qk,
        "head_dim_v": head_dim_v,
        "chunk_size": chunk_size,
        "family": FAMILIES.get(kernel, "other"),
        "status": status,
        "median_ms": median,
        "p20_ms": median * 0.98,
        "p80_ms": median * 1.02,
        "min_ms": median * 0.97,
        "first_call_s": 1.5 if ok else math.nan,
        "peak_memory_bytes": peak_memory_bytes if ok else math.nan,
        "peak_memory_above_inputs_bytes": peak_memory_bytes * 0.5 if ok else math.nan,
        "flops": flops,
        "bytes": moved,
        "tflops": flops / (median * 1e-3) / 1e12,
        "gbps": moved / (median * 1e-3) / 1e9,
        "device": "cuda:0" if ok else "",
        "error": error,
        "note": "",
        "warmup": 10 if ok else math.nan,
        "reps": 30 if ok else math.nan,
        "ci_rel": 0.005 if ok else math.nan,
        "stop": "ci" if ok else "",
        "host_gap_share": 0.0 if ok else math.nan,
        **{column: math.nan for column in row_schema.GPU_STATE_COLUMNS},
    }
    record.update({f"param_{k}": v for k, v in params.items()})
    return record


def published_value(figure_csv: str, kernel_name: str, mode: str, seq_len: int, heads: int, chunk=None):
    """(runtime_ms, peak_memory_bytes) of one published row."""
    df = pd.read_csv(PUBLISHED / figure_csv)
    sel = (
        (df["kernel_name"] == kernel_name)
        & (df["mode"] == mode)
        & (df["seq_len"] == seq_len)
        & (df["num_heads"] == heads)
    )
    if chunk is not None:
        sel &= df["chunk_size"] == chunk
    hit = df[sel]
    assert len(hit) == 1, (kernel_name, mode, seq_len, heads, chunk, len(hit))
    return float(hit["runtime_ms"].iloc[0]), float(hit["peak_memory_bytes"].iloc[0])


def fig5_rows(seq_lens=(2048, 4096, 8192)) -> list[dict[str, Any]]:
    """A small Fig. 5-like run (65,536 tokens) with every kind of status and match."""
    rows: list[dict[str, Any]] = []
    csv = "tfla_fig5_consttoken.csv"
    for mode in ("fw", "fwbw"):
        for seq_len in seq_lens:
            batch = 65536 // seq_len
            for kernel, pub, chunk in (
                ("tfla_sig", "chunkwise--triton_xl_chunk_siging", 128),
                ("tfla_exp", "chunkwise--triton_xl_chunk", 128),
                ("limit_chunk", "chunkwise--triton_limit_chunk", 64),
            ):
                ms, mem = published_value(csv, pub, mode, seq_len, 16, chunk)
                rows.append(
                    row(kernel, mode, batch=batch, seq_len=seq_len, num_heads=16, head_dim_qk=128,
                        head_dim_v=256, chunk_size=chunk, median_ms=ms * RUNTIME_FACTOR[kernel],
                        peak_memory_bytes=mem * MEMORY_FACTOR)
                )  # fmt: skip
            rows.append(
                row("mlstm_kernels_exp", mode, batch=batch, seq_len=seq_len, num_heads=16, head_dim_qk=128,
                    head_dim_v=256, chunk_size=128, status="crashed",
                    error="LLVM ERROR: SLPVectorizer assertion")
            )  # fmt: skip
            ms, mem = published_value(csv, "torch_cudnn", mode, seq_len, 32)
            rows.append(
                row("sdpa_cudnn", mode, batch=batch, seq_len=seq_len, num_heads=32, head_dim_qk=128,
                    head_dim_v=128, params={"causal": False}, median_ms=ms * RUNTIME_FACTOR["sdpa_cudnn"],
                    peak_memory_bytes=mem * MEMORY_FACTOR)
            )  # fmt: skip
            flash_ms = (3.0 if mode == "fw" else 9.0) * seq_len / 2048
            rows.append(
                row("sdpa_flash", mode, batch=batch, seq_len=seq_len, num_heads=32, head_dim_qk=128,
                    head_dim_v=128, params={"causal": True}, median_ms=flash_ms, peak_memory_bytes=2e9)
            )  # fmt: skip
            rows.append(
                row("fa3", mode, batch=batch, seq_len=seq_len, num_heads=32, head_dim_qk=128, head_dim_v=128,
                    status="unavailable", error="flash_attn_interface is not installed")
            )  # fmt: skip
            ms, mem = published_value(csv, "mamba2_noconv", mode, seq_len, 64)
            rows.append(
                row("mamba2", mode, batch=batch, seq_len=seq_len, num_heads=64, head_dim_qk=64, head_dim_v=64,
                    median_ms=ms * RUNTIME_FACTOR["mamba2"], peak_memory_bytes=mem * MEMORY_FACTOR)
            )  # fmt: skip
            rows.append(
                row("lightning2", mode, batch=batch, seq_len=seq_len, num_heads=32, head_dim_qk=128,
                    head_dim_v=128, median_ms=20.0, peak_memory_bytes=6e9)
            )  # fmt: skip
            gla_status = "ok" if mode == "fw" else "unsupported"
            rows.append(
                row("gla", mode, batch=batch, seq_len=seq_len, num_heads=16, head_dim_qk=128, head_dim_v=256,
                    status=gla_status, median_ms=9.0, peak_memory_bytes=9e9,
                    error="" if gla_status == "ok" else "fla refuses the gated backward on Hopper")
            )  # fmt: skip
    # A chunk sweep at T=8192 for the trade-off and measured-roofline figures.
    for mode in ("fw", "fwbw"):
        for chunk in (64, 256, 512):
            ms, mem = published_value(csv, "chunkwise--triton_xl_chunk_siging", mode, 8192, 16, chunk)
            rows.append(
                row("tfla_sig", mode, batch=8, seq_len=8192, num_heads=16, head_dim_qk=128, head_dim_v=256,
                    chunk_size=chunk, median_ms=ms * RUNTIME_FACTOR["tfla_sig"],
                    peak_memory_bytes=mem * MEMORY_FACTOR)
            )  # fmt: skip
    return rows


def headdim_rows() -> list[dict[str, Any]]:
    """A Fig. 17-like run: batch 4, T 8192, head dim 64..256 with heads = 4096 / head dim."""
    rows = []
    for mode in ("fw", "fwbw"):
        for dim in (64, 128, 256):
            for kernel, chunk, ms in (("tfla_sig", 256, 3.0), ("tfla_exp", 128, 4.0)):
                median_ms = ms * dim / 64 * (3 if mode == "fwbw" else 1)
                rows.append(
                    row(kernel, mode, batch=4, seq_len=8192, num_heads=4096 // dim, head_dim_qk=dim,
                        head_dim_v=dim, chunk_size=chunk, median_ms=median_ms,
                        peak_memory_bytes=1e9 * dim / 64)
                )  # fmt: skip
    return rows


def write_run(
    run_dir: Path,
    rows: list[dict[str, Any]],
    *,
    gpu_name: str = H100_NAME,
    spec: str = "fig5_consttoken",
    published: str | None = "tfla_fig5_consttoken_rerun_nh16",
    started_at: str = "2025-01-01T00:00:00Z",
    git_sha: str = "0000000",
) -> Path:
    """Write results.csv and env.json (the keys `envinfo` writes) into `run_dir`; return `run_dir`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    params = sorted(c for c in df.columns if c.startswith("param_"))
    df = df.reindex(columns=[*SCHEMA[:9], *params, *SCHEMA[9:]])  # a column the rows lack stays empty
    df.to_csv(run_dir / "results.csv", index=False)
    env = {
        "gpu_name": gpu_name,
        "gpu_count": 1,
        "sm_count": 132,
        "gpu_memory_bytes": 85_000_000_000,
        "driver": "580.00",
        "cuda": "13.0",
        "torch": "2.11.0+cu130",
        "triton": "3.6.0",
        "python": "3.12.3",
        "packages": {"fla-core": "0.6.0", "mlstm-kernels": "2.0.6", "mamba-ssm": None},
        "git_sha": git_sha,
        "host": "synthetic",
        "spec": spec,
        "published": published,
        "started_at": started_at,
        "measurement": {"warmup": 10, "reps": 30, "l2_flush": True, "grad": "sum"},
        "devices": ["cuda:0", "cuda:1"],
        "device_infos": [
            {"device": f"cuda:{i}", "name": gpu_name, "uuid": f"GPU-{i}", "nvml": {"max_sm_mhz": 1980}}
            for i in range(2)
        ],
    }
    (run_dir / "env.json").write_text(json.dumps(env, indent=2))
    return run_dir


# A Fig. 5-like sweep of 300 rows, as large as the largest committed runs: 15 kernels, both modes,
# 10 sequence lengths at 65,536 tokens (batch 1 above).
SITE_LENGTHS = tuple(256 * 2**i for i in range(10))
SITE_KERNELS = (
    ("tfla_sig", 128, 16, 128, 256),
    ("tfla_exp", 128, 16, 128, 256),
    ("limit_chunk", 64, 16, 128, 256),
    ("mlstm_kernels_sig", 128, 16, 128, 256),
    ("mlstm_kernels_exp", 128, 16, 128, 256),
    ("sdpa_cudnn", None, 32, 128, 128),
    ("sdpa_flash", None, 32, 128, 128),
    ("sdpa_math", None, 32, 128, 128),
    ("fa2", None, 32, 128, 128),
    ("fa3", None, 32, 128, 128),
    ("fa4", None, 32, 128, 128),
    ("mamba2", None, 64, 64, 64),
    ("lightning2", None, 32, 128, 128),
    ("gla", None, 16, 128, 256),
    ("simple_gla", None, 16, 128, 256),
)


def site_rows(
    seed: int = 0, slower: dict[str, float] | None = None, lengths: tuple[int, ...] = SITE_LENGTHS
) -> list[dict[str, Any]]:
    """300 rows like a Fig. 5 sweep (`SITE_KERNELS` x `SITE_LENGTHS` x fw, fwbw), runtimes from the FLOPs
    at 40% of an H100's peak with a seeded jitter of 0.2% (within a row's noise, 0.5%); `fa3` is
    unavailable. Each case whose key starts with a key of `slower` takes that many times as long
    (`{"tfla_sig|fw|bfloat16|B8|T8192": 1.5}`). `lengths` picks fewer sequence lengths (fewer rows)."""
    import random

    from tfla_bench.adapters.workloads import Case

    jitter = random.Random(seed)
    rows = [
        _site_row(kernel, mode, max(1, 65536 // seq_len), seq_len, heads, dqk, dv, chunk, jitter)
        for mode in ("fw", "fwbw")
        for seq_len in lengths
        for kernel, chunk, heads, dqk, dv in SITE_KERNELS
    ]
    for record in rows:
        case = Case(*(record[c] for c in row_schema.CASE_COLUMNS))
        factor = next((f for prefix, f in (slower or {}).items() if case.key.startswith(prefix)), 1.0)
        for column in ("median_ms", "p20_ms", "p80_ms", "min_ms"):
            record[column] *= factor
    return rows


def _site_row(kernel, mode, batch, seq_len, heads, dqk, dv, chunk, jitter) -> dict[str, Any]:
    flops, _ = counts(kernel, mode, batch, seq_len, heads, dqk, dv, chunk or 64)
    ms = flops / (0.4 * 989e12) * 1e3 * (1 + jitter.uniform(-0.002, 0.002))
    missing = (
        {"status": "unavailable", "error": "flash_attn_interface is not installed"} if kernel == "fa3" else {}
    )
    return row(kernel, mode, batch=batch, seq_len=seq_len, num_heads=heads, head_dim_qk=dqk, head_dim_v=dv,
               chunk_size=chunk, median_ms=ms, peak_memory_bytes=4e9 * seq_len / 8192, **missing)  # fmt: skip


def write_cases_as_run(run_dir: Path, cases: list, published: str | None) -> Path:
    """A run directory with one ok row per `Case` (made-up timings), as a sweep of those cases would write."""
    from tfla_bench.adapters import registry

    rows = []
    for case in cases:
        record = dict.fromkeys(SCHEMA, "")
        record.update(case.columns())
        record.update(
            family=registry.get(case.kernel).family,
            status="ok",
            median_ms=1.0,
            peak_memory_bytes=1e9,
            flops=1e12,
            bytes=1e9,
        )
        rows.append(record)
    return write_run(run_dir, rows, published=published)


# `tfla-bench run` of one tiny sdpa_math case on the CPU, shape flags only (add --dry-run or --out).
ADHOC_RUN = [
    "run",
    "-k",
    "sdpa_math",
    "--seq-len",
    "16",
    "--tokens",
    "32",
    "--heads",
    "1",
    "--head-dim-qk",
    "8",
]


# The case `site_runs` slows down in its third run, and by how much.
PLANTED = "tfla_sig|fw|bfloat16|B8|T8192|"
PLANTED_FACTOR = 1.5


def site_runs(folder: Path, lengths: tuple[int, ...] = (2048, 8192, 65536)) -> list[Path]:
    """Four runs of one spec for a site: two identical H100 runs at two commits, a third H100 run with
    the `PLANTED` case `PLANTED_FACTOR` times slower, and one H200 run."""
    runs = (
        ("a", 0, None, H100_NAME, "aaaaaaa"),
        ("b", 0, None, H100_NAME, "bbbbbbb"),
        ("c", 0, {PLANTED: PLANTED_FACTOR}, H100_NAME, "ccccccc"),
        ("h200", 1, None, "NVIDIA H200", "ccccccc"),
    )
    return [
        write_run(
            folder / f"fig5_consttoken-{name}",
            site_rows(seed, slower, lengths),
            gpu_name=gpu,
            started_at=f"2026-11-0{day}T10:00:00Z",
            git_sha=sha,
        )  # fmt: skip
        for day, (name, seed, slower, gpu, sha) in enumerate(runs, 1)
    ]
