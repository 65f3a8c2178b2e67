"""`mlstm_tfla`: the TFLA mLSTM kernels (xl_chunk) with autograd, for mLSTMexp and mLSTMsig.

The math is the one of `tfla_bench.kernels.reference` (see its docstring for the output formula,
the state tuples and the max-state convention `m_0 = -inf` for an empty memory). The forward pass
runs two Triton kernels (`tfla_fwd`), the backward pass four (`tfla_bwd`) and a small PyTorch
epilogue for the gate gradients. Memory: the forward pass keeps the chunk-boundary states (float32,
`(ceil(T/L) + 1) * Dqk * Dv` per head) and, per step, the float32 max state and denominator
(mLSTMexp; the denominator alone for mLSTMsig with `normalize`) for the backward pass, which
overwrites the states with their gradients in place.

Gradient conventions (TFLA paper, appendix B.3):

- No gradient flows through the normalizer or the max state: the per-row denominator
  `max(|n^T q|, exp(-m)) + eps` is a constant of the backward pass. This is exact when `h` is
  followed by a per-timestep scale-invariant norm (RMS-norm or LayerNorm without epsilon), as in
  the mLSTM block; it is exact for mLSTMsig without `normalize`, which has no denominator.
- The returned final `n` and `m` get no gradient, and the initial `n_0` gets a zero gradient;
  the initial `m_0` gets `sum(dC_0 * C_0)`, its exact gradient, since the memory is `C_0 exp(m_0)`.
  Passing a final state on as the next call's initial state therefore chains gradients exactly.
- Gate gradients (appendix B.3, `gates.chunk_log_gate_grads`): the row and column sums of `dD`
  (B.3) equal the dot products `q_t . dq_t` and `k_j . dk_j`, which the dQ and dK kernels
  write in float32 (dK also its inter-chunk part); the state kernel writes each chunk's
  `g_bar_k sum(C_{k-1} * dC_k)` (B.3). A PyTorch epilogue turns them into
  `d log_i_j = k_j . dk_j` and `d log_f` with within-chunk (reverse) cumulative sums.

Block sizes (`TFLABlocks`, `default_blocks`), chosen from per-kernel timings on an H100 80GB HBM3
(bf16, Dqk 128, Dv 256, L 128, 8 sequences x 16 heads of 8192 steps, fwbw):
- forward output kernel: `block_seq_q x block_seq_kv` = `min(L, 128) x min(L, 64)` for mLSTMsig and
  `min(L, 128) x min(L, 32)` for mLSTMexp (whose running-max rescaling favours short kv tiles), 8 warps,
  2 stages; float32 inputs keep `min(L, 64)` tiles (twice the shared memory per element);
- head-dim blocks `block_qk`, `block_v`: the largest power of two dividing the head dim, at most 128
  (64 for float32);
- backward dQ/dK/dV kernels: `min(L, 32) x min(L, 64)` tiles, 4 warps, 2 stages;
- recurrent kernels: the state is split into `block_state_qk x block_state_v` = 32 x 128 blocks
  (largest powers of two dividing the head dims, at most those); each program walks a chunk
  `block_state_seq` (`min(L, 64)`) steps at a time, with 4 warps.
Every block size can be overridden by keyword.
"""

import os
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from tfla_bench.kernels.gates import GATES, chunk_gates, chunk_log_gate_grads, log_gates
from tfla_bench.kernels.tfla_bwd import (
    tfla_bwd_kernel_dk,
    tfla_bwd_kernel_dq,
    tfla_bwd_kernel_dstates,
    tfla_bwd_kernel_dv,
)
from tfla_bench.kernels.tfla_fwd import tfla_exp_fwd_kernel_h, tfla_fwd_kernel_states, tfla_sig_fwd_kernel_h

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MIN_CHUNK, MAX_CHUNK = 16, 4096
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 1024
SEQ_MULTIPLE = 16
# Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined) runs them on the CPU.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class TFLABlocks:
    """Tile sizes and launch settings of the TFLA kernels (all powers of two >= 16 but the warps/stages).

    Attributes:
        seq_q: `B_Lhq`, query-row tile of the parallel kernels.
        seq_kv: `B_Lkv`, key/value-row tile of the parallel kernels.
        qk: `B_dqk`, query/key head-dim block of the parallel kernels (divides `Dqk`).
        v: `B_dhv`, value head-dim block of the parallel kernels (divides `Dv`).
        state_seq: steps per tile of the recurrent kernels.
        state_qk: state rows per recurrent-kernel program (divides `Dqk`).
        state_v: state columns per recurrent-kernel program (divides `Dv`).
        num_warps: warps per program of the parallel forward kernel.
        num_stages: software-pipelining stages of the parallel forward kernel.
        state_num_warps: warps per program of the recurrent kernels.
        bwd_seq_q, bwd_seq_kv, bwd_num_warps, bwd_num_stages: `seq_q`, `seq_kv`, `num_warps` and
            `num_stages` of the three parallel backward kernels (dQ, dK, dV), tuned apart from the forward.
    """

    seq_q: int
    seq_kv: int
    qk: int
    v: int
    state_seq: int
    state_qk: int
    state_v: int
    num_warps: int = 4
    num_stages: int = 2
    state_num_warps: int = 4
    bwd_seq_q: int = 64
    bwd_seq_kv: int = 64
    bwd_num_warps: int = 4
    bwd_num_stages: int = 2


