"""Our TFLA kernels with their tiles loaded through Hopper tensor descriptors (TMA) against the same
config's pointer loads, at the paper's TFLA shapes: fw and fwbw times, and the difference of every result.

    python experiments/tma_loads.py OUT.csv [--sets chunks,fig5,fig17] [--processes 14]

For each shape and gate, the config `config_for` picks on this GPU with pointer loads everywhere, then
with `tma` (the forward output kernel), with `bwd_tma` (the dQ, dK and dV kernels) and with both
(`KernelConfig`), whatever the picked config has. Worker processes first run each variant once on
one batch (as a sweep's precompile), so the timing process finds the kernels compiled. Then fw and
fwbw (`h.sum()` backward, as the sweeps time it) are each timed by `triton.testing.do_bench` (the
median; L2 cleared before each call), and each variant's `h` and gradients are held to the pointer
loads' (the largest relative RMS difference: both load the same tiles, so it is 0 or near the
float32 rounding of a reordered sum).
A variant that fails (a config whose tiles a descriptor cannot take) is a row with its error.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import torch

# (set, gate, batch, heads, T, Dqk, Dv, chunk): tfla_vs_peer_chunks, Fig. 5's mLSTMexp, Fig. 17
SHAPES = (
    [("chunks", "sig", 8, 16, 8192, 128, 256, c) for c in (64, 128, 256, 512, 1024)]
    + [("fig5", "exp", 8, 16, 8192, 128, 256, 128)]
    + [
        ("fig17", gate, 4, 4096 // d, 8192, d, d, chunk)
        for d in (32, 64, 128, 256, 512, 1024)
        for gate, chunk in (("sig", 256), ("exp", 128))
    ]
)
VARIANTS = {
    "pointers": {"tma": False, "bwd_tma": False},
    "tma": {"tma": True, "bwd_tma": False},
    "bwd_tma": {"tma": False, "bwd_tma": True},
    "both": {"tma": True, "bwd_tma": True},
}
FIELDS = (
    "set",
    "gate",
    "batch",
    "heads",
    "seq_len",
    "dqk",
    "dv",
    "chunk",
    "variant",
    "fw_ms",
    "fwbw_ms",
    "max_rel_rms",
    "error",
)


def config_of(shape: tuple, variant: str):
    from tfla_bench.kernels import config as kconfig

    _, gate, _, _, _, dqk, dv, chunk = shape
    base = kconfig.config_for(
        "tfla", dqk, dv, chunk, torch.bfloat16, gate, kconfig.gpu_target(torch.device("cuda"))
    )
    return dataclasses.replace(base, **VARIANTS[variant])


def inputs(shape: tuple, batch: int | None = None) -> list[torch.Tensor]:
    _, _, b, heads, seq_len, dqk, dv, _ = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    dims = (batch or b, heads, seq_len)
    q, k = (torch.randn(*dims, dqk, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(*dims, dv, device="cuda", generator=gen).bfloat16()
    i = torch.randn(*dims, device="cuda", generator=gen)
    f = torch.randn(*dims, device="cuda", generator=gen) + 3.0
    return [x.requires_grad_() for x in (q, k, v, i, f)]


def call(shape: tuple, variant: str, leaves: list[torch.Tensor]) -> torch.Tensor:
    from tfla_bench.kernels.tfla import mlstm_tfla

    return mlstm_tfla(*leaves, gate=shape[1], chunk_size=shape[7], config=config_of(shape, variant))


def warm(job: tuple) -> str | None:
    """One fw + bw of a variant on one batch, in a worker: compiles its kernels into Triton's cache."""
    shape, variant = job
    try:
        # one batch, or as many as keep batch x heads a multiple of 16 (as Triton specializes it)
        call(shape, variant, inputs(shape, batch=max(1, 16 // shape[3]))).sum().backward()
    except Exception as exc:  # reported again, with the row, by the timing process
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
    return None


def measure(shape: tuple) -> list[dict]:
    import triton.testing

    leaves = inputs(shape)
    rows, results = [], {}
    for variant in VARIANTS:
        row = dict(zip(FIELDS[:8], shape, strict=True)) | {"variant": variant}
        try:
            for x in leaves:
                x.grad = None
            h = call(shape, variant, leaves)
            h.sum().backward()
            # copies: do_bench's first calls add to the gradients in place
            results[variant] = [h.detach().float().clone(), *(x.grad.float().clone() for x in leaves)]
            with torch.no_grad():
                row["fw_ms"] = triton.testing.do_bench(
                    lambda variant=variant: call(shape, variant, leaves), return_mode="median"
                )
            row["fwbw_ms"] = triton.testing.do_bench(
                lambda variant=variant: call(shape, variant, leaves).sum().backward(),
                grad_to_none=leaves,
                return_mode="median",
            )
            reference = results["pointers"]
            row["max_rel_rms"] = max(
                ((a - b).norm() / b.norm()).item() for a, b in zip(results[variant], reference, strict=True)
            )
        except Exception as exc:  # a variant that fails is a finding, not a stop
            message = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            row["error"] = f"{type(exc).__name__}: {message}"
        rows.append(row)
        print(
            f"{shape[0]:6} {shape[1]} Dqk{shape[5]:>5} Dv{shape[6]:>5} L{shape[7]:>5} {variant:8} "
            f"fw {row.get('fw_ms', float('nan')):7.3f} fwbw {row.get('fwbw_ms', float('nan')):7.3f} "
            f"diff {row.get('max_rel_rms', float('nan')):.1e} {row.get('error', '')}",
            flush=True,
        )
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sets", default="chunks,fig5,fig17", help="which shapes: chunks, fig5, fig17")
    parser.add_argument("--processes", type=int, default=14, help="worker processes that compile first")
    args = parser.parse_args(argv)
    sets = set(args.sets.split(","))
    if unknown := sets - {shape[0] for shape in SHAPES}:
        print(f"error: --sets: unknown {', '.join(sorted(unknown))} (chunks, fig5, fig17)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: the comparison needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = [shape for shape in SHAPES if shape[0] in sets]
    with ProcessPoolExecutor(args.processes, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(warm, [(shape, variant) for shape in shapes for variant in VARIANTS]))
    print(
        f"TMA loads against pointer loads on {torch.cuda.get_device_name()}, torch {torch.__version__}",
        flush=True,
    )
    rows = [row for shape in shapes for row in measure(shape)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=FIELDS).to_csv(args.out, index=False)
    print(f"wrote {args.out}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
