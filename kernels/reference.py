"""PyTorch references of every kernel family the suite checks: readable, not fast.

Softmax attention (`softmax_attention`), decay linear attention (`decay_linear_attention`: the
recurrence behind GLA, Simple GLA and LightningAttention-2) and the Mamba scans built on it
(`ssd_reference`, `mamba2_split_conv_reference`, `selective_scan_reference`) compute in float64.

The mLSTM (TFLA paper, section 2 and appendix B) has three formulations of the same function, each
differentiable by autograd, each taking an initial state and returning the final state:

- `mlstm_recurrent`: step by step (eqs. 1-5 for mLSTMexp, eqs. 22-24 for mLSTMsig),
- `mlstm_parallel`: fully parallel and stabilized (appendix B.1),
- `mlstm_chunkwise`: chunkwise parallel (section 2.2, appendix B.2).

Shapes: `q, k` are `[B, NH, T, Dqk]`, `v` is `[B, NH, T, Dv]`, the gate pre-activations `i, f` are
`[B, NH, T]`. Queries are scaled by `1/sqrt(Dqk)`. The computation runs in float64 if any input is
float64, else in float32, and the output `h` (`[B, NH, T, Dv]`) keeps that dtype.

The hidden state before the output gate and the norm layer:

- mLSTMexp: `h_t = C_t^T q_t / (max(|n_t^T q_t|, exp(-m_t)) + eps)` with the max state `m`
  stabilizing the exponential input gate and the normalizer `n`.
- mLSTMsig: `h_t = C_t^T q_t` (no max state; `eps` unused). With `normalize=True` a normalizer
  with the same sigmoid gates is added: `h_t = C_t^T q_t / (max(|n_t^T q_t|, 1) + eps)`
  (appendix D.3, Fig. 10b); this is the mLSTMexp formula with `m = 0`.

States are tuples: `(C, n, m)` for mLSTMexp with `C` `[B, NH, Dqk, Dv]`, `n` `[B, NH, Dqk]`,
`m` `[B, NH]`; `(C,)` for mLSTMsig, `(C, n)` for mLSTMsig with `normalize=True`. For mLSTMexp the
stored `C, n` are stabilized: the unstabilized state is `C * exp(m)`.

Max-state convention: without an initial state the memory is empty and `m_0 = -inf`, which is
what the fully parallel form (B.1) computes (its stabilizer is the maximum over the causal row
only). With zero `C_0, n_0` the output does not depend on `m_0` (numerator and denominator scale
together), except through `eps`, which is added to the stabilized denominator.
"""

import math

import torch
import torch.nn.functional as F

from tfla_bench.kernels.gates import chunk_gates, compute_dtype, log_gates, num_chunks

State = tuple[torch.Tensor, ...]


def state_names(gate: str, normalize: bool) -> tuple[str, ...]:
    """Names of the state tensors for `gate`: `("C", "n", "m")`, `("C",)` or `("C", "n")`."""
    if gate == "exp":
        return ("C", "n", "m")
    return ("C", "n") if normalize else ("C",)


