"""`torch_linear_attention`: causal linear attention in plain PyTorch,
o_t = Dqk^-0.5 sum_{s <= t} (q_t . k_s) v_s, in parallel form (the T x T scores are materialized),
layout `[B, H, T, D]`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.registry import Adapter, GateShape, PlotStyle, register
from tfla_bench.adapters.support import element_bytes, generator, grad_if, qkv, unknown_params_reason
from tfla_bench.adapters.workloads import Case
from tfla_bench.model.counts import attention_flops

if TYPE_CHECKING:
    import torch

# The backward has twice the forward's matmuls (dS = dO V^T, dV = S^T dO, dQ = dS K, dK = dS^T Q).
BACKWARD_FACTOR = 2.0


@register
class TorchLinearAttention(Adapter):
    """Causal linear attention without decay, in plain PyTorch (CPU and GPU)."""

    name = "torch_linear_attention"
    family = "linear_attention"
    layout = "BHTD"
    cpu_capable = True
    constraints = "any shape; materializes B*H*T*T scores"
    gate_shape = GateShape(batch=2, seq_len=64, num_heads=2, head_dim_qk=16, head_dim_v=32)
    published = None  # no series of the paper runs this kernel
    plot_style = PlotStyle("#8e24aa", "-.")

    def check(self, case: Case) -> str | None:
        return unknown_params_reason(case, self.name, ("seed",))

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """q, k `[B, H, T, Dqk]` and v `[B, H, T, Dv]`, standard normal from the case's seed."""
        inputs: dict[str, Any] = qkv(case, generator(case, device), device, self.layout)
        grad_if(inputs, ("q", "k", "v"), case.mode)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        import torch

        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        future = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        return scores.masked_fill(future, 0.0) @ v

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The decay linear-attention recurrence with no decay (log decay 0), in float64."""
        from tfla_bench.kernels.reference import decay_linear_attention

        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        return decay_linear_attention(q, k, v, q.new_zeros(q.shape[:-1]), scale=q.shape[-1] ** -0.5)

    def flops(self, case: Case, mode: str) -> float:
        """The two causal matmuls of attention (softmax aside, the same count), times batch and heads."""
        per_head = attention_flops(
            seq_len=case.seq_len, head_dim_qk=case.head_dim_qk, head_dim_v=case.head_dim_v
        )
        forward = case.batch * case.num_heads * per_head
        return forward * (1 + BACKWARD_FACTOR) if mode == "fwbw" else forward

    def bytes(self, case: Case, mode: str) -> float:
        """Read q, k, v and write o, plus the T x T scores written and read once."""
        per_head = case.seq_len * (2 * case.head_dim_qk + 2 * case.head_dim_v) + 2 * case.seq_len**2
        forward = case.batch * case.num_heads * per_head * element_bytes(case.dtype)
        return forward * (1 + BACKWARD_FACTOR) if mode == "fwbw" else forward
