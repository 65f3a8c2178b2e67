"""`limit_chunk`: our one-level chunkwise mLSTMexp kernel (`tfla_bench.kernels.limit_chunk`, FLA
style: a whole L x L tile per program). The chunk size is the case's (default 64); a chunk beyond the
kernel's on-chip limit is unsupported with the limit as the reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.mlstm import LIMIT_CHUNK, OwnKernelAdapter
from tfla_bench.adapters.registry import SOLID, PlotStyle, register
from tfla_bench.adapters.support import torch_dtype, try_import
from tfla_bench.adapters.workloads import Case
from tfla_bench.kernels.contract import MAX_HEAD_DIM, MIN_CHUNK, MIN_HEAD_DIM

if TYPE_CHECKING:
    import torch

LIMIT_CHUNK_DEFAULT_CHUNK = 64


@register
class LimitChunk(OwnKernelAdapter):
    """Our one-level chunkwise mLSTMexp kernel (`tfla_bench.kernels.limit_chunk.mlstm_limit_chunk`)."""

    name = "limit_chunk"
    kernel_module = "tfla_bench.kernels.limit_chunk"
    default_chunk = LIMIT_CHUNK_DEFAULT_CHUNK  # the paper's limit_chunk runs
    published = LIMIT_CHUNK
    plot_style = PlotStyle("#e7298a", SOLID, "^")
    config_kernel = "limit_chunk"
    constraints = (
        f"chunk a power of two >= {MIN_CHUNK}, <= T (default {LIMIT_CHUNK_DEFAULT_CHUNK}) whose L x L tile "
        "fits on chip: <= 128 for bf16/fp16, <= 64 for fp32; head dims multiples of 16 in "
        f"[{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    )

    def check(self, case: Case) -> str | None:
        """Parameter, chunk and head-dim rules, then the kernel's on-chip limit (`unsupported_reason`)."""
        reason = self.params_reason(case) or self.shape_reason(case)
        if reason is not None:
            return reason
        module, reason = try_import(self.kernel_module)
        if module is None:
            return reason
        chunk = self.chunk(case)
        return module.unsupported_reason(chunk, case.head_dim_qk, case.head_dim_v, torch_dtype(case.dtype))

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        from tfla_bench.kernels.limit_chunk import mlstm_limit_chunk

        qkvif = (inputs[name] for name in ("q", "k", "v", "i", "f"))
        return mlstm_limit_chunk(*qkvif, chunk_size=inputs["chunk_size"])
