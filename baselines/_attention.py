"""The softmax-attention adapter family: causal by default (param `causal`), counts of
`tfla_bench.model.counts`, the float64 softmax reference; and the bases of its two library groups.

- `SdpaAdapter`: `torch.nn.functional.scaled_dot_product_attention` with one backend forced by
  `torch.nn.attention.sdpa_kernel([backend])`, so PyTorch cannot fall back to another one silently:
  a backend that cannot run a case raises, and the row says why. Only the forward runs inside the
  context; autograd records the backend's own op, so its backward is used. Inputs `[B, H, T, D]`.
- `FlashAttentionAdapter`: FlashAttention 2, 3 and 4 in the `[B, T, H, D]` layout, each the
  `flash_attn_func` of its `module`. They return the output or, in some versions, a tuple whose
  first element is the output.

Every attention adapter draws q, k, v from the case's seed (`adapter_support.qkv`) in its layout.

Case param `causal` (default true): the paper's torch SDPA baselines ran non-causal attention, so
`causal = false` reproduces that setting; its FLOPs use the causal factor 1 (0.5 when causal).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.registry import Adapter, GateShape
from tfla_bench.adapters.support import (
    bool_param,
    cuda_reason,
    element_bytes,
    generator,
    grad_if,
    is_installed,
    qkv,
    try_import,
    unknown_params_reason,
)
from tfla_bench.adapters.workloads import Case
from tfla_bench.model.counts import ATTENTION_BACKWARD, attention_bytes, attention_flops

if TYPE_CHECKING:
    import torch

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

    def check(self, case: Case) -> str | None:
        reason = unknown_params_reason(case, self.name, ("causal", "seed"))
        if reason is not None:
            return reason
        try:
            self.causal(case)
        except ValueError as exc:
            return str(exc)
        return None

    def causal(self, case: Case) -> bool:
        """The case's `causal` param (default true)."""
        return bool_param(case, "causal", self.param_defaults["causal"])

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """q, k and v standard normal in the adapter's layout (`qkv`), and the `causal` flag."""
        inputs: dict[str, Any] = qkv(case, generator(case, device), device, self.layout)
        grad_if(inputs, ("q", "k", "v"), case.mode)
        inputs["causal"] = self.causal(case)
        return inputs

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`reference.softmax_attention` (float64), in the adapter's layout."""
        from tfla_bench.kernels.reference import softmax_attention

        q, k, v = (inputs[name] for name in ("q", "k", "v"))
        if self.layout == "BTHD":
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))
            return softmax_attention(q, k, v, causal=inputs["causal"]).transpose(1, 2)
        return softmax_attention(q, k, v, causal=inputs["causal"])

    def flops(self, case: Case, mode: str) -> float:
        causal_factor = 0.5 if self.causal(case) else 1.0
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
    precompile = "none"  # cuDNN and the FlashAttention backend are precompiled CUDA

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The attention output `[B, H, T, Dv]`, computed by the forced backend only."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, self.backend)]):
            return torch.nn.functional.scaled_dot_product_attention(
                inputs["q"], inputs["k"], inputs["v"], is_causal=inputs["causal"]
            )


class FlashAttentionAdapter(AttentionAdapter):
    """FlashAttention 2, 3 and 4: `flash_attn_func` of `module`, layout `[B, T, H, D]`, 16-bit inputs,
    Dqk == Dv; available when the package is installed (else `missing` says how to install it), CUDA
    is there, the GPU passes `device_reason` and `module` imports with its `flash_attn_func`."""

    layout = "BTHD"
    dtypes = ("bfloat16", "float16")
    # FA2 and FA3 are CUDA extensions; FA4's CUTLASS DSL keeps what it compiles in the process.
    precompile = "none"
    constraints = (
        f"head_dim_qk == head_dim_v, a multiple of {HEAD_DIM_MULTIPLE}, <= {MAX_HEAD_DIM}; "
        "param causal (default true)"
    )
    module = ""
    missing = ""

    def device_reason(self) -> str | None:
        """Why this GPU cannot run the kernel (its architecture), or None."""
        return None

    def available(self) -> str | None:
        if not is_installed(self.module.partition(".")[0]):
            return self.missing
        reason = cuda_reason() or self.device_reason()
        if reason is not None:
            return reason
        module, reason = try_import(self.module)
        if module is not None and not hasattr(module, "flash_attn_func"):
            # FlashAttention-4's wheel installs flash_attn.cute alone, a `flash_attn` without FA2.
            return (
                f"{self.module} has no flash_attn_func: only another package's part of it is installed; "
                f"{self.missing}"
            )
        return reason

    def check(self, case: Case) -> str | None:
        reason = super().check(case)
        if reason is not None:
            return reason
        if case.head_dim_qk != case.head_dim_v:
            return f"needs head_dim_qk == head_dim_v, got {case.head_dim_qk} and {case.head_dim_v}"
        if case.head_dim_qk % HEAD_DIM_MULTIPLE or case.head_dim_qk > MAX_HEAD_DIM:
            return (
                f"head dim must be a multiple of {HEAD_DIM_MULTIPLE} and at most {MAX_HEAD_DIM}, "
                f"got {case.head_dim_qk}"
            )
        return None

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        kernel = importlib.import_module(self.module).flash_attn_func
        return output_of(kernel(inputs["q"], inputs["k"], inputs["v"], causal=inputs["causal"]))
