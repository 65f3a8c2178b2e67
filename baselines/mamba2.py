"""`mamba2`: Mamba2's SSD scan without conv, D or z (the paper's `mamba2_noconv`):
`mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size)` with x
`[B, T, H, P]`, dt `[B, T, H]`, A `[H]` fp32, B and C `[B, T, G, N]`, out `[B, T, H, P]`. Param
`num_groups` G (default H: per-head B and C, the paper's setting). Chunk size: the case's, default 256.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.registry import PlotStyle, PublishedSeries, register
from tfla_bench.adapters.support import generator, grad_if, randn, torch_dtype, uniform
from tfla_bench.adapters.workloads import Case
from tfla_bench.baselines._mamba import (
    A_MAX,
    A_MIN,
    Mamba2Adapter,
    import_ssd_combined,
    ssd_reason,
    time_steps,
)
from tfla_bench.model.counts import LINEAR_RNN_BACKWARD

if TYPE_CHECKING:
    import torch


@register
class Mamba2(Mamba2Adapter):
    """Mamba2's SSD scan (`mamba_chunk_scan_combined`), without conv, D or z."""

    name = "mamba2"
    constraints = (
        "param num_groups divides num_heads (default num_heads); chunk_size a power of two (default 256)"
    )
    published = PublishedSeries(
        "mamba2_noconv", note="mamba_chunk_scan_combined: the Mamba 2 SSD scan alone, no conv (chunk 256)"
    )
    plot_style = PlotStyle("#e6550d")

    def available(self) -> str | None:
        return ssd_reason()

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """x `[B, T, H, P]`, dt `[B, T, H]`, A `[H]` fp32, B and C `[B, T, G, N]`, and chunk_size."""
        gen = generator(case, device)
        dtype = torch_dtype(case.dtype)
        groups = self._groups(case)
        state_shape = (case.batch, case.seq_len, groups, case.head_dim_qk)
        inputs: dict[str, Any] = {
            "x": randn((case.batch, case.seq_len, case.num_heads, case.head_dim_v), gen, device, dtype),
            "dt": time_steps((case.batch, case.seq_len, case.num_heads), gen, device, dtype),
            "A": -uniform((case.num_heads,), A_MIN, A_MAX, gen, device, torch_dtype("float32")),
            "B": randn(state_shape, gen, device, dtype),
            "C": randn(state_shape, gen, device, dtype),
        }
        grad_if(inputs, ("x", "dt", "A", "B", "C"), case.mode)
        inputs["chunk_size"] = self._chunk(case)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        ssd = import_ssd_combined()
        return ssd.mamba_chunk_scan_combined(
            inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], inputs["chunk_size"]
        )

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`reference.ssd_reference` of the inputs."""
        from tfla_bench.kernels.reference import ssd_reference

        return ssd_reference(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"])

    def flops(self, case: Case, mode: str) -> float:
        return LINEAR_RNN_BACKWARD.total_flops(self._ssd_flops(case), mode)

    def bytes(self, case: Case, mode: str) -> float:
        return LINEAR_RNN_BACKWARD.total_bytes(self._ssd_bytes(case), mode)
