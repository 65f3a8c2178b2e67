"""Triton pieces shared by the TFLA and limit_chunk kernels: the program-to-tile split and the two
recurrent kernels over the chunk-boundary states (TFLA paper, appendix B.2 and B.3).

- `fwd_kernel_states`: materializes the memory states before every chunk, `C_k` (and `n_k`, `m_k`):
  `C_k = g_bar_k C_{k-1} + (a_bar_k * K^(k))^T V^(k)` (eqs. 41-42).
- `bwd_kernel_dstates`: the state gradients, backwards over the chunks,
  `dC_{k-1} = g_bar_k dC_k + Q_bar^(k)T dH~^(k)` (B.3), and each chunk's gate-sum gradient
  `g_bar_k sum(C_{k-1} * dC_k)`.

One program per (d_qk block, d_hv block, batch*head) walks over the chunks, `BLOCK_T` steps at a
time (TFLA's default), or with `ONE_TILE` (`BLOCK_T = L`, limit_chunk's default) a whole chunk per
step with no inner loop: then the software pipeline prefetches the next chunk's tiles, and the
decayed state is the accumulator of the chunk's product. `USE_MAX_STATE` selects mLSTMexp's max
state `m` (appendix B.2); without it (mLSTMsig) every `m` is 0.

Layout: `q, k` `[BH, T, DQK]`, `v, dh` `[BH, T, DV]` contiguous; the within-chunk cumulative log
forget gates `b` and the log input gates are `[BH, T]` float32; per-chunk `g` and `a_max` are
`[BH, NC]`; states `C` `[BH, NC + 1, DQK, DV]`, `n` `[BH, NC + 1, DQK]`, `m` `[BH, NC + 1]` (index
`k` is the state before chunk `k`, index `NC` the final state). The recurrences carry `C` and `dC`
in float32 registers but store them in the input dtype: every kernel that reads a state casts it
to the input dtype for its matrix products, so a float32 copy would only double the state traffic,
the largest of the backward pass. The initial state, the final state and their gradients, which
the caller sees, are float32 (`[BH, DQK, DV]`); `n` and `m` stay float32. The last chunk may be
shorter than `L`. State `k` of a head starts at `(bh * (NC + 1) + k) * DQK * DV`: int64 through `bh`, since
`k * DQK * DV` alone can pass int32 (2048 chunks of a 1024 x 1024 state).

Every launch grid is one-dimensional (the chunk count times batch*heads can exceed the 65,535
limit of grid axes 1 and 2); `program_tile` splits the program id with the embedding block
fastest, so the programs that share the same sequence tiles run side by side.
"""

import triton
import triton.language as tl

