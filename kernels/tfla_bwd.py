"""TFLA backward kernels (TFLA paper, appendix B.3, appendix C.3 and Table 1).

No max-state rescaling is needed: the forward pass stored the max state `m` and the denominator
of every row, so the stabilized gate matrix is `D_tj = exp(b_t - b_j + log_i_j - m_t)` (at most 1)
and `dH~ = dH / denom` (appendix B.3). No gradient flows through the normalizer or the max state.

1. `tfla_bwd_kernel_dstates` (recurrent): the state gradients, backwards over the chunks,
   `dC_{k-1} = g_bar_k dC_k + Q_bar^(k)T dH~^(k)` (B.3). Parallel over (d_qk block, d_hv block,
   batch*head). It writes into the buffer that holds the forward states.
2. Three parallel kernels, each parallel over its own outer sequence and embedding dims and looping
   over the inner ones (Table 1), one program per (outer embedding block, outer sequence tile,
   chunk, batch*head):

   - `tfla_bwd_kernel_dq`: `dQ = (dH~ V^T * D) K / sqrt(d) + b_bar * dH~ C_{k-1}^T / sqrt(d)`;
     parallel over (L_hq, d_qk), loops over L_kv up to the diagonal and over d_hv.
   - `tfla_bwd_kernel_dk`: `dK = (dH~ V^T * D)^T Q / sqrt(d) + a_bar * V dC_k^T`;
     parallel over (L_kv, d_qk), loops over L_hq from the diagonal and over d_hv.
   - `tfla_bwd_kernel_dv`: `dV = (Q K^T / sqrt(d) * D)^T dH~ + a_bar * K dC_k`;
     parallel over (L_kv, d_hv), loops over L_hq from the diagonal and over d_qk.

   `tfla_bwd_kernel_dq` and `tfla_bwd_kernel_dk` also write the row dot products `q_t . dq_t` and
   `k_t . dk_t` (dK also those of its inter-chunk part; float32, one slice per d_qk block), and
   the state kernel each chunk's `g_bar_k sum(C_{k-1} * dC_k)`; the caller forms the gate gradients
   from them (`tfla_bench.kernels.gates.chunk_log_gate_grads`).

Layout and state indexing as in `tfla_fwd`: the gradient of state `k` (the state before chunk
`k`) is `dC[:, k]`, and the caller writes the gradient of the final state at index `NC`. For
mLSTMsig (`USE_MAX_STATE=False`) every `m` is 0 and the denominator is 1 unless `HAS_DENOM`.
"""

import triton
import triton.language as tl


