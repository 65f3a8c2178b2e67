"""FLOP and byte counts of the baseline kernel families: GLA and Simple GLA (fla's chunkwise kernels),
Mamba2's SSD, LightningAttention-2, Mamba's selective scan and the causal depthwise conv of Mamba2.

Conventions are those of `tfla_bench.model.counts` (the TFLA paper's simplified counts): a
multiply-accumulate is 2 FLOPs, an elementwise operation (add, multiply, exp, ...) is 1 FLOP, the
L x L intra-chunk matrices are counted at the causal factor Fc (0.5 = only the causal half), and
nothing recomputed is counted. Counts are per head and per sequence in the forward pass unless a
function says otherwise; an adapter multiplies by batch * heads and applies its kernel's
`BackwardFactors` (`tfla_bench.model.counts`) for `fwbw`.

FLOPs count the algorithm's work. Bytes count the HBM traffic of the library's kernels as written:
every kernel that reads or writes a tensor counts it once (so a tensor read by two kernels counts
twice), intermediates that the kernels store (cumulated gates, chunk states, intra-chunk score
matrices) count at the dtype the library stores them in.

Chunkwise counts have the form `T/L * (a*L^2 + b*L + c)` and are returned as `ChunkTerms`, so
`tfla_bench.model.roofline` can place them on the roofline and derive optimal chunk sizes.

Notation: T sequence length, L chunk size, K = head_dim_qk (query/key dim; Mamba: the state dim N),
V = head_dim_v (value dim; Mamba: the head dim P), Fc the causal factor.

Arguments are keyword-only. Those the mLSTM counts take as well (seq_len, head_dim_qk, head_dim_v,
causal_factor, qkv_bytes, gate_bytes, state_bytes) mean what `tfla_bench.model.counts` says of them
and are checked the same way; the others:

- state_dim: the SSM state dim N (Mamba2: a Case's head_dim_qk).
- head_dim: Mamba2's head dim P (a Case's head_dim_v).
- groups_per_head: r = ngroups / nheads; the heads of a group share B and C.
- channels: the channels a kernel runs over.
- io_bytes: bytes per element of the tensors a kernel reads and writes in the input dtype (each
  function names them).

Where the per-channel GLA gate differs from Simple GLA's scalar gate (see `gla_flop_terms`):

- GLA's log gates are `[T, K]` per head, Simple GLA's `[T]`: the in-chunk cumulative sum, the
  key/query decay weights and the chunk-state decay cost K times more (linear and constant terms),
  and the gate traffic (read, cumulated fp32 copy written and re-read) scales with K.
- Simple GLA's intra-chunk decay is a scalar L x L mask exp(G_i - G_j) (3 FLOPs per pair). GLA's
  decay differs per channel, so fla folds it into rescaled queries and keys (`q * exp(G - G_ref)`,
  `k * exp(G_ref - G)`, a linear cost) for the off-diagonal sub-chunks of size c = 16, and computes
  the c x c diagonal sub-blocks elementwise per channel (5 FLOPs per pair and channel).
- GLA stores the fp32 intra-chunk score matrix A (L per token) between two kernels; Simple GLA
  computes it inside the output kernel.
"""

from __future__ import annotations

import math

from tfla_bench.model.counts import ChunkTerms, check_causal_factor, check_positive

# fla's GLA splits each chunk into sub-chunks of 16 for the intra-chunk scores (chunk_gla_fwd_intra_gk).
GLA_SUB_CHUNK = 16
# LightningAttention-2's forward kernel: 64-token blocks, value dim split into programs of 32 columns.
LIGHTNING_BLOCK = 64
LIGHTNING_VALUE_BLOCK = 32
# fla and Mamba2 keep cumulated gates, dt and the CB / A score matrices in fp32.
FP32_BYTES = 4


def _flop_dims(
    head_dim_qk: float, head_dim_v: float, causal_factor: float, **others: float
) -> tuple[float, float, float]:
    """K, V and Fc of a FLOP count as floats, checked (with `others`, such as a sub-chunk size)."""
    check_positive(head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, **others)
    check_causal_factor(causal_factor)
    return float(head_dim_qk), float(head_dim_v), causal_factor


