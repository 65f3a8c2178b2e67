"""`mlstm_tfla`: the TFLA mLSTM kernels (xl_chunk) with autograd, for mLSTMexp and mLSTMsig.

The math is the one of `tfla_bench.kernels.reference` (see its docstring for the output formula,
the state tuples and the max-state convention `m_0 = -inf` for an empty memory). The forward pass
runs three Triton kernels (`common.fwd_kernel_gates`, `common.fwd_kernel_states`, `tfla_fwd`), the
backward pass five (`common.bwd_kernel_dstates`, `tfla_bwd`: dQ, then dK and dV, and
`common.bwd_kernel_gates` for the gate gradients). Memory: the forward pass keeps the chunk-boundary
states (`(ceil(T/L) + 1) * Dqk * Dv` per head, in the input dtype or float32 by
`config.float32_states`) and, per step, the float32 log gates, max state and denominator (mLSTMexp;
the denominator alone for mLSTMsig with `normalize`) for the backward pass, which overwrites the
states with their gradients in place.

Gradient conventions (TFLA paper, appendix B.3):

- No gradient flows through the normalizer or the max state: the per-row denominator
  `max(|n^T q|, exp(-m)) + eps` is a constant of the backward pass. This is exact when `h` is
  followed by a per-timestep scale-invariant norm (RMS-norm or LayerNorm without epsilon), as in
  the mLSTM block; it is exact for mLSTMsig without `normalize`, which has no denominator.
- The initial and final states follow `chunkwise` (the initial `m_0` gets its exact gradient).
- Gate gradients (appendix B.3, `gates.chunk_log_gate_grads`): the row and column sums of `dD`
  (B.3) equal the dot products `q_t . dq_t` and `k_j . dk_j`, which the dQ and dK kernels
  write in float32 (dK also its inter-chunk part); the state kernel writes each chunk's
  `g_bar_k sum(C_{k-1} * dC_k)` (B.3). `common.bwd_kernel_gates` turns them into
  `d log_i_j = k_j . dk_j` and `d log_f` with within-chunk (reverse) cumulative sums, and those into
  the gradients of the gate pre-activations.

Tile sizes and launch settings: one `KernelConfig` (`config.default_config("tfla", ...)`, or a
config tuned for the GPU), overridable per call with `config=`.
"""

import torch
import torch.nn.functional as F

from tfla_bench.kernels.chunkwise import (
    KernelOps,
    RowDots,
    Settings,
    apply,
    check_inputs,
    dot_precision,
    pointer_or,
    prepare_call,
    resolve_config,
    states_backward,
    tma_aligned,
    tma_rows,
    tma_states,
)
from tfla_bench.kernels.config import KernelConfig, float32_states
from tfla_bench.kernels.tfla_bwd import tfla_bwd_kernel_dkv, tfla_bwd_kernel_dkv_fused, tfla_bwd_kernel_dq
from tfla_bench.kernels.tfla_fwd import tfla_fwd_kernel_h

SEQ_MULTIPLE = 16