@triton.jit
def tfla_bwd_kernel_dstates(
    q_ptr,
    dh_ptr,
    b_ptr,
    g_ptr,
    m_row_ptr,
    denom_ptr,
    m_ptr,
    dC_ptr,
    dg_ptr,
    T,
    NC,
    BH,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr,
    HAS_DENOM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """State gradients `dC_k` for k = NC-1 .. 0, from `dC_NC` (the final-state gradient).

    `dC_ptr` holds the forward states on entry; each program reads its block of `C_{k-1}` just
    before overwriting it with `dC_{k-1}`, for the chunk-sum gate gradient
    `dg_k = g_bar_k * sum(C_{k-1} * dC_k)` (B.3), stored per state block in `dg_ptr`.
    """
    N_DV: tl.constexpr = DV // BLOCK_DV
    N_DQK: tl.constexpr = DQK // BLOCK_DQK
    pid = tl.program_id(0)
    i_dv = pid % N_DV
    i_dqk = (pid // N_DV) % N_DQK
    bh = (pid // (N_DV * N_DQK)).to(tl.int64)

    offs_qk = i_dqk * BLOCK_DQK + tl.arange(0, BLOCK_DQK)
    offs_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs_t = tl.arange(0, BLOCK_T)
    q_base = q_ptr + bh * T * DQK
    dh_base = dh_ptr + bh * T * DV
    gate_base = bh * T
    # int64 state offsets through bh (see tfla_fwd_kernel_states)
    state_row = bh * (NC + 1)
    state_offs = offs_qk[:, None] * DV + offs_v[None, :]
    dtype = q_ptr.dtype.element_ty

    i_block = i_dqk * N_DV + i_dv
    dC = tl.load(dC_ptr + (state_row + NC) * DQK * DV + state_offs)
    for c_rev in range(NC):
        c = NC - 1 - c_rev
        g = tl.load(g_ptr + bh * NC + c)
        if USE_MAX_STATE:
            m_prev = tl.load(m_ptr + bh * (NC + 1) + c)
            decay = tl.exp(g + m_prev - tl.load(m_ptr + bh * (NC + 1) + c + 1))
        else:
            decay = tl.exp(g)
        chunk_start = c * L
        chunk_end = tl.minimum(chunk_start + L, T)
        acc = tl.zeros([BLOCK_DQK, BLOCK_DV], dtype=tl.float32)
        # Q_bar^T dH~ of dC_{k-1} (B.3), BLOCK_T steps at a time; Q_bar = exp(b + m_{k-1} - m) Q / sqrt(d)
        for t0 in range(chunk_start, chunk_end, BLOCK_T):
            t = t0 + offs_t
            valid = t < chunk_end
            q = tl.load(q_base + t[:, None] * DQK + offs_qk[None, :], mask=valid[:, None], other=0.0)
            dh = tl.load(dh_base + t[:, None] * DV + offs_v[None, :], mask=valid[:, None], other=0.0)
            b = tl.load(b_ptr + gate_base + t, mask=valid, other=0.0)
            if USE_MAX_STATE:
                m_row = tl.load(m_row_ptr + gate_base + t, mask=valid, other=0.0)
                weight = tl.exp(b + m_prev - m_row) * scale
            else:
                weight = tl.exp(b) * scale
            if HAS_DENOM:
                weight = weight / tl.load(denom_ptr + gate_base + t, mask=valid, other=1.0)
            weight = tl.where(valid, weight, 0.0)
            q_weighted = (q * weight[:, None]).to(dtype)
            acc = tl.dot(tl.trans(q_weighted), dh, acc, input_precision=DOT_PRECISION)
        C_prev = tl.load(dC_ptr + (state_row + c) * DQK * DV + state_offs)
        tl.store(dg_ptr + (i_block * BH + bh) * NC + c, decay * tl.sum(tl.sum(C_prev * dC, axis=1), axis=0))
        dC = decay * dC + acc
        tl.store(dC_ptr + (state_row + c) * DQK * DV + state_offs, dC)


@triton.jit
def _query_log_scale(
    b_ptr, m_row_ptr, denom_ptr, offs, valid, USE_MAX_STATE: tl.constexpr, HAS_DENOM: tl.constexpr
):
    """Per query row: `b - m` (the row part of log D) and `1 / denom` (1 where the row is invalid)."""
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
    q_ptr,
    k_ptr,
    v_ptr,
    dh_ptr,
    b_ptr,
    log_i_ptr,
    m_row_ptr,
    denom_ptr,
    m_ptr,
    C_ptr,
    dq_ptr,
    qdq_ptr,
    T,
    NC,
    BH,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLOCK_LQ: tl.constexpr,
    BLOCK_LKV: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr,
    HAS_DENOM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dQ of one (L_hq tile, d_qk block), and the row dot products q . dq of that block."""
    N_DQK: tl.constexpr = DQK // BLOCK_DQK
    N_LQ: tl.constexpr = L // BLOCK_LQ
    pid = tl.program_id(0)
    i_dqk = pid % N_DQK
    i_lq = (pid // N_DQK) % N_LQ
    chunk_bh = pid // (N_DQK * N_LQ)
    c = chunk_bh % NC
    bh = (chunk_bh // NC).to(tl.int64)
    q_start = c * L + i_lq * BLOCK_LQ
    if q_start >= T:
        return
    chunk_start = c * L
    chunk_end = tl.minimum(chunk_start + L, T)

    offs_q = q_start + tl.arange(0, BLOCK_LQ)
    offs_kv = tl.arange(0, BLOCK_LKV)
    offs_qk = i_dqk * BLOCK_DQK + tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_valid = offs_q < chunk_end
    gate_base = bh * T
    dh_base = dh_ptr + bh * T * DV
    v_base = v_ptr + bh * T * DV
    k_base = k_ptr + bh * T * DQK
    state_base = C_ptr + (bh * (NC + 1) + c) * DQK * DV
    dtype = q_ptr.dtype.element_ty

    log_scale_q, inv_denom = _query_log_scale(
        b_ptr + gate_base,
        m_row_ptr + gate_base,
        denom_ptr + gate_base,
        offs_q,
        q_valid,
        USE_MAX_STATE,
        HAS_DENOM,
    )
    # Inter-chunk part dQ_inter = dH~ C_{k-1}^T (B.3) over the d_hv blocks; b_bar is applied after the loop
    acc = tl.zeros([BLOCK_LQ, BLOCK_DQK], dtype=tl.float32)
    for d0 in range(0, DV, BLOCK_DV):
        dh = tl.load(
            dh_base + offs_q[:, None] * DV + (d0 + offs_dv)[None, :], mask=q_valid[:, None], other=0.0
        )
        C = tl.load(state_base + offs_qk[:, None] * DV + (d0 + offs_dv)[None, :])
        acc = tl.dot(dh, tl.trans(C.to(dtype)), acc, input_precision=DOT_PRECISION)
    if USE_MAX_STATE:
        inter_weight = tl.exp(log_scale_q + tl.load(m_ptr + bh * (NC + 1) + c))
    else:
        inter_weight = tl.exp(log_scale_q)
    acc = acc * (tl.where(q_valid, inter_weight, 0.0) * inv_denom)[:, None]

    # Intra-chunk part dQ_intra = (dS_bar * D) K (B.3) over the L_kv tiles up to the causal diagonal
    for kv_start in range(chunk_start, tl.minimum(q_start + BLOCK_LQ, chunk_end), BLOCK_LKV):
        kv = kv_start + offs_kv
        kv_valid = kv < chunk_end
        # dS_bar = dH~ V^T (B.3), accumulated over the d_hv blocks
        ds = tl.zeros([BLOCK_LQ, BLOCK_LKV], dtype=tl.float32)
        for d0 in range(0, DV, BLOCK_DV):
            dh = tl.load(
                dh_base + offs_q[:, None] * DV + (d0 + offs_dv)[None, :], mask=q_valid[:, None], other=0.0
            )
            v = tl.load(
                v_base + kv[:, None] * DV + (d0 + offs_dv)[None, :], mask=kv_valid[:, None], other=0.0
            )
            ds = tl.dot(dh, tl.trans(v), ds, input_precision=DOT_PRECISION)
        b_kv = tl.load(b_ptr + gate_base + kv, mask=kv_valid, other=0.0)
        log_i_kv = tl.load(log_i_ptr + gate_base + kv, mask=kv_valid, other=0.0)
        causal = (offs_q[:, None] >= kv[None, :]) & q_valid[:, None]
        gate = tl.where(causal, tl.exp(log_scale_q[:, None] + (log_i_kv - b_kv)[None, :]), 0.0)
        p = ds * gate * inv_denom[:, None]
        k = tl.load(k_base + kv[:, None] * DQK + offs_qk[None, :], mask=kv_valid[:, None], other=0.0)
        acc = tl.dot(p.to(dtype), k, acc, input_precision=DOT_PRECISION)

    dq = acc * scale
    q = tl.load(
        q_ptr + bh * T * DQK + offs_q[:, None] * DQK + offs_qk[None, :], mask=q_valid[:, None], other=0.0
    )
    tl.store(
        dq_ptr + bh * T * DQK + offs_q[:, None] * DQK + offs_qk[None, :],
        dq.to(dq_ptr.dtype.element_ty),
        mask=q_valid[:, None],
    )
    tl.store(qdq_ptr + (i_dqk * BH + bh) * T + offs_q, tl.sum(q.to(tl.float32) * dq, axis=1), mask=q_valid)


@triton.jit
def _key_log_weight(b_ptr, log_i_ptr, offs, valid):
    """Per key row: `log_i - b` (the column part of log D); -inf where the row is invalid."""
    b = tl.load(b_ptr + offs, mask=valid, other=0.0)
    log_i = tl.load(log_i_ptr + offs, mask=valid, other=float("-inf"))
    return log_i - b


@triton.jit
def tfla_bwd_kernel_dk(
    q_ptr,
    k_ptr,
    v_ptr,
    dh_ptr,
    b_ptr,
    log_i_ptr,
    g_ptr,
    m_row_ptr,
    denom_ptr,
    m_ptr,
    dC_ptr,
    dk_ptr,
    kdk_ptr,
    kdk_inter_ptr,
    T,
    NC,
    BH,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLOCK_LQ: tl.constexpr,
    BLOCK_LKV: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr,
    HAS_DENOM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dK of one (L_kv tile, d_qk block), and the row dot products k . dk of that block (all of
    dK, and its inter-chunk part)."""
    N_DQK: tl.constexpr = DQK // BLOCK_DQK
    N_LKV: tl.constexpr = L // BLOCK_LKV
    pid = tl.program_id(0)
    i_dqk = pid % N_DQK
    i_lkv = (pid // N_DQK) % N_LKV
    chunk_bh = pid // (N_DQK * N_LKV)
    c = chunk_bh % NC
    bh = (chunk_bh // NC).to(tl.int64)
    kv_start = c * L + i_lkv * BLOCK_LKV
    if kv_start >= T:
        return
    chunk_end = tl.minimum(c * L + L, T)

    offs_kv = kv_start + tl.arange(0, BLOCK_LKV)
    offs_q = tl.arange(0, BLOCK_LQ)
    offs_qk = i_dqk * BLOCK_DQK + tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    kv_valid = offs_kv < chunk_end
    gate_base = bh * T
    dh_base = dh_ptr + bh * T * DV
    v_base = v_ptr + bh * T * DV
    q_base = q_ptr + bh * T * DQK
    state_base = dC_ptr + (bh * (NC + 1) + c + 1) * DQK * DV
    dtype = q_ptr.dtype.element_ty

    k_ptrs = k_ptr + bh * T * DQK + offs_kv[:, None] * DQK + offs_qk[None, :]
    log_weight_kv = _key_log_weight(b_ptr + gate_base, log_i_ptr + gate_base, offs_kv, kv_valid)
    # Inter-chunk part dK_inter = V dC_k^T (B.3) over the d_hv blocks; a_bar is applied after the loop
    acc = tl.zeros([BLOCK_LKV, BLOCK_DQK], dtype=tl.float32)
    for d0 in range(0, DV, BLOCK_DV):
        v = tl.load(
            v_base + offs_kv[:, None] * DV + (d0 + offs_dv)[None, :], mask=kv_valid[:, None], other=0.0
        )
        dC = tl.load(state_base + offs_qk[:, None] * DV + (d0 + offs_dv)[None, :])
        acc = tl.dot(v, tl.trans(dC.to(dtype)), acc, input_precision=DOT_PRECISION)
    # a_bar = exp(a - m_k) with a = g + log_i - b (eq. 40)
    log_a = tl.load(g_ptr + bh * NC + c) + log_weight_kv
    if USE_MAX_STATE:
        log_a -= tl.load(m_ptr + bh * (NC + 1) + c + 1)
    acc = acc * tl.exp(log_a)[:, None]
    k = tl.load(k_ptrs, mask=kv_valid[:, None], other=0.0).to(tl.float32)
    tl.store(kdk_inter_ptr + (i_dqk * BH + bh) * T + offs_kv, tl.sum(k * acc, axis=1), mask=kv_valid)

    # Intra-chunk part dK_intra = (dS_bar * D)^T Q / sqrt(d) (B.3) over the L_hq tiles from the diagonal
    for q_start in range(kv_start, chunk_end, BLOCK_LQ):
        q_rows = q_start + offs_q
        q_valid = q_rows < chunk_end
        log_scale_q, inv_denom = _query_log_scale(
            b_ptr + gate_base,
            m_row_ptr + gate_base,
            denom_ptr + gate_base,
            q_rows,
            q_valid,
            USE_MAX_STATE,
            HAS_DENOM,
        )
        # dS_bar^T = V dH~^T, accumulated over the d_hv blocks
        ds_t = tl.zeros([BLOCK_LKV, BLOCK_LQ], dtype=tl.float32)
        for d0 in range(0, DV, BLOCK_DV):
            v = tl.load(
                v_base + offs_kv[:, None] * DV + (d0 + offs_dv)[None, :], mask=kv_valid[:, None], other=0.0
            )
            dh = tl.load(
                dh_base + q_rows[:, None] * DV + (d0 + offs_dv)[None, :], mask=q_valid[:, None], other=0.0
            )
            ds_t = tl.dot(v, tl.trans(dh), ds_t, input_precision=DOT_PRECISION)
        causal = (q_rows[None, :] >= offs_kv[:, None]) & q_valid[None, :]
        gate_t = tl.where(causal, tl.exp(log_weight_kv[:, None] + log_scale_q[None, :]), 0.0)
        p_t = ds_t * gate_t * (inv_denom * scale)[None, :]
        q = tl.load(q_base + q_rows[:, None] * DQK + offs_qk[None, :], mask=q_valid[:, None], other=0.0)
        acc = tl.dot(p_t.to(dtype), q, acc, input_precision=DOT_PRECISION)

    tl.store(
        dk_ptr + bh * T * DQK + offs_kv[:, None] * DQK + offs_qk[None, :],
        acc.to(dk_ptr.dtype.element_ty),
        mask=kv_valid[:, None],
    )
    # k is loaded again rather than kept live through the loop (register pressure)
    k = tl.load(k_ptrs, mask=kv_valid[:, None], other=0.0).to(tl.float32)
    tl.store(kdk_ptr + (i_dqk * BH + bh) * T + offs_kv, tl.sum(k * acc, axis=1), mask=kv_valid)


@triton.jit
def tfla_bwd_kernel_dv(
    q_ptr,
    k_ptr,
    dh_ptr,
    b_ptr,
    log_i_ptr,
    g_ptr,
    m_row_ptr,
    denom_ptr,
    m_ptr,
    dC_ptr,
    dv_ptr,
    T,
    NC,
    scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    L: tl.constexpr,
    BLOCK_LQ: tl.constexpr,
    BLOCK_LKV: tl.constexpr,
    BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr,
    HAS_DENOM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dV of one (L_kv tile, d_hv block)."""
    N_DV: tl.constexpr = DV // BLOCK_DV
    N_LKV: tl.constexpr = L // BLOCK_LKV
    pid = tl.program_id(0)
    i_dv = pid % N_DV
    i_lkv = (pid // N_DV) % N_LKV
    chunk_bh = pid // (N_DV * N_LKV)
    c = chunk_bh % NC
    bh = (chunk_bh // NC).to(tl.int64)
    kv_start = c * L + i_lkv * BLOCK_LKV
    if kv_start >= T:
        return
    chunk_end = tl.minimum(c * L + L, T)

    offs_kv = kv_start + tl.arange(0, BLOCK_LKV)
    offs_q = tl.arange(0, BLOCK_LQ)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    kv_valid = offs_kv < chunk_end
    gate_base = bh * T
    k_base = k_ptr + bh * T * DQK
    q_base = q_ptr + bh * T * DQK
    dh_base = dh_ptr + bh * T * DV
    state_base = dC_ptr + (bh * (NC + 1) + c + 1) * DQK * DV
    dtype = q_ptr.dtype.element_ty

    log_weight_kv = _key_log_weight(b_ptr + gate_base, log_i_ptr + gate_base, offs_kv, kv_valid)
    # Inter-chunk part dV_inter = K dC_k (B.3) over the d_qk blocks; a_bar is applied after the loop
    acc = tl.zeros([BLOCK_LKV, BLOCK_DV], dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_DQK):
        k = tl.load(
            k_base + offs_kv[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=kv_valid[:, None], other=0.0
        )
        dC = tl.load(state_base + (d0 + offs_dqk)[:, None] * DV + offs_v[None, :])
        acc = tl.dot(k, dC.to(dtype), acc, input_precision=DOT_PRECISION)
    log_a = tl.load(g_ptr + bh * NC + c) + log_weight_kv
    if USE_MAX_STATE:
        log_a -= tl.load(m_ptr + bh * (NC + 1) + c + 1)
    acc = acc * tl.exp(log_a)[:, None]

    # Intra-chunk part dV_intra = S_bar^T dH~ (B.3) over the L_hq tiles from the diagonal
    for q_start in range(kv_start, chunk_end, BLOCK_LQ):
        q_rows = q_start + offs_q
        q_valid = q_rows < chunk_end
        log_scale_q, inv_denom = _query_log_scale(
            b_ptr + gate_base,
            m_row_ptr + gate_base,
            denom_ptr + gate_base,
            q_rows,
            q_valid,
            USE_MAX_STATE,
            HAS_DENOM,
        )
        # S^T = K Q^T, accumulated over the d_qk blocks
        s_t = tl.zeros([BLOCK_LKV, BLOCK_LQ], dtype=tl.float32)
        for d0 in range(0, DQK, BLOCK_DQK):
            k = tl.load(
                k_base + offs_kv[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=kv_valid[:, None], other=0.0
            )
            q = tl.load(
                q_base + q_rows[:, None] * DQK + (d0 + offs_dqk)[None, :], mask=q_valid[:, None], other=0.0
            )
            s_t = tl.dot(k, tl.trans(q), s_t, input_precision=DOT_PRECISION)
        causal = (q_rows[None, :] >= offs_kv[:, None]) & q_valid[None, :]
        gate_t = tl.where(causal, tl.exp(log_weight_kv[:, None] + log_scale_q[None, :]), 0.0)
        p_t = s_t * gate_t * (inv_denom * scale)[None, :]
        dh = tl.load(dh_base + q_rows[:, None] * DV + offs_v[None, :], mask=q_valid[:, None], other=0.0)
        acc = tl.dot(p_t.to(dtype), dh, acc, input_precision=DOT_PRECISION)

    tl.store(
        dv_ptr + bh * T * DV + offs_kv[:, None] * DV + offs_v[None, :],
        acc.to(dv_ptr.dtype.element_ty),
        mask=kv_valid[:, None],
    )
