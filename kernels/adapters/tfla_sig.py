"""`tfla_sig`: our TFLA mLSTMsig kernels (xl_chunk, `tfla_bench.kernels.tfla.mlstm_tfla`), param
`normalize` (default false, as in all the paper's TFLA runs)."""

from tfla_bench.adapters.mlstm import XL_CHUNK_SIG, TflaAdapter
from tfla_bench.adapters.registry import PlotStyle, register


@register
class TflaSig(TflaAdapter):
    """Our TFLA mLSTMsig kernels (xl_chunk); param `normalize` (default false)."""

    name = "tfla_sig"
    gate = "sig"
    constraints = TflaAdapter.constraints + "; param normalize (default false)"
    published = XL_CHUNK_SIG
    plot_style = PlotStyle("#6a3d9a")