def _largest_pow2_divisor(n: int, cap: int) -> int:
    return min(n & -n, cap)


def default_blocks(
    head_dim_qk: int,
    head_dim_v: int,
    chunk_size: int,
    dtype: torch.dtype,
    gate: str = "sig",
) -> TFLABlocks:
    """The block-size heuristic (module docstring); head dims are multiples of 16.

    Args:
        head_dim_qk: `Dqk`.
        head_dim_v: `Dv`.
        chunk_size: `L`.
        dtype: input dtype (float32 tiles get half the head-dim block and shorter query tiles).
        gate: `"exp"` or `"sig"` (the forward kv tile differs). Default `"sig"`.
    """
    wide = dtype != torch.float32
    dim_cap = 128 if wide else 64
    seq = min(chunk_size, 64)
    qk = _largest_pow2_divisor(head_dim_qk, dim_cap)
    v = _largest_pow2_divisor(head_dim_v, dim_cap)
    # 32 x 128 state blocks also at few heads: at 2 x 16 heads of 32768 steps they took 8.70 ms fwbw
    # against 10.04 ms with 32 x 32 blocks (H100), though they leave fewer programs.
    state_qk = _largest_pow2_divisor(head_dim_qk, 32)
    state_v = _largest_pow2_divisor(head_dim_v, 128)
    return TFLABlocks(
        seq_q=min(chunk_size, 128) if wide else seq,
        seq_kv=min(chunk_size, 32) if gate == "exp" else seq,
        qk=qk,
        v=v,
        state_seq=seq,
        state_qk=state_qk,
        state_v=state_v,
        num_warps=8 if seq * max(qk, v) >= 64 * 128 else 4,
        num_stages=2,
        state_num_warps=4,
        bwd_seq_q=min(chunk_size, 32),
        bwd_seq_kv=seq,
        bwd_num_warps=4,
        bwd_num_stages=2,
    )


@dataclass(frozen=True)
class _Config:
    gate: str
    chunk_size: int
    eps: float
    normalize: bool
    blocks: TFLABlocks

    @property
    def use_max_state(self) -> bool:
        return self.gate == "exp"

    @property
    def has_n(self) -> bool:
        return self.gate == "exp" or self.normalize

    @property
    def has_denom(self) -> bool:
        return self.has_n


def _dot_precision(dtype: torch.dtype) -> str:
    # Full-precision float32 products (the CPU tests compare against float64); bf16/fp16 use tensor cores.
    return "ieee" if dtype == torch.float32 else "tf32"


