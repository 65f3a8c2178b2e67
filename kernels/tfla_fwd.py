"""TFLA forward kernels (TFLA paper, section 3.2, Algorithm 1, appendix B.2 and C).

Two-level sequence parallelism ("xl_chunk"):

1. `tfla_fwd_kernel_states` (recurrent): materializes the chunk-boundary memory states
   `C_k` (and `n_k`, `m_k`) in float32. One program per (d_qk block, d_hv block, batch*head) walks
   over the chunks (eqs. 41-42).
2. `tfla_exp_fwd_kernel_h` / `tfla_sig_fwd_kernel_h` (parallel): the outputs `H^(k)` of all chunks.
   One program per (d_hv block, L_hq tile, chunk, batch*head) loops over the L_kv tiles up to the
   causal diagonal and over the d_qk blocks (Fig. 3). mLSTMexp follows Algorithm 1 with the running
   max rescaling, but computes the inter-chunk product first and lets it seed the running max, so
   one accumulator serves both parts (with the second accumulator of Algorithm 1, an offline
   Triton compile for sm_90 reported register spills); mLSTMsig needs no max state and adds both
   products into one tile as they come (section 4, appendix C.2).

Layout: `q, k` `[BH, T, DQK]`, `v, h` `[BH, T, DV]` contiguous; the cumulative log gates `b`
(within-chunk cumsum of log forget gates) and the log input gates are `[BH, T]` float32; per-chunk
`g` and `a_max` are `[BH, NC]`; states `C` `[BH, NC + 1, DQK, DV]`, `n` `[BH, NC + 1, DQK]`,
`m` `[BH, NC + 1]` (index `k` is the state before chunk `k`, index `NC` the final state; the caller
writes the initial state at index 0). The last chunk may be shorter than `L`.

Every launch grid is one-dimensional (the chunk count times batch*heads can exceed the 65,535
limit of grid axes 1 and 2); the program id is split with the embedding block fastest, so the
programs that share the same `Q`/`K` tiles run side by side.
"""

import triton
import triton.language as tl


