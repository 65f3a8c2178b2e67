"""FlashAttention 2 and 3: softmax attention in the `[B, T, H, D]` layout, causal by default.

- `fa2` calls `flash_attn.flash_attn_func(q, k, v, causal=...)` (FlashAttention 2, package
  `flash-attn`, Ampere or newer).
- `fa3` calls FlashAttention 3's Hopper build, `flash_attn_interface.flash_attn_func(q, k, v,
  causal=...)`, and falls back to FlashAttention-4's CuTe DSL kernels,
  `flash_attn.cute.flash_attn_func(q, k, v, causal=...)` (wheel `flash-attn-4`); Hopper or newer.
  Case param `impl` = `hopper` or `cute` pins one; a spec that sets it records the implementation
  in the rows (`param_impl`). `Fa3.implementation(case)` tells which one a case uses.

Case param `causal` (default true): the paper's torch SDPA baselines ran non-causal attention, so
`causal = false` reproduces that setting; its FLOPs use the causal factor 1.

Both libraries return the output or, in some versions, a tuple whose first element is the output.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfla_bench.baselines._common import (
    bool_param,
    capability,
    cuda_reason,
    device_label,
    element_bytes,
    generator,
    grad_if,
    is_installed,
    randn,
    torch_dtype,
    try_import,
    unknown_params_reason,
)
from tfla_bench.model.counts import attention_bytes, attention_flops, mode_bytes, mode_flops
from tfla_bench.registry import Adapter, register
from tfla_bench.workloads import Case

if TYPE_CHECKING:
    import torch

MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8
FA3_IMPLEMENTATIONS = {
    "hopper": "flash_attn_interface",
    "cute": "flash_attn.cute",
}


def _output(result: Any) -> torch.Tensor:
    # Older FA3 builds and FA4 return (out, softmax_lse); newer ones the output alone.
    return result[0] if isinstance(result, tuple | list) else result


class _FlashAttention(Adapter):
    family = "attention"
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

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """Math-backend SDPA in float64, back in the `[B, T, H, Dv]` layout."""
        from tfla_bench.correctness import softmax_attention

        q, k, v = (inputs[name].transpose(1, 2) for name in ("q", "k", "v"))
        return softmax_attention(q, k, v, causal=inputs["causal"]).transpose(1, 2)

    def flops(self, case: Case, mode: str) -> float:
        causal_factor = 0.5 if bool_param(case, "causal", True) else 1.0
        per_head = attention_flops(
            seq_len=case.seq_len,
            head_dim_qk=case.head_dim_qk,
            head_dim_v=case.head_dim_v,
            causal_factor=causal_factor,
        )
        return mode_flops(case.batch * case.num_heads * per_head, "attention", mode)

    def bytes(self, case: Case, mode: str) -> float:
        per_head = attention_bytes(
            seq_len=case.seq_len,
            head_dim_qk=case.head_dim_qk,
            head_dim_v=case.head_dim_v,
            qkv_bytes=element_bytes(case.dtype),
        )
        return mode_bytes(case.batch * case.num_heads * per_head, "attention", mode)


@register
class FlashAttention2(_FlashAttention):
    """FlashAttention 2 (`flash_attn.flash_attn_func`)."""

    name = "fa2"

    def available(self) -> str | None:
        if not is_installed("flash_attn"):
            return "flash-attn not installed (pip install flash-attn; FlashAttention 2 builds from source)"
        reason = cuda_reason()
        if reason is not None:
            return reason
        if capability() < (8, 0):
            return f"FlashAttention 2 needs an Ampere (sm80) or newer GPU; this is {device_label()}"
        module, reason = try_import("flash_attn")
        if module is None:
            return reason
        if not hasattr(module, "flash_attn_func"):
            return "flash_attn has no flash_attn_func: only FlashAttention-4's flash_attn.cute is installed"
        return None

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        flash_attn = importlib.import_module("flash_attn")
        return _output(
            flash_attn.flash_attn_func(inputs["q"], inputs["k"], inputs["v"], causal=inputs["causal"])
        )


@register
class Fa3(_FlashAttention):
    """FlashAttention 3: the Hopper build, else FlashAttention-4's CuTe kernels (param `impl`)."""

    name = "fa3"
    known_params = ("causal", "impl", "seed")
    constraints = (
        _FlashAttention.constraints + "; Hopper or newer; param impl = hopper | cute (default: first found)"
    )

    def _importable(self, impl: str) -> str | None:
        """None if implementation `impl` imports on this GPU, else why not."""
        if impl == "hopper" and capability()[0] != 9:
            return f"the FA3 Hopper build runs on sm90 only; this is {device_label()}"
        _, reason = try_import(FA3_IMPLEMENTATIONS[impl])
        return reason

    def implementation(self, case: Case | None = None) -> str | None:
        """The implementation a case runs: its param `impl`, else the first usable one (`hopper`,
        then `cute`); None when none is usable (no CUDA, nothing installed)."""
        pinned = case.param("impl") if case is not None else None
        if pinned is not None:
            return pinned
        if cuda_reason() is not None:
            return None
        return next((impl for impl in FA3_IMPLEMENTATIONS if self._importable(impl) is None), None)

    def available(self) -> str | None:
        if not (is_installed("flash_attn_interface") or is_installed("flash_attn")):
            return (
                "FlashAttention 3 not installed (flash_attn_interface from flash-attention/hopper, "
                "or pip install flash-attn-4 for flash_attn.cute)"
            )
        reason = cuda_reason()
        if reason is not None:
            return reason
        if capability()[0] < 9:
            return f"FlashAttention 3 needs a Hopper (sm90) or newer GPU; this is {device_label()}"
        reasons = [self._importable(impl) for impl in FA3_IMPLEMENTATIONS]
        if all(reasons):
            return (
                "no FlashAttention 3: neither flash_attn_interface (the FA3 Hopper build) nor "
                f"flash_attn.cute (pip install flash-attn-4) is usable ({reasons[0]}; {reasons[1]})"
            )
        return None

    def check(self, case: Case) -> str | None:
        pinned = case.param("impl")
        if pinned is not None:
            if pinned not in FA3_IMPLEMENTATIONS:
                return f"param impl must be one of {', '.join(FA3_IMPLEMENTATIONS)}, got {pinned!r}"
            if cuda_reason() is None:
                reason = self._importable(pinned)
                if reason is not None:
                    return f"impl {pinned}: {reason}"
        return super().check(case)

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """As FA2's, plus `impl`, the implementation the forward calls (see `implementation`)."""
        inputs = super().make_inputs(case, device)
        inputs["impl"] = self.implementation(case)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        if inputs["impl"] is None:
            raise RuntimeError("no usable FlashAttention 3 implementation (see `tfla-bench list`)")
        module = importlib.import_module(FA3_IMPLEMENTATIONS[inputs["impl"]])
        return _output(module.flash_attn_func(inputs["q"], inputs["k"], inputs["v"], causal=inputs["causal"]))
