"""`mlstm_kernels_exp`: the official TFLA mLSTMexp, `chunkwise--triton_xl_chunk` (default chunk 128).

On the H100 stack of the committed runs (torch 2.11, Triton 3.6) the kernel aborts the process with
an LLVM assertion (`results/gate/check-h100-20261121.json`); the runner's worker isolation turns
that into a `crashed` row.
"""

import dataclasses

from tfla_bench.adapters.mlstm import XL_CHUNK_EXP
from tfla_bench.adapters.registry import DASHED, PlotStyle, register
from tfla_bench.baselines._mlstm_kernels import PEER_RANK, MlstmKernelsPeer


@register
class MlstmKernelsExp(MlstmKernelsPeer):
    """Official TFLA mLSTMexp (xl_chunk)."""

    name = "mlstm_kernels_exp"
    kernel_name = "chunkwise--triton_xl_chunk"
    constraints = "T % 16 == 0; chunk a power of two dividing T, a multiple of 64 or < 64 (default 128)"
    published = dataclasses.replace(XL_CHUNK_EXP, rank=PEER_RANK)
    plot_style = PlotStyle("#d62728", DASHED, "s")
