"""Runtime bounds, arithmetic intensity, the roofline and optimal chunk sizes (TFLA paper appendix G).

Runtime: tau_FLOPs = FLOPs / alpha and tau_Bytes = Bytes / beta. Without overlap of compute and
memory traffic the runtime is their sum (the upper bound, the paper's eq. 118); with full overlap
their maximum (the lower bound).

Optimal chunk size: a chunkwise count is `T * (a*L + b + c/L)` (see `ChunkTerms`). Setting the
derivative to zero gives the FLOP-optimal chunk `L = sqrt(c_F / a_F)` (paper eq. 113) and, for the
no-overlap runtime `FLOPs/alpha + Bytes/beta`, the runtime-optimal chunk
`L = sqrt((c_F + I_acc*c_B) / (a_F + I_acc*a_B))` with I_acc = alpha/beta (paper eq. 120 when the
byte count has no quadratic term). Both costs are convex in L > 0, so on [1, T] the minimum is
the unconstrained optimum clipped to that interval; `argmin_chunk_size` checks this numerically.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tfla_bench.model.counts import ChunkTerms
from tfla_bench.model.hardware import Accelerator

_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class Estimate:
    """The model's view of one call: its counts on one accelerator.

    Attributes:
        flops: FLOPs of the call.
        bytes_moved: memory bytes (loads + stores) of the call.
        accelerator: the accelerator it runs on.
    """

    flops: float
    bytes_moved: float
    accelerator: Accelerator

    @property
    def compute_ms(self) -> float:
        """Time the FLOPs take at peak, tau_FLOPs."""
        return self.flops / self.accelerator.peak_flops_per_s * 1e3

    @property
    def memory_ms(self) -> float:
        """Time the memory traffic takes at full bandwidth, tau_Bytes."""
        return self.bytes_moved / self.accelerator.bandwidth_bytes_per_s * 1e3

    @property
    def runtime_ms_lower(self) -> float:
        """Runtime with compute and memory traffic fully overlapped: max(tau_FLOPs, tau_Bytes)."""
        return max(self.compute_ms, self.memory_ms)

    @property
    def runtime_ms_upper(self) -> float:
        """Runtime with no overlap: tau_FLOPs + tau_Bytes (the paper's model for TFLA)."""
        return self.compute_ms + self.memory_ms

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved, I_algo."""
        return arithmetic_intensity(self.flops, self.bytes_moved)

    @property
    def roofline_flops_per_s(self) -> float:
        """Attainable FLOP/s at this intensity: min(beta * I, alpha)."""
        return roofline_flops_per_s(self.arithmetic_intensity, self.accelerator)

    @property
    def bound(self) -> str:
        """`"memory"` if the intensity is below the accelerator's ridge point, else `"compute"`."""
        return (
            "memory" if self.arithmetic_intensity < self.accelerator.intensity_flops_per_byte else "compute"
        )


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte, I_algo = FLOPs / Bytes (paper eq. 119)."""
    return flops / bytes_moved


def roofline_flops_per_s(intensity: float, accelerator: Accelerator) -> float:
    """The roofline min(beta * I, alpha): the attainable FLOP/s at arithmetic intensity `intensity`."""
    return min(accelerator.bandwidth_bytes_per_s * intensity, accelerator.peak_flops_per_s)


def runtime_ms_lower(flops: float, bytes_moved: float, accelerator: Accelerator) -> float:
    """Runtime lower bound (full overlap), milliseconds: max(FLOPs/alpha, Bytes/beta)."""
    return Estimate(flops, bytes_moved, accelerator).runtime_ms_lower


def runtime_ms_upper(flops: float, bytes_moved: float, accelerator: Accelerator) -> float:
    """Runtime upper bound (no overlap), milliseconds: FLOPs/alpha + Bytes/beta."""
    return Estimate(flops, bytes_moved, accelerator).runtime_ms_upper


def _clip_chunk(chunk_size: float, seq_len: float) -> float:
    return min(max(chunk_size, 1.0), float(seq_len))


def flop_optimal_chunk_size(flop_terms: ChunkTerms, seq_len: float) -> float:
    """Closed-form chunk size in [1, T] that minimizes the chunkwise FLOPs: sqrt(c/a), clipped.

    Args:
        flop_terms: per-chunk FLOP terms of one head.
        seq_len: sequence length T (the largest chunk).
    """
    return _clip_chunk(math.sqrt(flop_terms.constant / flop_terms.quadratic), seq_len)


def runtime_optimal_chunk_size(
    flop_terms: ChunkTerms, byte_terms: ChunkTerms, accelerator: Accelerator, seq_len: float
) -> float:
    """Closed-form chunk size in [1, T] that minimizes the no-overlap runtime FLOPs/alpha + Bytes/beta.

    L = sqrt((c_F + I_acc*c_B) / (a_F + I_acc*a_B)), clipped to [1, T].

    Args:
        flop_terms: per-chunk FLOP terms of one head.
        byte_terms: per-chunk byte terms of one head.
        accelerator: gives I_acc = peak / bandwidth.
        seq_len: sequence length T.
    """
    i_acc = accelerator.intensity_flops_per_byte
    numerator = flop_terms.constant + i_acc * byte_terms.constant
    denominator = flop_terms.quadratic + i_acc * byte_terms.quadratic
    return _clip_chunk(math.sqrt(numerator / denominator), seq_len)


def chunkwise_runtime_s(
    flop_terms: ChunkTerms,
    byte_terms: ChunkTerms,
    accelerator: Accelerator,
    seq_len: float,
    chunk_size: float,
) -> float:
    """No-overlap runtime of one head over one sequence, seconds, as a continuous function of L."""
    return (
        flop_terms.total(seq_len, chunk_size) / accelerator.peak_flops_per_s
        + byte_terms.total(seq_len, chunk_size) / accelerator.bandwidth_bytes_per_s
    )


def argmin_chunk_size(
    cost: Callable[[float], float], seq_len: float, *, grid_points: int = 129, rel_tol: float = 1e-10
) -> float:
    """Numeric minimizer of `cost(L)` over the continuous interval [1, T].

    A log-spaced grid finds the bracket of the smallest grid value, then a golden-section search
    on log L narrows it to `rel_tol`. Exact for unimodal costs (all counts here are convex in L).

    Args:
        cost: the function of the chunk size to minimize.
        seq_len: sequence length T (the interval's right end).
        grid_points: points of the initial log grid.
        rel_tol: relative width of the final bracket.
    """
    upper = math.log(seq_len)
    if upper <= 0:
        return 1.0
    step = upper / (grid_points - 1)
    values = [cost(math.exp(i * step)) for i in range(grid_points)]
    best = min(range(grid_points), key=values.__getitem__)
    low, high = max(best - 1, 0) * step, min(best + 1, grid_points - 1) * step
    x1, x2 = high - _GOLDEN * (high - low), low + _GOLDEN * (high - low)
    f1, f2 = cost(math.exp(x1)), cost(math.exp(x2))
    while high - low > rel_tol:
        if f1 <= f2:
            high, x2, f2 = x2, x1, f1
            x1 = high - _GOLDEN * (high - low)
            f1 = cost(math.exp(x1))
        else:
            low, x1, f1 = x1, x2, f2
            x2 = low + _GOLDEN * (high - low)
            f2 = cost(math.exp(x2))
    return math.exp((low + high) / 2)


def power_of_two_chunk_sizes(seq_len: int) -> list[int]:
    """Powers of two that divide `seq_len` (1, 2, 4, ... up to T), the chunk sizes a kernel can use."""
    sizes = [1]
    while seq_len % (sizes[-1] * 2) == 0:
        sizes.append(sizes[-1] * 2)
    return sizes


def best_power_of_two_chunk_size(cost: Callable[[float], float], seq_len: int) -> int:
    """The power-of-two chunk size dividing T with the smallest `cost` (the smaller one on a tie)."""
    return min(power_of_two_chunk_sizes(seq_len), key=cost)


@dataclass(frozen=True)
class ChunkOptima:
    """Optimal chunk sizes of one chunkwise workload on one accelerator (independent of batch and heads).

    Attributes:
        flop_optimal_chunk_size: closed form, minimizes FLOPs.
        flop_optimal_chunk_size_numeric: numeric argmin of the FLOPs over [1, T].
        runtime_optimal_chunk_size: closed form, minimizes the no-overlap runtime.
        runtime_optimal_chunk_size_numeric: numeric argmin of the no-overlap runtime over [1, T].
        best_power_of_two_chunk_size: power of two dividing T with the smallest no-overlap runtime.
        best_power_of_two_flop_chunk_size: power of two dividing T with the fewest FLOPs.
    """

    flop_optimal_chunk_size: float
    flop_optimal_chunk_size_numeric: float
    runtime_optimal_chunk_size: float
    runtime_optimal_chunk_size_numeric: float
    best_power_of_two_chunk_size: int
    best_power_of_two_flop_chunk_size: int


def chunk_optima(
    flop_terms: ChunkTerms, byte_terms: ChunkTerms, accelerator: Accelerator, seq_len: int
) -> ChunkOptima:
    """Every optimal chunk size of a chunkwise workload given its per-chunk terms.

    Args:
        flop_terms: per-chunk FLOP terms of one head.
        byte_terms: per-chunk byte terms of one head.
        accelerator: the accelerator of the runtime model.
        seq_len: sequence length T.
    """

    def flops(chunk_size: float) -> float:
        return flop_terms.total(seq_len, chunk_size)

    def runtime(chunk_size: float) -> float:
        return chunkwise_runtime_s(flop_terms, byte_terms, accelerator, seq_len, chunk_size)

    return ChunkOptima(
        flop_optimal_chunk_size=flop_optimal_chunk_size(flop_terms, seq_len),
        flop_optimal_chunk_size_numeric=argmin_chunk_size(flops, seq_len),
        runtime_optimal_chunk_size=runtime_optimal_chunk_size(flop_terms, byte_terms, accelerator, seq_len),
        runtime_optimal_chunk_size_numeric=argmin_chunk_size(runtime, seq_len),
        best_power_of_two_chunk_size=best_power_of_two_chunk_size(runtime, seq_len),
        best_power_of_two_flop_chunk_size=best_power_of_two_chunk_size(flops, seq_len),
    )
