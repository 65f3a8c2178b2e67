"""TFLA forward output kernel (TFLA paper, section 3.2, Algorithm 1, appendix B.2 and C).

Two-level sequence parallelism ("xl_chunk"): after `common.fwd_kernel_states` has materialized the
chunk-boundary states, `tfla_fwd_kernel_h` (parallel) computes the outputs `H^(k)` of all chunks.
One program per (d_hv block, L_hq tile, chunk, batch*head) loops over the L_kv tiles up to the
causal diagonal and over the d_qk blocks (Fig. 3). The gate is a compile-time switch:

- mLSTMexp (`USE_MAX_STATE`) needs each row's max state `m_comb = max(b + m_{k-1}, max_j D~)`
  (Algorithm 1, lines 15-17 and 24). Algorithm 1 finds it with a running max over the L_kv tiles and
  rescales its accumulators as it grows (lines 18-21). But `D~ = b - b^T + log_i^T` holds gates only,
  so its row max is `b` plus the within-chunk prefix max of `log_i - b`, which the gate kernel stores
  (`row_max`): the kernel knows `m_comb` before its first product, weights every product by its
  final scale and never rescales. On an H100 (8 x 256/512, L256) the kernel with the running max
  took 2987 us against mLSTMsig's 1981 with the same bytes moved; without it, 1827 against 1759;
- mLSTMsig needs no max state (section 4, appendix C.2); it has a normalizer `n` only with
  `normalize` (`HAS_N`).

Both add the inter- and the intra-chunk products into one accumulator as they come. The gate matrix
tiles are `exp2` of base-2 log weights (`common.gate_tile`), masked only where the causal diagonal
crosses the tile.

Layout and state indexing as in `common`; `h` is `[BH, T, DV]`, the per-row max state `m_row` and
denominator `denom` that the backward pass reuses are `[BH, T]` float32.
"""

import triton
import triton.language as tl

from tfla_bench.kernels.common import (
    LOG2E,
    dot_rows,
    gate_tile,
    load_state,
    load_tile,
    program_tile,
    store_rows,
    tile_bounds,
)


