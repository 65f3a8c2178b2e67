"""`fa3`: FlashAttention 3, layout `[B, T, H, D]`, Hopper or newer.

It calls FlashAttention 3's Hopper build, `flash_attn_interface.flash_attn_func(q, k, v,
causal=...)`, and falls back to FlashAttention-4's CuTe DSL kernels,
`flash_attn.cute.flash_attn_func(q, k, v, causal=...)` (wheel `flash-attn-4`). Case param `impl` =
`hopper` or `cute` pins one; a spec that sets it records the implementation in the rows
(`param_impl`). `Fa3.implementation(case)` tells which one a case uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfla_bench.adapter_support import capability, cuda_reason, device_label, is_installed, try_import
from tfla_bench.baselines._attention import FlashAttentionAdapter, output_of
from tfla_bench.registry import DASH_DOT, PlotStyle, PublishedSeries, register
from tfla_bench.workloads import Case

if TYPE_CHECKING:
    import torch

FA3_IMPLEMENTATIONS = {
    "hopper": "flash_attn_interface",
    "cute": "flash_attn.cute",
}


@register
class Fa3(FlashAttentionAdapter):
    """FlashAttention 3: the Hopper build, else FlashAttention-4's CuTe kernels (param `impl`)."""

    name = "fa3"
    known_params = ("causal", "impl", "seed")
    constraints = (
        FlashAttentionAdapter.constraints
        + "; Hopper or newer; param impl = hopper | cute (default: first found)"
    )
    published = PublishedSeries(
        "flashattn3",
        params={"causal": True},
        note="FlashAttention 3 (Hopper build), causal=True in the paper",
    )
    plot_style = PlotStyle("#08306b", DASH_DOT, "D")

    def _importable(self, impl: str) -> str | None:
        """None if implementation `impl` imports on this GPU, else why not."""
        if impl == "hopper" and capability()[0] != 9:
            return f"the FA3 Hopper build runs on sm90 only; this is {device_label()}"
        _, reason = try_import(FA3_IMPLEMENTATIONS[impl])
        return reason

    def implementation(self, case: Case | None = None) -> str | None:
        """The implementation a case runs: its param `impl`, else the first usable one (`hopper`,
        then `cute`); None when none is usable (no CUDA, nothing installed)."""
        pinned = case.param("impl") if case is not None else None
        if pinned is not None:
            return pinned
        if cuda_reason() is not None:
            return None
        return next((impl for impl in FA3_IMPLEMENTATIONS if self._importable(impl) is None), None)

    def available(self) -> str | None:
        if not (is_installed("flash_attn_interface") or is_installed("flash_attn")):
            return (
                "FlashAttention 3 not installed (flash_attn_interface from flash-attention/hopper, "
                "or pip install flash-attn-4 for flash_attn.cute)"
            )
        reason = cuda_reason()
        if reason is not None:
            return reason
        if capability()[0] < 9:
            return f"FlashAttention 3 needs a Hopper (sm90) or newer GPU; this is {device_label()}"
        reasons = [self._importable(impl) for impl in FA3_IMPLEMENTATIONS]
        if all(reasons):
            return (
                "no FlashAttention 3: neither flash_attn_interface (the FA3 Hopper build) nor "
                f"flash_attn.cute (pip install flash-attn-4) is usable ({reasons[0]}; {reasons[1]})"
            )
        return None

    def check(self, case: Case) -> str | None:
        pinned = case.param("impl")
        if pinned is not None:
            if pinned not in FA3_IMPLEMENTATIONS:
                return f"param impl must be one of {', '.join(FA3_IMPLEMENTATIONS)}, got {pinned!r}"
            if cuda_reason() is None:
                reason = self._importable(pinned)
                if reason is not None:
                    return f"impl {pinned}: {reason}"
        return super().check(case)

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """As FA2's, plus `impl`, the implementation the forward calls (see `implementation`)."""
        inputs = super().make_inputs(case, device)
        inputs["impl"] = self.implementation(case)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        if inputs["impl"] is None:
            raise RuntimeError("no usable FlashAttention 3 implementation (see `tfla-bench list`)")
        module = importlib.import_module(FA3_IMPLEMENTATIONS[inputs["impl"]])
        return output_of(
            module.flash_attn_func(inputs["q"], inputs["k"], inputs["v"], causal=inputs["causal"])
        )