def _forward(q, k, v, log_i, gates, C, n, m, h, m_row, denom, s: Settings):
    """The output kernel, one program per (d_hv block, L_hq tile, chunk, batch*head)."""
    bh, seq_len = log_i.shape
    dqk, dv, nc, cfg = q.shape[-1], v.shape[-1], gates.g.shape[-1], s.config
    tiles, tma = (q, k, v, C), cfg.tma and tma_aligned(q, k, v)
    if tma:  # their descriptors: Triton then launches the site every time (`launch.Launches`)
        tiles = (
            tma_rows(q, cfg.seq_q, cfg.qk),
            tma_rows(k, cfg.seq_kv, cfg.qk),
            tma_rows(v, cfg.seq_kv, cfg.v),
            tma_states(C, cfg.qk, cfg.v),
        )
    s.launches(
        "output", tfla_fwd_kernel_h, bh * nc * (s.chunk_size // cfg.seq_q) * (dv // cfg.v),
        (
            *tiles[:3], gates.b, log_i, pointer_or(gates.row_max, gates.b), tiles[3], pointer_or(n, C),
            pointer_or(m, C), h, pointer_or(m_row, h), pointer_or(denom, h), seq_len, nc, dqk**-0.5, s.eps,
        ),
        lambda: dict(
            DQK=dqk, DV=dv, L=s.chunk_size, BLOCK_LQ=cfg.seq_q, BLOCK_LKV=cfg.seq_kv, BLOCK_DQK=cfg.qk,
            BLOCK_DV=cfg.v, USE_MAX_STATE=s.use_max_state, HAS_N=s.has_n,
            DOT_PRECISION=dot_precision(q.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **({"TMA": True} if tma else {}),
        ),
    )  # fmt: skip


def _backward(q, k, v, dh, log_i, gates, C, m, m_row, denom, dC_final, initial_grad, s: Settings):
    """The backward kernels (dK and dV in one launch with `bwd_fused_kv`); `C` (the forward states)
    is overwritten with the state gradients.

    Returns `dq, dk, dv, row_dots, dg, dC0` (`chunkwise`'s docstring).
    """
    bh, seq_len, dqk = q.shape
    dv_dim = v.shape[-1]
    cfg = s.config
    nc = gates.g.shape[-1]
    scale = dqk**-0.5
    gate_args = (
        gates.b,
        log_i,
        gates.g,
        pointer_or(m_row, gates.b),
        pointer_or(denom, gates.b),
        pointer_or(m, gates.g),
    )
    settings = dict(
        DQK=dqk, DV=dv_dim, L=s.chunk_size, BLOCK_LQ=cfg.bwd_seq_q, BLOCK_LKV=cfg.bwd_seq_kv,
        BLOCK_DQK=cfg.bwd_qk, BLOCK_DV=cfg.bwd_v, USE_MAX_STATE=s.use_max_state, HAS_DENOM=s.has_n,
        DOT_PRECISION=dot_precision(q.dtype), num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages,
    )  # fmt: skip
    n_q_tiles = s.chunk_size // cfg.bwd_seq_q
    n_kv_tiles = s.chunk_size // cfg.bwd_seq_kv
    n_qk_blocks = dqk // cfg.bwd_qk

    dq = torch.empty_like(q)
    qdq = torch.empty(n_qk_blocks, bh, seq_len, dtype=torch.float32, device=q.device)
    b, log_i, g, m_row_arg, denom_arg, m_arg = gate_args
    # The tiles of the dQ, dK and dV kernels: the tensors, or with `bwd_tma` their descriptors
    # (`tma_rows`, with each launch's blocks) and the option
    tma = dict(TMA=True) if cfg.bwd_tma and tma_aligned(q, k, v, dh) else {}
    q_rows, kv_rows, qk, dv_block = cfg.bwd_seq_q, cfg.bwd_seq_kv, cfg.bwd_qk, cfg.bwd_v

    def tiles(*blocks):
        return [tma_rows(x, rows, cols) if tma else x for x, rows, cols in blocks]

    tfla_bwd_kernel_dq[(bh * nc * n_q_tiles * n_qk_blocks,)](
        *tiles((q, q_rows, qk), (k, kv_rows, qk), (v, kv_rows, dv_block), (dh, q_rows, dv_block)),
        b, log_i, m_row_arg, denom_arg, m_arg, tma_states(C, qk, dv_block) if tma else C, dq, qdq,
        seq_len, nc, bh, scale, **settings, **tma,
    )  # fmt: skip

    # The state gradients take the place of the forward states (read for the last time by the
    # dstates kernel, just before it overwrites them).
    dC = C
    dg, dC0 = states_backward(q, dh, gates, m, m_row, denom, C, dC, dC_final, s, initial_grad)

    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if cfg.bwd_fused_kv:
        # one slice of k . dk for all of dK; the other slices of the dQ kernel's count add nothing
        rows = torch.zeros if n_qk_blocks > 1 else torch.empty
        kdk = rows(2, n_qk_blocks, bh, seq_len, dtype=torch.float32, device=q.device)
        tfla_bwd_kernel_dkv_fused[(bh * nc * n_kv_tiles,)](
            q, k, v, dh, *gate_args, dC, dk, dv, kdk[0], kdk[1], seq_len, nc, scale, **settings
        )
        return dq, dk, dv, RowDots(qdq, kdk[0], kdk[1]), dg, dC0
    kdk = torch.empty(2, n_qk_blocks, bh, seq_len, dtype=torch.float32, device=q.device)
    dC_blocks = tma_states(dC, qk, dv_block) if tma else dC
    tfla_bwd_kernel_dkv[(bh * nc * n_kv_tiles * n_qk_blocks,)](
        *tiles((v, kv_rows, dv_block), (dh, q_rows, dv_block), (q, q_rows, qk), (k, kv_rows, qk)),
        *gate_args, dC_blocks, dk, kdk[0], kdk[1], seq_len, nc, bh, scale, GRAD_V=False, **settings, **tma,
    )  # fmt: skip
    tfla_bwd_kernel_dkv[(bh * nc * n_kv_tiles * (dv_dim // cfg.bwd_v),)](
        *tiles((k, kv_rows, qk), (q, q_rows, qk), (dh, q_rows, dv_block)), k,
        *gate_args, dC_blocks, dv, b, b, seq_len, nc, bh, scale, GRAD_V=True, **settings, **tma,
    )  # fmt: skip

    return dq, dk, dv, RowDots(qdq, kdk[0], kdk[1]), dg, dC0


OPS = KernelOps(_forward, _backward, row_max=True)


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
    config: KernelConfig | None = None,
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
        config: tile sizes and launch settings; default: the tuned or default config of this GPU and
            shape (`config.config_for`).

    Returns:
        `h` `[B, NH, T, Dv]` in the dtype of `q`, or `(h, final_state)` with `return_final_state`.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device, an unsupported size or config.

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

    def make() -> Settings:
        check_inputs(q, k, v, i, f, gate, chunk_size, seq_len + pad_steps, eps)
        resolved = resolve_config("tfla", config, q, v.shape[-1], chunk_size, gate)
        wide = float32_states("tfla", gate, q.shape[-1], resolved)
        sig_normalize = normalize and gate == "sig"
        return Settings(gate, chunk_size, float(eps), sig_normalize, resolved, return_final_state, wide)

    options = ("tfla", gate, chunk_size, type(chunk_size), eps, normalize, pad, config, return_final_state)
    s, (q, k, v, i, f), state = prepare_call(options, make, q, k, v, i, f, initial_state, gate, normalize)
    if pad_steps:
        # input gate 0 and forget gate 1: the padded steps leave the state unchanged
        q, k, v = (F.pad(x, (0, 0, 0, pad_steps)) for x in (q, k, v))
        i = F.pad(i, (0, pad_steps), value=float("-inf"))
        f = F.pad(f, (0, pad_steps), value=float("inf"))
    h, final_state = apply(OPS, q, k, v, i, f, state, s)
    if pad_steps:
        h = h[:, :, :seq_len]
    return (h, final_state) if return_final_state else h
