"""LightningAttention-2 (OpenNLPLab's `lightning-attn` 0.0.5), layout `[B, H, T, D]`.

`lightning2` calls `lightning_attn.ops.triton.lightning_attn2.lightning_attn2(q, k, v, s)`, the
Triton kernel the TFLA paper measured (Fig. 16). It computes linear attention with a fixed decay
per head, `o_t = sum_{s <= t} exp(-slope_h * (t - s)) (q_t . k_s) v_s` (no score scale), block by
block (64 tokens) and fully recurrently over blocks: the state never leaves the chip.

Decay slopes `s` `[H, 1, 1]` (fp32) are ALiBi's geometric slopes, as the paper's benchmark and
LightningAttention-2's models use: for H a power of two, slope_h = 2^(-8 (h + 1) / H); otherwise
those of the next lower power of two, filled up with every other slope of twice that count.

Constraints: Dqk == Dv (the paper: "only supports equal head dimension ... at most 128"); the
kernel indexes `tl.arange(0, d)`, so the head dim is a power of two, at least 16 for `tl.dot`.
Note that fla's `chunk_lightning_attn` is Simple GLA with fixed decays, not this kernel.
"""

from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.registry import Adapter, GateShape, PlotStyle, PublishedSeries, register
from tfla_bench.adapters.support import (
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
from tfla_bench.kernels.contract import is_power_of_two
from tfla_bench.model.counts import LINEAR_RNN_BACKWARD
from tfla_bench.model.families import (
    LIGHTNING_BLOCK,
    lightning_byte_terms,
    lightning_flop_terms,
)

if TYPE_CHECKING:
    import torch

LIGHTNING_MODULE = "lightning_attn.ops.triton.lightning_attn2"
MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 128


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al., 2022): geometric, 2^(-8/n) ... 2^(-8) for n heads.

    Args:
        num_heads: number of heads H.

    Examples::

        >>> alibi_slopes(2)
        [0.0625, 0.00390625]
    """
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive, got {num_heads}")

    def geometric(count: int) -> list[float]:
        start = 2.0 ** (-8.0 / count)
        return [start ** (index + 1) for index in range(count)]

    if is_power_of_two(num_heads):
        return geometric(num_heads)
    lower = 2 ** math.floor(math.log2(num_heads))
    return geometric(lower) + geometric(2 * lower)[0::2][: num_heads - lower]


@register
class LightningAttention2(Adapter):
    """LightningAttention-2's Triton kernel with ALiBi decay slopes."""

    name = "lightning2"
    family = "lightning"
    packages = ("lightning-attn",)
    precompile = "own"  # batch, heads and sequence length are constexprs of its kernels
    layout = "BHTD"
    constraints = (
        f"head_dim_qk == head_dim_v, a power of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]; "
        f"blocks of {LIGHTNING_BLOCK} (no chunk size)"
    )
    gate_shape = GateShape(batch=2, seq_len=256, num_heads=4, head_dim_qk=64, head_dim_v=64)
    published = PublishedSeries(
        "lightning_attn2", note="LightningAttention-2 (OpenNLPLab lightning-attn), Dqk == Dv <= 128"
    )
    plot_style = PlotStyle("#8c510a")

    def available(self) -> str | None:
        if not is_installed("lightning_attn"):
            return "lightning-attn not installed (pip install lightning-attn==0.0.5)"
        reason = cuda_reason()
        if reason is not None:
            return reason
        _, reason = try_import(LIGHTNING_MODULE)
        return reason

    def check(self, case: Case) -> str | None:
        reason = unknown_params_reason(case, self.name, ("seed",))
        if reason is not None:
            return reason
        if case.head_dim_qk != case.head_dim_v:
            return f"needs head_dim_qk == head_dim_v, got {case.head_dim_qk} and {case.head_dim_v}"
        dim = case.head_dim_qk
        if not is_power_of_two(dim) or not MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM:
            return f"head dim must be a power of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {dim}"
        return None

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """q, k, v `[B, H, T, D]` standard normal; slopes s `[H, 1, 1]` fp32 (no gradient)."""
        import torch

        inputs: dict[str, Any] = qkv(case, generator(case, device), device, self.layout)
        grad_if(inputs, ("q", "k", "v"), case.mode)
        slopes = torch.tensor(alibi_slopes(case.num_heads), dtype=torch.float32, device=device)
        inputs["s"] = slopes.reshape(-1, 1, 1)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        kernel = importlib.import_module(LIGHTNING_MODULE).lightning_attn2
        return kernel(inputs["q"], inputs["k"], inputs["v"], inputs["s"])

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The decay linear-attention recurrence in float64 with log decay -slope per head, scale 1."""
        from tfla_bench.kernels.reference import decay_linear_attention

        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        log_decay = (-inputs["s"].reshape(1, -1, 1)).expand(q.shape[0], -1, q.shape[2])
        return decay_linear_attention(q, k, v, log_decay, scale=1.0)

    def flops(self, case: Case, mode: str) -> float:
        block = min(LIGHTNING_BLOCK, case.seq_len)
        terms = lightning_flop_terms(head_dim_qk=case.head_dim_qk, head_dim_v=case.head_dim_v)
        return LINEAR_RNN_BACKWARD.total_flops(
            case.batch * case.num_heads * terms.total(case.seq_len, block), mode
        )

    def bytes(self, case: Case, mode: str) -> float:
        block = min(LIGHTNING_BLOCK, case.seq_len)
        terms = lightning_byte_terms(
            head_dim_qk=case.head_dim_qk, head_dim_v=case.head_dim_v, qkv_bytes=element_bytes(case.dtype)
        )
        return LINEAR_RNN_BACKWARD.total_bytes(
            case.batch * case.num_heads * terms.total(case.seq_len, block), mode
        )
