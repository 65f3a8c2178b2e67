"""`fa4`: FlashAttention-4, the CuTe DSL kernels of flash-attention (`flash_attn.cute`, wheel
`flash-attn-4`), `flash_attn.cute.flash_attn_func(q, k, v, causal=...)`, layout `[B, T, H, D]`,
Hopper (sm90) and Blackwell (sm100). Its first call JIT-compiles the kernel for the case's shape.
"""

from __future__ import annotations

from tfla_bench.adapters.registry import DASH_DOT, PlotStyle, register
from tfla_bench.adapters.support import capability, device_label
from tfla_bench.baselines._attention import FlashAttentionAdapter

ARCHITECTURES = (9, 10)


@register
class Fa4(FlashAttentionAdapter):
    """FlashAttention-4's CuTe DSL kernels (`flash_attn.cute.flash_attn_func`)."""

    name = "fa4"
    packages = ("flash-attn-4", "nvidia-cutlass-dsl")
    constraints = FlashAttentionAdapter.constraints + "; Hopper (sm90) or Blackwell (sm100)"
    plot_style = PlotStyle("#2171b5", DASH_DOT, "P")
    module = "flash_attn.cute"
    missing = (
        "FlashAttention-4 not installed (pip install flash-attn-4, or offline: "
        "`make wheelhouse` then the README's GPU-node install)"
    )

    def device_reason(self) -> str | None:
        if capability()[0] not in ARCHITECTURES:
            return f"FlashAttention-4 runs on Hopper (sm90) and Blackwell (sm100); this is {device_label()}"
        return None

    def available(self) -> str | None:
        reason = super().available()
        if reason is not None and "No module named 'cutlass'" in reason:
            # The CUTLASS DSL adds its packages to sys.path from a .pth file, which only a site
            # directory runs: a tree put on PYTHONPATH needs the folder named here.
            reason += (
                " (nvidia-cutlass-dsl's .pth did not run: install it with pip, or add its "
                "nvidia_cutlass_dsl/dsl_packages folder to PYTHONPATH)"
            )
        return reason
