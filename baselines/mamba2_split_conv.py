"""`mamba2_split_conv`: Mamba2's fused conv + SSD path (the paper's `mamba2`),
`mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
headdim=P, ngroups=G)`: causal conv of width 4, SiLU, softplus(dt + dt_bias), D skip, z gate. Param
`num_groups` (default 1, Mamba2's default). It needs `causal-conv1d` (a CUDA build).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.registry import DASHED, PlotStyle, PublishedSeries, register
from tfla_bench.adapters.support import (
    element_bytes,
    generator,
    grad_if,
    is_installed,
    randn,
    torch_dtype,
    try_import,
    uniform,
)
from tfla_bench.adapters.workloads import Case
from tfla_bench.baselines._mamba import (
    A_MAX,
    A_MIN,
    CONV_WIDTH,
    Mamba2Adapter,
    import_ssd_combined,
    ssd_reason,
    time_steps,
)
from tfla_bench.model.counts import LINEAR_RNN_BACKWARD
from tfla_bench.model.families import causal_conv1d_bytes, causal_conv1d_flops

if TYPE_CHECKING:
    import torch


@register
class Mamba2SplitConv(Mamba2Adapter):
    """Mamba2's fused conv + SSD path (`mamba_split_conv1d_scan_combined`)."""

    name = "mamba2_split_conv"
    packages = ("mamba-ssm", "causal-conv1d")
    default_groups = 1
    constraints = (
        "param num_groups divides num_heads (default 1); chunk_size a power of two (default 256); "
        "needs causal-conv1d"
    )
    published = PublishedSeries(
        "mamba2", note="mamba_split_conv1d_scan_combined: Mamba 2 with its causal conv1d fused in (chunk 256)"
    )
    plot_style = PlotStyle("#a63603", DASHED, "s")

    def available(self) -> str | None:
        reason = ssd_reason()
        if reason is not None:
            return reason
        if not is_installed("causal_conv1d"):
            return (
                "causal-conv1d not installed (a CUDA build: `make cuda-wheels CUDA_WHEELS=causal-conv1d` on "
                "the GPU node, or pip install causal-conv1d with nvcc there)"
            )
        _, reason = try_import("causal_conv1d.cpp_functions")
        return reason

    def _conv_channels(self, case: Case) -> int:
        return case.num_heads * case.head_dim_v + 2 * self._groups(case) * case.head_dim_qk

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """zxbcdt `[B, T, 2HP + 2GN + H]` (z, x, B, C, raw dt), conv weight `[HP + 2GN, 4]` and bias,
        dt_bias `[H]` in the input dtype; A `[H]` and D `[H]` fp32; chunk_size, head_dim, num_groups."""
        import torch

        gen = generator(case, device)
        dtype = torch_dtype(case.dtype)
        fp32 = torch_dtype("float32")
        heads, groups, channels = case.num_heads, self._groups(case), self._conv_channels(case)
        inner = heads * case.head_dim_v
        bound = CONV_WIDTH**-0.5  # PyTorch's default Conv1d init for a depthwise conv of this width
        dt0 = time_steps((heads,), gen, device, fp32)
        inputs: dict[str, Any] = {
            "zxbcdt": randn((case.batch, case.seq_len, inner + channels + heads), gen, device, dtype),
            "conv1d_weight": uniform((channels, CONV_WIDTH), -bound, bound, gen, device, dtype),
            "conv1d_bias": uniform((channels,), -bound, bound, gen, device, dtype),
            # softplus(dt_bias) = dt0: the inverse softplus, as Mamba2 initializes dt_bias.
            "dt_bias": (dt0 + torch.log(-torch.expm1(-dt0))).to(dtype),
            "A": -uniform((heads,), A_MIN, A_MAX, gen, device, fp32),
            "D": torch.ones(heads, dtype=fp32, device=device),
        }
        grad_if(inputs, ("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D"), case.mode)
        inputs.update(chunk_size=self._chunk(case), head_dim=case.head_dim_v, num_groups=groups)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        ssd = import_ssd_combined()
        return ssd.mamba_split_conv1d_scan_combined(
            inputs["zxbcdt"],
            inputs["conv1d_weight"],
            inputs["conv1d_bias"],
            inputs["dt_bias"],
            inputs["A"],
            inputs["D"],
            inputs["chunk_size"],
            headdim=inputs["head_dim"],
            ngroups=inputs["num_groups"],
        )

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`reference.mamba2_split_conv_reference` of the inputs, `[B, T, H * P]`."""
        from tfla_bench.kernels.reference import mamba2_split_conv_reference

        names = ("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "head_dim", "num_groups")
        return mamba2_split_conv_reference(*(inputs[name] for name in names))

    def flops(self, case: Case, mode: str) -> float:
        inner = case.num_heads * case.head_dim_v
        conv = causal_conv1d_flops(seq_len=case.seq_len, channels=self._conv_channels(case), width=CONV_WIDTH)
        # Per token: softplus(dt + dt_bias) per head (5), D skip (2) and SiLU(z) gate (5) per channel.
        extra = case.seq_len * (5 * case.num_heads + 7 * inner)
        return LINEAR_RNN_BACKWARD.total_flops(self._ssd_flops(case) + case.batch * (conv + extra), mode)

    def bytes(self, case: Case, mode: str) -> float:
        size = element_bytes(case.dtype)
        channels = self._conv_channels(case)
        conv = causal_conv1d_bytes(seq_len=case.seq_len, channels=channels, io_bytes=size)
        # z and the raw dt are read from zxbcdt by the scan; the conv output is what the SSD reads.
        extra = case.seq_len * size * (case.num_heads * case.head_dim_v + case.num_heads)
        return LINEAR_RNN_BACKWARD.total_bytes(self._ssd_bytes(case) + case.batch * (conv + extra), mode)
