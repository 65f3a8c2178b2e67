"""The official TFLA kernels (`mlstm-kernels` 2.0.6, NX-AI), the peers our kernels are measured against:
`MlstmKernelsPeer`, the base of their adapters.

Each adapter calls `mlstm_kernels.torch.get_mlstm_kernel(name)(q, k, v, i, f, chunk_size=L)`:

- `mlstm_kernels_exp`: `chunkwise--triton_xl_chunk` (TFLA mLSTMexp, default chunk 128);
- `mlstm_kernels_sig`: `chunkwise--triton_xl_chunk_siging` (TFLA mLSTMsig, default chunk 128),
  also given `normalize=` (Case param `normalize`, default false as in all the paper's TFLA runs);
- `mlstm_kernels_limit`: `chunkwise--triton_limit_chunk` (mLSTMexp, one-level chunking, default 64).

Layout `[B, NH, T, D]`: q, k `[B, NH, T, Dqk]`, v `[B, NH, T, Dv]`, i, f `[B, NH, T]`. The gates
are pre-activations: the kernels take logsigmoid(f) as the log forget gate and i as the log input
gate (exp) or logsigmoid(i) (sig); queries are scaled by Dqk^-0.5; eps = 1e-6 in the denominator.
Inputs: q, k, v, i standard normal and f = x + 3 (x standard normal, a forget gate of 0.95 on
average), so the state carries across chunks. The output is h `[B, NH, T, Dv]` in the input dtype.

Constraints, from the library's assertions:

- xl_chunk (exp, sig): T a multiple of 16; for T < 128 T must be a power of two and is the chunk
  (the chunk size is ignored); else the chunk size is a power of two that divides T and is a
  multiple of 64 or smaller than 64.
- limit_chunk: the chunk size is a power of two that divides T.
- head dims >= 16 (Triton's minimum dot size).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.mlstm import ChunkwiseMlstmAdapter
from tfla_bench.adapters.support import cuda_reason, is_installed, try_import
from tfla_bench.adapters.workloads import Case
from tfla_bench.kernels.contract import is_power_of_two

if TYPE_CHECKING:
    import torch

MIN_HEAD_DIM = 16
XL_MIN_CHUNKED_SEQ_LEN = 128
XL_BLOCK = 64
SEQ_LEN_MULTIPLE = 16
# The published series are our kernels' (`tfla_bench.adapters.mlstm`); the peers rank after them.
PEER_RANK = 1


class MlstmKernelsPeer(ChunkwiseMlstmAdapter):
    """An official kernel, `get_mlstm_kernel(kernel_name)`, with the library's constraints."""

    kernel_name = ""
    packages = ("mlstm-kernels",)
    precompile = "own"  # strides, batch, sequence length and chunk count are constexprs of its kernels

    def available(self) -> str | None:
        if not is_installed("mlstm_kernels"):
            return "mlstm-kernels not installed (pip install mlstm-kernels==2.0.6)"
        reason = cuda_reason()
        if reason is not None:
            return reason
        module, reason = try_import("mlstm_kernels.torch")
        if module is None:
            return reason
        try:
            module.get_mlstm_kernel(self.kernel_name)
        except ValueError as exc:
            # The Triton kernels register only if their modules import (mlstm_kernels swallows the error).
            return f"mlstm_kernels has no kernel {self.kernel_name}: {exc}"
        return None

    def chunk(self, case: Case) -> int:
        """The chunk size the kernel runs: the case's or the library default (xl_chunk: T when T < 128)."""
        chunk = super().chunk(case)
        if self.kernel_name != "chunkwise--triton_limit_chunk" and case.seq_len < XL_MIN_CHUNKED_SEQ_LEN:
            return case.seq_len
        return chunk

    def check(self, case: Case) -> str | None:
        reason = self.params_reason(case)
        if reason is not None:
            return reason
        if min(case.head_dim_qk, case.head_dim_v) < MIN_HEAD_DIM:
            return f"head dims must be at least {MIN_HEAD_DIM}, got {case.head_dim_qk} and {case.head_dim_v}"
        if self.kernel_name == "chunkwise--triton_limit_chunk":
            return self._limit_chunk_reason(case)
        return self._xl_chunk_reason(case)

    def _limit_chunk_reason(self, case: Case) -> str | None:
        chunk = self.chunk(case)
        if not is_power_of_two(chunk) or case.seq_len % chunk:
            return f"chunk_size must be a power of two that divides seq_len {case.seq_len}, got {chunk}"
        return None

    def _xl_chunk_reason(self, case: Case) -> str | None:
        if case.seq_len % SEQ_LEN_MULTIPLE:
            return f"seq_len must be a multiple of {SEQ_LEN_MULTIPLE}, got {case.seq_len}"
        if case.seq_len < XL_MIN_CHUNKED_SEQ_LEN:
            if not is_power_of_two(case.seq_len):
                return f"seq_len below {XL_MIN_CHUNKED_SEQ_LEN} must be a power of two, got {case.seq_len}"
            return None
        chunk = self.chunk(case)
        if not is_power_of_two(chunk) or case.seq_len % chunk:
            return f"chunk_size must be a power of two that divides seq_len {case.seq_len}, got {chunk}"
        if chunk >= XL_BLOCK and chunk % XL_BLOCK:
            return f"chunk_size must be a multiple of {XL_BLOCK} or smaller than it, got {chunk}"
        return None

    def _kernel_kwargs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        kwargs = {"chunk_size": inputs["chunk_size"]}
        return kwargs | ({"normalize": inputs["normalize"]} if self.gate == "sig" else {})

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        from mlstm_kernels.torch import get_mlstm_kernel

        kernel = get_mlstm_kernel(self.kernel_name)
        return kernel(
            inputs["q"], inputs["k"], inputs["v"], inputs["i"], inputs["f"], **self._kernel_kwargs(inputs)
        )