def _byte_dims(head_dim_qk: float, head_dim_v: float, **byte_sizes: float) -> tuple[float, float]:
    """K and V of a byte count as floats, checked with the element sizes `byte_sizes`."""
    check_positive(head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, **byte_sizes)
    return float(head_dim_qk), float(head_dim_v)


def simple_gla_flop_terms(*, head_dim_qk: float, head_dim_v: float, causal_factor: float = 0.5) -> ChunkTerms:
    """Per-chunk forward FLOP terms of fla's `chunk_simple_gla` (scalar log gate per token and head).

    Per chunk: gate cumsum (L); chunk state: key weights exp(G_L - G_t) (2L), scaled keys (LK),
    K~^T V (2LKV), state decay and update (2KV + 1); output: query decay (L + LK), Q~ H (2LKV),
    Q K^T (2 Fc L^2 K), the decay mask exp(G_i - G_j) and its product (3 Fc L^2), A V (2 Fc L^2 V),
    sum and scale (2LV).

    Examples::

        >>> simple_gla_flop_terms(head_dim_qk=1, head_dim_v=1, causal_factor=1.0)
        ChunkTerms(quadratic=7.0, linear=12.0, constant=3.0)
    """
    k, v, fc = _flop_dims(head_dim_qk, head_dim_v, causal_factor)
    return ChunkTerms(
        quadratic=fc * (2 * k + 2 * v + 3),
        linear=4 * k * v + 2 * k + 2 * v + 4,
        constant=2 * k * v + 1,
    )


def gla_flop_terms(
    *, head_dim_qk: float, head_dim_v: float, causal_factor: float = 0.5, sub_chunk: int = GLA_SUB_CHUNK
) -> ChunkTerms:
    """Per-chunk forward FLOP terms of fla's `chunk_gla` (log gate per token, head and key channel).

    Per chunk: gate cumsum (LK); chunk state: key weights and scaled keys (3LK), K~^T V (2LKV),
    state decay and update (2KV + K); intra scores: rescaled q and k (6LK), their product on the
    off-diagonal sub-chunks (2 Fc L^2 K, all causal pairs counted), the c x c diagonal sub-blocks
    elementwise per channel (5 Fc c L K); output: query decay (2LK), Q~ H (2LKV), mask and A V
    (Fc L^2 (2V + 1)), sum and scale (2LV). See the module docstring for the differences from
    Simple GLA.

    Args:
        head_dim_qk: K, also the gate dim.
        sub_chunk: fla's sub-chunk size c of the intra-chunk scores.

    Examples::

        >>> gla_flop_terms(head_dim_qk=1, head_dim_v=1, causal_factor=1.0, sub_chunk=2)
        ChunkTerms(quadratic=5.0, linear=28.0, constant=3.0)
    """
    k, v, fc = _flop_dims(head_dim_qk, head_dim_v, causal_factor, sub_chunk=sub_chunk)
    return ChunkTerms(
        quadratic=fc * (2 * k + 2 * v + 1),
        linear=4 * k * v + (12 + 5 * fc * sub_chunk) * k + 2 * v,
        constant=2 * k * v + k,
    )


def simple_gla_byte_terms(
    *,
    head_dim_qk: float,
    head_dim_v: float,
    qkv_bytes: float = 2,
    gate_bytes: float = 2,
    state_bytes: float = 2,
) -> ChunkTerms:
    """Per-chunk forward bytes of `chunk_simple_gla` (kernels: gate cumsum, chunk states, output).

    q read once, k and v twice (state and output kernels), o written once; g read once, its fp32
    cumsum written once and read twice; the chunk state written and read once (fla keeps it in the
    input dtype in the forward).
    """
    k, v = _byte_dims(
        head_dim_qk, head_dim_v, qkv_bytes=qkv_bytes, gate_bytes=gate_bytes, state_bytes=state_bytes
    )
    return ChunkTerms(
        quadratic=0.0,
        linear=qkv_bytes * (3 * k + 3 * v) + gate_bytes + 3 * FP32_BYTES,
        constant=2 * k * v * state_bytes,
    )