def zero_state(
    batch: int,
    num_heads: int,
    head_dim_qk: int,
    head_dim_v: int,
    *,
    gate: str,
    normalize: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> State:
    """The empty memory: zero `C` (and `n`), and `m = -inf` for mLSTMexp."""
    C = torch.zeros(batch, num_heads, head_dim_qk, head_dim_v, dtype=dtype, device=device)
    n = torch.zeros(batch, num_heads, head_dim_qk, dtype=dtype, device=device)
    if gate == "exp":
        return (C, n, torch.full((batch, num_heads), float("-inf"), dtype=dtype, device=device))
    return (C, n) if normalize else (C,)


def _prepare(q, k, v, i, f, gate, initial_state, normalize):
    """Inputs in the compute dtype, log gates, and the initial `(C, n, m)` with `n`/`m` possibly None."""
    dtype = compute_dtype(q, k, v, i, f, *(initial_state or ()))
    q, k, v = (x.to(dtype) for x in (q, k, v))
    log_i, log_f = log_gates(i.to(dtype), f.to(dtype), gate)
    batch, heads, _, dqk = q.shape
    names = state_names(gate, normalize)
    state = initial_state
    if state is None:
        state = zero_state(
            batch, heads, dqk, v.shape[-1], gate=gate, normalize=normalize, dtype=dtype, device=q.device
        )
    if len(state) != len(names):
        raise ValueError(f"initial_state must be a tuple {names} for gate={gate!r}, normalize={normalize}")
    parts = dict(zip(names, (s.to(dtype) for s in state), strict=True))
    return q, k, v, log_i, log_f, parts["C"], parts.get("n"), parts.get("m")


def _pack(gate: str, C: torch.Tensor, n: torch.Tensor | None, m: torch.Tensor | None) -> State:
    if gate == "exp":
        return (C, n, m)
    return (C,) if n is None else (C, n)


def _log_gate_matrix(cum_log_f: torch.Tensor, log_i: torch.Tensor) -> torch.Tensor:
    """`log D~_tj = F_t - F_j + log_i_j` for `j <= t`, `-inf` above the diagonal, with `F` the cumulative
    log forget gate over the last dim (appendix B.1: `D~ = log F + I~`; within a chunk `F` is `b`, B.2)."""
    seq_len = cum_log_f.shape[-1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=cum_log_f.device).tril()
    log_d = cum_log_f[..., :, None] - cum_log_f[..., None, :] + log_i[..., None, :]
    return log_d.masked_fill(~causal, -math.inf)


def _stabilized(gate: str, log_w: torch.Tensor, log_w0: torch.Tensor):
    """`(m, exp(log_w - m), exp(log_w0 - m))` for weights `log_w` over the last dim and one more weight
    `log_w0` (the initial state's), with mLSTMexp's max state `m` over both (B.1); mLSTMsig has no max
    state (`m` None, the weights unscaled)."""
    if gate != "exp":
        return None, torch.exp(log_w), torch.exp(log_w0)
    m = torch.maximum(log_w.amax(-1), log_w0)
    return m, torch.exp(log_w - m[..., None]), torch.exp(log_w0 - m)


def _denominator(nq: torch.Tensor, m: torch.Tensor | None, eps: float) -> torch.Tensor:
    """`max(|n^T q|, exp(-m)) + eps`; the lower bound is 1 when there is no max state (mLSTMsig)."""
    lower = torch.exp(-m) if m is not None else torch.ones_like(nq)
    return torch.maximum(nq.abs(), lower) + eps


def mlstm_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor, *,
    gate: str = "exp", initial_state: State | None = None, eps: float = 1e-6, normalize: bool = False,
) -> tuple[torch.Tensor, State]:  # fmt: skip
    """The mLSTM step by step (eqs. 1-5; mLSTMsig eqs. 22-24).

    Args:
        q: queries `[B, NH, T, Dqk]`.
        k: keys `[B, NH, T, Dqk]`.
        v: values `[B, NH, T, Dv]`.
        i: input-gate pre-activations `[B, NH, T]`.
        f: forget-gate pre-activations `[B, NH, T]`.
        gate: `"exp"` or `"sig"`.
        initial_state: `(C, n, m)` for exp, `(C,)` or with `normalize` `(C, n)` for sig; default empty.
        eps: added to the denominator (exp, and sig with `normalize`).
        normalize: mLSTMsig only: divide by `max(|n^T q|, 1) + eps`. mLSTMexp always normalizes.

    Returns:
        `(h, final_state)` with `h` `[B, NH, T, Dv]` in the compute dtype (float32 or float64).

    Examples::

        >>> q = k = torch.randn(1, 2, 8, 16); v = torch.randn(1, 2, 8, 32)
        >>> i, f = torch.randn(1, 2, 8), torch.randn(1, 2, 8) + 3
        >>> h, (C, n, m) = mlstm_recurrent(q, k, v, i, f, gate="exp")
    """
    q, k, v, log_i, log_f, C, n, m = _prepare(q, k, v, i, f, gate, initial_state, normalize)
    scale = q.shape[-1] ** -0.5
    outputs = []
    for t in range(q.shape[2]):
        q_t, k_t, v_t = q[:, :, t] * scale, k[:, :, t], v[:, :, t]
        if gate == "exp":
            # eq. 1 and the stabilized gates of eqs. 6-7
            m_new = torch.maximum(log_f[..., t] + m, log_i[..., t])
            forget = torch.exp(log_f[..., t] + m - m_new)
            inp = torch.exp(log_i[..., t] - m_new)
            m = m_new
        else:
            forget, inp = torch.exp(log_f[..., t]), torch.exp(log_i[..., t])
        C = forget[..., None, None] * C + inp[..., None, None] * (k_t[..., :, None] * v_t[..., None, :])
        h_t = torch.einsum("bhd,bhde->bhe", q_t, C)
        if n is not None:
            n = forget[..., None] * n + inp[..., None] * k_t
            h_t = h_t / _denominator((n * q_t).sum(-1), m, eps)[..., None]
        outputs.append(h_t)
    return torch.stack(outputs, dim=2), _pack(gate, C, n, m)