@triton.jit
def tfla_fwd_kernel_h(
    q_ptr, k_ptr, v_ptr, b_ptr, log_i_ptr, row_max_ptr,  # the inputs and their log gates
    C_ptr, n_ptr, m_ptr,  # the chunk-boundary states
    h_ptr, m_row_ptr, denom_ptr,  # the outputs, and what the backward pass reuses
    T, NC, scale, eps,
    DQK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_LQ: tl.constexpr, BLOCK_LKV: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr, HAS_N: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr = False,
):  # fmt: skip
    """Outputs `H = (b_bar Q / sqrt(d)) C_{k-1} + (S * D) V` of one (L_hq tile, d_hv block), normalized.

    Row `i` weights the inter-chunk product by `exp(r_i)` and the intra-chunk entry `(i, j)` by
    `exp(r_i + log_i_j - b_j)`: mLSTMsig with `r = b`; mLSTMexp with `r = -M`, `M = max(m_{k-1},
    row_max_i)`, so both weights are `exp(. - m_comb)` with `m_comb = b + M` (Algorithm 1, lines 24-33)
    and at most 1. Also stores, for mLSTMexp, `m_comb` and the denominator
    `max(|n^T q|, exp(-m_comb)) + eps` of each row, which the backward pass reuses (line 37); mLSTMsig
    with `HAS_N` has the denominator `max(|n^T q|, 1) + eps`.

    With `TMA` (`KernelConfig.tma`), `q_ptr`, `k_ptr`, `v_ptr` and `C_ptr` are Hopper tensor
    descriptors of all heads and states (`chunkwise.tma_rows`, `chunkwise.tma_states`, with this
    launch's tiles as their blocks), and the tiles come through them (`common.load_tile`).
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
    bh32, state_index = bh.to(tl.int32), (bh * (NC + 1) + c).to(tl.int32)  # a descriptor's indices
    if TMA:
        q_base, k_base, v_base, gate_base, state_base = q_ptr, k_ptr, v_ptr, bh * T, C_ptr
        dtype = h_ptr.dtype.element_ty
    else:
        q_base = q_ptr + bh * T * DQK
        k_base = k_ptr + bh * T * DQK
        v_base = v_ptr + bh * T * DV
        gate_base = bh * T
        state_base = C_ptr + (bh * (NC + 1) + c) * DQK * DV
        dtype = q_ptr.dtype.element_ty

    # The row log scale r and the inter-chunk weight exp(b + m_{k-1} - m_comb) (exp(b) for mLSTMsig)
    b_q = tl.load(b_ptr + gate_base + offs_q, mask=q_valid, other=0.0)
    if USE_MAX_STATE:
        m_prev = tl.load(m_ptr + bh * (NC + 1) + c)
        row_max = tl.maximum(m_prev, tl.load(row_max_ptr + gate_base + offs_q, mask=q_valid, other=0.0))
        row_log = -row_max
        inter_weight = tl.exp(m_prev - row_max)
    else:
        row_log = b_q
        inter_weight = tl.exp(b_q)

    # Lines 23-33: inter-chunk part Q C_{k-1} and Q n_{k-1} (H_inter, B.2)
    acc = tl.zeros([BLOCK_LQ, BLOCK_DV], dtype=tl.float32)
    n_acc = tl.zeros([BLOCK_LQ], dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_DQK):
        q = load_tile(q_base, bh32, q_start, offs_q, q_valid, d0, d0 + offs_dqk, DQK, TMA)
        C = load_state(state_base, state_index, d0, d0 + offs_dqk, i_dv * BLOCK_DV, offs_v, DV, TMA)
        acc = tl.dot(q, C.to(dtype), acc, input_precision=DOT_PRECISION)
        if HAS_N:
            n = tl.load(n_ptr + (bh * (NC + 1) + c) * DQK + d0 + offs_dqk)
            n_acc += tl.sum(q.to(tl.float32) * n[None, :], axis=1)
    acc = acc * inter_weight[:, None]
    n_acc = n_acc * inter_weight

    # Lines 4-22: intra-chunk part (S * D) V (H_intra, B.2) over the L_kv tiles up to the causal diagonal
    row_log2 = row_log * LOG2E
    for kv_start in range(chunk_start, tl.minimum(q_start + BLOCK_LQ, chunk_end), BLOCK_LKV):
        kv = kv_start + offs_kv
        # Lines 6-9: S = Q K^T over the d_qk blocks
        s = tl.zeros([BLOCK_LQ, BLOCK_LKV], dtype=tl.float32)
        s = dot_rows(
            q_base, offs_q, q_valid, k_base, kv, kv < chunk_end, s, DQK, BLOCK_DQK, DOT_PRECISION,
            bh32, q_start, kv_start, TMA,
        )  # fmt: skip
        b_kv = tl.load(b_ptr + gate_base + kv, mask=kv < chunk_end, other=0.0)
        log_i_kv = tl.load(log_i_ptr + gate_base + kv, mask=kv < chunk_end, other=float("-inf"))
        # Lines 10-17: the gate matrix at the row's final scale
        p = s * gate_tile(row_log2, log_i_kv, b_kv, offs_q, q_valid, kv, kv_start, q_start, BLOCK_LKV)
        v = load_tile(v_base, bh32, kv_start, kv, kv < chunk_end, i_dv * BLOCK_DV, offs_v, DV, TMA)
        acc = tl.dot(p.to(dtype), v, acc, input_precision=DOT_PRECISION)
        if HAS_N:
            n_acc += tl.sum(p, axis=1)

    # Lines 34-36: normalize
    if USE_MAX_STATE:
        m_comb = b_q + row_max
        denom = tl.maximum(tl.abs(n_acc * scale), tl.exp(-m_comb)) + eps
        h = acc * (scale / denom)[:, None]
        tl.store(m_row_ptr + gate_base + offs_q, m_comb, mask=q_valid & (i_dv == 0))
    else:
        h = acc * scale
        if HAS_N:
            # max(|n^T q|, 1) + eps (appendix D.3): the mLSTMexp denominator with m = 0
            denom = tl.maximum(tl.abs(n_acc * scale), 1.0) + eps
            h = h / denom[:, None]
    # Line 37: store H, and the denominator of each row for the backward pass
    if HAS_N:
        tl.store(denom_ptr + gate_base + offs_q, denom, mask=q_valid & (i_dv == 0))
    store_rows(h_ptr + bh * T * DV, offs_q, q_valid, offs_v, DV, h)
