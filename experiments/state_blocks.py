"""The recurrent state kernels' blocks at Fig. 5's longest rows: fwbw and fw times per `state_qk x
state_v`, and which results differ from the chosen config's own blocks.

    python experiments/state_blocks.py > OUT.csv

mLSTMsig and mLSTMexp at Fig. 5's head dims (Dqk 128, Dv 256, chunk 128, 16 heads, bf16) at B 1 x T
65,536 and B 2 x T 32,768, with the config `config_for` picks on this GPU and its state blocks
replaced (an explicit `config=`, which `config.filled_state_blocks` leaves as it is). fwbw (backward
of a fixed random `dh`) and fw (no grad) are each the median of `triton.testing.do_bench`. `identical`
lists h, dq, dk, dv, di and df: a name alone where the tensor equals the first blocks' to the bit,
else the name and its relative difference (the gate gradients sum one term per state block).
The run behind `config.filled_state_blocks` is `results/kernels/state-blocks-h100.csv`.
"""

from dataclasses import replace
from functools import partial

import torch
from triton.testing import do_bench

from tfla_bench.kernels.config import KernelConfig, config_for, gpu_target
from tfla_bench.kernels.tfla import mlstm_tfla

BLOCKS = ((64, 128), (64, 64), (64, 32), (32, 64), (32, 32), (32, 128))
NAMES = ("h", "dq", "dk", "dv", "di", "df")
HEADS, DQK, DV, CHUNK = 16, 128, 256, 128


def inputs(batch: int, seq_len: int, device: torch.device) -> tuple[list[torch.Tensor], torch.Tensor]:
    """q, k, v (bf16), i, f (float32, near the trained ranges), each needing its gradient, and `dh`."""
    g = torch.Generator(device=device).manual_seed(0)
    bf16 = {"device": device, "generator": g, "dtype": torch.bfloat16}
    q, k = (torch.randn(batch, HEADS, seq_len, DQK, **bf16) for _ in "qk")
    v = torch.randn(batch, HEADS, seq_len, DV, **bf16)
    i = torch.randn(batch, HEADS, seq_len, device=device, generator=g) - 3
    f = torch.randn(batch, HEADS, seq_len, device=device, generator=g) + 3
    dh = torch.randn(batch, HEADS, seq_len, DV, **bf16)
    return [x.requires_grad_() for x in (q, k, v, i, f)], dh


def fwbw(leaves: list[torch.Tensor], dh: torch.Tensor, gate: str, config: KernelConfig) -> tuple:
    h = mlstm_tfla(*leaves, gate=gate, chunk_size=CHUNK, config=config)
    return (h, *torch.autograd.grad(h, leaves, dh))


def differences(out: tuple, first: tuple) -> str:
    def one(name: str, a: torch.Tensor, b: torch.Tensor) -> str:
        if torch.equal(a, b):
            return name
        return f"{name}:{((a.float() - b.float()).norm() / b.float().norm()).item():.1e}"

    return " ".join(one(n, a, b) for n, a, b in zip(NAMES, out, first, strict=True))


def main() -> None:
    device = torch.device("cuda")
    print("gpu,gate,B,T,state_qk,state_v,programs,fwbw_ms,fw_ms,identical", flush=True)
    for gate in ("sig", "exp"):
        entry = config_for("tfla", DQK, DV, CHUNK, torch.bfloat16, gate, gpu_target(device))
        for batch, seq_len in ((1, 65536), (2, 32768)):
            leaves, dh = inputs(batch, seq_len, device)
            first = None
            for sq, sv in dict.fromkeys(((entry.state_qk, entry.state_v), *BLOCKS)):
                config = replace(entry, state_qk=sq, state_v=sv)
                with torch.no_grad():
                    forward = partial(mlstm_tfla, *leaves, gate=gate, chunk_size=CHUNK, config=config)
                    fw_ms = do_bench(forward, warmup=25, rep=200)
                out = fwbw(leaves, dh, gate, config)
                same = "" if first is None else differences(out, first)
                first = out if first is None else first
                ms = do_bench(partial(fwbw, leaves, dh, gate, config), warmup=25, rep=300)
                programs = batch * HEADS * (DQK // sq) * (DV // sv)
                cells = (torch.cuda.get_device_name(), gate, batch, seq_len, sq, sv, programs)
                print(",".join(map(str, cells)) + f",{ms:.4f},{fw_ms:.4f},{same}", flush=True)


if __name__ == "__main__":
    main()
