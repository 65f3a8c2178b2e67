"""`mlstm_limit_chunk`: mLSTMexp with one-level chunkwise parallelism (FLA style), in Triton.

The `limit_chunk` kernel the TFLA paper compares against (section 3, appendix B.2/B.3): the
sequence is split into chunks of `L` steps, all `N_c = ceil(T / L)` chunk-boundary states are
materialized in HBM (float32, `config.float32_states`) by a recurrent kernel, and a parallel kernel
computes each chunk's output with the chunk's whole `L x L` intra-chunk matrix in one program.
There is no second level of sequence parallelism inside a chunk (that is TFLA), so `L` is bounded
by on-chip memory.

The math and the conventions are those of `tfla_bench.kernels.reference` and `mlstm_tfla`: queries
scaled by `1/sqrt(Dqk)`, log forget gate `logsigmoid(f)`, log input gate `i`, output
`h_t = C_t^T q_t / (max(|n_t^T q_t|, exp(-m_t)) + eps)`, the empty memory has `m_0 = -inf`, states
are `(C, n, m)` with `C, n` stabilized by `exp(-m)`. Gradients follow `mlstm_tfla` (appendix B.3):
no gradient through the normalizer or the max state; the initial and final states follow
`chunkwise`; the gate gradients are `d log_i_j = k_j . dk_j` and `d log_f_s`
from chunk-local sums (`common.bwd_kernel_gates`, shared with TFLA; its PyTorch reference is
`tfla_bench.kernels.gates.chunk_log_gate_grads`): within-chunk cumulative sums of the row dot
products plus each chunk's `g_bar_k sum(C_{k-1} * dC_k)`. In exact arithmetic that equals one
reverse cumulative sum of `q . dq - k . dk` over the whole sequence, but that sum cancels the
rounding errors of all later steps: in bfloat16 on an H100 at T 8192 it is 6.5e-2 to 2.7e-1 off
(relative RMS).

Kernels (one-dimensional grids: chunks times batch*heads can exceed 65,535; `NK = Dqk / B_dqk`,
`NV = Dv / B_dhv`, `NC` chunks, `BH` batch*heads):

- `common.fwd_kernel_states`, grid `BH * NK_state * NV_state`: one program per state block
  walks over the chunks, a whole chunk per step, and stores `C_k, n_k, m_k` of every chunk boundary
  (eqs. 41-42).
- `limit_chunk_fwd_kernel_h`, grid `BH * NC * NV`: one program per (chunk, d_hv block) builds the
  chunk's `L x L` scores `Q K^T` and `Q C_{k-1}` over the d_qk blocks, takes the row max of the whole
  gate matrix at once (eq. 49; no running-max rescaling as in TFLA), and writes `H`, the row max
  state and the denominator (eqs. 50-55).
- `common.bwd_kernel_dstates`, grid `BH * NK_state * NV_state`: the state gradients backwards
  over the chunks, `dC_{k-1} = g_bar_k dC_k + Q_bar^T dH~` (B.3), and each chunk's
  `g_bar_k sum(C_{k-1} * dC_k)` from the stored forward states, per state block, into a buffer of
  their own (the gradient kernel reads both).
- `limit_chunk_bwd_kernel_dqkv`, grid `BH * NC`: one program per chunk builds `S = Q K^T` and
  `dS = dH V^T` (both `L x L`) and then produces `dV`, `dQ`, `dK` of the chunk block by block
  (eqs. 58-75), and the row dot products `q . dq`, `k . dk` and `k . dk_inter` (the part of `dk`
  through `dC_k`) for the gate gradients.

Tile sizes and launch settings: one `KernelConfig` (`config.default_config("limit_chunk", ...)`,
or a config tuned for the GPU), overridable per call with `config=`. Its sequence tiles are the
whole chunk, and its head-dim blocks follow the on-chip rule of `config` (`unsupported_reason`):
for 16-bit inputs chunk sizes 16 to 128 fit at any head dims, for float32 up to 64.

`T` need not be a multiple of `L`: the last chunk may be shorter (masked loads and stores).
"""

import torch
import triton
import triton.language as tl

