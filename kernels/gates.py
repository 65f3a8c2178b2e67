"""Gate preprocessing shared by every mLSTM formulation: log gates and their cumulative sums.

Notation of the TFLA paper (section 2.2, appendix B.2), per head and sequence:

- log forget gate  ``log_f[t] = log sigmoid(f~[t])``                      (both gates)
- log input gate   ``log_i[t] = i~[t]``               for mLSTMexp (``log exp``),
                   ``log_i[t] = log sigmoid(i~[t])``  for mLSTMsig (section 4).

Within chunk ``k`` of length ``L`` (positions ``kL .. kL+L-1``, the last chunk may be shorter):

- ``b[t]``  inclusive cumulative sum of ``log_f`` from the chunk start to ``t``   (eq. 39),
- ``g[k]``  sum of ``log_f`` over the chunk                                       (eq. 38),
- ``a[t] = g[k] - b[t] + log_i[t]``: the log weight of step ``t`` in the state at the chunk end (eq. 40),
- ``a_max[k]`` the largest ``a`` of the chunk (the intra part of the chunk's max state, appendix B.2).

All functions work on any leading shape (``[B, NH, T]`` in this package) and keep the dtype of the
log gates, which `log_gates` makes at least float32.

Gate gradients (appendix B.3). Every term of the mLSTM is weighted by
``exp(F_t - F_j + log_i_j)`` for an output (or final-state) step ``t`` and an input step ``j <= t``,
with ``F`` the cumulative log forget gate; call its contribution to the loss ``c_tj``. Then
``d log_i_j = sum_t c_tj`` and ``d log_f_s = sum_{t >= s > j} c_tj``. The row and column sums of
``c`` are the dot products ``q_t . dq_t`` and ``k_j . dk_j`` of the backward pass, so
``d log_i_j = k_j . dk_j``. `chunk_log_gate_grads` splits ``d log_f_s`` by where ``t`` and ``j``
lie relative to the chunk of ``s``, as the paper's cumulative gates do (appendix B.3):

- both in the chunk: a within-chunk reverse cumsum of ``q . dq_intra - k . dk_intra``;
- ``t`` in the chunk, ``j`` before it: a within-chunk reverse cumsum of ``q . dq_inter``;
- ``j`` in the chunk, ``t`` after it: a within-chunk exclusive cumsum of ``k . dk_inter``;
- ``j`` before and ``t`` after the chunk: the chunk's ``dg_k = g_bar_k sum(C_{k-1} * dC_k)``.

Only the first term cancels pairs (those with both steps after ``s``), and only within one chunk;
a reverse cumsum of ``q . dq - k . dk`` over the whole sequence gives the same value in exact
arithmetic but cancels the rounding errors of every later pair, which in bfloat16 costs ~10% of
the forget-gate gradient at T = 512.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

GATES = ("exp", "sig")


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 if any of `tensors` is float64, else float32 (None entries are skipped)."""
    return (
        torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32
    )


