"""`simple_gla`: fla's chunkwise Simple GLA, `fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=g)`: one
log forget gate per token and head, `g` `[B, T, H]`, fla's default chunk size 64.

fla 0.6.0 refuses the backward of Simple GLA on Hopper with Triton >= 3.4.0 and < 3.7.1:
`fla.ops.common.chunk_o.chunk_bwd_dqkwg` raises RuntimeError("Triton >= 3.4.0 and < 3.7.1 on
Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg (see #640) ...") when a gate `g`
is given, `fla.utils.IS_NVIDIA_HOPPER` ('NVIDIA H' in the device name or compute capability 9.x),
`TRITON_ABOVE_3_4_0` and not `TRITON_ABOVE_3_7_1`. Its TileLang backend would take over, but it
accepts only states of the inputs' dtype, and Simple GLA's backward keeps its states in fp32, so
only fp32 inputs escape the error when tilelang (with nvcc) is installed. `check` predicts this
from fla's own flags, so the fwbw row carries the reason and fw still runs. GLA's backward
(`chunk_gla_bwd`) does not go through `chunk_bwd_dqkwg` and has no such guard in fla 0.6.0.
"""

from __future__ import annotations

from tfla_bench.adapters.registry import DASHED, PlotStyle, PublishedSeries, register
from tfla_bench.adapters.support import cuda_reason, is_installed, try_import
from tfla_bench.adapters.workloads import Case
from tfla_bench.baselines._gla import FlaAdapter
from tfla_bench.model.families import simple_gla_byte_terms, simple_gla_flop_terms

SIMPLE_GLA_CHUNK = 64


def _tilelang_takes_over() -> bool:
    """Whether fla's TileLang backend is installed, finds nvcc and is enabled (its own check)."""
    backend, _ = try_import("fla.ops.common.backends.tilelang")
    return backend is not None and backend.CommonTileLangBackend.can_use()


def simple_gla_backward_refusal(dtype: str) -> str | None:
    """The reason fla 0.6.0 will refuse Simple GLA's backward on this GPU and Triton, or None.

    Args:
        dtype: the inputs' dtype name.
    """
    utils, _ = try_import("fla.utils")
    if utils is None:
        return None
    broken_triton = getattr(utils, "TRITON_ABOVE_3_4_0", False) and not getattr(
        utils, "TRITON_ABOVE_3_7_1", True
    )
    if not (getattr(utils, "IS_NVIDIA_HOPPER", False) and broken_triton):
        return None
    if dtype == "float32" and _tilelang_takes_over():
        return None
    import triton

    return (
        "fla refuses the gated backward (chunk_bwd_dqkwg) on Hopper with Triton >= 3.4.0 and < 3.7.1 "
        f"(wrong results, fla issue #640); Triton here is {triton.__version__}. Needs Triton >= 3.7.1 "
        "(tilelang helps only fp32 inputs: Simple GLA's backward keeps its states in fp32)"
    )


@register
class SimpleGla(FlaAdapter):
    """fla's chunkwise Simple GLA (one log forget gate per head and token)."""

    name = "simple_gla"
    module = "fla.ops.simple_gla"
    function = "chunk_simple_gla"
    constraints = (
        "no head-dim limit (fla tiles K and V); fwbw in 16 bit needs even head dims; "
        "fwbw refused by fla on Hopper with Triton 3.4-3.7.0"
    )
    published = PublishedSeries("chunk_simple_gla", note="fla chunk_simple_gla (scalar per-head gate)")
    plot_style = PlotStyle("#74c476", DASHED, "s")
    flop_terms = staticmethod(simple_gla_flop_terms)
    byte_terms = staticmethod(simple_gla_byte_terms)

    def check(self, case: Case) -> str | None:
        reason = super().check(case)
        if reason is not None or case.mode != "fwbw":
            return reason
        if case.dtype != "float32" and (case.head_dim_qk % 2 or case.head_dim_v % 2):
            return f"fla's 16-bit backward needs even head dims, got {case.head_dim_qk} and {case.head_dim_v}"
        if cuda_reason() is not None or not is_installed("fla"):
            return None
        return simple_gla_backward_refusal(case.dtype)

    def fla_chunk(self, case: Case) -> int:
        return min(SIMPLE_GLA_CHUNK, case.seq_len)
