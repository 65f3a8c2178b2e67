"""`fa2`: FlashAttention 2, `flash_attn.flash_attn_func(q, k, v, causal=...)` (package `flash-attn`,
Ampere or newer), layout `[B, T, H, D]`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfla_bench.adapter_support import capability, cuda_reason, device_label, is_installed, try_import
from tfla_bench.baselines._attention import FlashAttentionAdapter, output_of
from tfla_bench.registry import DASH_DOT, PlotStyle, register

if TYPE_CHECKING:
    import torch


@register
class FlashAttention2(FlashAttentionAdapter):
    """FlashAttention 2 (`flash_attn.flash_attn_func`)."""

    name = "fa2"
    packages = ("flash-attn",)
    plot_style = PlotStyle("#6baed6", DASH_DOT, "^")

    def available(self) -> str | None:
        if not is_installed("flash_attn"):
            return (
                "flash-attn not installed (a CUDA build: `make cuda-wheels CUDA_WHEELS=flash-attn` on the "
                "GPU node, or pip install flash-attn with nvcc there)"
            )
        reason = cuda_reason()
        if reason is not None:
            return reason
        if capability() < (8, 0):
            return f"FlashAttention 2 needs an Ampere (sm80) or newer GPU; this is {device_label()}"
        module, reason = try_import("flash_attn")
        if module is None:
            return reason
        if not hasattr(module, "flash_attn_func"):
            return "flash_attn has no flash_attn_func: only FlashAttention-4's flash_attn.cute is installed"
        return None

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        flash_attn = importlib.import_module("flash_attn")
        return output_of(
            flash_attn.flash_attn_func(inputs["q"], inputs["k"], inputs["v"], causal=inputs["causal"])
        )
