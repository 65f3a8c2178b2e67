"""`fa3`: FlashAttention 3, the Hopper build of flash-attention (`hopper/`, module
`flash_attn_interface`), `flash_attn_interface.flash_attn_func(q, k, v, causal=...)`, layout
`[B, T, H, D]`, sm90 only. It is not on PyPI: `make cuda-wheels FLASH_ATTN_SRC=...` builds it.
FlashAttention-4's CuTe kernels are the separate adapter `fa4`: one is never reported as the other.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfla_bench.adapter_support import capability, cuda_reason, device_label, is_installed, try_import
from tfla_bench.baselines._attention import FlashAttentionAdapter, output_of
from tfla_bench.registry import DASH_DOT, PlotStyle, PublishedSeries, register

if TYPE_CHECKING:
    import torch

MODULE = "flash_attn_interface"


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

    def available(self) -> str | None:
        if not is_installed(MODULE):
            return (
                "FlashAttention 3 not installed (flash_attn_interface: build it from flash-attention's "
                "hopper/ with `make cuda-wheels CUDA_WHEELS=fa3 FLASH_ATTN_SRC=path/to/flash-attention`)"
            )
        reason = cuda_reason()
        if reason is not None:
            return reason
        if capability()[0] != 9:
            return f"the FlashAttention 3 Hopper build runs on sm90 only; this is {device_label()}"
        _, reason = try_import(MODULE)
        return reason

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        module = importlib.import_module(MODULE)
        return output_of(
            module.flash_attn_func(inputs["q"], inputs["k"], inputs["v"], causal=inputs["causal"])
        )
