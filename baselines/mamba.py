"""`mamba`: Mamba's selective scan, `mamba_ssm.ops.selective_scan_interface.selective_scan_fn(u, delta,
A, B, C, D=D, z=z)` with u, delta, z `[B, H*P, T]`, A `[H*P, N]` fp32, B and C `[B, N, T]`, D `[H*P]`
fp32 (head_dim_qk = the state dim N, channels = num_heads * head_dim_v; the paper used H = 1). It
needs mamba-ssm's compiled extension `selective_scan_cuda`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.registry import SOLID, Adapter, GateShape, PlotStyle, PublishedSeries, register
from tfla_bench.adapters.support import (
    cuda_reason,
    element_bytes,
    generator,
    grad_if,
    is_installed,
    randn,
    torch_dtype,
    try_import,
    unknown_params_reason,
)
from tfla_bench.adapters.workloads import Case
from tfla_bench.baselines._mamba import (
    MAMBA_INSTALL,
    MAX_SELECTIVE_SCAN_STATE,
    MISSING_EXTENSION,
    SELECTIVE_SCAN_MODULE,
    time_steps,
)
from tfla_bench.model.counts import LINEAR_RNN_BACKWARD
from tfla_bench.model.families import selective_scan_bytes, selective_scan_flops

if TYPE_CHECKING:
    import torch


@register
class Mamba(Adapter):
    """Mamba's selective scan (`selective_scan_fn`, CUDA extension)."""

    name = "mamba"
    family = "mamba"
    packages = ("mamba-ssm",)
    precompile = "none"  # a CUDA extension
    layout = "BDT"
    constraints = (
        f"head_dim_qk is the state dim (<= {MAX_SELECTIVE_SCAN_STATE}); channels = num_heads * head_dim_v; "
        "needs the compiled selective_scan_cuda"
    )
    gate_shape = GateShape(batch=2, seq_len=256, num_heads=1, head_dim_qk=16, head_dim_v=128)
    published = PublishedSeries("mamba", note="Mamba 1 selective_scan_fn (CUDA extension)")
    plot_style = PlotStyle("#fdae6b", SOLID, "^")

    def available(self) -> str | None:
        if not is_installed("mamba_ssm"):
            return MAMBA_INSTALL
        if not is_installed(MISSING_EXTENSION):
            return (
                "mamba-ssm was built without its CUDA extension selective_scan_cuda "
                "(MAMBA_SKIP_CUDA_BUILD=TRUE); selective_scan_fn needs it: `make cuda-wheels "
                "CUDA_WHEELS=mamba-ssm` on the GPU node builds it"
            )
        reason = cuda_reason()
        if reason is not None:
            return reason
        _, reason = try_import(SELECTIVE_SCAN_MODULE)
        return reason

    def check(self, case: Case) -> str | None:
        reason = unknown_params_reason(case, self.name, ("seed",))
        if reason is not None:
            return reason
        if case.head_dim_qk > MAX_SELECTIVE_SCAN_STATE:
            return (
                f"selective_scan supports state dims up to {MAX_SELECTIVE_SCAN_STATE}, got {case.head_dim_qk}"
            )
        return None

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """u, delta, z `[B, D, T]`, B and C `[B, N, T]` in the case dtype; A `[D, N]`, D `[D]` fp32."""
        import torch

        gen = generator(case, device)
        dtype = torch_dtype(case.dtype)
        channels, state = case.num_heads * case.head_dim_v, case.head_dim_qk
        fp32 = torch_dtype("float32")
        inputs: dict[str, Any] = {
            "u": randn((case.batch, channels, case.seq_len), gen, device, dtype),
            "delta": time_steps((case.batch, channels, case.seq_len), gen, device, dtype),
            "A": -torch.arange(1, state + 1, dtype=fp32, device=device).repeat(channels, 1),
            "B": randn((case.batch, state, case.seq_len), gen, device, dtype),
            "C": randn((case.batch, state, case.seq_len), gen, device, dtype),
            "D": torch.ones(channels, dtype=fp32, device=device),
            "z": randn((case.batch, channels, case.seq_len), gen, device, dtype),
        }
        grad_if(inputs, ("u", "delta", "A", "B", "C", "D", "z"), case.mode)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        scan = importlib.import_module(SELECTIVE_SCAN_MODULE).selective_scan_fn
        return scan(
            inputs["u"], inputs["delta"], inputs["A"], inputs["B"], inputs["C"], D=inputs["D"], z=inputs["z"]
        )

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`reference.selective_scan_reference` of the inputs, `[B, D, T]`."""
        from tfla_bench.kernels.reference import selective_scan_reference

        return selective_scan_reference(*(inputs[name] for name in ("u", "delta", "A", "B", "C", "D", "z")))

    def flops(self, case: Case, mode: str) -> float:
        per_sequence = selective_scan_flops(
            seq_len=case.seq_len, channels=case.num_heads * case.head_dim_v, state_dim=case.head_dim_qk
        )
        return LINEAR_RNN_BACKWARD.total_flops(case.batch * per_sequence, mode)

    def bytes(self, case: Case, mode: str) -> float:
        per_sequence = selective_scan_bytes(
            seq_len=case.seq_len,
            channels=case.num_heads * case.head_dim_v,
            state_dim=case.head_dim_qk,
            io_bytes=element_bytes(case.dtype),
        )
        return LINEAR_RNN_BACKWARD.total_bytes(case.batch * per_sequence, mode)
