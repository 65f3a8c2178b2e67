"""FLOP and memory-byte counts of the mLSTM formulations and of softmax attention.

The mLSTM counts are the simplified counts of the TFLA paper (appendix F/G, tables 14-18 as
written out in `docs/model_formulas.md`): every operation factor F_OP = 1, a multiply-accumulate is
2 FLOPs, nothing recomputed. They are for one head and one sequence in the forward pass;
multiply by batch * heads for a whole call (`MlstmShape` does).

The chunkwise counts have the form `T/L * (a*L^2 + b*L + c)` per head; `ChunkTerms` holds
(a, b, c), from which `tfla_bench.model.roofline` derives the optimal chunk sizes for any
kernel family whose chunkwise cost has that form.

The chunk size L is a float here on purpose: the optimal-chunk search evaluates the counts
as a continuous function of L. `check_chunk_size` adds the integer rules a kernel needs.

An argument means the same in every count that takes it, here and in `tfla_bench.model.families`:

- gate: the mLSTM input gate, `"exp"` (mLSTMexp) or `"sig"` (mLSTMsig).
- formulation: `"chunkwise"`, `"parallel"` or `"recurrent"`.
- seq_len: sequence length T.
- chunk_size: chunk size L in (0, T]; the chunkwise formulation needs it, the others take None.
- head_dim_qk: query/key head dim d_qk.
- head_dim_v: value head dim d_hv (the mLSTM's hidden head dim).
- causal_factor: fraction Fc of the quadratic (L x L, or T x T) matrices computed: 0.5 ideal causal,
  about 0.66 with causal tiles, 1.0 non-causal.
- qkv_bytes: bytes per element of q, k, v and of the output (mLSTM: h; attention and GLA: o).
- gate_bytes: bytes per element of the gates (mLSTM: i and f; GLA: g).
- state_bytes: bytes per element of the states the kernels store (mLSTM: C, n and m).

A size that is missing, not finite or not positive, a causal factor outside (0, 1], or an unknown
gate or formulation is a `UserError` that names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tfla_bench.adapters.workloads import MODES
from tfla_bench.errors import UserError

GATES = ("exp", "sig")
FORMULATIONS = ("chunkwise", "parallel", "recurrent")


@dataclass(frozen=True)
class BackwardFactors:
    """A kernel's backward FLOPs and bytes as multiples of its forward's: fwbw = (1 + factor) * fw.

    An adapter's counts pick the factors of its kernel (`ATTENTION_BACKWARD`, `LINEAR_RNN_BACKWARD`).
    """

    flops: float
    bytes: float

    def total_flops(self, fw_flops: float, mode: str) -> float:
        """FLOPs of one call in `mode` (`fw` or `fwbw`) given its forward FLOPs."""
        return _in_mode(fw_flops, self.flops, mode)

    def total_bytes(self, fw_bytes: float, mode: str) -> float:
        """Bytes of one call in `mode` (`fw` or `fwbw`) given its forward bytes."""
        return _in_mode(fw_bytes, self.bytes, mode)


def _in_mode(fw_value: float, factor: float, mode: str) -> float:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    return fw_value if mode == "fw" else fw_value * (1 + factor)


# Softmax attention. FLOPs: FlashAttention's accounting, 5 matmuls in the backward against 2 in the
# forward. Bytes: exact for `attention_bytes`: the backward reads q, k, v, o, dO and writes dq, dk,
# dv, i.e. 4*(Dqk + Dv) elements per token against 2*(Dqk + Dv) in the forward.
ATTENTION_BACKWARD = BackwardFactors(flops=2.5, bytes=2.0)
# The linear RNNs (mLSTM, GLA, Mamba, LightningAttention): estimates, as the paper counts only the
# forward pass. The backward is dominated by matmuls over the same tiles as the forward (dQ, dK, dV
# and the state gradients), about twice the forward's matmul work, as for the gradient of any chain
# of matmuls; it reads the inputs, the stored chunk states and dO and writes the input and state
# gradients, about twice the forward traffic. fla and Mamba2 also recompute the chunk states in the
# backward, which is not counted.
LINEAR_RNN_BACKWARD = BackwardFactors(flops=2.0, bytes=2.0)


@dataclass(frozen=True)
class ChunkTerms:
    """Per-chunk cost `quadratic*L^2 + linear*L + constant` of one head in a chunkwise formulation.

    Over a sequence of length T the cost is `T/L` times that: `T*(quadratic*L + linear + constant/L)`.
    """

    quadratic: float
    linear: float
    constant: float

    def total(self, seq_len: float, chunk_size: float) -> float:
        """Cost of one head over a sequence of `seq_len` tokens split into chunks of `chunk_size`."""
        return (
            seq_len / chunk_size * (self.quadratic * chunk_size**2 + self.linear * chunk_size + self.constant)
        )


def check_positive(**values: float | None) -> None:
    """A `UserError` naming the first value that is missing, not finite or not positive."""
    for name, value in values.items():
        if value is None or not math.isfinite(value) or value <= 0:
            raise UserError(f"{name} must be a positive number, got {value}")


def _check_gate(gate: str) -> None:
    if gate not in GATES:
        raise UserError(f"unknown gate {gate!r}; choose one of {', '.join(GATES)}")


def _check_formulation(formulation: str) -> None:
    if formulation not in FORMULATIONS:
        raise UserError(f"unknown formulation {formulation!r}; choose one of {', '.join(FORMULATIONS)}")


def check_causal_factor(causal_factor: float) -> None:
    """A `UserError` unless the causal factor Fc is in (0, 1]."""
    if not 0 < causal_factor <= 1:
        raise UserError(f"causal_factor must be in (0, 1], got {causal_factor}")


def _check_chunk_in_range(seq_len: float, chunk_size: float | None) -> float:
    if chunk_size is None:
        raise UserError("the chunkwise formulation needs a chunk size")
    check_positive(chunk_size=chunk_size)
    if chunk_size > seq_len:
        raise UserError(f"chunk size {chunk_size} is larger than the sequence length {seq_len}")
    return chunk_size


def _checked_seq_len(gate: str, formulation: str, seq_len: float, **sizes: float) -> float:
    """T as a float, after the checks `mlstm_flops` and `mlstm_bytes` share: a known gate and
    formulation, a positive `seq_len` and positive `sizes`."""
    _check_gate(gate)
    _check_formulation(formulation)
    check_positive(seq_len=seq_len, **sizes)
    return float(seq_len)


def check_chunk_size(seq_len: int, chunk_size: int) -> None:
    """Raise a `UserError` unless `chunk_size` is a positive integer that divides `seq_len`.

    Args:
        seq_len: sequence length T.
        chunk_size: chunk size L of a chunkwise kernel.
    """
    if chunk_size <= 0:
        raise UserError(f"chunk size must be positive, got {chunk_size}")
    if chunk_size > seq_len:
        raise UserError(f"chunk size {chunk_size} is larger than the sequence length {seq_len}")
    if seq_len % chunk_size:
        raise UserError(f"chunk size {chunk_size} does not divide the sequence length {seq_len}")


def mlstm_flop_terms(
    gate: str, *, head_dim_qk: float, head_dim_v: float, causal_factor: float = 0.5
) -> ChunkTerms:
    """Per-chunk FLOP terms of the chunkwise mLSTM forward (paper table 17, one head); the arguments
    are those of the module docstring."""
    _check_gate(gate)
    check_positive(head_dim_qk=head_dim_qk, head_dim_v=head_dim_v)
    check_causal_factor(causal_factor)
    dqk, dhv, fc = head_dim_qk, head_dim_v, causal_factor
    if gate == "exp":
        return ChunkTerms(
            quadratic=2 * fc * dhv + 2 * fc * dqk + 8 * fc + 1,
            linear=2 * fc + 4 * dqk * dhv + 2 * dhv + 6 * dqk + 13,
            constant=2 * dqk * dhv + 2 * dqk + 5,
        )
    return ChunkTerms(
        quadratic=2 * fc * dhv + 2 * fc * dqk + 6 * fc + 1,
        linear=4 * dqk * dhv + dhv + 2 * dqk + 11,
        constant=2 * dqk * dhv + 5,
    )


def mlstm_byte_terms(
    gate: str,
    *,
    head_dim_qk: float,
    head_dim_v: float,
    qkv_bytes: float = 2,
    gate_bytes: float = 2,
    state_bytes: float = 4,
) -> ChunkTerms:
    """Per-chunk memory-byte terms (loads + stores) of the chunkwise mLSTM forward (one head); the
    arguments are those of the module docstring."""
    _check_gate(gate)
    check_positive(
        head_dim_qk=head_dim_qk,
        head_dim_v=head_dim_v,
        qkv_bytes=qkv_bytes,
        gate_bytes=gate_bytes,
        state_bytes=state_bytes,
    )
    dqk, dhv = head_dim_qk, head_dim_v
    io_per_token = 4 * gate_bytes + 3 * qkv_bytes * (dhv + dqk)
    if gate == "exp":
        return ChunkTerms(
            quadratic=0.0,
            linear=io_per_token + 2 * state_bytes,
            constant=2 * state_bytes * (dqk * dhv + dqk + 1),
        )
    return ChunkTerms(quadratic=0.0, linear=io_per_token, constant=2 * state_bytes * dqk * dhv)


def mlstm_flops(
    gate: str,
    formulation: str,
    *,
    seq_len: float,
    chunk_size: float | None,
    head_dim_qk: float,
    head_dim_v: float,
    causal_factor: float = 0.5,
) -> float:
    """Forward FLOPs of one mLSTM head over one sequence; the arguments are those of the module docstring.

    Examples::

        >>> mlstm_flops("sig", "recurrent", seq_len=2, chunk_size=None, head_dim_qk=1, head_dim_v=1)
        18.0
    """
    dims = {"head_dim_qk": head_dim_qk, "head_dim_v": head_dim_v}
    t = _checked_seq_len(gate, formulation, seq_len, **dims)
    check_causal_factor(causal_factor)
    if formulation == "chunkwise":
        terms = mlstm_flop_terms(gate, causal_factor=causal_factor, **dims)
        return terms.total(t, _check_chunk_in_range(t, chunk_size))
    dqk, dhv, fc = head_dim_qk, head_dim_v, causal_factor
    if formulation == "parallel":
        quadratic = t**2 * (2 * fc * dhv + fc * (2 * dqk + 2) + 6)
        if gate == "exp":
            return fc * (4 * t**2 + 2 * t) + quadratic + t * (0.5 * t + 2.5)
        return quadratic + t * (0.5 * t + 4.5)
    if gate == "exp":
        return t * (6 * dqk * dhv + dhv + 7 * dqk + 12)
    return t * (6 * dqk * dhv + dqk + 2)


def mlstm_bytes(
    gate: str,
    formulation: str,
    *,
    seq_len: float,
    chunk_size: float | None,
    head_dim_qk: float,
    head_dim_v: float,
    qkv_bytes: float = 2,
    gate_bytes: float = 2,
    state_bytes: float = 4,
) -> float:
    """Forward memory bytes (loads + stores) of one mLSTM head over one sequence; the arguments are
    those of the module docstring.

    The recurrent count materializes the state after every step (the text-generation setting).

    Examples::

        >>> mlstm_bytes("sig", "parallel", seq_len=4, chunk_size=None, head_dim_qk=1, head_dim_v=1)
        48.0
    """
    dims = {"head_dim_qk": head_dim_qk, "head_dim_v": head_dim_v}
    element_bytes = {"qkv_bytes": qkv_bytes, "gate_bytes": gate_bytes, "state_bytes": state_bytes}
    t = _checked_seq_len(gate, formulation, seq_len, **dims, **element_bytes)
    if formulation == "chunkwise":
        terms = mlstm_byte_terms(gate, **dims, **element_bytes)
        return terms.total(t, _check_chunk_in_range(t, chunk_size))
    dqk, dhv = head_dim_qk, head_dim_v
    io_per_token = 2 * gate_bytes + 2 * qkv_bytes * (dhv + dqk)
    if formulation == "parallel":
        return t * (io_per_token + (2 * state_bytes if gate == "exp" else 0))
    if gate == "exp":
        return t * (2 * state_bytes * (dqk * dhv + dqk + 1) + io_per_token)
    return t * (2 * state_bytes * dqk * dhv + io_per_token)


def attention_flops(
    *, seq_len: float, head_dim_qk: float, head_dim_v: float, causal_factor: float = 0.5
) -> float:
    """Forward FLOPs of softmax attention for one head over one sequence.

    Two matmuls, S = Q K^T (2*T^2*Dqk) and O = P V (2*T^2*Dv), of which the causal factor is
    computed; 4*T^2*D*causal_factor when Dqk = Dv = D. Softmax FLOPs are not counted
    (the usual FlashAttention convention). The arguments are those of the module docstring.
    """
    check_positive(seq_len=seq_len, head_dim_qk=head_dim_qk, head_dim_v=head_dim_v)
    check_causal_factor(causal_factor)
    return 2 * float(seq_len) ** 2 * (head_dim_qk + head_dim_v) * causal_factor


def attention_bytes(*, seq_len: float, head_dim_qk: float, head_dim_v: float, qkv_bytes: float = 2) -> float:
    """Forward memory bytes of fused (flash) attention for one head: read q, k, v and write o once (the
    arguments are those of the module docstring)."""
    check_positive(seq_len=seq_len, head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, qkv_bytes=qkv_bytes)
    return float(seq_len) * (2 * head_dim_qk + 2 * head_dim_v) * qkv_bytes


@dataclass(frozen=True)
class MlstmShape:
    """An mLSTM workload: gate, shape and element sizes; its counts are for the whole batch and all heads.

    Raises `UserError` on non-positive dims or byte sizes and on a causal factor outside (0, 1].
    """

    gate: str
    seq_len: int
    head_dim_qk: int
    head_dim_v: int
    batch: int = 1
    heads: int = 1
    causal_factor: float = 0.5
    qkv_bytes: float = 2
    gate_bytes: float = 2
    state_bytes: float = 4

    def __post_init__(self) -> None:
        _check_gate(self.gate)
        check_positive(seq_len=self.seq_len, batch=self.batch, heads=self.heads, **self._byte_args())
        check_causal_factor(self.causal_factor)

    @property
    def label(self) -> str:
        """The paper's name of the variant: mLSTMexp or mLSTMsig."""
        return f"mLSTM{self.gate}"

    def _flop_args(self) -> dict[str, float]:
        """What the FLOP counts take besides gate, formulation and lengths."""
        return {name: getattr(self, name) for name in ("head_dim_qk", "head_dim_v", "causal_factor")}

    def _byte_args(self) -> dict[str, float]:
        """What the byte counts take besides gate, formulation and lengths."""
        names = ("head_dim_qk", "head_dim_v", "qkv_bytes", "gate_bytes", "state_bytes")
        return {name: getattr(self, name) for name in names}

    def flop_terms(self) -> ChunkTerms:
        """Per-chunk FLOP terms of one head (see `mlstm_flop_terms`)."""
        return mlstm_flop_terms(self.gate, **self._flop_args())

    def byte_terms(self) -> ChunkTerms:
        """Per-chunk byte terms of one head (see `mlstm_byte_terms`)."""
        return mlstm_byte_terms(self.gate, **self._byte_args())

    def flops(self, formulation: str, chunk_size: float | None = None) -> float:
        """Forward FLOPs of the whole call (batch * heads * per-head count)."""
        per_head = mlstm_flops(
            self.gate, formulation, seq_len=self.seq_len, chunk_size=chunk_size, **self._flop_args()
        )
        return self.batch * self.heads * per_head

    def bytes_moved(self, formulation: str, chunk_size: float | None = None) -> float:
        """Forward memory bytes of the whole call (batch * heads * per-head count)."""
        per_head = mlstm_bytes(
            self.gate, formulation, seq_len=self.seq_len, chunk_size=chunk_size, **self._byte_args()
        )
        return self.batch * self.heads * per_head