from tfla_bench.kernels.chunkwise import (
    KernelOps,
    RowDots,
    Settings,
    apply,
    check_inputs,
    dot_precision,
    prepare_call,
    resolve_config,
    states_backward,
)
from tfla_bench.kernels.common import dot_rows, load_rows, store_rows
from tfla_bench.kernels.config import KernelConfig, float32_states, unsupported_reason


@triton.jit
def limit_chunk_fwd_kernel_h(
    q_ptr, k_ptr, v_ptr, b_ptr, log_i_ptr,  # the inputs and their log gates
    C_ptr, n_ptr, m_ptr,  # the chunk-boundary states
    h_ptr, m_row_ptr, denom_ptr,  # the outputs, and what the backward pass reuses
    T, NC, scale, eps,
    DQK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
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
        q = load_rows(q_base, offs_t, valid, d0 + offs_dqk, DQK)
        k = load_rows(k_base, offs_t, valid, d0 + offs_dqk, DQK)
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
    v = load_rows(v_ptr + bh * T * DV, offs_t, valid, offs_v, DV)
    h_num = tl.dot(p.to(dtype), v, h_inter * inter_weight[:, None], input_precision=DOT_PRECISION) * scale
    n_q = (n_inter * inter_weight + tl.sum(p, axis=1)) * scale
    denom = tl.maximum(tl.abs(n_q), tl.exp(-m_row)) + eps
    h = h_num / denom[:, None]
    store_rows(h_ptr + bh * T * DV, offs_t, valid, offs_v, DV, h)
    tl.store(m_row_ptr + gate_base + offs_t, m_row, mask=valid & (i_dv == 0))
    tl.store(denom_ptr + gate_base + offs_t, denom, mask=valid & (i_dv == 0))


@triton.jit
def limit_chunk_bwd_kernel_dqkv(
    q_ptr, k_ptr, v_ptr, dh_ptr, b_ptr, log_i_ptr, g_ptr,  # the inputs, the output gradient, the gates
    m_ptr, m_row_ptr, denom_ptr, C_ptr, dC_ptr,  # what the forward pass stored, the state gradients
    dq_ptr, dk_ptr, dv_ptr, qdq_ptr, kdk_ptr, kdk_inter_ptr,  # the gradients and their row dot products
    T, NC, scale,
    DQK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
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
    s = dot_rows(q_base, offs_t, valid, k_base, offs_t, valid, s, DQK, BLOCK_DQK, DOT_PRECISION)
    p = (s * gate).to(dtype)
    # dP = (dS * D) / denom / sqrt(d) with dS = dH V^T over the d_hv blocks (eqs. 71-72)
    ds = tl.zeros([L, L], dtype=tl.float32)
    ds = dot_rows(dh_base, offs_t, valid, v_base, offs_t, valid, ds, DV, BLOCK_DV, DOT_PRECISION)
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
            dh = load_rows(dh_base, offs_t, valid, v0 + offs_dv, DV)
            v = load_rows(v_base, offs_t, valid, v0 + offs_dv, DV)
            state_offs = (d0 + offs_dqk)[:, None] * DV + (v0 + offs_dv)[None, :]
            C = tl.load(C_base + state_offs)
            dC = tl.load(dC_base + state_offs)
            acc_q = tl.dot(dh, tl.trans(C.to(dtype)), acc_q, input_precision=DOT_PRECISION)
            acc_k = tl.dot(v, tl.trans(dC.to(dtype)), acc_k, input_precision=DOT_PRECISION)
        q = load_rows(q_base, offs_t, valid, d0 + offs_dqk, DQK)
        k = load_rows(k_base, offs_t, valid, d0 + offs_dqk, DQK)
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


DEFAULT_CHUNK_SIZE = 64


def _forward(q, k, v, log_i, gates, C, n, m, h, m_row, denom, s: Settings):
    """The output kernel, one program per (d_hv block, chunk, batch*head)."""
    bh, seq_len = log_i.shape
    dqk, dv, nc, cfg = q.shape[-1], v.shape[-1], gates.g.shape[-1], s.config
    s.launches(
        "output", limit_chunk_fwd_kernel_h, bh * nc * (dv // cfg.v),
        (q, k, v, gates.b, log_i, C, n, m, h, m_row, denom, seq_len, nc, dqk**-0.5, s.eps),
        lambda: dict(
            DQK=dqk, DV=dv, L=s.chunk_size, BLOCK_DQK=cfg.qk, BLOCK_DV=cfg.v,
            DOT_PRECISION=dot_precision(q.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        ),
    )  # fmt: skip


def _backward(q, k, v, dh, log_i, gates, C, m, m_row, denom, dC_final, initial_grad, s: Settings):
    """Both backward kernels; returns `dq, dk, dv, row_dots, dg, dC0` (`chunkwise`'s docstring)."""
    bh, seq_len, dqk = q.shape
    dv_dim = v.shape[-1]
    cfg = s.config
    nc = gates.g.shape[-1]
    dC = torch.empty_like(C)
    dg, dC0 = states_backward(q, dh, gates, m, m_row, denom, C, dC, dC_final, s, initial_grad)

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    q_dq = torch.empty(bh, seq_len, dtype=torch.float32, device=q.device)
    k_dk = torch.empty_like(q_dq)
    k_dk_inter = torch.empty_like(q_dq)
    limit_chunk_bwd_kernel_dqkv[(bh * nc,)](
        q, k, v, dh, gates.b, log_i, gates.g, m, m_row, denom, C, dC, dq, dk, dv, q_dq, k_dk, k_dk_inter,
        seq_len, nc, dqk**-0.5,
        DQK=dqk, DV=dv_dim, L=s.chunk_size, BLOCK_DQK=cfg.bwd_qk, BLOCK_DV=cfg.bwd_v,
        DOT_PRECISION=dot_precision(q.dtype), num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages,
    )  # fmt: skip

    # The gate gradients come from chunk-local sums (module docstring); the final state's share is in
    # dg of the last chunk and in k . dk_inter
    return dq, dk, dv, RowDots(q_dq[None], k_dk[None], k_dk_inter[None]), dg, dC0


OPS = KernelOps(_forward, _backward)


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
    config: KernelConfig | None = None,
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
        config: tile sizes and launch settings; default: the tuned or default config of this GPU and
            shape (`config.config_for`).

    Returns:
        `h` `[B, NH, T, Dv]` in the dtype of `q`, or `(h, final_state)` with `return_final_state`.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device, a chunk size beyond the limit, or an
            unsupported config.

    Examples::

        >>> q = torch.randn(2, 4, 512, 128, device="cuda", dtype=torch.bfloat16); k = torch.randn_like(q)
        >>> v = torch.randn(2, 4, 512, 256, device="cuda", dtype=torch.bfloat16)
        >>> i, f = torch.randn(2, 4, 512, device="cuda"), torch.randn(2, 4, 512, device="cuda") + 3
        >>> h = mlstm_limit_chunk(q, k, v, i, f, chunk_size=64)
        >>> h, (C, n, m) = mlstm_limit_chunk(q, k, v, i, f, return_final_state=True)
    """
    seq_len = q.shape[2] if isinstance(q, torch.Tensor) and q.dim() == 4 else 0

    def make() -> Settings:
        check_inputs(q, k, v, i, f, "exp", chunk_size, seq_len, eps)
        reason = unsupported_reason(chunk_size, q.shape[-1], v.shape[-1], q.dtype)
        if reason is not None:
            raise ValueError(reason)
        resolved = resolve_config("limit_chunk", config, q, v.shape[-1], chunk_size, "exp")
        wide = float32_states("limit_chunk", "exp", q.shape[-1], resolved)
        return Settings("exp", chunk_size, float(eps), False, resolved, return_final_state, wide)

    options = ("limit_chunk", chunk_size, type(chunk_size), eps, config, return_final_state)
    s, (q, k, v, i, f), state = prepare_call(options, make, q, k, v, i, f, initial_state, "exp", False)
    h, final_state = apply(OPS, q, k, v, i, f, state, s)
    return (h, final_state) if return_final_state else h
