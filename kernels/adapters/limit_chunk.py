"""`limit_chunk`: our one-level chunkwise mLSTMexp kernel (`tfla_bench.kernels.limit_chunk`, FLA
style: a whole L x L tile per program). The chunk size is the case's (default 64); a chunk beyond the
kernel's on-chip limit is unsupported with the limit as the reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapter_support import cuda_reason, is_power_of_two, torch_dtype, try_import
from tfla_bench.kernels.adapters._mlstm import (
    LIMIT_CHUNK,
    MAX_HEAD_DIM,
    MIN_CHUNK,
    MIN_HEAD_DIM,
    ChunkwiseMlstmAdapter,
)
from tfla_bench.registry import SOLID, PlotStyle, register
from tfla_bench.workloads import Case

if TYPE_CHECKING:
    import torch

LIMIT_CHUNK_DEFAULT_CHUNK = 64


@register
class LimitChunk(ChunkwiseMlstmAdapter):
    """Our one-level chunkwise mLSTMexp kernel (`tfla_bench.kernels.limit_chunk.mlstm_limit_chunk`)."""

    name = "limit_chunk"
    default_chunk = LIMIT_CHUNK_DEFAULT_CHUNK  # the paper's limit_chunk runs
    published = LIMIT_CHUNK
    plot_style = PlotStyle("#e7298a", SOLID, "^")
    constraints = (
        f"chunk a power of two >= {MIN_CHUNK}, <= T (default {LIMIT_CHUNK_DEFAULT_CHUNK}) whose L x L tile "
        "fits on chip: <= 128 for bf16/fp16, <= 64 for fp32; head dims multiples of 16 in "
        f"[{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    )

    def available(self) -> str | None:
        reason = cuda_reason()
        if reason is not None:
            return reason
        _, reason = try_import("tfla_bench.kernels.limit_chunk")
        return reason

    def check(self, case: Case) -> str | None:
        """Parameter, chunk and head-dim rules, then the kernel's on-chip limit (`unsupported_reason`)."""
        reason = self.params_reason(case)
        if reason is not None:
            return reason
        chunk = self.chunk(case)
        if not (is_power_of_two(chunk) and chunk >= MIN_CHUNK):
            return f"chunk_size must be a power of two >= {MIN_CHUNK}, got {chunk}"
        if chunk > case.seq_len:
            return f"chunk_size {chunk} is larger than seq_len {case.seq_len}"
        for name, dim in (("head_dim_qk", case.head_dim_qk), ("head_dim_v", case.head_dim_v)):
            if not (MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM and dim % 16 == 0):
                return f"{name} must be a multiple of 16 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {dim}"
        module, reason = try_import("tfla_bench.kernels.limit_chunk")
        if module is None:
            return reason
        return module.unsupported_reason(chunk, case.head_dim_qk, case.head_dim_v, torch_dtype(case.dtype))

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        from tfla_bench.kernels.limit_chunk import mlstm_limit_chunk

        qkvif = (inputs[name] for name in ("q", "k", "v", "i", "f"))
        return mlstm_limit_chunk(*qkvif, chunk_size=inputs["chunk_size"])
