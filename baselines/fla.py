"""GLA and Simple GLA from flash-linear-attention (`fla-core` 0.6.0), layout `[B, T, H, D]`.

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

fla 0.6.0 refuses the backward of Simple GLA on Hopper with Triton >= 3.4.0 and < 3.7.1:
`fla.ops.common.chunk_o.chunk_bwd_dqkwg` raises RuntimeError("Triton >= 3.4.0 and < 3.7.1 on
Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg (see #640) ...") when a gate `g`
is given, `fla.utils.IS_NVIDIA_HOPPER` ('NVIDIA H' in the device name or compute capability 9.x),
`TRITON_ABOVE_3_4_0` and not `TRITON_ABOVE_3_7_1`. Its TileLang backend would take over, but it
accepts only states of the inputs' dtype, and Simple GLA's backward keeps its states in fp32, so
only fp32 inputs escape the error when tilelang (with nvcc) is installed. `check` predicts this
from fla's own flags, so the fwbw row carries the reason and fw still runs. GLA's backward
(`chunk_gla_bwd`) does not go through `chunk_bwd_dqkwg` and has no such guard in fla 0.6.0.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfla_bench.baselines._common import (
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
from tfla_bench.model.counts import mode_bytes, mode_flops
from tfla_bench.model.families import (
    gla_byte_terms,
    gla_flop_terms,
    simple_gla_byte_terms,
    simple_gla_flop_terms,
)
from tfla_bench.registry import Adapter, register
from tfla_bench.workloads import Case

if TYPE_CHECKING:
    import torch

FLA_INSTALL = "fla-core not installed (pip install fla-core==0.6.0)"
SIMPLE_GLA_CHUNK = 64
FORGET_GATE_BIAS = 3.0


def gla_chunk_size(seq_len: int) -> int:
    """The chunk size `chunk_gla` picks for `seq_len`: min(64, max(16, next power of two of T))."""
    return min(64, max(16, 1 << (seq_len - 1).bit_length()))


def _tilelang_takes_over() -> bool:
    """Whether fla's TileLang backend is installed, finds nvcc and is enabled (its own check)."""
    backend, _ = try_import("fla.ops.common.backends.tilelang")
    return backend is not None and backend.CommonTileLangBackend.can_use()


def simple_gla_backward_refusal(dtype: str) -> str | None:
    """The reason fla 0.6.0 will refuse Simple GLA's backward on this GPU and Triton, or None.

    Args:
        dtype: the inputs' dtype name.
    """
    utils, _ = try_import("fla.utils")
    if utils is None:
        return None
    broken_triton = getattr(utils, "TRITON_ABOVE_3_4_0", False) and not getattr(
        utils, "TRITON_ABOVE_3_7_1", True
    )
    if not (getattr(utils, "IS_NVIDIA_HOPPER", False) and broken_triton):
        return None
    if dtype == "float32" and _tilelang_takes_over():
        return None
    import triton

    return (
        "fla refuses the gated backward (chunk_bwd_dqkwg) on Hopper with Triton >= 3.4.0 and < 3.7.1 "
        f"(wrong results, fla issue #640); Triton here is {triton.__version__}. Needs Triton >= 3.7.1 "
        "(tilelang helps only fp32 inputs: Simple GLA's backward keeps its states in fp32)"
    )


class _FlaAdapter(Adapter):
    family = "gla"
    layout = "BTHD"
    autotuned = True  # fla autotunes most chunk kernels (GLA's backward: about 100 configs in fla 0.6)
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
        dtype = torch_dtype(case.dtype)
        shape_qk = (case.batch, case.seq_len, case.num_heads, case.head_dim_qk)
        inputs: dict[str, Any] = {
            "q": randn(shape_qk, gen, device, dtype),
            "k": randn(shape_qk, gen, device, dtype),
            "v": randn((case.batch, case.seq_len, case.num_heads, case.head_dim_v), gen, device, dtype),
        }
        gate_shape = (case.batch, case.seq_len, case.num_heads)
        if self.per_channel_gate:
            gate_shape += (case.head_dim_qk,)
        pre_activation = randn(gate_shape, gen, device, torch_dtype("float32"))
        inputs["g"] = F.logsigmoid(pre_activation + FORGET_GATE_BIAS).to(dtype)
        grad_if(inputs, ("q", "k", "v", "g"), case.mode)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        kernel = getattr(importlib.import_module(self.module), self.function)
        out, _ = kernel(inputs["q"], inputs["k"], inputs["v"], g=inputs["g"])
        return out

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The decay linear-attention recurrence in float64 with fla's scale Dqk^-0.5."""
        from tfla_bench.correctness import decay_linear_attention

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
        return mode_flops(case.batch * case.num_heads * per_head, "gla", mode)

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
        return mode_bytes(case.batch * case.num_heads * per_head, "gla", mode)


@register
class Gla(_FlaAdapter):
    """fla's chunkwise GLA (per-channel log forget gates)."""

    name = "gla"
    module = "fla.ops.gla"
    function = "chunk_gla"
    per_channel_gate = True
    constraints = (
        "no head-dim limit (fla tiles K and V); chunk size fixed by fla (64); first call autotunes long"
    )
    flop_terms = staticmethod(gla_flop_terms)
    byte_terms = staticmethod(gla_byte_terms)

    def fla_chunk(self, case: Case) -> int:
        return min(gla_chunk_size(case.seq_len), case.seq_len)


@register
class SimpleGla(_FlaAdapter):
    """fla's chunkwise Simple GLA (one log forget gate per head and token)."""

    name = "simple_gla"
    module = "fla.ops.simple_gla"
    function = "chunk_simple_gla"
    constraints = (
        "no head-dim limit (fla tiles K and V); fwbw in 16 bit needs even head dims; "
        "fwbw refused by fla on Hopper with Triton 3.4-3.7.0"
    )
    flop_terms = staticmethod(simple_gla_flop_terms)
    byte_terms = staticmethod(simple_gla_byte_terms)

    def check(self, case: Case) -> str | None:
        reason = super().check(case)
        if reason is not None or case.mode != "fwbw":
            return reason
        if case.dtype != "float32" and (case.head_dim_qk % 2 or case.head_dim_v % 2):
            return f"fla's 16-bit backward needs even head dims, got {case.head_dim_qk} and {case.head_dim_v}"
        if cuda_reason() is not None or not is_installed("fla"):
            return None
        return simple_gla_backward_refusal(case.dtype)

    def fla_chunk(self, case: Case) -> int:
        return min(SIMPLE_GLA_CHUNK, case.seq_len)