def mlstm_parallel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor, *,
    gate: str = "exp", initial_state: State | None = None, eps: float = 1e-6, normalize: bool = False,
) -> tuple[torch.Tensor, State]:  # fmt: skip
    """The fully parallel stabilized mLSTM (appendix B.1), `O(T^2)` memory.

    The initial state enters as one more "column" of the gate matrix with log weight
    `F_t + m_0` (`F` the cumulative log forget gate), so the row max state also covers it.
    Arguments and return value as in `mlstm_recurrent`.

    Examples::

        >>> h, (C,) = mlstm_parallel(q, k, v, i, f, gate="sig")
    """
    q, k, v, log_i, log_f, C0, n0, m0 = _prepare(q, k, v, i, f, gate, initial_state, normalize)
    scale = q.shape[-1] ** -0.5
    cum_f = log_f.cumsum(-1)  # F_t = sum_{s <= t} log_f[s]
    log_d = _log_gate_matrix(cum_f, log_i)
    log_init = cum_f + (m0[..., None] if m0 is not None else 0.0)  # log weight of C_0 in row t
    # mLSTMexp: m is the row max of D~ (B.1), extended by the C_0 column
    m, gate_matrix, init_weight = _stabilized(gate, log_d, log_init)
    s_bar = (q @ k.transpose(-1, -2)) * scale * gate_matrix  # S and S_bar = S * D (B.1)
    q_init = q * scale * init_weight[..., None]
    h = s_bar @ v + q_init @ C0
    if n0 is not None:
        nq = s_bar.sum(-1) + (q_init * n0[..., None, :]).sum(-1)  # normalizer of B.1 with the C_0 column
        h = h / _denominator(nq, m, eps)[..., None]

    # Final state: every step's weight in C_T, and C_0's.
    log_w = cum_f[..., -1:] - cum_f + log_i
    m_T, w, w0 = _stabilized(gate, log_w, log_init[..., -1])
    C_T = w0[..., None, None] * C0 + (k * w[..., None]).transpose(-1, -2) @ v
    n_T = None if n0 is None else w0[..., None] * n0 + (k * w[..., None]).sum(-2)
    return h, _pack(gate, C_T, n_T, m_T)


