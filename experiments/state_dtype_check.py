"""Our TFLA kernels with 16-bit chunk states against the same kernels with float32 states, at every
config the committed sweeps run: a check that the compiled kernels agree, config by config.

python experiments/state_dtype_check.py OUT [--processes 15]   (the H100's table is in results/kernels/)

Every reader of a chunk state casts it to the input dtype before its products
(`tfla_bench.kernels.common`), so both variants compute the same products and should agree to the
last bits of their float32 accumulations. Each config (gate, head dims, chunk size, with the tuned or
default KernelConfig of this GPU) runs fw + bw on B1 NH2 T8192 bfloat16 inputs with both state dtypes
forced; the table gives the relative RMS difference of h and of every gradient, and the state dtype
that `mlstm_tfla` picks there (`config.float32_states`). A miscompiled variant shows as a difference
near the bfloat16 error itself (1e-2) instead of ~0.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from tfla_bench.kernels import config as kconfig

# (gate, Dqk, Dv, chunk): Fig. 5 and its chunk sweep, Fig. 6, Fig. 17 (sig at 256, exp at 128)
CONFIGS = sorted(
    {("sig", 128, 256, c) for c in (64, 128, 256, 512, 1024)}
    | {("exp", 128, 256, 128)}
    | {(g, 256, 512, c) for g in ("sig", "exp") for c in (64, 128, 256, 512, 1024, 2048, 4096)}
    | {("sig", d, d, 256) for d in (32, 64, 128, 256, 512, 1024)}
    | {("exp", d, d, 128) for d in (32, 64, 128, 256, 512, 1024)}
)
NAMES = ("h", "dq", "dk", "dv", "di", "df")


def run(gate: str, dqk: int, dv: int, chunk: int, float32_states: bool) -> list[torch.Tensor]:
    from tfla_bench.kernels import tfla

    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, 2, 8192)
    q, k = (torch.randn(*shape, dqk, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(*shape, dv, device="cuda", generator=gen).bfloat16()
    i = torch.randn(*shape, device="cuda", generator=gen)
    f = torch.randn(*shape, device="cuda", generator=gen) + 3.0
    leaves = [x.requires_grad_() for x in (q, k, v, i, f)]
    rule = tfla.float32_states
    tfla.float32_states = lambda *args: float32_states
    try:
        h = tfla.mlstm_tfla(*leaves, gate=gate, chunk_size=chunk)
    finally:
        tfla.float32_states = rule
    h.float().square().sum().backward()
    return [h.detach(), *(x.grad for x in leaves)]


def compare(config: tuple[str, int, int, int]) -> tuple[tuple, list[float] | str]:
    try:
        ours = run(*config, float32_states=False)
        wide = run(*config, float32_states=True)
    except Exception as exc:  # out of resources, for instance: reported in the table
        return config, f"{type(exc).__name__}: {str(exc).strip()[:120]}"
    pairs = zip(ours, wide, strict=True)
    return config, [((a.double() - b.double()).norm() / b.double().norm()).item() for a, b in pairs]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--processes", type=int, default=15)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the check needs a CUDA GPU", file=sys.stderr)
        return 2
    with ProcessPoolExecutor(args.processes, mp_context=mp.get_context("spawn")) as pool:
        results = list(pool.map(compare, CONFIGS))
    lines = [
        f"16-bit vs float32 chunk states of tfla on {torch.cuda.get_device_name()} (B1 NH2 T8192 bf16; "
        f"relative RMS difference; torch {torch.__version__})",
        "",
        "| gate | Dqk | Dv | chunk | states used | " + " | ".join(NAMES) + " |",
        "|---|---:|---:|---:|---|" + "---:|" * len(NAMES),
    ]
    worst = {"bfloat16": 0.0, "float32": 0.0}
    gpu = kconfig.gpu_target(torch.device("cuda"))
    for (gate, dqk, dv, chunk), diffs in results:
        config = kconfig.config_for("tfla", dqk, dv, chunk, torch.bfloat16, gate, gpu)
        used = "float32" if kconfig.float32_states("tfla", gate, dqk, config) else "bfloat16"
        if isinstance(diffs, list):
            cells = [f"{d:.1e}" for d in diffs]
            worst[used] = max(worst[used], *diffs)
        else:
            cells = [diffs] + [""] * (len(NAMES) - 1)
        lines.append(f"| {gate} | {dqk} | {dv} | {chunk} | {used} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"largest difference where mlstm_tfla uses bfloat16 states: {worst['bfloat16']:.1e}; "
        f"where it keeps float32 states: {worst['float32']:.1e}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
