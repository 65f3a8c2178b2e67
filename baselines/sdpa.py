"""Softmax attention through `torch.nn.functional.scaled_dot_product_attention`, one backend forced.

- `sdpa_math`: the math backend (plain matmul + softmax; materializes the T x T scores), CPU and GPU;
- `sdpa_flash`: the FLASH backend, FlashAttention-2 built into PyTorch;
- `sdpa_cudnn`: the cuDNN backend (cuDNN's fused flash attention; FA3-class on Hopper).

The backend is forced with `torch.nn.attention.sdpa_kernel([backend])`, so PyTorch cannot fall back
to another one silently: a backend that cannot run a case raises, and the row says why. Only the
forward runs inside the context; autograd records the backend's own op, so its backward is used.

Inputs are `[B, H, T, D]` (layout BHTD), standard normal. Causal by default; the Case param
`causal = false` gives full attention, as the paper's torch baselines ran. FLOPs and bytes come
from `tfla_bench.model.counts` (causal factor 0.5 when causal, 1.0 otherwise).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tfla_bench.model.counts import attention_bytes, attention_flops, mode_bytes, mode_flops
from tfla_bench.registry import Adapter, register
from tfla_bench.workloads import Case

PARAMS = ("causal",)


class _Sdpa(Adapter):
    """Shared inputs, forward, reference and counts; subclasses pick the backend and the limits."""

    family = "attention"
    layout = "BHTD"
    backend = ""

    def check(self, case: Case) -> str | None:
        unknown = sorted(set(case.params) - set(PARAMS))
        if unknown:
            return f"unknown param(s) {', '.join(unknown)}; {self.name} takes only: {', '.join(PARAMS)}"
        if not isinstance(case.param("causal", True), bool):
            return f"param causal must be true or false, got {case.param('causal')!r}"
        return None

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """q `[B, H, T, Dqk]`, k `[B, H, T, Dqk]`, v `[B, H, T, Dv]` and the `causal` flag.

        Args:
            case: shape, dtype and mode (`fwbw` sets `requires_grad` on q, k, v).
            device: `cpu` or a CUDA device.
        """
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
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, self.backend)]):
            return torch.nn.functional.scaled_dot_product_attention(
                inputs["q"], inputs["k"], inputs["v"], is_causal=inputs["causal"]
            )

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """softmax(q k^T / sqrt(Dqk) + causal mask) v in float32, `[B, H, T, Dv]`."""
        q, k, v = (inputs[name].detach().float() for name in ("q", "k", "v"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if inputs["causal"]:
            seq_len = q.shape[-2]
            future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def flops(self, case: Case, mode: str) -> float:
        causal_factor = 0.5 if case.param("causal", True) else 1.0
        per_head = attention_flops(
            seq_len=case.seq_len,
            head_dim_qk=case.head_dim_qk,
            head_dim_v=case.head_dim_v,
            causal_factor=causal_factor,
        )
        return mode_flops(per_head * case.batch * case.num_heads, self.family, mode)

    def bytes(self, case: Case, mode: str) -> float:
        element_bytes = torch.empty((), dtype=getattr(torch, case.dtype)).element_size()
        per_head = attention_bytes(
            seq_len=case.seq_len,
            head_dim_qk=case.head_dim_qk,
            head_dim_v=case.head_dim_v,
            qkv_bytes=element_bytes,
        )
        return mode_bytes(per_head * case.batch * case.num_heads, self.family, mode)


@register
class SdpaMath(_Sdpa):
    """Torch SDPA, math backend: unfused reference attention, any device."""

    name = "sdpa_math"
    backend = "MATH"
    cpu_capable = True
    constraints = "params: causal (default true); materializes B*H*T*T scores"


@register
class SdpaFlash(_Sdpa):
    """Torch SDPA, FLASH backend (FlashAttention-2 inside PyTorch)."""

    name = "sdpa_flash"
    backend = "FLASH_ATTENTION"
    dtypes = ("bfloat16", "float16")
    constraints = "CUDA sm80+; Dqk = Dv <= 256; params: causal (default true)"

    def available(self) -> str | None:
        if not torch.cuda.is_available():
            return "needs CUDA"
        if not torch.backends.cuda.is_flash_attention_available():
            return "this PyTorch build has no FlashAttention kernels"
        return None

    def check(self, case: Case) -> str | None:
        if case.head_dim_qk != case.head_dim_v:
            return f"needs Dqk = Dv (got {case.head_dim_qk}, {case.head_dim_v})"
        if case.head_dim_qk > 256:
            return f"head dim {case.head_dim_qk} > 256"
        return super().check(case)


@register
class SdpaCudnn(_Sdpa):
    """Torch SDPA, cuDNN backend (cuDNN's fused flash attention)."""

    name = "sdpa_cudnn"
    backend = "CUDNN_ATTENTION"
    dtypes = ("bfloat16", "float16")
    constraints = "CUDA + cuDNN >= 9; Dqk, Dv multiples of 8, <= 128 (<= 256 on sm90); params: causal"

    def available(self) -> str | None:
        if not torch.cuda.is_available():
            return "needs CUDA"
        if not torch.backends.cudnn.is_available():
            return "this PyTorch build has no cuDNN"
        version = torch.backends.cudnn.version() or 0
        if version < 90000:
            return f"cuDNN {version} found; the SDPA cuDNN backend needs cuDNN >= 9"
        return None

    def check(self, case: Case) -> str | None:
        for label, dim in (("Dqk", case.head_dim_qk), ("Dv", case.head_dim_v)):
            if dim % 8 or dim > 256:
                return f"{label} = {dim}: must be a multiple of 8 and <= 256"
        return super().check(case)