def mlstm_chunkwise(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: torch.Tensor, f: torch.Tensor, *,
    gate: str = "exp", chunk_size: int = 64, initial_state: State | None = None, eps: float = 1e-6,
    normalize: bool = False,
) -> tuple[torch.Tensor, State]:  # fmt: skip
    """The chunkwise parallel mLSTM (appendix B.2): an inter-chunk recurrence and intra-chunk attention.

    `T` need not be a multiple of `chunk_size`; the last chunk is then shorter. Other arguments and
    the return value as in `mlstm_recurrent`.

    Examples::

        >>> h, (C, n, m) = mlstm_chunkwise(q, k, v, i, f, gate="exp", chunk_size=4)
    """
    q, k, v, log_i, log_f, C, n, m = _prepare(q, k, v, i, f, gate, initial_state, normalize)
    seq_len = q.shape[2]
    scale = q.shape[-1] ** -0.5
    gates = chunk_gates(log_i, log_f, chunk_size)
    outputs = []
    for c in range(num_chunks(seq_len, chunk_size)):
        span = slice(c * chunk_size, min((c + 1) * chunk_size, seq_len))
        q_c, k_c, v_c = q[:, :, span] * scale, k[:, :, span], v[:, :, span]
        b, a = gates.b[..., span], gates.a[..., span]
        # Intra-chunk part (B.2): D~ = b - b^T + log_i^T, stabilized by its row max m_intra
        log_d = _log_gate_matrix(b, log_i[..., span])
        if gate == "exp":
            m_intra = log_d.amax(-1)
            m_comb = torch.maximum(b + m[..., None], m_intra)  # m_combine (B.2)
            gate_matrix = torch.exp(log_d - m_intra[..., None])
            intra_rescale = torch.exp(m_intra - m_comb)
            q_bar = q_c * torch.exp(b + m[..., None] - m_comb)[..., None]  # Q_bar of H_inter (B.2)
        else:
            gate_matrix, intra_rescale = torch.exp(log_d), torch.ones_like(b)
            q_bar = q_c * torch.exp(b)[..., None]
        s_bar = (q_c @ k_c.transpose(-1, -2)) * gate_matrix  # S_bar = S * D (B.2)
        h_c = q_bar @ C + intra_rescale[..., None] * (s_bar @ v_c)  # numerator of H (B.2)
        if n is not None:
            nq = (q_bar * n[..., None, :]).sum(-1) + intra_rescale * s_bar.sum(-1)
            h_c = h_c / _denominator(nq, m_comb if gate == "exp" else None, eps)[..., None]
        outputs.append(h_c)

        # Inter-chunk recurrence (eqs. 41-42): C_k = g_k C_{k-1} + (a_k * K)^T V, stabilized
        g = gates.g[..., c]
        if gate == "exp":
            m_new = torch.maximum(g + m, gates.a_max[..., c])
            decay, weight = torch.exp(g + m - m_new), torch.exp(a - m_new[..., None])
            m = m_new
        else:
            decay, weight = torch.exp(g), torch.exp(a)
        k_weighted = k_c * weight[..., None]
        C = decay[..., None, None] * C + k_weighted.transpose(-1, -2) @ v_c
        if n is not None:
            n = decay[..., None] * n + k_weighted.sum(-2)
    return torch.cat(outputs, dim=2), _pack(gate, C, n, m)


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, scale: float | None = None
) -> torch.Tensor:
    """Softmax attention in float64 through torch SDPA's math backend.

    Args:
        q: queries `[B, H, T, D]`.
        k: keys `[B, H, T, D]`.
        v: values `[B, H, T, Dv]`.
        causal: mask future keys.
        scale: score scale, default `D ** -0.5`.

    Returns:
        `[B, H, T, Dv]` in float64.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q64, k64, v64 = (x.detach().to(torch.float64) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, scale=scale)


def decay_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, *, scale: float = 1.0
) -> torch.Tensor:
    """Decay linear attention, step by step in float64: the recurrence behind GLA, Simple GLA,
    Mamba2's SSD, Mamba's selective scan and LightningAttention-2.

    `S_t = diag(exp(log_decay_t)) S_{t-1} + k_t v_t^T` (S_0 = 0), `o_t = scale * S_t^T q_t`.

    Args:
        q: queries `[B, H, T, K]`.
        k: keys `[B, H, T, K]`.
        v: values `[B, H, T, V]`.
        log_decay: log decay per key channel `[B, H, T, K]` (GLA) or per head `[B, H, T]` (scalar
            gates; broadcast over K). Values <= 0.
        scale: output scale.

    Returns:
        `[B, H, T, V]` in float64.

    Examples::

        >>> q = k = torch.ones(1, 1, 3, 1); v = torch.ones(1, 1, 3, 1)
        >>> decay_linear_attention(q, k, v, torch.zeros(1, 1, 3)).flatten().tolist()
        [1.0, 2.0, 3.0]
    """
    q64, k64, v64, g64 = (x.detach().to(torch.float64) for x in (q, k, v, log_decay))
    if g64.dim() == 3:
        g64 = g64[..., None].expand_as(k64)
    batch, heads, seq_len, dim_k = k64.shape
    state = q64.new_zeros(batch, heads, dim_k, v64.shape[-1])
    out = q64.new_empty(batch, heads, seq_len, v64.shape[-1])
    for t in range(seq_len):
        state = state * g64[:, :, t, :, None].exp() + k64[:, :, t, :, None] * v64[:, :, t, None, :]
        out[:, :, t] = scale * torch.einsum("bhk,bhkv->bhv", q64[:, :, t], state)
    return out


def ssd_reference(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
) -> torch.Tensor:
    """Mamba2's SSD as decay linear attention in float64: q = C, k = dt * B, v = x, log decay dt * A.

    `h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T`, `y_t = h_t^T C_t` per head; group g's B and C
    serve heads g * H/G ... (g + 1) * H/G - 1.

    Args:
        x: `[B, T, H, P]`.
        dt: time steps `[B, T, H]` (> 0).
        a: `[H]` (< 0).
        b: `[B, T, G, N]`.
        c: `[B, T, G, N]`.

    Returns:
        y `[B, T, H, P]` in float64.
    """
    heads_per_group = x.shape[2] // b.shape[2]
    b64, c64 = (t.to(torch.float64).repeat_interleave(heads_per_group, dim=2) for t in (b, c))
    dt64 = dt.to(torch.float64)
    keys = b64 * dt64[..., None]
    log_decay = dt64 * a.to(torch.float64)
    y = decay_linear_attention(
        c64.transpose(1, 2), keys.transpose(1, 2), x.transpose(1, 2), log_decay.transpose(1, 2)
    )
    return y.transpose(1, 2)


def mamba2_split_conv_reference(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor,
    dt_bias: torch.Tensor,
    a: torch.Tensor,
    d: torch.Tensor,
    head_dim: int,
    num_groups: int,
) -> torch.Tensor:
    """Mamba2's fused block in float64: causal depthwise conv + SiLU over x, B, C; softplus time steps
    `dt + dt_bias`; `ssd_reference`; the D skip; the SiLU(z) gate.

    Args:
        zxbcdt: `[B, T, 2HP + 2GN + H]` (z, x, B, C, raw dt).
        conv1d_weight: `[HP + 2GN, W]`.
        conv1d_bias: `[HP + 2GN]`.
        dt_bias: `[H]`.
        a: `[H]` (< 0).
        d: `[H]`.
        head_dim: P.
        num_groups: G.

    Returns:
        `[B, T, H * P]` in float64.
    """
    zxbcdt = zxbcdt.to(torch.float64)
    weight = conv1d_weight.to(torch.float64)
    heads, groups = a.shape[0], num_groups
    inner, channels = heads * head_dim, weight.shape[0]
    state_dim = (channels - inner) // (2 * groups)
    z, xbc, dt_raw = torch.split(zxbcdt, [inner, channels, heads], dim=-1)
    seq_len = xbc.shape[1]
    conv = F.conv1d(
        xbc.transpose(1, 2),
        weight[:, None, :],
        conv1d_bias.to(torch.float64),
        padding=weight.shape[1] - 1,
        groups=channels,
    )
    xbc = F.silu(conv[..., :seq_len]).transpose(1, 2)
    x, b, c = torch.split(xbc, [inner, groups * state_dim, groups * state_dim], dim=-1)
    x = x.unflatten(-1, (heads, head_dim))
    b, c = (t.unflatten(-1, (groups, state_dim)) for t in (b, c))
    dt = F.softplus(dt_raw + dt_bias.to(torch.float64))
    y = ssd_reference(x, dt, a, b, c) + d.to(torch.float64)[:, None] * x
    return (y * F.silu(z.unflatten(-1, (heads, head_dim)))).flatten(-2)


def selective_scan_reference(
    u: torch.Tensor,
    delta: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    z: torch.Tensor,
) -> torch.Tensor:
    """Mamba's selective scan in float64: per channel, decay linear attention with q = C, k = delta B,
    v = u and a log decay delta * A per state channel; plus D u and the SiLU(z) gate.

    Args:
        u, delta, z: `[B, D, T]`.
        a: `[D, N]` (< 0).
        b, c: `[B, N, T]`.
        d: `[D]`.

    Returns:
        `[B, D, T]` in float64.
    """
    u, delta, z = (x.to(torch.float64) for x in (u, delta, z))
    b, c = (x.to(torch.float64).transpose(1, 2) for x in (b, c))
    channels = u.shape[1]
    # Channels play the role of heads: [batch, channels, T, N] keys and queries, values of dim 1.
    queries = c[:, None].expand(-1, channels, -1, -1)
    keys = b[:, None] * delta[..., None]
    log_decay = delta[..., None] * a.to(torch.float64)[None, :, None, :]
    y = decay_linear_attention(queries, keys, u[..., None], log_decay)[..., 0]
    y = y + d.to(torch.float64)[:, None] * u
    return y * F.silu(z)