@triton.jit
def tfla_fwd_kernel_states(
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
    BLOCK_T: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr,
    HAS_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Chunk-boundary states: `C_k = g_k C_{k-1} + (a_k * K)^T V` (eq. 41), stabilized for mLSTMexp."""
    N_DV: tl.constexpr = DV // BLOCK_DV
    N_DQK: tl.constexpr = DQK // BLOCK_DQK
    pid = tl.program_id(0)
    i_dv = pid % N_DV
    i_dqk = (pid // N_DV) % N_DQK
    bh = (pid // (N_DV * N_DQK)).to(tl.int64)

    offs_qk = i_dqk * BLOCK_DQK + tl.arange(0, BLOCK_DQK)
    offs_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs_t = tl.arange(0, BLOCK_T)
    k_base = k_ptr + bh * T * DQK
    v_base = v_ptr + bh * T * DV
    gate_base = bh * T
    # State k of this head starts at (bh * (NC + 1) + k) * DQK * DV: int64 through bh, since
    # k * DQK * DV alone can pass int32 (2048 chunks of a 1024 x 1024 state).
    state_row = bh * (NC + 1)
    state_offs = offs_qk[:, None] * DV + offs_v[None, :]
    dtype = k_ptr.dtype.element_ty

    C = tl.load(C_ptr + state_row * DQK * DV + state_offs)
    if HAS_N:
        n = tl.load(n_ptr + state_row * DQK + offs_qk)
    if USE_MAX_STATE:
        m = tl.load(m_ptr + bh * (NC + 1))
    for c in range(NC):
        g = tl.load(g_ptr + bh * NC + c)
        if USE_MAX_STATE:
            # m_k = max(g_k + m_{k-1}, max_j a_kj): the max state at the chunk end (appendix B.2)
            m_new = tl.maximum(g + m, tl.load(a_max_ptr + bh * NC + c))
            decay = tl.exp(g + m - m_new)
        else:
            decay = tl.exp(g)
        chunk_start = c * L
        chunk_end = tl.minimum(chunk_start + L, T)
        acc = tl.zeros([BLOCK_DQK, BLOCK_DV], dtype=tl.float32)
        if HAS_N:
            n_acc = tl.zeros([BLOCK_DQK], dtype=tl.float32)
        # (exp(a_k - m_k) * K^(k))^T V^(k) of eq. 41 (and its row sums for eq. 42), BLOCK_T steps at a time
        for t0 in range(chunk_start, chunk_end, BLOCK_T):
            t = t0 + offs_t
            valid = t < chunk_end
            k = tl.load(k_base + t[:, None] * DQK + offs_qk[None, :], mask=valid[:, None], other=0.0)
            v = tl.load(v_base + t[:, None] * DV + offs_v[None, :], mask=valid[:, None], other=0.0)
            b = tl.load(b_ptr + gate_base + t, mask=valid, other=0.0)
            log_i = tl.load(log_i_ptr + gate_base + t, mask=valid, other=float("-inf"))
            if USE_MAX_STATE:
                weight = tl.exp(g - b + log_i - m_new)
            else:
                weight = tl.exp(g - b + log_i)
            k_weighted = k * weight[:, None]
            acc = tl.dot(tl.trans(k_weighted.to(dtype)), v, acc, input_precision=DOT_PRECISION)
            if HAS_N:
                n_acc += tl.sum(k_weighted, axis=0)
        C = decay * C + acc
        tl.store(C_ptr + (state_row + c + 1) * DQK * DV + state_offs, C)
        if HAS_N:
            n = decay * n + n_acc
            # every d_hv block computes the same n; one of them stores it
            tl.store(n_ptr + (state_row + c + 1) * DQK + offs_qk, n, mask=(offs_qk < DQK) & (i_dv == 0))
        if USE_MAX_STATE:
            m = m_new
            if (i_dv == 0) & (i_dqk == 0):
                tl.store(m_ptr + bh * (NC + 1) + c + 1, m)


@triton.jit
def tfla_sig_fwd_kernel_h(
    q_ptr,
    k_ptr,
    v_ptr,
    b_ptr,
    log_i_ptr,
    C_ptr,
    n_ptr,
    h_ptr,
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
    NORMALIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """mLSTMsig outputs `H = (exp(b) * Q / sqrt(d)) C_{k-1} + (S * D) V` of one (L_hq tile, d_hv block)."""
    N_DV: tl.constexpr = DV // BLOCK_DV
    N_LQ: tl.constexpr = L // BLOCK_LQ
    pid = tl.program_id(0)
    i_dv = pid % N_DV
    i_lq = (pid // N_DV) % N_LQ
    chunk_bh = pid // (N_DV * N_LQ)
    c = chunk_bh % NC
    bh = (chunk_bh // NC).to(tl.int64)
    q_start = c * L + i_lq * BLOCK_LQ
    if q_start >= T:
        return
    chunk_start = c * L
    chunk_end = tl.minimum(chunk_start + L, T)

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

    b_q = tl.load(b_ptr + gate_base + offs_q, mask=q_valid, other=0.0)
    acc = tl.zeros([BLOCK_LQ, BLOCK_DV], dtype=tl.float32)
    n_acc = tl.zeros([BLOCK_LQ], dtype=tl.float32)
    # Inter-chunk part Q C_{k-1} (H_inter, B.2); the row weights exp(b) are applied after the loop
    for d0 in range(0, DQK, BLOCK_DQK):
        q = tl.load(
            q_base + offs_q[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=q_valid[:, None], other=0.0
        )
        C = tl.load(state_base + (d0 + offs_dqk)[:, None] * DV + offs_v[None, :])
        acc = tl.dot(q, C.to(dtype), acc, input_precision=DOT_PRECISION)
        if NORMALIZE:
            n = tl.load(n_ptr + (bh * (NC + 1) + c) * DQK + d0 + offs_dqk)
            n_acc += tl.sum(q.to(tl.float32) * n[None, :], axis=1)
    inter_weight = tl.exp(b_q)
    acc = acc * inter_weight[:, None]
    n_acc = n_acc * inter_weight

    # Intra-chunk part (S * D) V (H_intra, B.2) over the L_kv tiles up to the causal diagonal;
    # without a max state it accumulates into the same tile as the inter-chunk part
    for kv_start in range(chunk_start, tl.minimum(q_start + BLOCK_LQ, chunk_end), BLOCK_LKV):
        kv = kv_start + offs_kv
        s = tl.zeros([BLOCK_LQ, BLOCK_LKV], dtype=tl.float32)
        # S = Q K^T, accumulated over the d_qk blocks (Algorithm 1, lines 6-9)
        for d0 in range(0, DQK, BLOCK_DQK):
            q = tl.load(
                q_base + offs_q[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=q_valid[:, None], other=0.0
            )
            k = tl.load(
                k_base + kv[:, None] * DQK + (d0 + offs_dqk)[None, :],
                mask=(kv < chunk_end)[:, None],
                other=0.0,
            )
            s = tl.dot(q, tl.trans(k), s, input_precision=DOT_PRECISION)
        b_kv = tl.load(b_ptr + gate_base + kv, mask=kv < chunk_end, other=0.0)
        log_i_kv = tl.load(log_i_ptr + gate_base + kv, mask=kv < chunk_end, other=float("-inf"))
        causal = (offs_q[:, None] >= kv[None, :]) & q_valid[:, None]
        gate = tl.where(causal, tl.exp(b_q[:, None] - b_kv[None, :] + log_i_kv[None, :]), 0.0)
        p = s * gate
        v = tl.load(v_base + kv[:, None] * DV + offs_v[None, :], mask=(kv < chunk_end)[:, None], other=0.0)
        acc = tl.dot(p.to(dtype), v, acc, input_precision=DOT_PRECISION)
        if NORMALIZE:
            n_acc += tl.sum(p, axis=1)

    h = acc * scale
    if NORMALIZE:
        # max(|n^T q|, 1) + eps (appendix D.3): the mLSTMexp denominator with m = 0
        denom = tl.maximum(tl.abs(n_acc * scale), 1.0) + eps
        h = h / denom[:, None]
        tl.store(denom_ptr + gate_base + offs_q, denom, mask=q_valid & (i_dv == 0))
    tl.store(
        h_ptr + bh * T * DV + offs_q[:, None] * DV + offs_v[None, :],
        h.to(h_ptr.dtype.element_ty),
        mask=q_valid[:, None],
    )


@triton.jit
def tfla_exp_fwd_kernel_h(
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
    DOT_PRECISION: tl.constexpr,
):
    """mLSTMexp outputs of one (L_hq tile, d_hv block): Algorithm 1 with the running max state.

    The inter-chunk product (Algorithm 1, lines 23-33) comes first and seeds the running max with
    its own row log scale `b + m_{k-1}`; the intra-chunk tiles (lines 4-22) then rescale one shared
    accumulator as the max grows, and it ends at `m_comb = max(b + m_{k-1}, max_j D~)` (line 24),
    so the combination (lines 34-35) needs no second accumulator. Also stores, per row, `m_comb`
    and the denominator `max(|n^T q|, exp(-m_comb)) + eps` that the backward pass reuses (line 37).
    """
    N_DV: tl.constexpr = DV // BLOCK_DV
    N_LQ: tl.constexpr = L // BLOCK_LQ
    pid = tl.program_id(0)
    i_dv = pid % N_DV
    i_lq = (pid // N_DV) % N_LQ
    chunk_bh = pid // (N_DV * N_LQ)
    c = chunk_bh % NC
    bh = (chunk_bh // NC).to(tl.int64)
    q_start = c * L + i_lq * BLOCK_LQ
    if q_start >= T:
        return
    chunk_start = c * L
    chunk_end = tl.minimum(chunk_start + L, T)

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

    # Lines 23-33: inter-chunk part Q C_{k-1} and Q n_{k-1}, at the row log scale b + m_{k-1}
    b_q = tl.load(b_ptr + gate_base + offs_q, mask=q_valid, other=0.0)
    m_old = b_q + tl.load(m_ptr + bh * (NC + 1) + c)
    acc = tl.zeros([BLOCK_LQ, BLOCK_DV], dtype=tl.float32)
    n_acc = tl.zeros([BLOCK_LQ], dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_DQK):
        q = tl.load(
            q_base + offs_q[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=q_valid[:, None], other=0.0
        )
        C = tl.load(state_base + (d0 + offs_dqk)[:, None] * DV + offs_v[None, :])
        acc = tl.dot(q, C.to(dtype), acc, input_precision=DOT_PRECISION)
        n = tl.load(n_ptr + (bh * (NC + 1) + c) * DQK + d0 + offs_dqk)
        n_acc += tl.sum(q.to(tl.float32) * n[None, :], axis=1)

    # Lines 4-22: intra-chunk part over the L_kv tiles up to the causal diagonal
    for kv_start in range(chunk_start, tl.minimum(q_start + BLOCK_LQ, chunk_end), BLOCK_LKV):
        kv = kv_start + offs_kv
        s = tl.zeros([BLOCK_LQ, BLOCK_LKV], dtype=tl.float32)
        # Lines 6-9: S = Q K^T over the d_qk blocks
        for d0 in range(0, DQK, BLOCK_DQK):
            q = tl.load(
                q_base + offs_q[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=q_valid[:, None], other=0.0
            )
            k = tl.load(
                k_base + kv[:, None] * DQK + (d0 + offs_dqk)[None, :],
                mask=(kv < chunk_end)[:, None],
                other=0.0,
            )
            s = tl.dot(q, tl.trans(k), s, input_precision=DOT_PRECISION)
        # Lines 10-14: log gate matrix D~ = b_q - b_kv^T + i_kv^T with the causal mask
        b_kv = tl.load(b_ptr + gate_base + kv, mask=kv < chunk_end, other=0.0)
        log_i_kv = tl.load(log_i_ptr + gate_base + kv, mask=kv < chunk_end, other=float("-inf"))
        causal = offs_q[:, None] >= kv[None, :]
        log_d = tl.where(causal, b_q[:, None] - b_kv[None, :] + log_i_kv[None, :], float("-inf"))
        # Lines 15-17: new running max, stabilized gate matrix
        m_new = tl.maximum(m_old, tl.max(log_d, axis=1))
        p = s * tl.exp(log_d - m_new[:, None])
        # Lines 18-21: rescale the accumulators to the new max and add S V and S 1
        rescale = tl.exp(m_old - m_new)
        v = tl.load(v_base + kv[:, None] * DV + offs_v[None, :], mask=(kv < chunk_end)[:, None], other=0.0)
        acc = tl.dot(p.to(dtype), v, acc * rescale[:, None], input_precision=DOT_PRECISION)
        n_acc = n_acc * rescale + tl.sum(p, axis=1)
        m_old = m_new

    # Lines 34-36: m_old is now m_comb; normalize
    denom = tl.maximum(tl.abs(n_acc * scale), tl.exp(-m_old)) + eps
    h = acc * (scale / denom)[:, None]
    # Line 37: store H, and the max state and denominator of each row for the backward pass
    tl.store(
        h_ptr + bh * T * DV + offs_q[:, None] * DV + offs_v[None, :],
        h.to(h_ptr.dtype.element_ty),
        mask=q_valid[:, None],
    )
    tl.store(m_row_ptr + gate_base + offs_q, m_old, mask=q_valid & (i_dv == 0))
    tl.store(denom_ptr + gate_base + offs_q, denom, mask=q_valid & (i_dv == 0))
