"""`sdpa_math`: torch SDPA's math backend (plain matmul + softmax; materializes the T x T scores),
on CPU and GPU."""

from tfla_bench.adapters.registry import SOLID, PlotStyle, register
from tfla_bench.baselines._attention import SdpaAdapter


@register
class SdpaMath(SdpaAdapter):
    """Torch SDPA, math backend: unfused reference attention, any device."""

    name = "sdpa_math"
    backend = "MATH"
    cpu_capable = True
    constraints = "params: causal (default true); materializes B*H*T*T scores"
    plot_style = PlotStyle("#9ecae1", SOLID, "v")
