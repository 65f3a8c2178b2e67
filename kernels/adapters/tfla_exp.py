"""`tfla_exp`: our TFLA mLSTMexp kernels (xl_chunk, `tfla_bench.kernels.tfla.mlstm_tfla`)."""

from tfla_bench.adapters.mlstm import XL_CHUNK_EXP, TflaAdapter
from tfla_bench.adapters.registry import PlotStyle, register


@register
class TflaExp(TflaAdapter):
    """Our TFLA mLSTMexp kernels (xl_chunk)."""

    name = "tfla_exp"
    published = XL_CHUNK_EXP
    plot_style = PlotStyle("#d62728")
