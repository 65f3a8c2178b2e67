"""`sdpa_flash`: torch SDPA's FLASH backend, FlashAttention-2 built into PyTorch."""

from __future__ import annotations

from tfla_bench.adapters.registry import PlotStyle, PublishedSeries, register
from tfla_bench.adapters.workloads import Case
from tfla_bench.baselines._attention import SdpaAdapter


@register
class SdpaFlash(SdpaAdapter):
    """Torch SDPA, FLASH backend (FlashAttention-2 inside PyTorch)."""

    name = "sdpa_flash"
    backend = "FLASH_ATTENTION"
    dtypes = ("bfloat16", "float16")
    constraints = "CUDA sm80+; Dqk = Dv <= 256; params: causal (default true)"
    published = PublishedSeries(
        "torch_flash",
        params={"causal": False},
        note="torch SDPA, FLASH backend (FlashAttention 2); non-causal in the paper",
    )
    plot_style = PlotStyle("#2171b5")

    def available(self) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return "needs CUDA"
        if not torch.backends.cuda.is_flash_attention_available():
            return "this PyTorch build has no FlashAttention kernels"
        return None

    def check(self, case: Case) -> str | None:
        if case.head_dim_qk != case.head_dim_v:
            return f"needs Dqk = Dv (got {case.head_dim_qk}, {case.head_dim_v})"
        if case.head_dim_qk > 256:
            return f"head dim {case.head_dim_qk} > 256"
        return super().check(case)
