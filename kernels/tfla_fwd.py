"""TFLA forward output kernel (TFLA paper, section 3.2, Algorithm 1, appendix B.2 and C).

Two-level sequence parallelism ("xl_chunk"): after `common.fwd_kernel_states` has materialized the
chunk-boundary states, `tfla_fwd_kernel_h` (parallel) computes the outputs `H^(k)` of all chunks.
One program per (d_hv block, L_hq tile, chunk, batch*head) loops over the L_kv tiles up to the
causal diagonal and over the d_qk blocks (Fig. 3). The gate is a compile-time switch:

- mLSTMexp (`USE_MAX_STATE`) follows Algorithm 1 with the running max rescaling, but computes the
  inter-chunk product first and lets it seed the running max, so one accumulator serves both parts
  (with the second accumulator of Algorithm 1, an offline Triton compile for sm_90 reported register
  spills);
- mLSTMsig needs no max state and adds both products into one tile as they come (section 4,
  appendix C.2); it has a normalizer `n` only with `normalize` (`HAS_N`).

Layout and state indexing as in `common`; `h` is `[BH, T, DV]`, the per-row max state `m_row` and
denominator `denom` that the backward pass reuses are `[BH, T]` float32.
"""

import triton
import triton.language as tl

from tfla_bench.kernels.common import dot_rows, program_tile, tile_bounds


@triton.jit
def tfla_fwd_kernel_h(
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
    BLOCK_LQ: tl.constexpr,
    BLOCK_LKV: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr,
    HAS_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Outputs `H = (b_bar Q / sqrt(d)) C_{k-1} + (S * D) V` of one (L_hq tile, d_hv block), normalized.

    mLSTMexp: the inter-chunk product (Algorithm 1, lines 23-33) comes first and seeds the running
    max with its own row log scale `b + m_{k-1}`; the intra-chunk tiles (lines 4-22) then rescale one
    shared accumulator as the max grows, and it ends at `m_comb = max(b + m_{k-1}, max_j D~)` (line
    24), so the combination (lines 34-35) needs no second accumulator. Also stores, per row, `m_comb`
    and the denominator `max(|n^T q|, exp(-m_comb)) + eps` that the backward pass reuses (line 37).
    mLSTMsig: `b_bar = exp(b)`, no max state; with `HAS_N` the denominator `max(|n^T q|, 1) + eps`.
    """
    i_dv, i_lq, c, bh = program_tile(DV // BLOCK_DV, L // BLOCK_LQ, NC)
    q_start, chunk_start, chunk_end = tile_bounds(c, i_lq, L, BLOCK_LQ, T)
    if q_start >= T:
        return

    offs_q = q_start + tl.arange(0, BLOCK_LQ)
    offs_kv = tl.arange(0, BLOCK_LKV)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    q_valid = offs_q < chunk_end
    q_base = q_ptr + bh * T * DQK
    k_base = k_ptr + bh * T * DQK
    v_base = v_ptr + bh * T * DV
    gate_base = bh * T
    state_base = C_ptr + (bh * (NC + 1) + c) * DQK * DV
    dtype = q_ptr.dtype.element_ty

    # Lines 23-33: inter-chunk part Q C_{k-1} and Q n_{k-1} (H_inter, B.2); mLSTMexp at the row log
    # scale b + m_{k-1}, mLSTMsig with the row weights exp(b) applied after the loop
    b_q = tl.load(b_ptr + gate_base + offs_q, mask=q_valid, other=0.0)
    if USE_MAX_STATE:
        m_old = b_q + tl.load(m_ptr + bh * (NC + 1) + c)
    acc = tl.zeros([BLOCK_LQ, BLOCK_DV], dtype=tl.float32)
    n_acc = tl.zeros([BLOCK_LQ], dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_DQK):
        q = tl.load(
            q_base + offs_q[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=q_valid[:, None], other=0.0
        )
        C = tl.load(state_base + (d0 + offs_dqk)[:, None] * DV + offs_v[None, :])
        acc = tl.dot(q, C.to(dtype), acc, input_precision=DOT_PRECISION)
        if HAS_N:
            n = tl.load(n_ptr + (bh * (NC + 1) + c) * DQK + d0 + offs_dqk)
            n_acc += tl.sum(q.to(tl.float32) * n[None, :], axis=1)
    if not USE_MAX_STATE:
        inter_weight = tl.exp(b_q)
        acc = acc * inter_weight[:, None]
        n_acc = n_acc * inter_weight

    # Lines 4-22: intra-chunk part (S * D) V (H_intra, B.2) over the L_kv tiles up to the causal diagonal
    for kv_start in range(chunk_start, tl.minimum(q_start + BLOCK_LQ, chunk_end), BLOCK_LKV):
        kv = kv_start + offs_kv
        # Lines 6-9: S = Q K^T over the d_qk blocks
        s = tl.zeros([BLOCK_LQ, BLOCK_LKV], dtype=tl.float32)
        s = dot_rows(q_base, offs_q, q_valid, k_base, kv, kv < chunk_end, s, DQK, BLOCK_DQK, DOT_PRECISION)
        b_kv = tl.load(b_ptr + gate_base + kv, mask=kv < chunk_end, other=0.0)
        log_i_kv = tl.load(log_i_ptr + gate_base + kv, mask=kv < chunk_end, other=float("-inf"))
        if USE_MAX_STATE:
            # Lines 10-14: log gate matrix D~ = b_q - b_kv^T + i_kv^T with the causal mask
            causal = offs_q[:, None] >= kv[None, :]
            log_d = tl.where(causal, b_q[:, None] - b_kv[None, :] + log_i_kv[None, :], float("-inf"))
            # Lines 15-17: new running max, stabilized gate matrix
            m_new = tl.maximum(m_old, tl.max(log_d, axis=1))
            p = s * tl.exp(log_d - m_new[:, None])
            # Lines 18-21: rescale the accumulators to the new max before adding S V and S 1
            rescale = tl.exp(m_old - m_new)
            acc = acc * rescale[:, None]
            n_acc = n_acc * rescale
            m_old = m_new
        else:
            causal = (offs_q[:, None] >= kv[None, :]) & q_valid[:, None]
            p = s * tl.where(causal, tl.exp(b_q[:, None] - b_kv[None, :] + log_i_kv[None, :]), 0.0)
        v = tl.load(v_base + kv[:, None] * DV + offs_v[None, :], mask=(kv < chunk_end)[:, None], other=0.0)
        acc = tl.dot(p.to(dtype), v, acc, input_precision=DOT_PRECISION)
        if HAS_N:
            n_acc += tl.sum(p, axis=1)

    # Lines 34-36: normalize (m_old is now m_comb)
    if USE_MAX_STATE:
        denom = tl.maximum(tl.abs(n_acc * scale), tl.exp(-m_old)) + eps
        h = acc * (scale / denom)[:, None]
        tl.store(m_row_ptr + gate_base + offs_q, m_old, mask=q_valid & (i_dv == 0))
    else:
        h = acc * scale
        if HAS_N:
            # max(|n^T q|, 1) + eps (appendix D.3): the mLSTMexp denominator with m = 0
            denom = tl.maximum(tl.abs(n_acc * scale), 1.0) + eps
            h = h / denom[:, None]
    # Line 37: store H, and the denominator of each row for the backward pass
    if HAS_N:
        tl.store(denom_ptr + gate_base + offs_q, denom, mask=q_valid & (i_dv == 0))
    tl.store(
        h_ptr + bh * T * DV + offs_q[:, None] * DV + offs_v[None, :],
        h.to(h_ptr.dtype.element_ty),
        mask=q_valid[:, None],
    )