# The state kernel keeps `n` as this many equal columns: `(a_bar * K)^T` times a block of ones, the
# narrowest product `tl.dot` takes.
N_COLUMNS = tl.constexpr(16)
# log2(e). The L x L gate matrices are exp(row + column) = exp2(row log2(e) + column log2(e)), each
# term scaled once per tile: `tl.exp2` compiles to one MUFU.EX2 (ex2.approx.ftz), `tl.exp` to that
# behind a multiply and a subnormal fix-up (Triton 3.6, sm90), four instructions more per entry.
# Flushing results below 2^-126 to zero leaves a gate weight of at most 1 as it is.
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def program_tile(N_BLOCKS: tl.constexpr, N_TILES: tl.constexpr, NC):
    """`(block, tile, chunk, batch*head)` of this program, for `N_BLOCKS` embedding blocks and `N_TILES`
    sequence tiles per chunk; batch*head is int64 (it multiplies into the state offsets)."""
    pid = tl.program_id(0)
    i_block = pid % N_BLOCKS
    i_tile = (pid // N_BLOCKS) % N_TILES
    chunk_bh = pid // (N_BLOCKS * N_TILES)
    return i_block, i_tile, chunk_bh % NC, (chunk_bh // NC).to(tl.int64)


@triton.jit
def tile_bounds(c, i_tile, L: tl.constexpr, BLOCK: tl.constexpr, T):
    """The first step of sequence tile `i_tile` of chunk `c`, and the chunk's first and end steps (the
    last chunk may be shorter than `L`)."""
    chunk_start = c * L
    return chunk_start + i_tile * BLOCK, chunk_start, tl.minimum(chunk_start + L, T)


@triton.jit
def load_rows(base, rows, valid, cols, D: tl.constexpr):
    """The tile `M[rows, cols]` of the row-major matrix `M` of width `D` at `base`; zero in the rows
    that are not `valid`."""
    return tl.load(base + rows[:, None] * D + cols[None, :], mask=valid[:, None], other=0.0)


@triton.jit
def store_rows(base, rows, valid, cols, D: tl.constexpr, tile):
    """`M[rows, cols] = tile`, in the dtype of `M` (as `load_rows`), in the rows that are `valid`."""
    tl.store(base + rows[:, None] * D + cols[None, :], tile.to(base.dtype.element_ty), mask=valid[:, None])


@triton.jit
def load_tile(src, bh, row0, rows, valid, col0, cols, D: tl.constexpr, TMA: tl.constexpr):
    """`load_rows(src, rows, valid, cols, D)` with `src` one head's base; with `TMA`, the same tile
    through `src`, the Hopper tensor descriptor (`tma_rows`) of every head's `[T, D]` rows, as
    `[bh, row0:, col0:]`. The descriptor returns zeros for rows past `T` only: a caller's rows past
    `valid` must all be past `T` (a tile within its chunk), or the caller zeroes them."""
    if TMA:
        tile = src.load([bh, row0, col0]).reshape(rows.shape[0], cols.shape[0])
    else:
        tile = load_rows(src, rows, valid, cols, D)
    return tile


@triton.jit
def dot_rows(
    x_ptr, x_rows, x_valid, y_ptr, y_rows, y_valid, acc,
    D: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    bh=0, x_row0=0, y_row0=0, TMA: tl.constexpr = False,
):  # fmt: skip
    """`acc + X[x_rows] Y[y_rows]^T` for row-major `X, Y` of width `D`, `BLOCK_D` columns at a time:
    the scores `S = Q K^T` and `dS = dH V^T` over a head dim (Algorithm 1, lines 6-9). With `TMA`,
    `X` and `Y` are descriptors (`load_tile`) and the tiles start at rows `x_row0`, `y_row0`."""
    offs_d = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        x = load_tile(x_ptr, bh, x_row0, x_rows, x_valid, d0, d0 + offs_d, D, TMA)
        y = load_tile(y_ptr, bh, y_row0, y_rows, y_valid, d0, d0 + offs_d, D, TMA)
        acc = tl.dot(x, tl.trans(y), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def gate_tile(row_log2, log_i_kv, b_kv, rows, q_valid, kv, kv_start, q_start, BLOCK_LKV: tl.constexpr):
    """The gate matrix `D` of a query tile and a key tile, `exp(row's log scale + log_i - b)` from the
    rows' log scale times `LOG2E`, with the causal mask only where the diagonal crosses the tile. A row
    past the chunk's end may then take any value: the forward and dQ kernels, its callers, do not
    store it."""
    gate = tl.exp2(row_log2[:, None] + ((log_i_kv - b_kv) * LOG2E)[None, :])
    if kv_start + BLOCK_LKV > q_start:
        gate = tl.where((rows[:, None] >= kv[None, :]) & q_valid[:, None], gate, 0.0)
    return gate


@triton.jit
def load_state(src, index, row0, rows, col0, cols, DV: tl.constexpr, TMA: tl.constexpr):
    """The block `[rows, cols]` of one chunk state at `src`, the state's base; with `TMA`, through
    `src`, the descriptor of every state (`tma_states`), as state `index` at `[row0:, col0:]`."""
    if TMA:
        block = src.load([index, row0, col0]).reshape(rows.shape[0], cols.shape[0])
    else:
        block = tl.load(src + rows[:, None] * DV + cols[None, :])
    return block


@triton.jit
def state_block(DQK: tl.constexpr, DV: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The state block of this recurrent-kernel program: its row and column block indices, its rows
    and columns, its element offsets within one state, and its batch*head."""
    i_dv, i_dqk, _, bh = program_tile(DV // BLOCK_DV, DQK // BLOCK_DQK, 1)
    offs_qk = i_dqk * BLOCK_DQK + tl.arange(0, BLOCK_DQK)
    offs_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    return i_dqk, i_dv, offs_qk, offs_v, offs_qk[:, None] * DV + offs_v[None, :], bh


@triton.jit
def _add_keys_tile(
    C, n, k_base, v_base, gate_ptr, log_i_ptr, t, end, offs_qk, offs_v, log_scale,
    DQK: tl.constexpr, DV: tl.constexpr, HAS_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """`C + (a_bar * K)^T V` and `n + (a_bar * K)^T 1` over the steps `t < end` (eqs. 41-42), with
    `log a_bar = log_scale - b + log_i` (`log_scale = g_k - m_k`). `n` is `N_COLUMNS` equal columns,
    a product of the weighted keys (rounded to the input dtype, as for `C`) with a block of ones,
    where a float32 sum over the steps would cross the warps on every tile (on an H100 that sum made
    the state kernel take 1.47x as long)."""
    valid = t < end
    k = load_rows(k_base, t, valid, offs_qk, DQK)
    v = load_rows(v_base, t, valid, offs_v, DV)
    b = tl.load(gate_ptr + t, mask=valid, other=0.0)
    log_i = tl.load(log_i_ptr + t, mask=valid, other=float("-inf"))
    k_weighted = tl.trans((k * tl.exp(log_scale - b + log_i)[:, None]).to(k_base.dtype.element_ty))
    C = tl.dot(k_weighted, v, C, input_precision=DOT_PRECISION)
    if HAS_N:
        ones = tl.full([t.shape[0], N_COLUMNS], 1.0, k_base.dtype.element_ty)
        n = tl.dot(k_weighted, ones, n, input_precision=DOT_PRECISION)
    return C, n


@triton.jit
def fwd_kernel_states(
    k_ptr, v_ptr, b_ptr, log_i_ptr, g_ptr, a_max_ptr,  # the keys, the values and the log gates
    C0_ptr, n0_ptr, m0_ptr,  # the initial state
    C_ptr, n_ptr, m_ptr, C_final_ptr,  # the chunk-boundary states, the final C
    T, NC,
    DQK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr, HAS_N: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_FINAL: tl.constexpr,
    ONE_TILE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Chunk-boundary states: `C_k = g_bar_k C_{k-1} + (a_bar_k * K)^T V` (eq. 41) and `n_k` (eq. 42).

    The recurrence runs in float32 registers from the initial state (`C0, n0, m0`, float32, with
    `HAS_INITIAL`; else the empty memory); `C_k` is stored in the dtype of `C_ptr` (the input dtype:
    every reader casts it to that dtype for its matrix products), the final `C` also in float32 to
    `C_final_ptr` with `STORE_FINAL`.
    """
    i_dqk, i_dv, offs_qk, offs_v, state_offs, bh = state_block(DQK, DV, BLOCK_DQK, BLOCK_DV)
    offs_t = tl.arange(0, BLOCK_T)
    k_base = k_ptr + bh * T * DQK
    v_base = v_ptr + bh * T * DV
    gate_base = bh * T
    state_row = bh * (NC + 1)
    state_dtype = C_ptr.dtype.element_ty
    first_block = (i_dv == 0) & (i_dqk == 0)

    n = tl.zeros([BLOCK_DQK, N_COLUMNS], dtype=tl.float32)  # compiled away without HAS_N
    if HAS_INITIAL:
        C = tl.load(C0_ptr + bh * DQK * DV + state_offs)
        if HAS_N:
            n = tl.broadcast_to(tl.load(n0_ptr + bh * DQK + offs_qk)[:, None], (BLOCK_DQK, N_COLUMNS))
        if USE_MAX_STATE:
            m = tl.load(m0_ptr + bh)
    else:
        C = tl.zeros([BLOCK_DQK, BLOCK_DV], dtype=tl.float32)
        if USE_MAX_STATE:
            m = tl.full([], float("-inf"), tl.float32)  # the empty memory (`reference`'s docstring)
    tl.store(C_ptr + state_row * DQK * DV + state_offs, C.to(state_dtype))
    if HAS_N:
        tl.store(n_ptr + state_row * DQK + offs_qk, tl.max(n, axis=1), mask=(offs_qk < DQK) & (i_dv == 0))
    if USE_MAX_STATE:
        if first_block:
            tl.store(m_ptr + state_row, m)
    for c in range(NC):
        g = tl.load(g_ptr + bh * NC + c)
        if USE_MAX_STATE:
            # m_k = max(g_k + m_{k-1}, max_j a_kj): the max state at the chunk end (appendix B.2), so
            # the decay g_bar and the weights a_bar are at most 1
            m_new = tl.maximum(g + m, tl.load(a_max_ptr + bh * NC + c))
            decay = tl.exp(g + m - m_new)
            log_scale = g - m_new
            m = m_new
        else:
            decay = tl.exp(g)
            log_scale = g
        chunk_start = c * L
        if ONE_TILE:
            C, n = _add_keys_tile(
                decay * C, decay * n, k_base, v_base, b_ptr + gate_base, log_i_ptr + gate_base,
                chunk_start + offs_t, T, offs_qk, offs_v, log_scale, DQK, DV, HAS_N, DOT_PRECISION,
            )  # fmt: skip
        else:
            chunk_end = tl.minimum(chunk_start + L, T)
            acc = tl.zeros([BLOCK_DQK, BLOCK_DV], dtype=tl.float32)
            n_acc = tl.zeros([BLOCK_DQK, N_COLUMNS], dtype=tl.float32)
            for t0 in range(chunk_start, chunk_end, BLOCK_T):
                acc, n_acc = _add_keys_tile(
                    acc, n_acc, k_base, v_base, b_ptr + gate_base, log_i_ptr + gate_base,
                    t0 + offs_t, chunk_end, offs_qk, offs_v, log_scale, DQK, DV, HAS_N, DOT_PRECISION,
                )  # fmt: skip
            C = decay * C + acc
            n = decay * n + n_acc
        tl.store(C_ptr + (state_row + c + 1) * DQK * DV + state_offs, C.to(state_dtype))
        if HAS_N:
            # every d_hv block computes the same n; one of them stores one of its equal columns (the
            # mask is all true but makes the condition a tensor of the block's shape)
            n_col = tl.max(n, axis=1)
            tl.store(n_ptr + (state_row + c + 1) * DQK + offs_qk, n_col, mask=(offs_qk < DQK) & (i_dv == 0))
        if USE_MAX_STATE:
            if first_block:
                tl.store(m_ptr + state_row + c + 1, m)
    if STORE_FINAL:
        tl.store(C_final_ptr + bh * DQK * DV + state_offs, C)


@triton.jit
def _add_queries_tile(
    dC, q_base, dh_base, gate_ptr, m_row_ptr, denom_ptr, t, end, offs_qk, offs_v, log_scale, scale,
    DQK: tl.constexpr, DV: tl.constexpr, USE_MAX_STATE: tl.constexpr, HAS_DENOM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """`dC + Q_bar^T dH~` over the steps `t < end` (B.3), with `Q_bar = exp(b + m_{k-1} - m) Q / sqrt(d)`
    (`log_scale = m_{k-1}`) and `dH~ = dH / denom`."""
    valid = t < end
    q = load_rows(q_base, t, valid, offs_qk, DQK)
    dh = load_rows(dh_base, t, valid, offs_v, DV)
    log_weight = tl.load(gate_ptr + t, mask=valid, other=0.0) + log_scale
    if USE_MAX_STATE:
        log_weight -= tl.load(m_row_ptr + t, mask=valid, other=0.0)
    weight = tl.exp(log_weight) * scale
    if HAS_DENOM:
        weight = weight / tl.load(denom_ptr + t, mask=valid, other=1.0)
    q_weighted = (q * tl.where(valid, weight, 0.0)[:, None]).to(q_base.dtype.element_ty)
    return tl.dot(tl.trans(q_weighted), dh, dC, input_precision=DOT_PRECISION)


@triton.jit
def bwd_kernel_dstates(
    q_ptr, dh_ptr, b_ptr, g_ptr, m_row_ptr, denom_ptr,  # the queries, the output gradient, the gates
    m_ptr, C_ptr,  # the forward's states
    dC_ptr, dC_final_ptr, dC0_ptr, dg_ptr,  # the state gradients, and the chunk-sum gate gradients
    T, NC, BH, scale,
    DQK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    USE_MAX_STATE: tl.constexpr, HAS_DENOM: tl.constexpr, HAS_FINAL_GRAD: tl.constexpr,
    STORE_INITIAL_GRAD: tl.constexpr, ONE_TILE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """State gradients `dC_k` for k = NC .. 0, from the final-state gradient `dC_NC` (float32 at
    `dC_final_ptr` with `HAS_FINAL_GRAD`, else zero).

    The recurrence runs in float32 registers; `dC_k` is stored in the dtype of `dC_ptr` (the input
    dtype, as its readers cast it), the initial state's gradient `dC_0` also in float32 to `dC0_ptr`
    with `STORE_INITIAL_GRAD`. `C_ptr` holds the forward states; it may be `dC_ptr` itself: each
    program reads its block of `C_{k-1}` before overwriting it with `dC_{k-1}` (and the forward's
    final state, which no gradient reads, first). Also the chunk-sum gate gradient
    `dg_k = g_bar_k * sum(C_{k-1} * dC_k)` (B.3), stored per state block in `dg_ptr`
    (`[N_DQK * N_DV, BH, NC]`). `C_{k-1}` is stabilized by `exp(-m_{k-1})` and `dC_k` by `exp(m_k)`,
    so `g_bar_k` includes `exp(m_{k-1} - m_k)`, as in the decay.
    """
    i_dqk, i_dv, offs_qk, offs_v, state_offs, bh = state_block(DQK, DV, BLOCK_DQK, BLOCK_DV)
    i_block = i_dqk * (DV // BLOCK_DV) + i_dv
    offs_t = tl.arange(0, BLOCK_T)
    q_base = q_ptr + bh * T * DQK
    dh_base = dh_ptr + bh * T * DV
    gate_base = bh * T
    state_row = bh * (NC + 1)
    state_dtype = dC_ptr.dtype.element_ty

    if HAS_FINAL_GRAD:
        dC = tl.load(dC_final_ptr + bh * DQK * DV + state_offs)
    else:
        dC = tl.zeros([BLOCK_DQK, BLOCK_DV], dtype=tl.float32)
    tl.store(dC_ptr + (state_row + NC) * DQK * DV + state_offs, dC.to(state_dtype))
    for c_rev in range(NC):
        c = NC - 1 - c_rev
        g = tl.load(g_ptr + bh * NC + c)
        if USE_MAX_STATE:
            m_prev = tl.load(m_ptr + state_row + c)
            decay = tl.exp(g + m_prev - tl.load(m_ptr + state_row + c + 1))
        else:
            m_prev = 0.0
            decay = tl.exp(g)
        # dg_k from dC_k before it becomes dC_{k-1}
        C_prev = tl.load(C_ptr + (state_row + c) * DQK * DV + state_offs).to(tl.float32)
        tl.store(dg_ptr + (i_block * BH + bh) * NC + c, decay * tl.sum(tl.sum(C_prev * dC, axis=1), axis=0))
        chunk_start = c * L
        if ONE_TILE:
            dC = _add_queries_tile(
                decay * dC, q_base, dh_base, b_ptr + gate_base, m_row_ptr + gate_base, denom_ptr + gate_base,
                chunk_start + offs_t, T, offs_qk, offs_v, m_prev, scale,
                DQK, DV, USE_MAX_STATE, HAS_DENOM, DOT_PRECISION,
            )  # fmt: skip
        else:
            chunk_end = tl.minimum(chunk_start + L, T)
            acc = tl.zeros([BLOCK_DQK, BLOCK_DV], dtype=tl.float32)
            for t0 in range(chunk_start, chunk_end, BLOCK_T):
                acc = _add_queries_tile(
                    acc, q_base, dh_base, b_ptr + gate_base, m_row_ptr + gate_base, denom_ptr + gate_base,
                    t0 + offs_t, chunk_end, offs_qk, offs_v, m_prev, scale,
                    DQK, DV, USE_MAX_STATE, HAS_DENOM, DOT_PRECISION,
                )  # fmt: skip
            dC = decay * dC + acc
        tl.store(dC_ptr + (state_row + c) * DQK * DV + state_offs, dC.to(state_dtype))
    if STORE_INITIAL_GRAD:
        tl.store(dC0_ptr + bh * DQK * DV + state_offs, dC)


@triton.jit
def _log1p(x):
    """`log(1 + x)` for `x >= 0`, accurate also where `1 + x` rounds (its rounding divides out)."""
    u = 1.0 + x
    rounded = u - 1.0
    return tl.where(rounded == 0.0, x, tl.log(u) * (x / tl.where(rounded == 0.0, 1.0, rounded)))


@triton.jit
def _log_sigmoid(x):
    return tl.minimum(x, 0.0) - _log1p(tl.exp(-tl.abs(x)))


@triton.jit
def _maximum(x, y):
    return tl.maximum(x, y)


@triton.jit
def fwd_kernel_gates(
    i_ptr, f_ptr, log_i_ptr, b_ptr, g_ptr, a_max_ptr, row_max_ptr, T, NC,
    L: tl.constexpr, SIG_INPUT: tl.constexpr, ROW_MAX: tl.constexpr,
):  # fmt: skip
    """The log gates of one chunk and their sums (`gates.log_gates`, `gates.chunk_gates`, eqs. 38-40):
    `log_i` (`i`, or `log sigmoid(i)` with `SIG_INPUT`), `b` (the within-chunk cumulative sum of
    `log_f = log sigmoid(f)`), `g` (the chunk's total) and `a_max = max(g - b + log_i)`, float32.
    Steps past `T` count as forget gate 1 and input gate 0, which leave every sum unchanged.

    With `ROW_MAX` (for mLSTMexp's TFLA output kernel) it also stores `row_max[t] = max_{j <= t}
    (log_i[j] - b[j])` over the steps of the chunk: row `t` of the log gate matrix
    `D~ = b - b^T + log_i^T` (eq. 44) is at most `b[t] + row_max[t]`, so the output kernel knows each
    row's max state before any product."""
    pid = tl.program_id(0)
    c = pid % NC
    bh = (pid // NC).to(tl.int64)
    steps = tl.arange(0, L)
    offs = bh * T + c * L + steps
    valid = c * L + steps < T
    log_f = tl.where(valid, _log_sigmoid(tl.load(f_ptr + offs, mask=valid, other=0.0).to(tl.float32)), 0.0)
    log_i = tl.load(i_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    if SIG_INPUT:
        log_i = _log_sigmoid(log_i)
    log_i = tl.where(valid, log_i, float("-inf"))
    b = tl.cumsum(log_f, axis=0)
    g = tl.sum(tl.where(steps == L - 1, b, 0.0), axis=0)
    tl.store(log_i_ptr + offs, log_i, mask=valid)
    tl.store(b_ptr + offs, b, mask=valid)
    tl.store(g_ptr + bh * NC + c, g)
    tl.store(a_max_ptr + bh * NC + c, tl.max(g - b + log_i, axis=0))
    if ROW_MAX:
        tl.store(row_max_ptr + offs, tl.associative_scan(log_i - b, 0, _maximum), mask=valid)


@triton.jit
def bwd_kernel_gates(
    i_ptr, f_ptr, qdq_ptr, kdk_ptr, kdk_inter_ptr, dg_ptr, di_ptr, df_ptr, T, NC, BH,
    L: tl.constexpr, N_ROW_BLOCKS: tl.constexpr, N_STATE_BLOCKS: tl.constexpr, SIG_INPUT: tl.constexpr,
):  # fmt: skip
    """`di` and `df` of one chunk: `gates.chunk_log_gate_grads` through the gate activations.

    The row dot products `q . dq`, `k . dk` and `k . dk_inter` come in `N_ROW_BLOCKS` head-dim slices
    (`[N_ROW_BLOCKS, BH, T]`), the chunk-sum gradients `g_bar_k sum(C_{k-1} * dC_k)` in
    `N_STATE_BLOCKS` state-block slices (`[N_STATE_BLOCKS, BH, NC]`); both are summed here. Then
    `d log_i = k . dk` and `d log_f` = the within-chunk reverse cumsum of `q . dq - k . dk_intra`, plus
    the exclusive cumsum of `k . dk_inter`, plus the chunk sum (`gates` docstring), and
    `d log sigmoid(x) / dx = sigmoid(-x)`."""
    pid = tl.program_id(0)
    c = pid % NC
    bh = (pid // NC).to(tl.int64)
    steps = c * L + tl.arange(0, L)
    valid = steps < T
    qdq = tl.zeros([L], dtype=tl.float32)
    kdk = tl.zeros([L], dtype=tl.float32)
    kdk_inter = tl.zeros([L], dtype=tl.float32)
    for j in tl.static_range(N_ROW_BLOCKS):
        offs = (j * BH + bh) * T + steps
        qdq += tl.load(qdq_ptr + offs, mask=valid, other=0.0)
        kdk += tl.load(kdk_ptr + offs, mask=valid, other=0.0)
        kdk_inter += tl.load(kdk_inter_ptr + offs, mask=valid, other=0.0)
    dg = 0.0
    for j in tl.static_range(N_STATE_BLOCKS):
        dg += tl.load(dg_ptr + (j * BH + bh) * NC + c)
    within = tl.cumsum(qdq - (kdk - kdk_inter), axis=0, reverse=True)
    before = tl.cumsum(kdk_inter, axis=0) - kdk_inter
    f = tl.load(f_ptr + bh * T + steps, mask=valid, other=0.0).to(tl.float32)
    df = (within + before + dg) * tl.sigmoid(-f)
    di = kdk
    if SIG_INPUT:
        di = di * tl.sigmoid(-tl.load(i_ptr + bh * T + steps, mask=valid, other=0.0).to(tl.float32))
    tl.store(di_ptr + bh * T + steps, di.to(di_ptr.dtype.element_ty), mask=valid)
    tl.store(df_ptr + bh * T + steps, df.to(df_ptr.dtype.element_ty), mask=valid)