def log_gates(i: torch.Tensor, f: torch.Tensor, gate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Log input and log forget gates from pre-activations (differentiable).

    Args:
        i: input-gate pre-activations, `[..., T]`, any float dtype.
        f: forget-gate pre-activations, `[..., T]`, any float dtype.
        gate: `"exp"` (exponential input gate, mLSTMexp) or `"sig"` (sigmoid input gate, mLSTMsig).

    Returns:
        `(log_i, log_f)`, both `[..., T]` in float64 if either input is float64, else float32.

    Examples::

        >>> log_i, log_f = log_gates(torch.full((4,), -10.0), torch.full((4,), 3.0), "sig")
    """
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    dtype = compute_dtype(i, f)
    log_f = F.logsigmoid(f.to(dtype))
    log_i = i.to(dtype) if gate == "exp" else F.logsigmoid(i.to(dtype))
    return log_i, log_f


def num_chunks(seq_len: int, chunk_size: int) -> int:
    """Number of chunks of `chunk_size` covering `seq_len` steps (the last one may be partial)."""
    return -(-seq_len // chunk_size)


@dataclass
class ChunkGates:
    """Cumulative log gates of the chunkwise formulation (appendix B.2, eqs. 38-40).

    Attributes:
        b: `[..., T]` within-chunk inclusive cumulative sum of the log forget gates.
        g: `[..., NC]` per-chunk sum of the log forget gates.
        a: `[..., T]` `g - b + log_i`: log weight of each step in the state at the end of its chunk.
        a_max: `[..., NC]` per-chunk maximum of `a`.
    """

    b: torch.Tensor
    g: torch.Tensor
    a: torch.Tensor
    a_max: torch.Tensor


def chunk_gates(log_i: torch.Tensor, log_f: torch.Tensor, chunk_size: int) -> ChunkGates:
    """Cumulative log gates per chunk; `T` need not be a multiple of `chunk_size`.

    Args:
        log_i: log input gates `[..., T]` (from `log_gates`).
        log_f: log forget gates `[..., T]`.
        chunk_size: chunk length `L` (any positive int).

    Returns:
        A `ChunkGates` with `NC = ceil(T / L)` chunks; its tensors are contiguous.
    """
    seq_len = log_f.shape[-1]
    n_chunks = num_chunks(seq_len, chunk_size)
    pad = n_chunks * chunk_size - seq_len
    # Padding the last chunk with forget gate 1 (log 0) and input gate 0 (log -inf) leaves its sums,
    # its cumulative sums and its maximum unchanged.
    log_f_c = F.pad(log_f, (0, pad), value=0.0).unflatten(-1, (n_chunks, chunk_size))
    log_i_c = F.pad(log_i, (0, pad), value=float("-inf")).unflatten(-1, (n_chunks, chunk_size))
    b = log_f_c.cumsum(-1)
    g = b[..., -1]
    a = g[..., None] - b + log_i_c
    return ChunkGates(
        b=b.flatten(-2)[..., :seq_len].contiguous(),
        g=g.contiguous(),
        a=a.flatten(-2)[..., :seq_len].contiguous(),
        a_max=a.amax(-1),
    )


def reverse_cumsum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`out[t] = sum_{s >= t} x[s]` along `dim` (the adjoint of `cumsum`)."""
    return x.flip(dim).cumsum(dim).flip(dim)


def chunk_log_gate_grads(
    qdq: torch.Tensor, kdk: torch.Tensor, kdk_inter: torch.Tensor, dg: torch.Tensor, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the log input and log forget gates from the backward pass's dot products.

    See the module docstring for the derivation. No gradient flows through the normalizer or the
    max state (exact for a per-step scale-invariant loss on h).

    Args:
        qdq: `[..., T]` `q_t . dq_t` (all of dq, queries unscaled).
        kdk: `[..., T]` `k_j . dk_j` (all of dk).
        kdk_inter: `[..., T]` `k_j . dk_j` of the inter-chunk part of dk (through the next state).
        dg: `[..., NC]` gradient of each chunk's log forget-gate sum through the state recurrence,
            `g_bar_k * sum(C_{k-1} * dC_k)` (stabilized states and their gradients).
        chunk_size: `L`; `T` need not be a multiple of it.

    Returns:
        `(dlog_i, dlog_f)`, both `[..., T]`.
    """
    seq_len = qdq.shape[-1]
    n_chunks = dg.shape[-1]
    pad = n_chunks * chunk_size - seq_len

    def chunked(x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, pad)).unflatten(-1, (n_chunks, chunk_size))

    within = reverse_cumsum(chunked(qdq - (kdk - kdk_inter)))
    before = F.pad(chunked(kdk_inter), (1, 0))[..., :-1].cumsum(-1)
    dlog_f = (within + before + dg[..., None]).flatten(-2)[..., :seq_len]
    return kdk, dlog_f
