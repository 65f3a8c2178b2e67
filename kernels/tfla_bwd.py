"""TFLA backward kernels (TFLA paper, appendix B.3, appendix C.3 and Table 1).

No max-state rescaling is needed: the forward pass stored the max state `m` and the denominator
of every row, so the stabilized gate matrix is `D_tj = exp(b_t - b_j + log_i_j - m_t)` (at most 1)
and `dH~ = dH / denom` (appendix B.3). No gradient flows through the normalizer or the max state.

After `common.bwd_kernel_dstates` has computed the state gradients (in the buffer that held the
forward states), two parallel kernels, each parallel over its own outer sequence and embedding dims
and looping over the inner ones (Table 1), one program per (outer embedding block, outer sequence
tile, chunk, batch*head):

- `tfla_bwd_kernel_dq`: `dQ = (dH~ V^T * D) K / sqrt(d) + b_bar * dH~ C_{k-1}^T / sqrt(d)`;
  parallel over (L_hq, d_qk), loops over L_kv up to the diagonal and over d_hv.
- `tfla_bwd_kernel_dkv`, launched once per gradient (`GRAD_V`), parallel over (L_kv, outer dim),
  loops over L_hq from the diagonal and over the inner dim:
  `dK = (dH~ V^T * D)^T Q / sqrt(d) + a_bar * V dC_k^T` (outer d_qk, inner d_hv) and
  `dV = (Q K^T / sqrt(d) * D)^T dH~ + a_bar * K dC_k` (outer d_hv, inner d_qk).
  Both are `(X Y^T * D)^T Z + a_bar * X dC_k^{(T)}` with `X` the key-row operand and `Y`, `Z` the
  query-row operands, so the caller passes `(X, Y, Z) = (V, dH, Q)` for dK and `(K, Q, dH)` for dV.

With `KernelConfig.bwd_fused_kv`, `tfla_bwd_kernel_dkv_fused` computes dK and dV in one program
per (L_kv tile, chunk, batch*head) over the whole head dims, each gate matrix built once for both.

`tfla_bwd_kernel_dq` and the dK launch also write the row dot products `q_t . dq_t` and `k_t . dk_t`
(dK also those of its inter-chunk part; float32, one slice per d_qk block), and the state kernel
each chunk's `g_bar_k sum(C_{k-1} * dC_k)`; `common.bwd_kernel_gates` forms the gate gradients
from them.

Every kernel builds its gate matrix tiles with `exp2` (`common.gate_tile`) and applies the causal mask
only to the tiles the diagonal crosses: in dQ those are the last of its loop; in dK and dV, whose
products sum over the query rows, also the query tile that passes the chunk's end (`_gate_t`).

Layout and state indexing as in `common`: the gradient of state `k` (the state before chunk `k`)
is `dC[:, k]`. For mLSTMsig (`USE_MAX_STATE=False`) every `m` is 0 and the denominator is 1
unless `HAS_DENOM`.
"""

import triton
import triton.language as tl

from tfla_bench.kernels.common import (
    LOG2E,
    dot_rows,
    gate_tile,
    load_rows,
    load_state,
    load_tile,
    program_tile,
    store_rows,
    tile_bounds,
)


@triton.jit
def _query_log_scale(
    b_ptr, m_row_ptr, denom_ptr, gate_base, offs, valid, USE_MAX_STATE: tl.constexpr, HAS_DENOM: tl.constexpr
):
    """Per query row of the head at `gate_base`: `b - m` (the row part of log D) and `1 / denom` (1
    where the row is invalid)."""
    b_ptr, m_row_ptr, denom_ptr = b_ptr + gate_base, m_row_ptr + gate_base, denom_ptr + gate_base
    b = tl.load(b_ptr + offs, mask=valid, other=0.0)
    if USE_MAX_STATE:
        b = b - tl.load(m_row_ptr + offs, mask=valid, other=0.0)
    if HAS_DENOM:
        inv_denom = 1.0 / tl.load(denom_ptr + offs, mask=valid, other=1.0)
    else:
        inv_denom = tl.full(offs.shape, 1.0, dtype=tl.float32)
    return b, inv_denom