def gla_byte_terms(
    *,
    head_dim_qk: float,
    head_dim_v: float,
    qkv_bytes: float = 2,
    gate_bytes: float = 2,
    state_bytes: float = 2,
) -> ChunkTerms:
    """Per-chunk forward bytes of `chunk_gla` (kernels: cumsum, chunk states, intra scores A, output).

    q and k read twice, v read twice, o written once; g (`[T, K]`) read once, its fp32 cumsum
    written once and read three times; the fp32 intra-chunk score matrix A (`L` per token) written
    and read once; the chunk state written and read once.
    """
    k, v = _byte_dims(
        head_dim_qk, head_dim_v, qkv_bytes=qkv_bytes, gate_bytes=gate_bytes, state_bytes=state_bytes
    )
    return ChunkTerms(
        quadratic=2 * FP32_BYTES,
        linear=qkv_bytes * (4 * k + 3 * v) + k * (gate_bytes + 4 * FP32_BYTES),
        constant=2 * k * v * state_bytes,
    )


def mamba2_flop_terms(
    *, state_dim: float, head_dim: float, causal_factor: float = 0.5, groups_per_head: float = 1.0
) -> ChunkTerms:
    """Per-chunk forward FLOP terms of Mamba2's SSD (`mamba_chunk_scan_combined`, no D, no z).

    In linear-attention terms q = C, k = B (state dim N), v = x (head dim P), per-token log decay
    dt * A. Per chunk: dA and its cumsum (2L); chunk state: weights exp(dA_L - dA_t) * dt (3L),
    scaled B (LN), x^T B~ (2LNP); state passing (2NP + 1); CB = C B^T per group (2 Fc L^2 N r);
    output: exp(dA_t) and C prev_state (L + 2LNP), row scale (LP), the decay mask (subtract, clamp,
    exp, times CB, times dt: 5 Fc L^2), its product with x (2 Fc L^2 P), the sum (LP).
    The library computes CB for the full L x L block and skips the upper triangle only in the scan;
    pass `causal_factor=1.0` to count that executed work.

    Examples::

        >>> mamba2_flop_terms(state_dim=1, head_dim=1, causal_factor=1.0)
        ChunkTerms(quadratic=9.0, linear=13.0, constant=3.0)
    """
    check_positive(state_dim=state_dim, head_dim=head_dim, groups_per_head=groups_per_head)
    check_causal_factor(causal_factor)
    n, p, fc, r = float(state_dim), float(head_dim), causal_factor, groups_per_head
    return ChunkTerms(
        quadratic=fc * (2 * n * r + 2 * p + 5),
        linear=4 * n * p + n + 2 * p + 6,
        constant=2 * n * p + 1,
    )


def mamba2_byte_terms(
    *,
    state_dim: float,
    head_dim: float,
    io_bytes: float = 2,
    state_bytes: float = 2,
    groups_per_head: float = 1.0,
) -> ChunkTerms:
    """Per-chunk forward bytes of Mamba2's SSD (kernels: dt cumsum, chunk state, state passing, CB, scan).

    x read twice, out written once; B and C read once per head (chunk state, scan) and once per
    group (CB); dt read once, the fp32 dt and dA cumsum each written once and read twice; the fp32
    CB matrix written per group and read per head; chunk states written in fp32, read and written
    back in the input dtype by the state passing, read by the scan.

    Args:
        io_bytes: bytes per element of x, dt, B, C, out.
        state_bytes: bytes per element of the passed states (the dtype of C in mamba_ssm).
    """
    check_positive(
        state_dim=state_dim,
        head_dim=head_dim,
        io_bytes=io_bytes,
        state_bytes=state_bytes,
        groups_per_head=groups_per_head,
    )
    n, p, r = float(state_dim), float(head_dim), groups_per_head
    return ChunkTerms(
        quadratic=FP32_BYTES * (1 + r),
        linear=io_bytes * (3 * p + 2 * n * (1 + r) + 1) + 6 * FP32_BYTES,
        constant=n * p * (2 * FP32_BYTES + 2 * state_bytes),
    )


