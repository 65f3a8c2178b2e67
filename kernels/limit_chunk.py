"""`mlstm_limit_chunk`: mLSTMexp with one-level chunkwise parallelism (FLA style), in Triton.

The `limit_chunk` kernel the TFLA paper compares against (section 3, appendix B.2/B.3): the
sequence is split into chunks of `L` steps, all `N_c = ceil(T / L)` chunk-boundary states are
materialized in HBM (float32) by a recurrent kernel, and a parallel kernel computes each chunk's
output with the chunk's whole `L x L` intra-chunk matrix in one program. There is no second level
of sequence parallelism inside a chunk (that is TFLA), so `L` is bounded by on-chip memory.

The math and the conventions are those of `tfla_bench.kernels.reference` and `mlstm_tfla`: queries
scaled by `1/sqrt(Dqk)`, log forget gate `logsigmoid(f)`, log input gate `i`, output
`h_t = C_t^T q_t / (max(|n_t^T q_t|, exp(-m_t)) + eps)`, the empty memory has `m_0 = -inf`, states
are `(C, n, m)` with `C, n` stabilized by `exp(-m)`. Gradients follow `mlstm_tfla` (appendix B.3):
no gradient through the normalizer or the max state; the final `n, m` get none, `n_0` gets zero and
`m_0` gets `sum(dC_0 * C_0)`; the gate gradients are `d log_i_j = k_j . dk_j` and `d log_f_s`
from chunk-local sums (`tfla_bench.kernels.gates.chunk_log_gate_grads`, a PyTorch epilogue shared
with TFLA): within-chunk cumulative sums of the row dot products plus each chunk's
`g_bar_k sum(C_{k-1} * dC_k)`. In exact arithmetic that equals one reverse cumulative sum of
`q . dq - k . dk` over the whole sequence, but that sum cancels the rounding errors of all later
steps: in bfloat16 on an H100 at T 8192 it is 6.5e-2 to 2.7e-1 off (relative RMS).

Kernels (one-dimensional grids: chunks times batch*heads can exceed 65,535; `NK = Dqk / B_dqk`,
`NV = Dv / B_dhv`, `NC` chunks, `BH` batch*heads):

- `limit_chunk_fwd_kernel_states`, grid `BH * NK_state * NV_state`: one program per state block
  walks over the chunks and stores `C_k, n_k, m_k` of every chunk boundary (eqs. 41-42).
- `limit_chunk_fwd_kernel_h`, grid `BH * NC * NV`: one program per (chunk, d_hv block) builds the
  chunk's `L x L` scores `Q K^T` and `Q C_{k-1}` over the d_qk blocks, takes the row max of the whole
  gate matrix at once (eq. 49; no running-max rescaling as in TFLA), and writes `H`, the row max
  state and the denominator (eqs. 50-55).
- `limit_chunk_bwd_kernel_dstates`, grid `BH * NK_state * NV_state`: the state gradients backwards
  over the chunks, `dC_{k-1} = g_bar_k dC_k + Q_bar^T dH~` (eq. 64), and each chunk's
  `g_bar_k sum(C_{k-1} * dC_k)` from the stored forward states, per state block.
- `limit_chunk_bwd_kernel_dqkv`, grid `BH * NC`: one program per chunk builds `S = Q K^T` and
  `dS = dH V^T` (both `L x L`) and then produces `dV`, `dQ`, `dK` of the chunk block by block
  (eqs. 58-75), and the row dot products `q . dq`, `k . dk` and `k . dk_inter` (the part of `dk`
  through `dC_k`) for the gate gradients.

The on-chip rule (`on_chip_bytes`, `unsupported_reason`). A program of the parallel kernels keeps,
with `e` bytes per input element and the head-dim blocks `B_dqk`, `B_dhv` of its loops:

- output kernel: the float32 scores and their gated copy in the input dtype, `(4 + e) L^2`, the
  float32 output block `4 L B_dhv`, the `Q, K, V` tiles `e (2 L B_dqk + L B_dhv)` and one state block
  loaded in float32 and cast, `(4 + e) B_dqk B_dhv`;
- gradient kernel: `P` and `dP` in the input dtype plus one float32 `L x L` accumulator,
  `(4 + 2e) L^2`, the float32 `dQ, dK` blocks `8 L B_dqk`, their operand tiles
  `e (2 L B_dqk + 2 L B_dhv)` and two state blocks `2 (4 + e) B_dqk B_dhv`.

Both must fit the 228 KiB of shared memory of an H100 SM (which is also below its 256 KiB register
file). `default_blocks` halves each kernel's head-dim blocks (from `BLOCK_CAPS`) until its program
fits; a chunk for which even 16 x 16 blocks do not fit is unsupported. The head dims
themselves never hit the limit (the kernels loop over them), so for 16-bit inputs chunk sizes 16 to
128 run at any head dims (Dqk/Dv = 128/256 and 256/512 included) and 256 needs 512 KiB for its
`L x L` tiles alone; for float32 inputs the largest chunk is 64.

`T` need not be a multiple of `L`: the last chunk may be shorter (masked loads and stores).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tfla_bench.kernels.gates import chunk_gates, chunk_log_gate_grads, log_gates
from tfla_bench.kernels.tfla import _check_inputs, _check_state

SRAM_BYTES = 228 * 1024  # shared memory of one H100 (sm90) streaming multiprocessor
MIN_BLOCK = 16  # tl.dot's smallest operand dimension
MIN_CHUNK = 16
DEFAULT_CHUNK_SIZE = 64


@dataclass(frozen=True)
class LimitChunkBlocks:
    """Head-dim blocks and launch settings (block sizes are powers of two >= 16 dividing the head dim).

    Attributes:
        qk: `B_dqk` of the output kernel's loop.
        v: `B_dhv` of the output kernel: it splits d_hv over `Dv / v` programs per chunk.
        bwd_qk: `B_dqk` of the gradient kernel's loops.
        bwd_v: `B_dhv` of the gradient kernel's loops.
        state_qk: state rows per program of the recurrent kernels.
        state_v: state columns per program of the recurrent kernels.
        num_warps: warps per program of the output kernel.
        num_stages: software-pipelining stages of the output kernel.
        bwd_num_warps: warps per program of the gradient kernel.
        bwd_num_stages: software-pipelining stages of the gradient kernel.
        state_num_warps: warps per program of the recurrent kernels.
    """

    qk: int
    v: int
    bwd_qk: int
    bwd_v: int
    state_qk: int
    state_v: int
    num_warps: int = 8
    num_stages: int = 2
    bwd_num_warps: int = 8
    bwd_num_stages: int = 1
    state_num_warps: int = 4


# The largest head-dim blocks (B_dqk, B_dhv) each parallel kernel starts from, by input element size.
# The gradient kernel loads two state blocks and two tiles per loop step beside its L x L tiles, so
# its d_hv block starts smaller.
BLOCK_CAPS = {"output": {2: (64, 128), 4: (32, 64)}, "gradient": {2: (64, 64), 4: (32, 32)}}


def _largest_pow2_divisor(n: int, cap: int) -> int:
    return min(n & -n, cap)


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def on_chip_bytes(kernel: str, chunk_size: int, block_qk: int, block_v: int, element_bytes: int) -> int:
    """Bytes one program of a parallel kernel keeps on chip (module docstring: the rule).

    Args:
        kernel: `"output"` (`limit_chunk_fwd_kernel_h`) or `"gradient"` (`limit_chunk_bwd_kernel_dqkv`).
        chunk_size: `L`.
        block_qk: `B_dqk`.
        block_v: `B_dhv`.
        element_bytes: bytes per input element (2 for bfloat16/float16, 4 for float32).
    """
    L, bk, bv, e = chunk_size, block_qk, block_v, element_bytes
    if kernel == "output":
        return (4 + e) * L * L + 4 * L * bv + e * (2 * L * bk + L * bv) + (4 + e) * bk * bv
    return (4 + 2 * e) * L * L + 8 * L * bk + e * (2 * L * bk + 2 * L * bv) + 2 * (4 + e) * bk * bv


def _fitting_blocks(
    kernel: str, chunk_size: int, head_dim_qk: int, head_dim_v: int, element_bytes: int
) -> tuple[int, int]:
    """The largest head-dim blocks (from `BLOCK_CAPS`, halving the larger) that fit `SRAM_BYTES`."""
    cap_qk, cap_v = BLOCK_CAPS[kernel][element_bytes]
    qk = _largest_pow2_divisor(head_dim_qk, cap_qk)
    v = _largest_pow2_divisor(head_dim_v, cap_v)
    while on_chip_bytes(kernel, chunk_size, qk, v, element_bytes) > SRAM_BYTES and max(qk, v) > MIN_BLOCK:
        if v >= qk:
            v //= 2
        else:
            qk //= 2
    return qk, v


def _needed_bytes(chunk_size: int, head_dim_qk: int, head_dim_v: int, element_bytes: int) -> int:
    """On-chip bytes of the larger of the two parallel kernels, each with its fitting blocks."""
    needed = 0
    for kernel in BLOCK_CAPS:
        blocks = _fitting_blocks(kernel, chunk_size, head_dim_qk, head_dim_v, element_bytes)
        needed = max(needed, on_chip_bytes(kernel, chunk_size, *blocks, element_bytes))
    return needed


def max_chunk_size(head_dim_qk: int, head_dim_v: int, dtype: torch.dtype) -> int:
    """The largest power-of-two chunk size within the on-chip rule (128 for 16-bit inputs, 64 for float32).

    Args:
        head_dim_qk: `Dqk` (a multiple of 16).
        head_dim_v: `Dv` (a multiple of 16).
        dtype: the input dtype.
    """
    e = _element_bytes(dtype)
    chunk = MIN_CHUNK
    while _needed_bytes(2 * chunk, head_dim_qk, head_dim_v, e) <= SRAM_BYTES:
        chunk *= 2
    return chunk


def unsupported_reason(chunk_size: int, head_dim_qk: int, head_dim_v: int, dtype: torch.dtype) -> str | None:
    """Why limit_chunk cannot run this chunk size (its on-chip limit), or None.

    Args:
        chunk_size: `L`, a power of two >= 16.
        head_dim_qk: `Dqk` (a multiple of 16).
        head_dim_v: `Dv` (a multiple of 16).
        dtype: the input dtype.
    """
    e = _element_bytes(dtype)
    needed = _needed_bytes(chunk_size, head_dim_qk, head_dim_v, e)
    if needed <= SRAM_BYTES:
        return None
    tiles_kib = (4 + 2 * e) * chunk_size * chunk_size // 1024
    return (
        f"limit_chunk keeps one whole L x L intra-chunk tile per program: chunk_size {chunk_size} "
        f"with {str(dtype).removeprefix('torch.')} inputs needs {needed // 1024} KiB on chip "
        f"({tiles_kib} KiB for the L x L tiles alone) > {SRAM_BYTES // 1024} KiB of shared memory of an "
        f"H100 SM; the largest chunk_size that fits is {max_chunk_size(head_dim_qk, head_dim_v, dtype)} "
        "(the TFLA kernel tiles the chunk and has no such limit)"
    )


def default_blocks(
    head_dim_qk: int, head_dim_v: int, chunk_size: int, dtype: torch.dtype
) -> LimitChunkBlocks:
    """The block-size heuristic: per parallel kernel, the largest head-dim blocks within the on-chip rule.

    Args:
        head_dim_qk: `Dqk` (a multiple of 16).
        head_dim_v: `Dv` (a multiple of 16).
        chunk_size: `L`.
        dtype: input dtype.
    """
    e = _element_bytes(dtype)
    qk, v = _fitting_blocks("output", chunk_size, head_dim_qk, head_dim_v, e)
    bwd_qk, bwd_v = _fitting_blocks("gradient", chunk_size, head_dim_qk, head_dim_v, e)
    warps = 4 if chunk_size <= 32 else 8
    return LimitChunkBlocks(
        qk=qk,
        v=v,
        bwd_qk=bwd_qk,
        bwd_v=bwd_v,
        state_qk=_largest_pow2_divisor(head_dim_qk, 64),
        state_v=_largest_pow2_divisor(head_dim_v, 64),
        # H100, bf16, 128/256, L 64: the output kernel took 1.71 ms with 4 warps against 2.38 ms with 8.
        num_warps=4 if chunk_size <= 64 else 8,
        # A second buffer of the loop operands (Q, K and a float32 state block) fits beside the
        # L x L tiles up to L = 64; the gradient kernel's loops load two state blocks and two tiles
        # per step, which would double its shared memory, and run only a few steps anyway.
        num_stages=2 if chunk_size <= 64 else 1,
        bwd_num_warps=warps,
        bwd_num_stages=1,
        state_num_warps=4,
    )


def _dot_precision(dtype: torch.dtype) -> str:
    # Full-precision float32 products (the CPU tests compare against float64); bf16/fp16 use tensor cores.
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def limit_chunk_fwd_kernel_states(
    k_ptr,
    v_ptr,
    b_ptr,
    log_i_ptr,
    g_ptr,
    a_max_ptr,
    C_ptr,
    n_ptr,
    m_ptr,
    T,
    NC,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Chunk-boundary states `C_k = g_bar_k C_{k-1} + (a_bar_k * K)^T V` (eqs. 41-42), a chunk per step."""
    N_DV: tl.constexpr = DV // BLOCK_DV
    N_DQK: tl.constexpr = DQK // BLOCK_DQK
    pid = tl.program_id(0)
    i_dv = pid % N_DV
    i_dqk = (pid // N_DV) % N_DQK
    bh = (pid // (N_DV * N_DQK)).to(tl.int64)

    offs_qk = i_dqk * BLOCK_DQK + tl.arange(0, BLOCK_DQK)
    offs_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs_l = tl.arange(0, L)
    k_base = k_ptr + bh * T * DQK
    v_base = v_ptr + bh * T * DV
    gate_base = bh * T
    # State k of this head starts at (bh * (NC + 1) + k) * DQK * DV: int64 arithmetic through bh, since
    # k * DQK * DV alone can exceed int32 (4096 chunks of a 1024 x 1024 state).
    state_offs = offs_qk[:, None] * DV + offs_v[None, :]
    dtype = k_ptr.dtype.element_ty

    C = tl.load(C_ptr + bh * (NC + 1) * DQK * DV + state_offs)
    n = tl.load(n_ptr + bh * (NC + 1) * DQK + offs_qk)
    m = tl.load(m_ptr + bh * (NC + 1))
    for c in range(NC):
        t = c * L + offs_l
        valid = t < T
        g = tl.load(g_ptr + bh * NC + c)
        # m_k = max(g_k + m_{k-1}, max_j a_kj) (appendix B.2); the decay g_bar and weights a_bar are <= 1
        m_new = tl.maximum(g + m, tl.load(a_max_ptr + bh * NC + c))
        decay = tl.exp(g + m - m_new)
        b = tl.load(b_ptr + gate_base + t, mask=valid, other=0.0)
        log_i = tl.load(log_i_ptr + gate_base + t, mask=valid, other=float("-inf"))
        k = tl.load(k_base + t[:, None] * DQK + offs_qk[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_base + t[:, None] * DV + offs_v[None, :], mask=valid[:, None], other=0.0)
        k_weighted = k * tl.exp(g - b + log_i - m_new)[:, None]
        C = tl.dot(tl.trans(k_weighted.to(dtype)), v, decay * C, input_precision=DOT_PRECISION)
        n = decay * n + tl.sum(k_weighted, axis=0)
        m = m_new
        tl.store(C_ptr + (bh * (NC + 1) + c + 1) * DQK * DV + state_offs, C)
        # every d_hv block computes the same n and m; one program stores them (the mask is all true
        # but makes the condition a tensor of the block's shape)
        tl.store(n_ptr + (bh * (NC + 1) + c + 1) * DQK + offs_qk, n, mask=(offs_qk < DQK) & (i_dv == 0))
        if (i_dv == 0) & (i_dqk == 0):
            tl.store(m_ptr + bh * (NC + 1) + c + 1, m)


@triton.jit
def limit_chunk_fwd_kernel_h(
    q_ptr,
    k_ptr,
    v_ptr,
    b_ptr,
    log_i_ptr,
    C_ptr,
    n_ptr,
    m_ptr,
    h_ptr,
    m_row_ptr,
    denom_ptr,
    T,
    NC,
    scale,
    eps,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Outputs of one (chunk, d_hv block) from the whole L x L tile; also the row max state and denom."""
    N_DV: tl.constexpr = DV // BLOCK_DV
    pid = tl.program_id(0)
    i_dv = pid % N_DV
    c = (pid // N_DV) % NC
    bh = (pid // (N_DV * NC)).to(tl.int64)

    offs_t = c * L + tl.arange(0, L)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    valid = offs_t < T
    q_base = q_ptr + bh * T * DQK
    k_base = k_ptr + bh * T * DQK
    gate_base = bh * T
    C_base = C_ptr + (bh * (NC + 1) + c) * DQK * DV
    n_base = n_ptr + (bh * (NC + 1) + c) * DQK
    dtype = q_ptr.dtype.element_ty

    # S = Q K^T (eq. 47), Q C_{k-1} and Q n_{k-1} (eq. 50) over the d_qk blocks
    s = tl.zeros([L, L], dtype=tl.float32)
    h_inter = tl.zeros([L, BLOCK_DV], dtype=tl.float32)
    n_inter = tl.zeros([L], dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_DQK):
        q = tl.load(q_base + offs_t[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=valid[:, None], other=0.0)
        k = tl.load(k_base + offs_t[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=valid[:, None], other=0.0)
        C = tl.load(C_base + (d0 + offs_dqk)[:, None] * DV + offs_v[None, :])
        s = tl.dot(q, tl.trans(k), s, input_precision=DOT_PRECISION)
        h_inter = tl.dot(q, C.to(dtype), h_inter, input_precision=DOT_PRECISION)
        n_inter += tl.sum(q.to(tl.float32) * tl.load(n_base + d0 + offs_dqk)[None, :], axis=1)

    # log D~ = b - b^T + log_i^T (eq. 44); the whole row is here, so its max combines with the
    # inter-chunk weight directly: m = max(b + m_{k-1}, max_j log D~) (eq. 49)
    b = tl.load(b_ptr + gate_base + offs_t, mask=valid, other=0.0)
    log_i = tl.load(log_i_ptr + gate_base + offs_t, mask=valid, other=float("-inf"))
    causal = offs_t[:, None] >= offs_t[None, :]
    log_d = tl.where(causal, b[:, None] - b[None, :] + log_i[None, :], float("-inf"))
    m_prev = tl.load(m_ptr + bh * (NC + 1) + c)
    m_row = tl.maximum(b + m_prev, tl.max(log_d, axis=1))
    p = s * tl.exp(log_d - m_row[:, None])
    inter_weight = tl.exp(b + m_prev - m_row)

    # H = (b_bar Q C_{k-1} + (S * D) V) / sqrt(d) and its denominator (eqs. 51-55)
    v = tl.load(v_ptr + bh * T * DV + offs_t[:, None] * DV + offs_v[None, :], mask=valid[:, None], other=0.0)
    h_num = tl.dot(p.to(dtype), v, h_inter * inter_weight[:, None], input_precision=DOT_PRECISION) * scale
    n_q = (n_inter * inter_weight + tl.sum(p, axis=1)) * scale
    denom = tl.maximum(tl.abs(n_q), tl.exp(-m_row)) + eps
    h = h_num / denom[:, None]
    tl.store(
        h_ptr + bh * T * DV + offs_t[:, None] * DV + offs_v[None, :],
        h.to(h_ptr.dtype.element_ty),
        mask=valid[:, None],
    )
    tl.store(m_row_ptr + gate_base + offs_t, m_row, mask=valid & (i_dv == 0))
    tl.store(denom_ptr + gate_base + offs_t, denom, mask=valid & (i_dv == 0))


@triton.jit
def limit_chunk_bwd_kernel_dstates(
    q_ptr,
    dh_ptr,
    b_ptr,
    g_ptr,
    m_ptr,
    m_row_ptr,
    denom_ptr,
    C_ptr,
    dC_ptr,
    dg_ptr,
    T,
    NC,
    BH,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """State gradients `dC_k` for k = NC-1 .. 0 from `dC_NC`, the final-state gradient (eq. 64).

    Also each chunk's gate-sum gradient `dg_k = g_bar_k * sum(C_{k-1} * dC_k)` (B.3) from the forward
    states in `C_ptr`, stored per state block in `dg_ptr` (`[N_DQK * N_DV, BH, NC]`).
    """
    N_DV: tl.constexpr = DV // BLOCK_DV
    N_DQK: tl.constexpr = DQK // BLOCK_DQK
    pid = tl.program_id(0)
    i_dv = pid % N_DV
    i_dqk = (pid // N_DV) % N_DQK
    bh = (pid // (N_DV * N_DQK)).to(tl.int64)

    offs_qk = i_dqk * BLOCK_DQK + tl.arange(0, BLOCK_DQK)
    offs_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs_l = tl.arange(0, L)
    q_base = q_ptr + bh * T * DQK
    dh_base = dh_ptr + bh * T * DV
    gate_base = bh * T
    state_offs = offs_qk[:, None] * DV + offs_v[None, :]
    dtype = q_ptr.dtype.element_ty
    i_block = i_dqk * N_DV + i_dv

    dC = tl.load(dC_ptr + (bh * (NC + 1) + NC) * DQK * DV + state_offs)
    for c_rev in range(NC):
        c = NC - 1 - c_rev
        t = c * L + offs_l
        valid = t < T
        m_prev = tl.load(m_ptr + bh * (NC + 1) + c)
        decay = tl.exp(tl.load(g_ptr + bh * NC + c) + m_prev - tl.load(m_ptr + bh * (NC + 1) + c + 1))
        b = tl.load(b_ptr + gate_base + t, mask=valid, other=0.0)
        m_row = tl.load(m_row_ptr + gate_base + t, mask=valid, other=0.0)
        denom = tl.load(denom_ptr + gate_base + t, mask=valid, other=1.0)
        # Q_bar^T dH~ with Q_bar = exp(b + m_{k-1} - m) Q / sqrt(d) and dH~ = dH / denom
        weight = tl.where(valid, tl.exp(b + m_prev - m_row) * scale / denom, 0.0)
        q = tl.load(q_base + t[:, None] * DQK + offs_qk[None, :], mask=valid[:, None], other=0.0)
        dh = tl.load(dh_base + t[:, None] * DV + offs_v[None, :], mask=valid[:, None], other=0.0)
        q_weighted = (q * weight[:, None]).to(dtype)
        # dg_k from dC_k before it becomes dC_{k-1}. C_{k-1} is stabilized by exp(-m_{k-1}) and dC_k by
        # exp(m_k), so g_bar_k includes exp(m_{k-1} - m_k) as in the decay. int64 offsets through bh (see
        # limit_chunk_fwd_kernel_states).
        C_prev = tl.load(C_ptr + (bh * (NC + 1) + c) * DQK * DV + state_offs)
        tl.store(dg_ptr + (i_block * BH + bh) * NC + c, decay * tl.sum(tl.sum(C_prev * dC, axis=1), axis=0))
        dC = tl.dot(tl.trans(q_weighted), dh, decay * dC, input_precision=DOT_PRECISION)
        tl.store(dC_ptr + (bh * (NC + 1) + c) * DQK * DV + state_offs, dC)


@triton.jit
def limit_chunk_bwd_kernel_dqkv(
    q_ptr,
    k_ptr,
    v_ptr,
    dh_ptr,
    b_ptr,
    log_i_ptr,
    g_ptr,
    m_ptr,
    m_row_ptr,
    denom_ptr,
    C_ptr,
    dC_ptr,
    dq_ptr,
    dk_ptr,
    dv_ptr,
    qdq_ptr,
    kdk_ptr,
    kdk_inter_ptr,
    T,
    NC,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dQ, dK, dV of one chunk from its whole L x L tiles, and the row dot products q . dq, k . dk
    and k . dk_inter (the inter-chunk part of dK, through the state at the chunk's end)."""
    pid = tl.program_id(0)
    c = pid % NC
    bh = (pid // NC).to(tl.int64)

    offs_t = c * L + tl.arange(0, L)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    valid = offs_t < T
    q_base = q_ptr + bh * T * DQK
    k_base = k_ptr + bh * T * DQK
    v_base = v_ptr + bh * T * DV
    dh_base = dh_ptr + bh * T * DV
    gate_base = bh * T
    C_base = C_ptr + (bh * (NC + 1) + c) * DQK * DV
    dC_base = dC_ptr + (bh * (NC + 1) + c + 1) * DQK * DV
    dtype = q_ptr.dtype.element_ty

    # Gates of the backward pass (appendix B.3): with the stored row max m and denominator, the
    # stabilized gate matrix is D = exp(b_t - b_j + log_i_j - m_t) <= 1, and dH~ = dH / denom.
    b = tl.load(b_ptr + gate_base + offs_t, mask=valid, other=0.0)
    log_i = tl.load(log_i_ptr + gate_base + offs_t, mask=valid, other=float("-inf"))
    m_row = tl.load(m_row_ptr + gate_base + offs_t, mask=valid, other=0.0)
    row_scale = tl.where(valid, scale / tl.load(denom_ptr + gate_base + offs_t, mask=valid, other=1.0), 0.0)
    causal = offs_t[:, None] >= offs_t[None, :]
    gate = tl.exp(tl.where(causal, (b - m_row)[:, None] + (log_i - b)[None, :], float("-inf")))
    gate = gate * row_scale[:, None]
    m_prev = tl.load(m_ptr + bh * (NC + 1) + c)
    # b_bar / denom / sqrt(d) for the rows' inter-chunk term, a_bar = exp(a - m_k) for the columns'
    q_weight = tl.exp(b + m_prev - m_row) * row_scale
    kv_weight = tl.exp(tl.load(g_ptr + bh * NC + c) + log_i - b - tl.load(m_ptr + bh * (NC + 1) + c + 1))

    # P = (S * D) / denom / sqrt(d) with S = Q K^T over the d_qk blocks (eq. 68)
    s = tl.zeros([L, L], dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_DQK):
        q = tl.load(q_base + offs_t[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=valid[:, None], other=0.0)
        k = tl.load(k_base + offs_t[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), s, input_precision=DOT_PRECISION)
    p = (s * gate).to(dtype)
    # dP = (dS * D) / denom / sqrt(d) with dS = dH V^T over the d_hv blocks (eqs. 71-72)
    ds = tl.zeros([L, L], dtype=tl.float32)
    for d0 in range(0, DV, BLOCK_DV):
        dh = tl.load(dh_base + offs_t[:, None] * DV + (d0 + offs_dv)[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_base + offs_t[:, None] * DV + (d0 + offs_dv)[None, :], mask=valid[:, None], other=0.0)
        ds = tl.dot(dh, tl.trans(v), ds, input_precision=DOT_PRECISION)
    dp = (ds * gate).to(dtype)

    # dV = P^T dH + a_bar * K dC_k (eqs. 58, 70), one d_hv block at a time
    for v0 in range(0, DV, BLOCK_DV):
        acc = tl.zeros([L, BLOCK_DV], dtype=tl.float32)
        for d0 in range(0, DQK, BLOCK_DQK):
            k = tl.load(
                k_base + offs_t[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=valid[:, None], other=0.0
            )
            dC = tl.load(dC_base + (d0 + offs_dqk)[:, None] * DV + (v0 + offs_dv)[None, :])
            acc = tl.dot(k, dC.to(dtype), acc, input_precision=DOT_PRECISION)
        dh = tl.load(dh_base + offs_t[:, None] * DV + (v0 + offs_dv)[None, :], mask=valid[:, None], other=0.0)
        dv = tl.dot(tl.trans(p), dh, acc * kv_weight[:, None], input_precision=DOT_PRECISION)
        tl.store(
            dv_ptr + bh * T * DV + offs_t[:, None] * DV + (v0 + offs_dv)[None, :],
            dv.to(dv_ptr.dtype.element_ty),
            mask=valid[:, None],
        )

    # dQ = dP K + b_bar * dH~ C_{k-1}^T / sqrt(d) (eqs. 62, 73) and dK = dP^T Q + a_bar * V dC_k^T
    # (eqs. 59-61, 75), one d_qk block at a time
    q_dq = tl.zeros([L], dtype=tl.float32)
    k_dk = tl.zeros([L], dtype=tl.float32)
    k_dk_inter = tl.zeros([L], dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_DQK):
        acc_q = tl.zeros([L, BLOCK_DQK], dtype=tl.float32)
        acc_k = tl.zeros([L, BLOCK_DQK], dtype=tl.float32)
        for v0 in range(0, DV, BLOCK_DV):
            dh = tl.load(
                dh_base + offs_t[:, None] * DV + (v0 + offs_dv)[None, :], mask=valid[:, None], other=0.0
            )
            v = tl.load(
                v_base + offs_t[:, None] * DV + (v0 + offs_dv)[None, :], mask=valid[:, None], other=0.0
            )
            state_offs = (d0 + offs_dqk)[:, None] * DV + (v0 + offs_dv)[None, :]
            C = tl.load(C_base + state_offs)
            dC = tl.load(dC_base + state_offs)
            acc_q = tl.dot(dh, tl.trans(C.to(dtype)), acc_q, input_precision=DOT_PRECISION)
            acc_k = tl.dot(v, tl.trans(dC.to(dtype)), acc_k, input_precision=DOT_PRECISION)
        q = tl.load(q_base + offs_t[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=valid[:, None], other=0.0)
        k = tl.load(k_base + offs_t[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=valid[:, None], other=0.0)
        dk_inter = acc_k * kv_weight[:, None]
        dq = tl.dot(dp, k, acc_q * q_weight[:, None], input_precision=DOT_PRECISION)
        dk = tl.dot(tl.trans(dp), q, dk_inter, input_precision=DOT_PRECISION)
        qk_offs = offs_t[:, None] * DQK + (d0 + offs_dqk)[None, :]
        tl.store(dq_ptr + bh * T * DQK + qk_offs, dq.to(dq_ptr.dtype.element_ty), mask=valid[:, None])
        tl.store(dk_ptr + bh * T * DQK + qk_offs, dk.to(dk_ptr.dtype.element_ty), mask=valid[:, None])
        q_dq += tl.sum(q.to(tl.float32) * dq, axis=1)
        k_dk += tl.sum(k.to(tl.float32) * dk, axis=1)
        k_dk_inter += tl.sum(k.to(tl.float32) * dk_inter, axis=1)
    tl.store(qdq_ptr + gate_base + offs_t, q_dq, mask=valid)
    tl.store(kdk_ptr + gate_base + offs_t, k_dk, mask=valid)
    tl.store(kdk_inter_ptr + gate_base + offs_t, k_dk_inter, mask=valid)


@dataclass(frozen=True)
class _Config:
    chunk_size: int
    eps: float
    blocks: LimitChunkBlocks


def _forward(q, k, v, log_i, log_f, C0, n0, m0, cfg: _Config):
    """Both forward kernels on `[BH, T, D]` inputs; returns the output and what the backward needs."""
    bh, seq_len, dqk = q.shape
    dv = v.shape[-1]
    blk = cfg.blocks
    gates = chunk_gates(log_i, log_f, cfg.chunk_size)
    nc = gates.g.shape[-1]
    precision = _dot_precision(q.dtype)
    # State k is the memory before chunk k; index 0 holds the initial state, index NC the final one.
    C = torch.empty(bh, nc + 1, dqk, dv, dtype=torch.float32, device=q.device)
    n = torch.empty(bh, nc + 1, dqk, dtype=torch.float32, device=q.device)
    m = torch.empty(bh, nc + 1, dtype=torch.float32, device=q.device)
    C[:, 0] = 0.0 if C0 is None else C0.reshape(bh, dqk, dv)
    n[:, 0] = 0.0 if n0 is None else n0.reshape(bh, dqk)
    m[:, 0] = float("-inf") if m0 is None else m0.reshape(bh)
    limit_chunk_fwd_kernel_states[(bh * (dqk // blk.state_qk) * (dv // blk.state_v),)](
        k, v, gates.b, log_i, gates.g, gates.a_max, C, n, m, seq_len, nc,
        DQK=dqk, DV=dv, L=cfg.chunk_size, BLOCK_DQK=blk.state_qk, BLOCK_DV=blk.state_v,
        DOT_PRECISION=precision, num_warps=blk.state_num_warps,
    )  # fmt: skip

    h = torch.empty_like(v)
    m_row = torch.empty(bh, seq_len, dtype=torch.float32, device=q.device)
    denom = torch.empty(bh, seq_len, dtype=torch.float32, device=q.device)
    limit_chunk_fwd_kernel_h[(bh * nc * (dv // blk.v),)](
        q, k, v, gates.b, log_i, C, n, m, h, m_row, denom, seq_len, nc, dqk**-0.5, cfg.eps,
        DQK=dqk, DV=dv, L=cfg.chunk_size, BLOCK_DQK=blk.qk, BLOCK_DV=blk.v, DOT_PRECISION=precision,
        num_warps=blk.num_warps, num_stages=blk.num_stages,
    )  # fmt: skip
    return h, gates, C, n, m, m_row, denom


def _backward(q, k, v, dh, log_i, b, g, C, m, m_row, denom, dC_final, cfg: _Config):
    """Both backward kernels; returns `dq, dk, dv, dlog_i, dlog_f, dC` (`dC[:, 0]`: the initial state's)."""
    bh, seq_len, dqk = q.shape
    dv_dim = v.shape[-1]
    blk = cfg.blocks
    nc = g.shape[-1]
    scale = dqk**-0.5
    precision = _dot_precision(q.dtype)
    dC = torch.empty_like(C)
    dC[:, nc] = 0.0 if dC_final is None else dC_final.reshape(bh, dqk, dv_dim)
    n_state_blocks = (dqk // blk.state_qk) * (dv_dim // blk.state_v)
    dg = torch.empty(n_state_blocks, bh, nc, dtype=torch.float32, device=q.device)
    limit_chunk_bwd_kernel_dstates[(bh * n_state_blocks,)](
        q, dh, b, g, m, m_row, denom, C, dC, dg, seq_len, nc, bh, scale,
        DQK=dqk, DV=dv_dim, L=cfg.chunk_size, BLOCK_DQK=blk.state_qk, BLOCK_DV=blk.state_v,
        DOT_PRECISION=precision, num_warps=blk.state_num_warps,
    )  # fmt: skip

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    q_dq = torch.empty(bh, seq_len, dtype=torch.float32, device=q.device)
    k_dk = torch.empty_like(q_dq)
    k_dk_inter = torch.empty_like(q_dq)
    limit_chunk_bwd_kernel_dqkv[(bh * nc,)](
        q, k, v, dh, b, log_i, g, m, m_row, denom, C, dC, dq, dk, dv, q_dq, k_dk, k_dk_inter, seq_len, nc,
        scale,
        DQK=dqk, DV=dv_dim, L=cfg.chunk_size, BLOCK_DQK=blk.bwd_qk, BLOCK_DV=blk.bwd_v,
        DOT_PRECISION=precision, num_warps=blk.bwd_num_warps, num_stages=blk.bwd_num_stages,
    )  # fmt: skip

    # Gate gradients from chunk-local sums (module docstring); the final state's share is in dg of the
    # last chunk and in k . dk_inter
    dlog_i, dlog_f = chunk_log_gate_grads(q_dq, k_dk, k_dk_inter, dg.sum(0), cfg.chunk_size)
    return dq, dk, dv, dlog_i, dlog_f, dC


class _LimitChunkFunction(torch.autograd.Function):
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
        n_T = n[:, nc].clone().reshape(batch, heads, dqk)
        m_T = m[:, nc].clone().reshape(batch, heads)
        ctx.save_for_backward(*flat, log_i_flat, gates.b, gates.g, C, m, m_row, denom, C0, m0)
        ctx.cfg = cfg
        ctx.shape = (batch, heads, seq_len, dqk, dv)
        ctx.has_n0 = n0 is not None
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(n_T, m_T)
        return h.reshape(batch, heads, seq_len, dv), C_T, n_T, m_T

    @staticmethod
    def backward(ctx, dh, dC_T, dn_T, dm_T):
        q, k, v, log_i, b, g, C, m, m_row, denom, C0, m0 = ctx.saved_tensors
        batch, heads, seq_len, dqk, dv_dim = ctx.shape
        dh = torch.zeros_like(v) if dh is None else dh.reshape(v.shape).contiguous()
        dq, dk, dv, dlog_i, dlog_f, dC = _backward(
            q, k, v, dh, log_i, b, g, C, m, m_row, denom, dC_T, ctx.cfg
        )
        dC0 = dn0 = dm0 = None
        if C0 is not None:
            dC0 = dC[:, 0].reshape(C0.shape)
            dm0 = (dC0 * C0).sum((-1, -2))
        if ctx.has_n0:
            dn0 = torch.zeros(batch, heads, dqk, dtype=torch.float32, device=q.device)
        rows = (batch, heads, seq_len)
        return (
            dq.reshape(*rows, dqk),
            dk.reshape(*rows, dqk),
            dv.reshape(*rows, dv_dim),
            dlog_i.reshape(rows),
            dlog_f.reshape(rows),
            dC0,
            dn0,
            dm0,
            None,
        )


def _check_blocks(blocks: LimitChunkBlocks, head_dim_qk: int, head_dim_v: int) -> None:
    for name in ("qk", "v", "bwd_qk", "bwd_v", "state_qk", "state_v"):
        dim = head_dim_v if name.endswith("v") else head_dim_qk
        size = getattr(blocks, name)
        if not (_is_pow2(size) and size >= MIN_BLOCK and dim % size == 0):
            raise ValueError(
                f"blocks.{name} must be a power of two >= 16 dividing the head dim {dim}, got {size}"
            )
    for name in ("num_warps", "bwd_num_warps", "state_num_warps"):
        if not _is_pow2(getattr(blocks, name)):
            raise ValueError(f"blocks.{name} must be a power of two, got {getattr(blocks, name)}")
    for name in ("num_stages", "bwd_num_stages"):
        if getattr(blocks, name) < 1:
            raise ValueError(f"blocks.{name} must be at least 1, got {getattr(blocks, name)}")


def mlstm_limit_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    initial_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    return_final_state: bool = False,
    eps: float = 1e-6,
    blocks: LimitChunkBlocks | None = None,
) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """mLSTMexp with the one-level chunkwise limit_chunk kernels (Triton), differentiable.

    Args:
        q: queries `[B, NH, T, Dqk]`, bfloat16, float16 or float32.
        k: keys `[B, NH, T, Dqk]`, dtype of `q`.
        v: values `[B, NH, T, Dv]`, dtype of `q`. `Dqk` and `Dv` are multiples of 16 in [16, 1024].
        i: input-gate pre-activations `[B, NH, T]` (any float dtype; computed in float32).
        f: forget-gate pre-activations `[B, NH, T]`.
        chunk_size: `L`, a power of two, at least 16, at most `T` and within the on-chip limit
            (`unsupported_reason`: 16, 32, 64 or 128 for 16-bit inputs, up to 64 for float32).
            `T` need not be a multiple of `L`. Default 64.
        initial_state: `(C, n, m)`: `[B, NH, Dqk, Dv]`, `[B, NH, Dqk]`, `[B, NH]`. Default: the empty
            memory (`m = -inf`).
        return_final_state: also return the final state `(C, n, m)` (float32).
        eps: added to the denominator. Default 1e-6.
        blocks: override the `default_blocks` heuristic (`LimitChunkBlocks`).

    Returns:
        `h` `[B, NH, T, Dv]` in the dtype of `q`, or `(h, final_state)` with `return_final_state`.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device, or a chunk size beyond the limit.

    Examples::

        >>> q = torch.randn(2, 4, 512, 128, device="cuda", dtype=torch.bfloat16); k = torch.randn_like(q)
        >>> v = torch.randn(2, 4, 512, 256, device="cuda", dtype=torch.bfloat16)
        >>> i, f = torch.randn(2, 4, 512, device="cuda"), torch.randn(2, 4, 512, device="cuda") + 3
        >>> h = mlstm_limit_chunk(q, k, v, i, f, chunk_size=64)
        >>> h, (C, n, m) = mlstm_limit_chunk(q, k, v, i, f, return_final_state=True)
    """
    seq_len = q.shape[2] if isinstance(q, torch.Tensor) and q.dim() == 4 else 0
    _check_inputs(q, k, v, i, f, "exp", chunk_size, seq_len, eps)
    dqk, dv = q.shape[-1], v.shape[-1]
    reason = unsupported_reason(chunk_size, dqk, dv, q.dtype)
    if reason is not None:
        raise ValueError(reason)
    state = _check_state(initial_state, "exp", False, q, dv) if initial_state is not None else {}
    if blocks is None:
        blocks = default_blocks(dqk, dv, chunk_size, q.dtype)
    else:
        _check_blocks(blocks, dqk, dv)
    cfg = _Config(chunk_size=chunk_size, eps=float(eps), blocks=blocks)

    log_i, log_f = log_gates(i, f, "exp")
    C0, n0, m0 = (state[name].float() if name in state else None for name in ("C", "n", "m"))
    h, C_T, n_T, m_T = _LimitChunkFunction.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), log_i.float(), log_f.float(), C0, n0, m0, cfg
    )
    if not return_final_state:
        return h
    return h, (C_T, n_T, m_T)
