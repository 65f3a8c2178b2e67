"""`fa3`: FlashAttention 3, the Hopper build of flash-attention (`hopper/`, module
`flash_attn_interface`), `flash_attn_interface.flash_attn_func(q, k, v, causal=...)`, layout
`[B, T, H, D]`, sm90 only. It is not on PyPI: `make cuda-wheels FLASH_ATTN_SRC=...` builds it.
FlashAttention-4's CuTe kernels are the separate adapter `fa4`: one is never reported as the other.
"""

from __future__ import annotations

from tfla_bench.adapters.registry import DASH_DOT, PlotStyle, PublishedSeries, register
from tfla_bench.adapters.support import capability, device_label
from tfla_bench.baselines._attention import FlashAttentionAdapter


@register
class Fa3(FlashAttentionAdapter):
    """FlashAttention 3's Hopper build (`flash_attn_interface.flash_attn_func`)."""

    name = "fa3"
    packages = ("flash-attn-3",)
    constraints = FlashAttentionAdapter.constraints + "; Hopper (sm90) only"
    published = PublishedSeries(
        "flashattn3",
        params={"causal": True},
        note="FlashAttention 3 (Hopper build), causal=True in the paper",
    )
    plot_style = PlotStyle("#08306b", DASH_DOT, "D")
    module = "flash_attn_interface"
    missing = (
        "FlashAttention 3 not installed (flash_attn_interface: build it from flash-attention's "
        "hopper/ with `make cuda-wheels CUDA_WHEELS=fa3 FLASH_ATTN_SRC=path/to/flash-attention`)"
    )

    def device_reason(self) -> str | None:
        if capability()[0] != 9:
            return f"the FlashAttention 3 Hopper build runs on sm90 only; this is {device_label()}"
        return None