def lightning_flop_terms(*, head_dim_qk: float, head_dim_v: float, causal_factor: float = 0.5) -> ChunkTerms:
    """Per-block forward FLOP terms of LightningAttention-2 (`lightning_attn2`, fixed decay per head).

    Blocks of L = 64 are processed one after another; the decay factors are constants per head, so
    the L x L decay mask is precomputed. Per block: Q K^T, the mask product and A V
    (Fc L^2 (2K + 2V + 1)); inter-block output Q KV, its decay scale and the sum (2LKV + 2LV);
    state update with decayed keys (LK + 2LKV) and the state decay and add (2KV). The kernel
    computes full 64 x 64 tiles (`causal_factor=1.0` counts that) and recomputes Q K^T in every
    program over a 32-column slice of V (not counted: algorithmic work only).

    Examples::

        >>> lightning_flop_terms(head_dim_qk=1, head_dim_v=1, causal_factor=1.0)
        ChunkTerms(quadratic=5.0, linear=7.0, constant=2.0)
    """
    k, v, fc = _flop_dims(head_dim_qk, head_dim_v, causal_factor)
    return ChunkTerms(
        quadratic=fc * (2 * k + 2 * v + 1),
        linear=4 * k * v + k + 2 * v,
        constant=2 * k * v,
    )


def lightning_byte_terms(*, head_dim_qk: float, head_dim_v: float, qkv_bytes: float = 2) -> ChunkTerms:
    """Per-block forward bytes of LightningAttention-2: one kernel, the state never leaves the chip.

    Each of the ceil(V / 32) programs of a head loads all of q and k and its slice of v and writes
    its slice of o.
    """
    k, v = _byte_dims(head_dim_qk, head_dim_v, qkv_bytes=qkv_bytes)
    value_programs = math.ceil(v / LIGHTNING_VALUE_BLOCK)
    return ChunkTerms(quadratic=0.0, linear=qkv_bytes * (2 * k * value_programs + 2 * v), constant=0.0)


def selective_scan_flops(*, seq_len: float, channels: float, state_dim: float) -> float:
    """Forward FLOPs of Mamba's selective scan (`selective_scan_fn` with D and z) for one sequence.

    Per token, channel and state: dt * A, exp, times B, h * dA + dB u (2), C h and its sum (2): 7.
    Per token and channel: dt * u, the D skip (2), the z gate silu(z) * y (5): 8.

    Args:
        channels: inner channels D (num_heads * head_dim_v).

    Examples::

        >>> selective_scan_flops(seq_len=2, channels=3, state_dim=4)
        216.0
    """
    check_positive(seq_len=seq_len, channels=channels, state_dim=state_dim)
    return float(seq_len) * channels * (7 * state_dim + 8)


def selective_scan_bytes(*, seq_len: float, channels: float, state_dim: float, io_bytes: float = 2) -> float:
    """Forward bytes of the selective scan for one sequence: u, dt, z read and out written per
    channel, B and C read per token, the fp32 A (D x N) and D (D) read once; the state stays on chip.

    Args:
        io_bytes: bytes per element of u, dt, z, B, C, out.
    """
    check_positive(seq_len=seq_len, channels=channels, state_dim=state_dim, io_bytes=io_bytes)
    t = float(seq_len)
    return t * io_bytes * (4 * channels + 2 * state_dim) + FP32_BYTES * channels * (state_dim + 1)


def causal_conv1d_flops(*, seq_len: float, channels: float, width: float) -> float:
    """Forward FLOPs of a causal depthwise conv of `width` taps with bias and SiLU (Mamba2's conv).

    Per token and channel: width multiply-adds (2 * width), the bias (1) and SiLU (4).

    Args:
        width: conv width (taps).
    """
    check_positive(seq_len=seq_len, channels=channels, width=width)
    return float(seq_len) * channels * (2 * width + 5)


def causal_conv1d_bytes(*, seq_len: float, channels: float, io_bytes: float = 2) -> float:
    """Forward bytes of the causal depthwise conv: input read and output written once per element."""
    check_positive(seq_len=seq_len, channels=channels, io_bytes=io_bytes)
    return 2 * float(seq_len) * channels * io_bytes
