"""The softmax-attention adapter family: causal by default (param `causal`), counts of
`tfla_bench.model.counts`, the float64 softmax reference; and the bases of its two library groups.

- `SdpaAdapter`: `torch.nn.functional.scaled_dot_product_attention` with one backend forced by
  `torch.nn.attention.sdpa_kernel([backend])`, so PyTorch cannot fall back to another one silently:
  a backend that cannot run a case raises, and the row says why. Only the forward runs inside the
  context; autograd records the backend's own op, so its backward is used. Inputs `[B, H, T, D]`.
- `FlashAttentionAdapter`: FlashAttention 2 and 3 in the `[B, T, H, D]` layout. Both libraries
  return the output or, in some versions, a tuple whose first element is the output.

Case param `causal` (default true): the paper's torch SDPA baselines ran non-causal attention, so
`causal = false` reproduces that setting; its FLOPs use the causal factor 1 (0.5 when causal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapter_support import (
    bool_param,
    element_bytes,
    generator,
    grad_if,
    randn,
    torch_dtype,
    unknown_params_reason,
)
from tfla_bench.model.counts import ATTENTION_BACKWARD, attention_bytes, attention_flops
from tfla_bench.registry import Adapter, GateShape
from tfla_bench.workloads import Case

if TYPE_CHECKING:
    import torch

SDPA_PARAMS = ("causal",)
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8


def output_of(result: Any) -> torch.Tensor:
    """The output of a FlashAttention call: older FA3 builds and FA4 return (out, softmax_lse)."""
    return result[0] if isinstance(result, tuple | list) else result


class AttentionAdapter(Adapter):
    """Softmax attention: causal unless param `causal` is false; `[B, H, T, D]` unless `layout` says
    `BTHD`; the gate runs 256 tokens, 4 heads of 64."""

    family = "attention"
    layout = "BHTD"
    gate_shape = GateShape(batch=2, seq_len=256, num_heads=4, head_dim_qk=64, head_dim_v=64)
    param_defaults = {"causal": True}

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`reference.softmax_attention` (float64), in the adapter's layout."""
        from tfla_bench.kernels.reference import softmax_attention

        q, k, v = (inputs[name] for name in ("q", "k", "v"))
        if self.layout == "BTHD":
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))
            return softmax_attention(q, k, v, causal=inputs["causal"]).transpose(1, 2)
        return softmax_attention(q, k, v, causal=inputs["causal"])

    def flops(self, case: Case, mode: str) -> float:
        causal_factor = 0.5 if bool_param(case, "causal", True) else 1.0
        per_head = attention_flops(
            seq_len=case.seq_len,
            head_dim_qk=case.head_dim_qk,
            head_dim_v=case.head_dim_v,
            causal_factor=causal_factor,
        )
        return ATTENTION_BACKWARD.total_flops(case.batch * case.num_heads * per_head, mode)

    def bytes(self, case: Case, mode: str) -> float:
        per_head = attention_bytes(
            seq_len=case.seq_len,
            head_dim_qk=case.head_dim_qk,
            head_dim_v=case.head_dim_v,
            qkv_bytes=element_bytes(case.dtype),
        )
        return ATTENTION_BACKWARD.total_bytes(case.batch * case.num_heads * per_head, mode)


class SdpaAdapter(AttentionAdapter):
    """Torch SDPA with the backend `backend` (an `SDPBackend` member name) forced."""

    backend = ""
    packages = ("torch",)

    def check(self, case: Case) -> str | None:
        unknown = sorted(set(case.params) - set(SDPA_PARAMS))
        if unknown:
            return f"unknown param(s) {', '.join(unknown)}; {self.name} takes only: {', '.join(SDPA_PARAMS)}"
        if not isinstance(case.param("causal", True), bool):
            return f"param causal must be true or false, got {case.param('causal')!r}"
        return None

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """q `[B, H, T, Dqk]`, k `[B, H, T, Dqk]`, v `[B, H, T, Dv]` and the `causal` flag.

        Args:
            case: shape, dtype and mode (`fwbw` sets `requires_grad` on q, k, v).
            device: `cpu` or a CUDA device.
        """
        import torch

        dtype = getattr(torch, case.dtype)
        grad = case.mode == "fwbw"
        qk_shape = (case.batch, case.num_heads, case.seq_len, case.head_dim_qk)
        v_shape = (case.batch, case.num_heads, case.seq_len, case.head_dim_v)
        return {
            "q": torch.randn(qk_shape, device=device, dtype=dtype).requires_grad_(grad),
            "k": torch.randn(qk_shape, device=device, dtype=dtype).requires_grad_(grad),
            "v": torch.randn(v_shape, device=device, dtype=dtype).requires_grad_(grad),
            "causal": bool(case.param("causal", True)),
        }

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The attention output `[B, H, T, Dv]`, computed by the forced backend only."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, self.backend)]):
            return torch.nn.functional.scaled_dot_product_attention(
                inputs["q"], inputs["k"], inputs["v"], is_causal=inputs["causal"]
            )


class FlashAttentionAdapter(AttentionAdapter):
    """FlashAttention 2 and 3: layout `[B, T, H, D]`, 16-bit inputs, Dqk == Dv."""

    layout = "BTHD"
    dtypes = ("bfloat16", "float16")
    constraints = (
        f"head_dim_qk == head_dim_v, a multiple of {HEAD_DIM_MULTIPLE}, <= {MAX_HEAD_DIM}; "
        "param causal (default true)"
    )

    known_params: tuple[str, ...] = ("causal", "seed")

    def check(self, case: Case) -> str | None:
        reason = unknown_params_reason(case, self.name, self.known_params)
        if reason is not None:
            return reason
        try:
            bool_param(case, "causal", True)
        except ValueError as exc:
            return str(exc)
        if case.head_dim_qk != case.head_dim_v:
            return f"needs head_dim_qk == head_dim_v, got {case.head_dim_qk} and {case.head_dim_v}"
        if case.head_dim_qk % HEAD_DIM_MULTIPLE or case.head_dim_qk > MAX_HEAD_DIM:
            return (
                f"head dim must be a multiple of {HEAD_DIM_MULTIPLE} and at most {MAX_HEAD_DIM}, "
                f"got {case.head_dim_qk}"
            )
        return None

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """q, k `[B, T, H, Dqk]`, v `[B, T, H, Dv]` standard normal, and the `causal` flag."""
        gen = generator(case, device)
        dtype = torch_dtype(case.dtype)
        shape_qk = (case.batch, case.seq_len, case.num_heads, case.head_dim_qk)
        shape_v = (case.batch, case.seq_len, case.num_heads, case.head_dim_v)
        inputs: dict[str, Any] = {
            "q": randn(shape_qk, gen, device, dtype),
            "k": randn(shape_qk, gen, device, dtype),
            "v": randn(shape_v, gen, device, dtype),
        }
        grad_if(inputs, ("q", "k", "v"), case.mode)
        inputs["causal"] = bool_param(case, "causal", True)
        return inputs
