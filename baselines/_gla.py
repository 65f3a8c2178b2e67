"""The fla adapter family (`FlaAdapter`): GLA and Simple GLA from flash-linear-attention (`fla-core`
0.6.0), layout `[B, T, H, D]`.

- `gla` calls `fla.ops.gla.chunk_gla(q, k, v, g)`: a log forget gate per token, head and key
  channel, `g` `[B, T, H, Dqk]`. fla fixes its chunk size to min(64, max(16, next_pow2(T))).
- `simple_gla` calls `fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=g)`: one log forget gate
  per token and head, `g` `[B, T, H]`, fla's default chunk size 64.

Both return `(o, final_state)`; the adapters return `o` `[B, T, H, Dv]`. The output is
`o_t = Dqk^-0.5 * S_t^T q_t` with `S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T` (fla's default scale).

Gates are log-sigmoids, as fla expects (`g <= 0`): `g = logsigmoid(x + 3)` with x standard normal,
a forget gate of 0.95 on average, which keeps a memory of a few chunks (fla's GLA layer reaches
the same range with its gate normalizer 16), so the inter-chunk state matters in the gate.

Head dims: fla 0.6.0 tiles K and V, with no upper limit (the paper ran 1024). Its backward of
Simple GLA asserts even K and V for 16-bit inputs (`chunk_bwd_dv`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.registry import Adapter, GateShape
from tfla_bench.adapters.support import (
    cuda_reason,
    element_bytes,
    generator,
    grad_if,
    is_installed,
    qkv,
    randn,
    torch_dtype,
    try_import,
    unknown_params_reason,
)
from tfla_bench.adapters.workloads import Case
from tfla_bench.model.counts import LINEAR_RNN_BACKWARD

if TYPE_CHECKING:
    import torch

FLA_INSTALL = "fla-core not installed (pip install fla-core==0.6.0)"
FORGET_GATE_BIAS = 3.0


class FlaAdapter(Adapter):
    """fla's chunkwise kernels: layout `[B, T, H, D]`, log-sigmoid gates, fla's chunk size
    (`fla_chunk`) in the counts; the gate runs 256 tokens with Dqk != Dv."""

    family = "gla"
    packages = ("fla-core",)
    layout = "BTHD"
    gate_shape = GateShape(batch=2, seq_len=256, num_heads=2, head_dim_qk=64, head_dim_v=128)
    autotuned = True  # fla autotunes most chunk kernels (GLA's backward: about 100 configs in fla 0.6)
    precompile = "sequence"  # fla's chunk kernels: the batch a constexpr, the length unspecialized
    module = ""
    function = ""
    per_channel_gate = False

    def check(self, case: Case) -> str | None:
        return unknown_params_reason(case, self.name, ("seed",))

    def available(self) -> str | None:
        if not is_installed("fla"):
            return FLA_INSTALL
        reason = cuda_reason()
        if reason is not None:
            return reason
        module, reason = try_import(self.module)
        if module is not None and not hasattr(module, self.function):
            return f"{self.module} has no {self.function} (fla-core 0.6.0 expected)"
        return reason

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """q, k `[B, T, H, Dqk]`, v `[B, T, H, Dv]` standard normal; log-sigmoid gates g, `[B, T, H, Dqk]`
        (GLA) or `[B, T, H]` (Simple GLA)."""
        import torch.nn.functional as F

        gen = generator(case, device)
        inputs: dict[str, Any] = qkv(case, gen, device, self.layout)
        gate_shape = (case.batch, case.seq_len, case.num_heads)
        if self.per_channel_gate:
            gate_shape += (case.head_dim_qk,)
        pre_activation = randn(gate_shape, gen, device, torch_dtype("float32"))
        inputs["g"] = F.logsigmoid(pre_activation + FORGET_GATE_BIAS).to(torch_dtype(case.dtype))
        grad_if(inputs, ("q", "k", "v", "g"), case.mode)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        kernel = getattr(importlib.import_module(self.module), self.function)
        out, _ = kernel(inputs["q"], inputs["k"], inputs["v"], g=inputs["g"])
        return out

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The decay linear-attention recurrence in float64 with fla's scale Dqk^-0.5."""
        from tfla_bench.kernels.reference import decay_linear_attention

        q, k, v, g = (inputs[name].transpose(1, 2) for name in ("q", "k", "v", "g"))
        out = decay_linear_attention(q, k, v, g, scale=q.shape[-1] ** -0.5)
        return out.transpose(1, 2)

    def fla_chunk(self, case: Case) -> int:
        """The chunk size fla runs at this sequence length (the counts' `flop_terms` / `byte_terms`
        of the subclass are evaluated there)."""
        raise NotImplementedError

    def flops(self, case: Case, mode: str) -> float:
        terms = self.flop_terms(head_dim_qk=case.head_dim_qk, head_dim_v=case.head_dim_v)
        per_head = terms.total(case.seq_len, self.fla_chunk(case))
        return LINEAR_RNN_BACKWARD.total_flops(case.batch * case.num_heads * per_head, mode)

    def bytes(self, case: Case, mode: str) -> float:
        size = element_bytes(case.dtype)
        terms = self.byte_terms(
            head_dim_qk=case.head_dim_qk,
            head_dim_v=case.head_dim_v,
            qkv_bytes=size,
            gate_bytes=size,
            state_bytes=size,
        )
        per_head = terms.total(case.seq_len, self.fla_chunk(case))
        return LINEAR_RNN_BACKWARD.total_bytes(case.batch * case.num_heads * per_head, mode)
