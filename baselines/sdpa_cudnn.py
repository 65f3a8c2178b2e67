"""`sdpa_cudnn`: torch SDPA's cuDNN backend (cuDNN's fused flash attention; FA3-class on Hopper)."""

from __future__ import annotations

from tfla_bench.adapters.registry import SOLID, PlotStyle, PublishedSeries, register
from tfla_bench.adapters.workloads import Case
from tfla_bench.baselines._attention import SdpaAdapter


@register
class SdpaCudnn(SdpaAdapter):
    """Torch SDPA, cuDNN backend (cuDNN's fused flash attention)."""

    name = "sdpa_cudnn"
    backend = "CUDNN_ATTENTION"
    dtypes = ("bfloat16", "float16")
    constraints = "CUDA + cuDNN >= 9; Dqk, Dv multiples of 8, <= 128 (<= 256 on sm90); params: causal"
    published = PublishedSeries(
        "torch_cudnn",
        params={"causal": False},
        note="torch SDPA, CUDNN backend; the paper called it without is_causal (full attention)",
    )
    plot_style = PlotStyle("#17becf", SOLID, "s")

    def available(self) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return "needs CUDA"
        if not torch.backends.cudnn.is_available():
            return "this PyTorch build has no cuDNN"
        version = torch.backends.cudnn.version() or 0
        if version < 90000:
            return f"cuDNN {version} found; the SDPA cuDNN backend needs cuDNN >= 9"
        return None

    def check(self, case: Case) -> str | None:
        for label, dim in (("Dqk", case.head_dim_qk), ("Dv", case.head_dim_v)):
            if dim % 8 or dim > 256:
                return f"{label} = {dim}: must be a multiple of 8 and <= 256"
        return super().check(case)
