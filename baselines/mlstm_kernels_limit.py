"""`mlstm_kernels_limit`: the official mLSTMexp `chunkwise--triton_limit_chunk` (one level of sequence
parallelism, default chunk 64)."""

import dataclasses

from tfla_bench.adapters.mlstm import LIMIT_CHUNK
from tfla_bench.adapters.registry import DASHED, PlotStyle, register
from tfla_bench.baselines._mlstm_kernels import PEER_RANK, MlstmKernelsPeer


@register
class MlstmKernelsLimit(MlstmKernelsPeer):
    """Official mLSTMexp limit_chunk (one level of sequence parallelism)."""

    name = "mlstm_kernels_limit"
    kernel_name = "chunkwise--triton_limit_chunk"
    default_chunk = 64
    constraints = "chunk a power of two dividing T (default 64)"
    published = dataclasses.replace(LIMIT_CHUNK, rank=PEER_RANK)
    plot_style = PlotStyle("#e7298a", DASHED, "v")
