"""`mlstm_kernels_sig`: the official TFLA mLSTMsig, `chunkwise--triton_xl_chunk_siging` (default chunk
128), also given `normalize=` (param `normalize`, default false as in all the paper's TFLA runs)."""

import dataclasses

from tfla_bench.adapters.mlstm import XL_CHUNK_SIG
from tfla_bench.adapters.registry import DASHED, PlotStyle, register
from tfla_bench.baselines._mlstm_kernels import PEER_RANK, MlstmKernelsPeer


@register
class MlstmKernelsSig(MlstmKernelsPeer):
    """Official TFLA mLSTMsig (xl_chunk_siging); param `normalize` (default false)."""

    name = "mlstm_kernels_sig"
    kernel_name = "chunkwise--triton_xl_chunk_siging"
    gate = "sig"
    constraints = (
        "T % 16 == 0; chunk a power of two dividing T, a multiple of 64 or < 64 (default 128); "
        "param normalize (default false)"
    )
    published = dataclasses.replace(XL_CHUNK_SIG, rank=PEER_RANK)
    plot_style = PlotStyle("#6a3d9a", DASHED, "s")