@triton.jit
def tfla_bwd_kernel_dq(
    q_ptr, k_ptr, v_ptr, dh_ptr, b_ptr, log_i_ptr,  # the inputs, the output gradient, the log gates
    m_row_ptr, denom_ptr, m_ptr, C_ptr,  # what the forward pass stored
    dq_ptr, qdq_ptr,  # dQ and the row dot products q . dq
    T, NC, BH, scale,
    DQK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_LQ: tl.constexpr, BLOCK_LKV: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr, HAS_DENOM: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr = False,
):  # fmt: skip
    """dQ of one (L_hq tile, d_qk block), and the row dot products q . dq of that block. With `TMA`
    (`KernelConfig.bwd_tma`), `q_ptr`, `k_ptr`, `v_ptr`, `dh_ptr` and `C_ptr` are tensor descriptors,
    as in `tfla_fwd_kernel_h`."""
    i_dqk, i_lq, c, bh = program_tile(DQK // BLOCK_DQK, L // BLOCK_LQ, NC)
    q_start, chunk_start, chunk_end = tile_bounds(c, i_lq, L, BLOCK_LQ, T)
    if q_start >= T:
        return

    offs_q = q_start + tl.arange(0, BLOCK_LQ)
    offs_kv = tl.arange(0, BLOCK_LKV)
    offs_qk = i_dqk * BLOCK_DQK + tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_valid = offs_q < chunk_end
    bh32, state_index = bh.to(tl.int32), (bh * (NC + 1) + c).to(tl.int32)  # a descriptor's indices
    if TMA:
        gate_base, dh_base, v_base, k_base, state_base = bh * T, dh_ptr, v_ptr, k_ptr, C_ptr
        q_base = q_ptr
        dtype = dq_ptr.dtype.element_ty
    else:
        gate_base = bh * T
        dh_base = dh_ptr + bh * T * DV
        v_base = v_ptr + bh * T * DV
        k_base = k_ptr + bh * T * DQK
        state_base = C_ptr + (bh * (NC + 1) + c) * DQK * DV
        dtype = q_ptr.dtype.element_ty

    log_scale_q, inv_denom = _query_log_scale(
        b_ptr, m_row_ptr, denom_ptr, gate_base, offs_q, q_valid, USE_MAX_STATE, HAS_DENOM
    )
    # Inter-chunk part dQ_inter = dH~ C_{k-1}^T (B.3) over the d_hv blocks; b_bar is applied after the loop
    acc = tl.zeros([BLOCK_LQ, BLOCK_DQK], dtype=tl.float32)
    for d0 in range(0, DV, BLOCK_DV):
        dh = load_tile(dh_base, bh32, q_start, offs_q, q_valid, d0, d0 + offs_dv, DV, TMA)
        C = load_state(state_base, state_index, i_dqk * BLOCK_DQK, offs_qk, d0, d0 + offs_dv, DV, TMA)
        acc = tl.dot(dh, tl.trans(C.to(dtype)), acc, input_precision=DOT_PRECISION)
    if USE_MAX_STATE:
        inter_weight = tl.exp(log_scale_q + tl.load(m_ptr + bh * (NC + 1) + c))
    else:
        inter_weight = tl.exp(log_scale_q)
    acc = acc * (tl.where(q_valid, inter_weight, 0.0) * inv_denom)[:, None]

    # Intra-chunk part dQ_intra = (dS_bar * D) K (B.3) over the L_kv tiles up to the causal diagonal
    row_log2 = log_scale_q * LOG2E
    for kv_start in range(chunk_start, tl.minimum(q_start + BLOCK_LQ, chunk_end), BLOCK_LKV):
        kv = kv_start + offs_kv
        kv_valid = kv < chunk_end
        # dS_bar = dH~ V^T (B.3), accumulated over the d_hv blocks
        ds = tl.zeros([BLOCK_LQ, BLOCK_LKV], dtype=tl.float32)
        ds = dot_rows(
            dh_base, offs_q, q_valid, v_base, kv, kv_valid, ds, DV, BLOCK_DV, DOT_PRECISION,
            bh32, q_start, kv_start, TMA,
        )  # fmt: skip
        b_kv = tl.load(b_ptr + gate_base + kv, mask=kv_valid, other=0.0)
        log_i_kv = tl.load(log_i_ptr + gate_base + kv, mask=kv_valid, other=0.0)
        gate = gate_tile(row_log2, log_i_kv, b_kv, offs_q, q_valid, kv, kv_start, q_start, BLOCK_LKV)
        p = ds * gate * inv_denom[:, None]
        k = load_tile(k_base, bh32, kv_start, kv, kv_valid, i_dqk * BLOCK_DQK, offs_qk, DQK, TMA)
        acc = tl.dot(p.to(dtype), k, acc, input_precision=DOT_PRECISION)

    dq = acc * scale
    if TMA:
        q = load_tile(q_base, bh32, q_start, offs_q, q_valid, i_dqk * BLOCK_DQK, offs_qk, DQK, TMA)
    else:
        q = load_rows(q_ptr + bh * T * DQK, offs_q, q_valid, offs_qk, DQK)
    store_rows(dq_ptr + bh * T * DQK, offs_q, q_valid, offs_qk, DQK, dq)
    tl.store(qdq_ptr + (i_dqk * BH + bh) * T + offs_q, tl.sum(q.to(tl.float32) * dq, axis=1), mask=q_valid)


@triton.jit
def _key_log_weight(b_ptr, log_i_ptr, gate_base, offs, valid):
    """Per key row of the head at `gate_base`: `log_i - b` (the column part of log D); -inf where the
    row is invalid."""
    b_ptr, log_i_ptr = b_ptr + gate_base, log_i_ptr + gate_base
    b = tl.load(b_ptr + offs, mask=valid, other=0.0)
    log_i = tl.load(log_i_ptr + offs, mask=valid, other=float("-inf"))
    return log_i - b


@triton.jit
def _key_inter_weight(g_ptr, m_ptr, bh, NC, c, log_weight_kv, USE_MAX_STATE: tl.constexpr):
    """Per key row of chunk `c`: `a_bar = exp(a - m_k)` with `a = g + log_i - b` (eq. 40), the weight
    of its inter-chunk gradient part."""
    log_a = tl.load(g_ptr + bh * NC + c) + log_weight_kv
    if USE_MAX_STATE:
        log_a -= tl.load(m_ptr + bh * (NC + 1) + c + 1)
    return tl.exp(log_a)


@triton.jit
def _gate_t(col_log2, log_scale_q, offs_kv, q_rows, q_valid, kv_start, q_start, chunk_end,
            BLOCK_LKV: tl.constexpr, BLOCK_LQ: tl.constexpr):  # fmt: skip
    """The transposed gate matrix `D^T` of a key tile and a query tile: `exp(log_i - b + b_q - m)`,
    `col_log2` the key rows' `log_i - b` times `LOG2E`. The causal mask applies where the diagonal
    crosses the tiles or the query tile passes the chunk's end: these products sum over the query
    rows, so a row past the end must weigh 0."""
    gate_t = tl.exp2(col_log2[:, None] + (log_scale_q * LOG2E)[None, :])
    if (q_start < kv_start + BLOCK_LKV - 1) | (q_start + BLOCK_LQ > chunk_end):
        gate_t = tl.where((q_rows[None, :] >= offs_kv[:, None]) & q_valid[None, :], gate_t, 0.0)
    return gate_t


@triton.jit
def tfla_bwd_kernel_dkv(
    x_ptr, y_ptr, z_ptr, k_ptr, b_ptr, log_i_ptr, g_ptr,  # the operands (docstring), the keys, the gates
    m_row_ptr, denom_ptr, m_ptr, dC_ptr,  # what the forward pass stored, the state gradients
    out_ptr, kdk_ptr, kdk_inter_ptr,  # dK or dV, the row dot products k . dk and k . dk_inter
    T, NC, BH, scale,
    DQK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_LQ: tl.constexpr, BLOCK_LKV: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    GRAD_V: tl.constexpr, USE_MAX_STATE: tl.constexpr, HAS_DENOM: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr = False,
):  # fmt: skip
    """dK (`GRAD_V=False`) or dV of one (L_kv tile, outer block) from `X, Y, Z` (module docstring);
    dK also the row dot products k . dk of that block (all of dK, and its inter-chunk part). With
    `TMA`, `x_ptr`, `y_ptr`, `z_ptr`, `k_ptr` and `dC_ptr` are tensor descriptors, as in
    `tfla_fwd_kernel_h`; the query tiles then end within the chunk (`BLOCK_LQ <= BLOCK_LKV`)."""
    if GRAD_V:
        D_IN: tl.constexpr = DQK
        D_OUT: tl.constexpr = DV
        BLOCK_IN: tl.constexpr = BLOCK_DQK
        BLOCK_OUT: tl.constexpr = BLOCK_DV
    else:
        D_IN: tl.constexpr = DV
        D_OUT: tl.constexpr = DQK
        BLOCK_IN: tl.constexpr = BLOCK_DV
        BLOCK_OUT: tl.constexpr = BLOCK_DQK
    i_out, i_lkv, c, bh = program_tile(D_OUT // BLOCK_OUT, L // BLOCK_LKV, NC)
    kv_start, _, chunk_end = tile_bounds(c, i_lkv, L, BLOCK_LKV, T)
    if kv_start >= T:
        return

    offs_kv = kv_start + tl.arange(0, BLOCK_LKV)
    offs_q = tl.arange(0, BLOCK_LQ)
    offs_in = tl.arange(0, BLOCK_IN)
    offs_out = i_out * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    kv_valid = offs_kv < chunk_end
    bh32, state_index = bh.to(tl.int32), (bh * (NC + 1) + c + 1).to(tl.int32)  # a descriptor's indices
    if TMA:
        gate_base, x_base, y_base, z_base, state_base = bh * T, x_ptr, y_ptr, z_ptr, dC_ptr
        k_ptrs = k_ptr
        dtype = out_ptr.dtype.element_ty
    else:
        gate_base = bh * T
        x_base = x_ptr + bh * T * D_IN
        y_base = y_ptr + bh * T * D_IN
        z_base = z_ptr + bh * T * D_OUT
        state_base = dC_ptr + (bh * (NC + 1) + c + 1) * DQK * DV
        dtype = x_ptr.dtype.element_ty
        k_ptrs = k_ptr + bh * T * DQK + offs_kv[:, None] * DQK + offs_out[None, :]
    log_weight_kv = _key_log_weight(b_ptr, log_i_ptr, gate_base, offs_kv, kv_valid)
    # Inter-chunk part dK_inter = V dC_k^T, dV_inter = K dC_k (B.3) over the inner blocks; a_bar is
    # applied after the loop
    acc = tl.zeros([BLOCK_LKV, BLOCK_OUT], dtype=tl.float32)
    for d0 in range(0, D_IN, BLOCK_IN):
        x = load_tile(x_base, bh32, kv_start, offs_kv, kv_valid, d0, d0 + offs_in, D_IN, TMA)
        if GRAD_V:
            dC = load_state(state_base, state_index, d0, d0 + offs_in, i_out * BLOCK_OUT, offs_out, DV, TMA)
        else:
            dC = tl.trans(
                load_state(state_base, state_index, i_out * BLOCK_OUT, offs_out, d0, d0 + offs_in, DV, TMA)
            )
        dC = dC.to(dtype)
        acc = tl.dot(x, dC, acc, input_precision=DOT_PRECISION)
    acc = acc * _key_inter_weight(g_ptr, m_ptr, bh, NC, c, log_weight_kv, USE_MAX_STATE)[:, None]
    if not GRAD_V:
        if TMA:
            k = load_tile(k_ptrs, bh32, kv_start, offs_kv, kv_valid, i_out * BLOCK_OUT, offs_out, DQK, TMA)
            k = k.to(tl.float32)
        else:
            k = tl.load(k_ptrs, mask=kv_valid[:, None], other=0.0).to(tl.float32)
        tl.store(kdk_inter_ptr + (i_out * BH + bh) * T + offs_kv, tl.sum(k * acc, axis=1), mask=kv_valid)

    # Intra-chunk part dK_intra = (dS_bar * D)^T Q / sqrt(d), dV_intra = S_bar^T dH~ (B.3) over the
    # L_hq tiles from the diagonal
    col_log2 = log_weight_kv * LOG2E
    for q_start in range(kv_start, chunk_end, BLOCK_LQ):
        q_rows = q_start + offs_q
        q_valid = q_rows < chunk_end
        log_scale_q, inv_denom = _query_log_scale(
            b_ptr, m_row_ptr, denom_ptr, gate_base, q_rows, q_valid, USE_MAX_STATE, HAS_DENOM
        )
        # X Y^T: dS_bar^T = V dH~^T or S^T = K Q^T, accumulated over the inner blocks
        xy_t = tl.zeros([BLOCK_LKV, BLOCK_LQ], dtype=tl.float32)
        xy_t = dot_rows(
            x_base, offs_kv, kv_valid, y_base, q_rows, q_valid, xy_t, D_IN, BLOCK_IN, DOT_PRECISION,
            bh32, kv_start, q_start, TMA,
        )  # fmt: skip
        gate_t = _gate_t(col_log2, log_scale_q, offs_kv, q_rows, q_valid, kv_start, q_start, chunk_end,
                         BLOCK_LKV, BLOCK_LQ)  # fmt: skip
        p_t = xy_t * gate_t * (inv_denom * scale)[None, :]
        z = load_tile(z_base, bh32, q_start, q_rows, q_valid, i_out * BLOCK_OUT, offs_out, D_OUT, TMA)
        acc = tl.dot(p_t.to(dtype), z, acc, input_precision=DOT_PRECISION)

    store_rows(out_ptr + bh * T * D_OUT, offs_kv, kv_valid, offs_out, D_OUT, acc)
    if not GRAD_V:
        # k is loaded again rather than kept live through the loop (register pressure)
        if TMA:
            k = load_tile(k_ptrs, bh32, kv_start, offs_kv, kv_valid, i_out * BLOCK_OUT, offs_out, DQK, TMA)
            k = k.to(tl.float32)
        else:
            k = tl.load(k_ptrs, mask=kv_valid[:, None], other=0.0).to(tl.float32)
        tl.store(kdk_ptr + (i_out * BH + bh) * T + offs_kv, tl.sum(k * acc, axis=1), mask=kv_valid)


@triton.jit
def tfla_bwd_kernel_dkv_fused(
    q_ptr, k_ptr, v_ptr, dh_ptr, b_ptr, log_i_ptr, g_ptr,  # the inputs, the output gradient, the gates
    m_row_ptr, denom_ptr, m_ptr, dC_ptr,  # what the forward pass stored, the state gradients
    dk_ptr, dv_ptr, kdk_ptr, kdk_inter_ptr,  # dK, dV, the row dot products k . dk and k . dk_inter
    T, NC, scale,
    DQK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_LQ: tl.constexpr, BLOCK_LKV: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr, HAS_DENOM: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV of one L_kv tile over the whole head dims, in one program: each query tile's gate
    matrix is built once for both, where `tfla_bwd_kernel_dkv` builds it once per gradient and outer
    block. Also the row dot products k . dk and k . dk_inter (into their first head-dim slice).

    `DQK` and `DV` are powers of two: the accumulators span them whole, `BLOCK_DQK` and `BLOCK_DV`
    only split the products' inner dims (the scores and the inter-chunk parts)."""
    _, i_lkv, c, bh = program_tile(1, L // BLOCK_LKV, NC)
    kv_start, _, chunk_end = tile_bounds(c, i_lkv, L, BLOCK_LKV, T)
    if kv_start >= T:
        return

    offs_kv = kv_start + tl.arange(0, BLOCK_LKV)
    offs_q = tl.arange(0, BLOCK_LQ)
    offs_qk = tl.arange(0, DQK)
    offs_v = tl.arange(0, DV)
    offs_bqk = tl.arange(0, BLOCK_DQK)
    offs_bv = tl.arange(0, BLOCK_DV)
    kv_valid = offs_kv < chunk_end
    gate_base = bh * T
    q_base = q_ptr + bh * T * DQK
    k_base = k_ptr + bh * T * DQK
    v_base = v_ptr + bh * T * DV
    dh_base = dh_ptr + bh * T * DV
    state_base = dC_ptr + (bh * (NC + 1) + c + 1) * DQK * DV
    dtype = q_ptr.dtype.element_ty

    log_weight_kv = _key_log_weight(b_ptr, log_i_ptr, gate_base, offs_kv, kv_valid)
    # Inter-chunk parts dK_inter = V dC_k^T (over d_hv blocks) and dV_inter = K dC_k (over d_qk
    # blocks) (B.3); a_bar is applied after the loops
    acc_k = tl.zeros([BLOCK_LKV, DQK], dtype=tl.float32)
    for d0 in range(0, DV, BLOCK_DV):
        v = load_rows(v_base, offs_kv, kv_valid, d0 + offs_bv, DV)
        dC = tl.load(state_base + offs_qk[:, None] * DV + (d0 + offs_bv)[None, :]).to(dtype)
        acc_k = tl.dot(v, tl.trans(dC), acc_k, input_precision=DOT_PRECISION)
    acc_v = tl.zeros([BLOCK_LKV, DV], dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_DQK):
        k = load_rows(k_base, offs_kv, kv_valid, d0 + offs_bqk, DQK)
        dC = tl.load(state_base + (d0 + offs_bqk)[:, None] * DV + offs_v[None, :]).to(dtype)
        acc_v = tl.dot(k, dC, acc_v, input_precision=DOT_PRECISION)
    a_bar = _key_inter_weight(g_ptr, m_ptr, bh, NC, c, log_weight_kv, USE_MAX_STATE)
    acc_k = acc_k * a_bar[:, None]
    acc_v = acc_v * a_bar[:, None]
    k_ptrs = k_base + offs_kv[:, None] * DQK + offs_qk[None, :]
    k = tl.load(k_ptrs, mask=kv_valid[:, None], other=0.0).to(tl.float32)
    tl.store(kdk_inter_ptr + gate_base + offs_kv, tl.sum(k * acc_k, axis=1), mask=kv_valid)

    # Intra-chunk parts dK_intra = (dS_bar * D)^T Q / sqrt(d) and dV_intra = S_bar^T dH~ (B.3) over the
    # L_hq tiles from the diagonal, both from one gate matrix per tile
    col_log2 = log_weight_kv * LOG2E
    for q_start in range(kv_start, chunk_end, BLOCK_LQ):
        q_rows = q_start + offs_q
        q_valid = q_rows < chunk_end
        log_scale_q, inv_denom = _query_log_scale(
            b_ptr, m_row_ptr, denom_ptr, gate_base, q_rows, q_valid, USE_MAX_STATE, HAS_DENOM
        )
        gate_t = _gate_t(col_log2, log_scale_q, offs_kv, q_rows, q_valid, kv_start, q_start, chunk_end,
                         BLOCK_LKV, BLOCK_LQ)  # fmt: skip
        gate_t = gate_t * (inv_denom * scale)[None, :]
        # dS_bar^T = V dH~^T and S^T = K Q^T
        ds_t = tl.zeros([BLOCK_LKV, BLOCK_LQ], dtype=tl.float32)
        ds_t = dot_rows(
            v_base, offs_kv, kv_valid, dh_base, q_rows, q_valid, ds_t, DV, BLOCK_DV, DOT_PRECISION
        )
        q = load_rows(q_base, q_rows, q_valid, offs_qk, DQK)
        acc_k = tl.dot((ds_t * gate_t).to(dtype), q, acc_k, input_precision=DOT_PRECISION)
        s_t = tl.zeros([BLOCK_LKV, BLOCK_LQ], dtype=tl.float32)
        s_t = dot_rows(k_base, offs_kv, kv_valid, q_base, q_rows, q_valid, s_t, DQK, BLOCK_DQK, DOT_PRECISION)
        dh = load_rows(dh_base, q_rows, q_valid, offs_v, DV)
        acc_v = tl.dot((s_t * gate_t).to(dtype), dh, acc_v, input_precision=DOT_PRECISION)

    store_rows(dk_ptr + bh * T * DQK, offs_kv, kv_valid, offs_qk, DQK, acc_k)
    store_rows(dv_ptr + bh * T * DV, offs_kv, kv_valid, offs_v, DV, acc_v)
    # k is loaded again rather than kept live through the loop (register pressure)
    k = tl.load(k_ptrs, mask=kv_valid[:, None], other=0.0).to(tl.float32)
    tl.store(kdk_ptr + gate_base + offs_kv, tl.sum(k * acc_k, axis=1), mask=kv_valid)
