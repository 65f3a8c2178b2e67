"""The host side that `mlstm_tfla` and `mlstm_limit_chunk` share: input checks, the per-call settings,
the launches of the chunk-state kernels (`common`), and the autograd glue.

Both run the same chunk-state kernels before their output kernel. Each kernel module supplies a
`KernelOps` pair on `[BH, T, D]` inputs: `forward(q, k, v, log_i, gates, C, n, m, h, m_row, denom,
settings)`, the output kernel on the forward states, writing `h` and, where the gate has them, the
per-row max state `m_row` and denominator `denom` (else None), and
`backward(q, k, v, dh, log_i, gates, C, m, m_row, denom, dC_final, settings)`, returning
`(dq, dk, dv, dlog_i, dlog_f, dC)` with `dC[:, 0]` the initial state's gradient. `backward` may
overwrite the forward states `C` (TFLA writes the state gradients into them); a second backward
through the same graph recomputes them.

Gradient conventions of the initial and final states (TFLA paper, appendix B.3): the returned
final `n` and `m` get no gradient, and the initial `n_0` gets a zero gradient; the initial `m_0`
gets `sum(dC_0 * C_0)`, its exact gradient, since the memory is `C_0 exp(m_0)`. Passing a final
state on as the next call's initial state therefore chains gradients exactly.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from tfla_bench.kernels.common import bwd_kernel_dstates, fwd_kernel_states
from tfla_bench.kernels.config import KernelConfig, check_config, config_for, gpu_name, is_pow2
from tfla_bench.kernels.gates import GATES, ChunkGates, chunk_gates
from tfla_bench.kernels.reference import state_names

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MIN_CHUNK, MAX_CHUNK = 16, 4096
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 1024
# Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined) runs them on the CPU.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class Settings:
    """What one call fixes for all its kernels: the gate, `L`, `eps`, mLSTMsig's normalizer, the config."""

    gate: str
    chunk_size: int
    eps: float
    normalize: bool
    config: KernelConfig

    @property
    def use_max_state(self) -> bool:
        return self.gate == "exp"

    @property
    def has_n(self) -> bool:
        """Whether there is a normalizer `n` and a per-row denominator."""
        return self.gate == "exp" or self.normalize


def dot_precision(dtype: torch.dtype) -> str:
    # Full-precision float32 products (the CPU tests compare against float64); bf16/fp16 use tensor cores.
    return "ieee" if dtype == torch.float32 else "tf32"


