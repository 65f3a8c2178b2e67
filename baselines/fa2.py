"""`fa2`: FlashAttention 2, `flash_attn.flash_attn_func(q, k, v, causal=...)` (package `flash-attn`,
Ampere or newer), layout `[B, T, H, D]`."""

from __future__ import annotations

from tfla_bench.adapters.registry import DASH_DOT, PlotStyle, register
from tfla_bench.adapters.support import capability, device_label
from tfla_bench.baselines._attention import FlashAttentionAdapter


@register
class FlashAttention2(FlashAttentionAdapter):
    """FlashAttention 2 (`flash_attn.flash_attn_func`)."""

    name = "fa2"
    packages = ("flash-attn",)
    plot_style = PlotStyle("#6baed6", DASH_DOT, "^")
    module = "flash_attn"
    missing = (
        "flash-attn not installed (a CUDA build: `make cuda-wheels CUDA_WHEELS=flash-attn` on the GPU node, "
        "or pip install flash-attn with nvcc there)"
    )

    def device_reason(self) -> str | None:
        if capability() < (8, 0):
            return f"FlashAttention 2 needs an Ampere (sm80) or newer GPU; this is {device_label()}"
        return None