def _states_forward(k, v, gates, log_i, C0, n0, m0, cfg: _Config, with_n: bool):
    """Run `tfla_fwd_kernel_states`: the states before every chunk and the final one, float32."""
    bh, seq_len, dqk = k.shape
    dv = v.shape[-1]
    nc = gates.g.shape[-1]
    blk = cfg.blocks
    C = torch.empty(bh, nc + 1, dqk, dv, dtype=torch.float32, device=k.device)
    C[:, 0] = 0.0 if C0 is None else C0.reshape(bh, dqk, dv)
    n = m = None
    if with_n:
        n = torch.empty(bh, nc + 1, dqk, dtype=torch.float32, device=k.device)
        n[:, 0] = 0.0 if n0 is None else n0.reshape(bh, dqk)
    if cfg.use_max_state:
        m = torch.empty(bh, nc + 1, dtype=torch.float32, device=k.device)
        m[:, 0] = float("-inf") if m0 is None else m0.reshape(bh)
    grid = (bh * (dqk // blk.state_qk) * (dv // blk.state_v),)
    tfla_fwd_kernel_states[grid](
        k, v, gates.b, log_i, gates.g, gates.a_max, C, n if with_n else C, m if m is not None else C,
        seq_len, nc,
        DQK=dqk, DV=dv, L=cfg.chunk_size, BLOCK_T=blk.state_seq, BLOCK_DQK=blk.state_qk, BLOCK_DV=blk.state_v,
        USE_MAX_STATE=cfg.use_max_state, HAS_N=with_n, DOT_PRECISION=_dot_precision(k.dtype),
        num_warps=blk.state_num_warps,
    )  # fmt: skip
    return C, n, m


def _forward(q, k, v, log_i, log_f, C0, n0, m0, cfg: _Config):
    """Both forward kernels on `[BH, T, D]` inputs; returns the output and what the backward needs."""
    bh, seq_len, dqk = q.shape
    dv = v.shape[-1]
    blk = cfg.blocks
    gates = chunk_gates(log_i, log_f, cfg.chunk_size)
    nc = gates.g.shape[-1]
    C, n, m = _states_forward(k, v, gates, log_i, C0, n0, m0, cfg, with_n=cfg.has_n)
    h = torch.empty_like(v)
    denom = torch.empty(bh, seq_len, dtype=torch.float32, device=q.device) if cfg.has_denom else None
    m_row = torch.empty(bh, seq_len, dtype=torch.float32, device=q.device) if cfg.use_max_state else None
    grid = (bh * nc * (cfg.chunk_size // blk.seq_q) * (dv // blk.v),)
    common = dict(
        DQK=dqk, DV=dv, L=cfg.chunk_size, BLOCK_LQ=blk.seq_q, BLOCK_LKV=blk.seq_kv, BLOCK_DQK=blk.qk,
        BLOCK_DV=blk.v, DOT_PRECISION=_dot_precision(q.dtype), num_warps=blk.num_warps,
        num_stages=blk.num_stages,
    )  # fmt: skip
    scale = dqk**-0.5
    if cfg.gate == "exp":
        tfla_exp_fwd_kernel_h[grid](
            q, k, v, gates.b, log_i, C, n, m, h, m_row, denom, seq_len, nc, scale, cfg.eps, **common
        )
    else:
        tfla_sig_fwd_kernel_h[grid](
            q, k, v, gates.b, log_i, C, n if n is not None else C, h, denom if denom is not None else h,
            seq_len, nc, scale, cfg.eps, NORMALIZE=cfg.normalize, **common,
        )  # fmt: skip
    return h, gates, C, n, m, m_row, denom


def _backward(q, k, v, dh, log_i, gates, C, m, m_row, denom, dC_final, cfg: _Config):
    """The four backward kernels; `C` (the forward states) is overwritten with the state gradients.

    Returns `dq, dk, dv, dlog_i, dlog_f, dC` with `dC[:, 0]` the initial-state gradient.
    """
    bh, seq_len, dqk = q.shape
    dv_dim = v.shape[-1]
    blk = cfg.blocks
    nc = gates.g.shape[-1]
    scale = dqk**-0.5
    precision = _dot_precision(q.dtype)
    # The kernels skip the loads of absent tensors (constexpr flags); any pointer fills the slot.
    m_arg = m if m is not None else gates.g
    m_row_arg = m_row if m_row is not None else gates.b
    denom_arg = denom if denom is not None else gates.b
    flags = dict(USE_MAX_STATE=cfg.use_max_state, HAS_DENOM=cfg.has_denom, DOT_PRECISION=precision)
    tiles = dict(
        DQK=dqk,
        DV=dv_dim,
        L=cfg.chunk_size,
        BLOCK_LQ=blk.bwd_seq_q,
        BLOCK_LKV=blk.bwd_seq_kv,
        BLOCK_DQK=blk.qk,
        BLOCK_DV=blk.v,
        num_warps=blk.bwd_num_warps,
        num_stages=blk.bwd_num_stages,
    )
    n_seq_tiles = cfg.chunk_size // blk.bwd_seq_q
    n_kv_tiles = cfg.chunk_size // blk.bwd_seq_kv

    dq = torch.empty_like(q)
    qdq = torch.empty(dqk // blk.qk, bh, seq_len, dtype=torch.float32, device=q.device)
    tfla_bwd_kernel_dq[(bh * nc * n_seq_tiles * (dqk // blk.qk),)](
        q, k, v, dh, gates.b, log_i, m_row_arg, denom_arg, m_arg, C, dq, qdq, seq_len, nc, bh, scale,
        **tiles, **flags,
    )  # fmt: skip

    # The state gradients take the place of the forward states (read for the last time by the
    # dstates kernel, just before it overwrites them).
    C[:, nc] = 0.0 if dC_final is None else dC_final.reshape(bh, dqk, dv_dim)
    dC = C
    n_state_blocks = (dqk // blk.state_qk) * (dv_dim // blk.state_v)
    dg = torch.empty(n_state_blocks, bh, nc, dtype=torch.float32, device=q.device)
    tfla_bwd_kernel_dstates[(bh * n_state_blocks,)](
        q, dh, gates.b, gates.g, m_row_arg, denom_arg, m_arg, dC, dg, seq_len, nc, bh, scale,
        DQK=dqk, DV=dv_dim, L=cfg.chunk_size, BLOCK_T=blk.state_seq, BLOCK_DQK=blk.state_qk,
        BLOCK_DV=blk.state_v, num_warps=blk.state_num_warps, **flags,
    )  # fmt: skip

    dk = torch.empty_like(k)
    kdk = torch.empty(2, dqk // blk.qk, bh, seq_len, dtype=torch.float32, device=q.device)
    tfla_bwd_kernel_dk[(bh * nc * n_kv_tiles * (dqk // blk.qk),)](
        q, k, v, dh, gates.b, log_i, gates.g, m_row_arg, denom_arg, m_arg, dC, dk, kdk[0], kdk[1], seq_len,
        nc, bh, scale, **tiles, **flags,
    )  # fmt: skip
    dv = torch.empty_like(v)
    tfla_bwd_kernel_dv[(bh * nc * n_kv_tiles * (dv_dim // blk.v),)](
        q, k, dh, gates.b, log_i, gates.g, m_row_arg, denom_arg, m_arg, dC, dv, seq_len, nc, scale,
        **tiles, **flags,
    )  # fmt: skip

    kdk = kdk.sum(1)
    dlog_i, dlog_f = chunk_log_gate_grads(qdq.sum(0), kdk[0], kdk[1], dg.sum(0), cfg.chunk_size)
    return dq, dk, dv, dlog_i, dlog_f, dC


class _TFLAFunction(torch.autograd.Function):
    """Autograd glue on `[B, NH, T, D]` inputs and float32 log gates (gate activations stay in PyTorch)."""

    @staticmethod
    def forward(ctx, q, k, v, log_i, log_f, C0, n0, m0, cfg: _Config):
        batch, heads, seq_len, dqk = q.shape
        dv = v.shape[-1]
        bh = batch * heads
        flat = [x.reshape(bh, seq_len, -1) for x in (q, k, v)]
        log_i_flat = log_i.reshape(bh, seq_len).contiguous()
        log_f_flat = log_f.reshape(bh, seq_len).contiguous()
        h, gates, C, n, m, m_row, denom = _forward(*flat, log_i_flat, log_f_flat, C0, n0, m0, cfg)
        nc = gates.g.shape[-1]
        C_T = C[:, nc].clone().reshape(batch, heads, dqk, dv)
        n_T = n[:, nc].clone().reshape(batch, heads, dqk) if n is not None else None
        m_T = m[:, nc].clone().reshape(batch, heads) if m is not None else None
        ctx.save_for_backward(*flat, log_i_flat, C0, m0)
        # Kept outside save_for_backward: the backward pass overwrites the states with their gradients.
        ctx.states = C
        ctx.fwd = (gates, m, m_row, denom)
        ctx.cfg = cfg
        ctx.shape = (batch, heads, seq_len, dqk, dv)
        ctx.has_n0 = n0 is not None
        ctx.set_materialize_grads(False)
        outputs = [x for x in (n_T, m_T) if x is not None]
        ctx.mark_non_differentiable(*outputs)
        return h.reshape(batch, heads, seq_len, dv), C_T, n_T, m_T

    @staticmethod
    def backward(ctx, dh, dC_T, dn_T, dm_T):
        q, k, v, log_i, C0, m0 = ctx.saved_tensors
        gates, m, m_row, denom = ctx.fwd
        cfg = ctx.cfg
        batch, heads, seq_len, dqk, dv = ctx.shape
        C = ctx.states
        ctx.states = None
        if C is None:  # a second backward through the same graph: recompute the forward states
            C, _, _ = _states_forward(k, v, gates, log_i, C0, None, m0, cfg, with_n=False)
        if dh is None:
            dh = torch.zeros_like(v)
        dh = dh.reshape(q.shape[0], seq_len, dv).contiguous()
        dq, dk, dvv, dlog_i, dlog_f, dC = _backward(q, k, v, dh, log_i, gates, C, m, m_row, denom, dC_T, cfg)
        shape4 = (batch, heads, seq_len)
        dC0 = dn0 = dm0 = None
        if C0 is not None:
            dC0 = dC[:, 0].reshape(C0.shape).to(C0.dtype)
        if ctx.has_n0:
            dn0 = torch.zeros(batch, heads, dqk, dtype=C0.dtype, device=q.device)
        if m0 is not None:
            dm0 = (dC[:, 0].reshape(C0.shape) * C0.float()).sum((-1, -2)).to(m0.dtype)
        return (
            dq.reshape(*shape4, dqk),
            dk.reshape(*shape4, dqk),
            dvv.reshape(*shape4, dv),
            dlog_i.reshape(shape4),
            dlog_f.reshape(shape4),
            dC0,
            dn0,
            dm0,
            None,
        )


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _check_inputs(q, k, v, i, f, gate, chunk_size, seq_len_padded, eps):
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
    if (
        not isinstance(chunk_size, int)
        or not _is_pow2(chunk_size)
        or not MIN_CHUNK <= chunk_size <= MAX_CHUNK
    ):
        raise ValueError(f"chunk_size must be a power of two in [16, 4096], got {chunk_size!r}")
    if chunk_size > seq_len_padded:
        raise ValueError(
            f"chunk_size must be at most the sequence length T={seq_len_padded}, got {chunk_size}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def _check_state(initial_state, gate, normalize, q, dv):
    batch, heads, _, dqk = q.shape
    shapes = {"C": (batch, heads, dqk, dv), "n": (batch, heads, dqk), "m": (batch, heads)}
    names = ("C", "n", "m") if gate == "exp" else (("C", "n") if normalize else ("C",))
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


def _resolve_blocks(dqk, dv, chunk_size, dtype, gate, overrides: dict) -> TFLABlocks:
    defaults = default_blocks(dqk, dv, chunk_size, dtype, gate)
    blocks = replace(defaults, **{k: x for k, x in overrides.items() if x is not None})
    for name in ("seq_q", "seq_kv", "state_seq", "bwd_seq_q", "bwd_seq_kv"):
        size = getattr(blocks, name)
        if not (_is_pow2(size) and 16 <= size <= chunk_size):
            raise ValueError(
                f"block_{name} must be a power of two in [16, chunk_size={chunk_size}], got {size}"
            )
    for name, dim in (("qk", dqk), ("v", dv), ("state_qk", dqk), ("state_v", dv)):
        size = getattr(blocks, name)
        if not (_is_pow2(size) and size >= 16 and dim % size == 0):
            raise ValueError(
                f"block_{name} must be a power of two >= 16 dividing the head dim {dim}, got {size}"
            )
    for name in ("num_warps", "state_num_warps", "bwd_num_warps"):
        if not _is_pow2(getattr(blocks, name)):
            raise ValueError(f"{name} must be a power of two, got {getattr(blocks, name)}")
    for name in ("num_stages", "bwd_num_stages"):
        if getattr(blocks, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(blocks, name)}")
    return blocks


def mlstm_tfla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    gate: str = "exp",
    chunk_size: int = 128,
    initial_state: tuple[torch.Tensor, ...] | torch.Tensor | None = None,
    return_final_state: bool = False,
    eps: float = 1e-6,
    normalize: bool = False,
    pad: bool = False,
    block_seq_q: int | None = None,
    block_seq_kv: int | None = None,
    block_qk: int | None = None,
    block_v: int | None = None,
    block_state_seq: int | None = None,
    block_state_qk: int | None = None,
    block_state_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    state_num_warps: int | None = None,
    bwd_block_seq_q: int | None = None,
    bwd_block_seq_kv: int | None = None,
    bwd_num_warps: int | None = None,
    bwd_num_stages: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The mLSTM with the TFLA xl_chunk kernels (Triton), differentiable.

    Args:
        q: queries `[B, NH, T, Dqk]`, bfloat16, float16 or float32.
        k: keys `[B, NH, T, Dqk]`, dtype of `q`.
        v: values `[B, NH, T, Dv]`, dtype of `q`. `Dqk` and `Dv` are multiples of 16 in [16, 1024].
        i: input-gate pre-activations `[B, NH, T]` (any float dtype; computed in float32).
        f: forget-gate pre-activations `[B, NH, T]`.
        gate: `"exp"` (mLSTMexp) or `"sig"` (mLSTMsig). Default `"exp"`.
        chunk_size: `L`, a power of two in [16, 4096], at most `T`. Default 128.
        initial_state: `(C, n, m)` for exp (`[B, NH, Dqk, Dv]`, `[B, NH, Dqk]`, `[B, NH]`); `C` or `(C,)`
            for sig, `(C, n)` for sig with `normalize`. Default: the empty memory (`m = -inf`).
        return_final_state: also return the final state (a tuple in the form of `initial_state`,
            float32).
        eps: added to the denominator (exp; sig with `normalize`). Default 1e-6.
        normalize: mLSTMsig only: divide by `max(|n^T q|, 1) + eps`. mLSTMexp always normalizes.
        pad: if `T` is not a multiple of 16, pad the sequence with steps that leave the state
            unchanged (forget gate 1, input gate 0) instead of raising.
        block_seq_q, block_seq_kv, block_qk, block_v, block_state_seq, block_state_qk, block_state_v,
        num_warps, num_stages, state_num_warps, bwd_block_seq_q, bwd_block_seq_kv, bwd_num_warps,
        bwd_num_stages: override the `default_blocks` heuristic (`TFLABlocks`).

    Returns:
        `h` `[B, NH, T, Dv]` in the dtype of `q`, or `(h, final_state)` with `return_final_state`.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device, or an unsupported size.

    Examples::

        >>> q, k = torch.randn(2, 2, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
        >>> v = torch.randn(2, 4, 256, 128, device="cuda", dtype=torch.bfloat16)
        >>> i = torch.randn(2, 4, 256, device="cuda") - 10.0  # input-gate pre-activations near -10
        >>> f = torch.randn(2, 4, 256, device="cuda") + 3.0  # forget gates near sigmoid(3) = 0.95
        >>> h = mlstm_tfla(q, k, v, i, f, gate="sig", chunk_size=64)
        >>> h, (C, n, m) = mlstm_tfla(q, k, v, i, f, gate="exp", return_final_state=True)
    """
    seq_len = q.shape[2] if isinstance(q, torch.Tensor) and q.dim() == 4 else 0
    pad_steps = -seq_len % SEQ_MULTIPLE
    if pad_steps and not pad:
        raise ValueError(
            f"the sequence length T={seq_len} must be a multiple of {SEQ_MULTIPLE} (or pass pad=True)"
        )
    _check_inputs(q, k, v, i, f, gate, chunk_size, seq_len + pad_steps, eps)
    dv = v.shape[-1]
    state = _check_state(initial_state, gate, normalize, q, dv) if initial_state is not None else {}
    overrides = dict(
        seq_q=block_seq_q,
        seq_kv=block_seq_kv,
        qk=block_qk,
        v=block_v,
        state_seq=block_state_seq,
        state_qk=block_state_qk,
        state_v=block_state_v,
        num_warps=num_warps,
        num_stages=num_stages,
        state_num_warps=state_num_warps,
        bwd_seq_q=bwd_block_seq_q,
        bwd_seq_kv=bwd_block_seq_kv,
        bwd_num_warps=bwd_num_warps,
        bwd_num_stages=bwd_num_stages,
    )
    blocks = _resolve_blocks(q.shape[-1], dv, chunk_size, q.dtype, gate, overrides)
    cfg = _Config(
        gate=gate, chunk_size=chunk_size, eps=float(eps), normalize=normalize and gate == "sig", blocks=blocks
    )

    log_i, log_f = log_gates(i, f, gate)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if pad_steps:
        q, k, v = (F.pad(x, (0, 0, 0, pad_steps)) for x in (q, k, v))
        log_i = F.pad(log_i, (0, pad_steps), value=float("-inf"))
        log_f = F.pad(log_f, (0, pad_steps), value=0.0)
    C0, n0, m0 = (state.get(name) for name in ("C", "n", "m"))
    C0, n0, m0 = (x.float() if x is not None else None for x in (C0, n0, m0))
    h, C_T, n_T, m_T = _TFLAFunction.apply(q, k, v, log_i.float(), log_f.float(), C0, n0, m0, cfg)
    if pad_steps:
        h = h[:, :, :seq_len]
    if not return_final_state:
        return h
    return h, tuple(x for x in (C_T, n_T, m_T) if x is not None)