def pointer_or(x: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """`x`, or for an absent tensor `stand_in`: the kernels skip the loads and stores of absent tensors
    (constexpr flags), so any pointer fills the slot."""
    return stand_in if x is None else x


def states_forward(k, v, gates: ChunkGates, log_i, C0, n0, m0, s: Settings, with_n: bool):
    """Run `fwd_kernel_states`: the states before every chunk and the final one, float32."""
    bh, seq_len, dqk = k.shape
    dv = v.shape[-1]
    nc = gates.g.shape[-1]
    cfg = s.config
    C = torch.empty(bh, nc + 1, dqk, dv, dtype=torch.float32, device=k.device)
    C[:, 0] = 0.0 if C0 is None else C0.reshape(bh, dqk, dv)
    n = m = None
    if with_n:
        n = torch.empty(bh, nc + 1, dqk, dtype=torch.float32, device=k.device)
        n[:, 0] = 0.0 if n0 is None else n0.reshape(bh, dqk)
    if s.use_max_state:
        m = torch.empty(bh, nc + 1, dtype=torch.float32, device=k.device)
        m[:, 0] = float("-inf") if m0 is None else m0.reshape(bh)
    fwd_kernel_states[(bh * (dqk // cfg.state_qk) * (dv // cfg.state_v),)](
        k, v, gates.b, log_i, gates.g, gates.a_max, C, pointer_or(n, C), pointer_or(m, C),
        seq_len, nc,
        DQK=dqk, DV=dv, L=s.chunk_size, BLOCK_T=cfg.state_seq, BLOCK_DQK=cfg.state_qk, BLOCK_DV=cfg.state_v,
        USE_MAX_STATE=s.use_max_state, HAS_N=with_n, ONE_TILE=cfg.state_one_tile,
        DOT_PRECISION=dot_precision(k.dtype),
        num_warps=cfg.state_num_warps, num_stages=cfg.state_num_stages,
    )  # fmt: skip
    return C, n, m


def states_backward(q, dh, gates: ChunkGates, m, m_row, denom, C, dC, dC_final, s: Settings) -> torch.Tensor:
    """Run `bwd_kernel_dstates` into `dC` (`dC` may be `C`) from the final state's gradient `dC_final`
    (None: zero); returns each chunk's gate-sum gradient `g_bar_k sum(C_{k-1} * dC_k)`, `[BH, NC]`."""
    bh, seq_len, dqk = q.shape
    dv = dh.shape[-1]
    nc = gates.g.shape[-1]
    cfg = s.config
    dC[:, nc] = 0.0 if dC_final is None else dC_final.reshape(bh, dqk, dv)
    n_state_blocks = (dqk // cfg.state_qk) * (dv // cfg.state_v)
    dg = torch.empty(n_state_blocks, bh, nc, dtype=torch.float32, device=q.device)
    bwd_kernel_dstates[(bh * n_state_blocks,)](
        q, dh, gates.b, gates.g, pointer_or(m_row, gates.b), pointer_or(denom, gates.b),
        pointer_or(m, gates.g), C, dC, dg,
        seq_len, nc, bh, dqk**-0.5,
        DQK=dqk, DV=dv, L=s.chunk_size, BLOCK_T=cfg.state_seq, BLOCK_DQK=cfg.state_qk, BLOCK_DV=cfg.state_v,
        USE_MAX_STATE=s.use_max_state, HAS_DENOM=s.has_n, ONE_TILE=cfg.state_one_tile,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=cfg.state_num_warps, num_stages=cfg.state_num_stages,
    )  # fmt: skip
    return dg.sum(0)


class KernelOps(NamedTuple):
    """The forward and backward passes of one kernel on `[BH, T, D]` inputs (module docstring)."""

    forward: Callable
    backward: Callable


class ChunkwiseFunction(torch.autograd.Function):
    """Autograd glue on `[B, NH, T, D]` inputs and float32 log gates (gate activations stay in PyTorch)."""

    @staticmethod
    def forward(ctx, ops: KernelOps, q, k, v, log_i, log_f, C0, n0, m0, s: Settings):
        batch, heads, seq_len, dqk = q.shape
        dv = v.shape[-1]
        bh = batch * heads
        flat = [x.reshape(bh, seq_len, -1) for x in (q, k, v)]
        log_i_flat = log_i.reshape(bh, seq_len).contiguous()
        log_f_flat = log_f.reshape(bh, seq_len).contiguous()
        gates = chunk_gates(log_i_flat, log_f_flat, s.chunk_size)
        C, n, m = states_forward(flat[1], flat[2], gates, log_i_flat, C0, n0, m0, s, with_n=s.has_n)
        h = torch.empty_like(flat[2])
        m_row = torch.empty(bh, seq_len, dtype=torch.float32, device=q.device) if s.use_max_state else None
        denom = torch.empty(bh, seq_len, dtype=torch.float32, device=q.device) if s.has_n else None
        ops.forward(*flat, log_i_flat, gates, C, n, m, h, m_row, denom, s)
        nc = gates.g.shape[-1]
        C_T = C[:, nc].clone().reshape(batch, heads, dqk, dv)
        n_T = n[:, nc].clone().reshape(batch, heads, dqk) if n is not None else None
        m_T = m[:, nc].clone().reshape(batch, heads) if m is not None else None
        ctx.save_for_backward(*flat, log_i_flat, C0, m0)
        # Kept outside save_for_backward: the backward pass may overwrite the states with their gradients.
        ctx.states = C
        ctx.fwd = (gates, m, m_row, denom)
        ctx.ops = ops
        ctx.settings = s
        ctx.shape = (batch, heads, seq_len, dqk, dv)
        ctx.has_n0 = n0 is not None
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(x for x in (n_T, m_T) if x is not None))
        return h.reshape(batch, heads, seq_len, dv), C_T, n_T, m_T

    @staticmethod
    def backward(ctx, dh, dC_T, dn_T, dm_T):
        q, k, v, log_i, C0, m0 = ctx.saved_tensors
        gates, m, m_row, denom = ctx.fwd
        s = ctx.settings
        batch, heads, seq_len, dqk, dv = ctx.shape
        C = ctx.states
        ctx.states = None
        if C is None:  # a second backward through the same graph: recompute the forward states
            C, _, _ = states_forward(k, v, gates, log_i, C0, None, m0, s, with_n=False)
        dh = torch.zeros_like(v) if dh is None else dh.reshape(v.shape).contiguous()
        dq, dk, dvv, dlog_i, dlog_f, dC = ctx.ops.backward(
            q, k, v, dh, log_i, gates, C, m, m_row, denom, dC_T, s
        )
        dC0 = dn0 = dm0 = None
        if C0 is not None:
            dC0 = dC[:, 0].reshape(C0.shape).to(C0.dtype)
        if ctx.has_n0:
            dn0 = torch.zeros(batch, heads, dqk, dtype=C0.dtype, device=q.device)
        if m0 is not None:
            dm0 = (dC[:, 0].reshape(C0.shape) * C0.float()).sum((-1, -2)).to(m0.dtype)
        rows = (batch, heads, seq_len)
        return (
            None,
            dq.reshape(*rows, dqk),
            dk.reshape(*rows, dqk),
            dvv.reshape(*rows, dv),
            dlog_i.reshape(rows),
            dlog_f.reshape(rows),
            dC0,
            dn0,
            dm0,
            None,
        )


def check_inputs(q, k, v, i, f, gate, chunk_size, seq_len_padded, eps):
    """Raise ValueError unless the tensors, the gate, `chunk_size` and `eps` suit the kernels."""
    for name, x in (("q", q), ("k", k), ("v", v), ("i", i), ("f", f)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, NH, T, Dqk], got {tuple(q.shape)}")
    batch, heads, seq_len, dqk = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have shape [B, NH, T, Dv] = [{batch}, {heads}, {seq_len}, Dv], got {tuple(v.shape)}"
        )
    for name, x in (("i", i), ("f", f)):
        if x.shape != q.shape[:3]:
            raise ValueError(
                f"{name} must have shape [B, NH, T] = {tuple(q.shape[:3])}, got {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if q.dtype not in INPUT_DTYPES:
        raise ValueError(f"q must be bfloat16, float16 or float32, got {q.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"{name} must have the dtype of q ({q.dtype}), got {x.dtype}")
    for name, x in (("k", k), ("v", v), ("i", i), ("f", f)):
        if x.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {x.device}")
    if q.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"q must be a CUDA tensor (or set TRITON_INTERPRET=1 before import), got {q.device}")
    for name, dim in (("Dqk (q.shape[-1])", dqk), ("Dv (v.shape[-1])", v.shape[-1])):
        if not (MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM and dim % 16 == 0):
            raise ValueError(f"head dim {name} must be a multiple of 16 in [16, 1024], got {dim}")
    if not isinstance(chunk_size, int) or not is_pow2(chunk_size) or not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be a power of two in [16, 4096], got {chunk_size!r}")
    if chunk_size > seq_len_padded:
        raise ValueError(
            f"chunk_size must be at most the sequence length T={seq_len_padded}, got {chunk_size}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def check_state(initial_state, gate, normalize, q, dv) -> dict[str, torch.Tensor]:
    """The initial state by name (`C`, `n`, `m`); raise ValueError unless it fits the gate and `q`."""
    batch, heads, _, dqk = q.shape
    shapes = {"C": (batch, heads, dqk, dv), "n": (batch, heads, dqk), "m": (batch, heads)}
    names = state_names(gate, normalize)
    if isinstance(initial_state, torch.Tensor) and names == ("C",):
        initial_state = (initial_state,)
    if not isinstance(initial_state, tuple | list) or len(initial_state) != len(names):
        raise ValueError(f"initial_state must be a tuple {names} for gate={gate!r}, normalize={normalize}")
    for name, x in zip(names, initial_state, strict=True):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != shapes[name]:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"initial_state {name} must have shape {list(shapes[name])}, got {got}")
        if x.device != q.device:
            raise ValueError(f"initial_state {name} must be on the device of q ({q.device}), got {x.device}")
        if not x.is_floating_point():
            raise ValueError(f"initial_state {name} must be a floating-point tensor, got {x.dtype}")
    return dict(zip(names, initial_state, strict=True))


def resolve_config(
    kernel: str, config: KernelConfig | None, q: torch.Tensor, dv: int, chunk_size: int, gate: str
):
    """The caller's `config` once checked, else the cached config for this GPU and shape (`config_for`)."""
    dqk = q.shape[-1]
    if config is None:
        return config_for(kernel, dqk, dv, chunk_size, q.dtype, gate, gpu_name(q.device))
    check_config(kernel, config, dqk, dv, chunk_size)
    return config


def apply(ops: KernelOps, q, k, v, log_i, log_f, state: dict[str, torch.Tensor], s: Settings):
    """Run `ops` through autograd on contiguous `[B, NH, T, D]` inputs and log gates; returns `h` and
    the final state (the tuple of `reference.state_names`, float32)."""
    C0, n0, m0 = (state[name].float() if name in state else None for name in ("C", "n", "m"))
    h, C_T, n_T, m_T = ChunkwiseFunction.apply(ops, q, k, v, log_i.float(), log_f.float(), C0, n0, m0, s)
    return h, tuple(x for x in (C_T, n_T, m_T) if x is not None)
