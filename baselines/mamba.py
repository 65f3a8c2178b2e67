"""Mamba2's SSD and Mamba's selective scan from `mamba-ssm` 2.3.2.post1.

Case conventions (as in the published CSVs): num_heads H, head_dim_qk = the SSM state dim N,
head_dim_v = the head dim P (Mamba: inner channels = H * P, the paper used H = 1).

- `mamba2` calls `mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined(x, dt, A, B, C,
  chunk_size)` (the paper's `mamba2_noconv`): x `[B, T, H, P]`, dt `[B, T, H]`, A `[H]` fp32,
  B and C `[B, T, G, N]`, out `[B, T, H, P]`. Param `num_groups` G (default H: per-head B and C,
  the paper's setting). Chunk size: the case's, default 256.
- `mamba2_split_conv` calls `mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias,
  dt_bias, A, D, chunk_size, headdim=P, ngroups=G)` (the paper's `mamba2`: causal conv of width 4,
  SiLU, softplus(dt + dt_bias), D skip, z gate). Param `num_groups` (default 1, Mamba2's default).
  It needs `causal-conv1d` (a CUDA build).
- `mamba` calls `mamba_ssm.ops.selective_scan_interface.selective_scan_fn(u, delta, A, B, C, D=D,
  z=z)` with u, delta, z `[B, H*P, T]`, A `[H*P, N]` fp32, B and C `[B, N, T]`, D `[H*P]` fp32.
  It needs mamba-ssm's compiled extension `selective_scan_cuda`.

Value ranges, as Mamba's initialization: time steps dt log-uniform in [1e-3, 1e-1] (the split-conv
kernel gets dt_bias = softplus^-1 of such values and standard-normal raw dt), Mamba2's A uniform in
[-16, -1], Mamba's A = -(1, ..., N) per channel (S4D-real), D = 1. A and D stay fp32 whatever the
input dtype; everything else is in the case's dtype.

Import without the CUDA extension: mamba-ssm installed with MAMBA_SKIP_CUDA_BUILD=TRUE has no
`selective_scan_cuda`, and its package `__init__` imports `selective_scan_interface`, which imports
that extension, so `import mamba_ssm.ops.triton.ssd_combined` fails although the Triton SSD code
needs neither. `import_ssd_combined` handles exactly that error (ModuleNotFoundError naming
`selective_scan_cuda`): it registers `mamba_ssm` as a bare package (its `__path__` only, the
`__init__` not run) and imports the submodule through it. Any other import error is raised as is.
The extension is not stubbed, so `mamba` still reports it missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfla_bench.baselines._common import (
    cuda_reason,
    element_bytes,
    exception_line,
    generator,
    grad_if,
    int_param,
    is_installed,
    is_power_of_two,
    randn,
    torch_dtype,
    try_import,
    uniform,
    unknown_params_reason,
)
from tfla_bench.model.counts import mode_bytes, mode_flops
from tfla_bench.model.families import (
    causal_conv1d_bytes,
    causal_conv1d_flops,
    mamba2_byte_terms,
    mamba2_flop_terms,
    selective_scan_bytes,
    selective_scan_flops,
)
from tfla_bench.registry import Adapter, register
from tfla_bench.workloads import Case

if TYPE_CHECKING:
    import torch

MAMBA_INSTALL = (
    "mamba-ssm not installed (MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE "
    "pip install --no-build-isolation mamba-ssm==2.3.2.post1)"
)
SSD_MODULE = "mamba_ssm.ops.triton.ssd_combined"
SELECTIVE_SCAN_MODULE = "mamba_ssm.ops.selective_scan_interface"
MISSING_EXTENSION = "selective_scan_cuda"
DEFAULT_CHUNK = 256
CONV_WIDTH = 4
DT_MIN, DT_MAX = 1e-3, 1e-1
A_MIN, A_MAX = 1.0, 16.0
MAX_SELECTIVE_SCAN_STATE = 256


def import_ssd_combined() -> ModuleType:
    """Import `mamba_ssm.ops.triton.ssd_combined`, also when mamba-ssm lacks `selective_scan_cuda`.

    Raises:
        ImportError: any import failure other than the missing `selective_scan_cuda` extension.
    """
    try:
        return importlib.import_module(SSD_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != MISSING_EXTENSION:
            raise
    spec = importlib.util.find_spec("mamba_ssm")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("mamba_ssm is not an importable package")
    sys.modules["mamba_ssm"] = importlib.util.module_from_spec(spec)
    return importlib.import_module(SSD_MODULE)


def _ssd_reason() -> str | None:
    """Why the Triton SSD module cannot be used here, or None."""
    if not is_installed("mamba_ssm"):
        return MAMBA_INSTALL
    reason = cuda_reason()
    if reason is not None:
        return reason
    try:
        import_ssd_combined()
    except Exception as exc:  # reported as the reason, never hidden
        return f"import {SSD_MODULE} failed: {exception_line(exc)}"
    return None


def _time_steps(
    shape: tuple[int, ...], gen: torch.Generator, device: str, dtype: torch.dtype
) -> torch.Tensor:
    """Time steps log-uniform in [DT_MIN, DT_MAX], Mamba's dt initialization range."""
    log_dt = uniform(shape, math.log(DT_MIN), math.log(DT_MAX), gen, device, torch_dtype("float32"))
    return log_dt.exp().to(dtype)


def ssd_reference(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
) -> torch.Tensor:
    """Mamba2's SSD as decay linear attention in float64: q = C, k = dt * B, v = x, log decay dt * A.

    `h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T`, `y_t = h_t^T C_t` per head; group g's B and C
    serve heads g * H/G ... (g + 1) * H/G - 1.

    Args:
        x: `[B, T, H, P]`.
        dt: time steps `[B, T, H]` (> 0).
        a: `[H]` (< 0).
        b: `[B, T, G, N]`.
        c: `[B, T, G, N]`.

    Returns:
        y `[B, T, H, P]` in float64.
    """
    import torch

    from tfla_bench.correctness import decay_linear_attention

    heads_per_group = x.shape[2] // b.shape[2]
    b64, c64 = (t.to(torch.float64).repeat_interleave(heads_per_group, dim=2) for t in (b, c))
    dt64 = dt.to(torch.float64)
    keys = b64 * dt64[..., None]
    log_decay = dt64 * a.to(torch.float64)
    y = decay_linear_attention(
        c64.transpose(1, 2), keys.transpose(1, 2), x.transpose(1, 2), log_decay.transpose(1, 2)
    )
    return y.transpose(1, 2)


class _Mamba2Base(Adapter):
    family = "mamba2"
    layout = "BTHD"
    autotuned = True  # mamba_ssm's SSD Triton kernels autotune
    uses_chunk_size = True
    default_groups: int | None = None

    def _groups(self, case: Case) -> int:
        default = self.default_groups if self.default_groups is not None else case.num_heads
        return int_param(case, "num_groups", default)

    def _chunk(self, case: Case) -> int:
        return case.chunk_size if case.chunk_size is not None else DEFAULT_CHUNK

    def check(self, case: Case) -> str | None:
        reason = unknown_params_reason(case, self.name, ("num_groups", "seed"))
        if reason is not None:
            return reason
        try:
            groups = self._groups(case)
        except ValueError as exc:
            return str(exc)
        if case.num_heads % groups:
            return f"num_groups {groups} must divide num_heads {case.num_heads}"
        chunk = self._chunk(case)
        if not is_power_of_two(chunk) or chunk < 16:
            return f"chunk_size must be a power of two >= 16, got {chunk}"
        return None

    def _ssd_flops(self, case: Case) -> float:
        terms = mamba2_flop_terms(
            state_dim=case.head_dim_qk,
            head_dim=case.head_dim_v,
            groups_per_head=self._groups(case) / case.num_heads,
        )
        return case.batch * case.num_heads * terms.total(case.seq_len, min(self._chunk(case), case.seq_len))

    def _ssd_bytes(self, case: Case) -> float:
        size = element_bytes(case.dtype)
        terms = mamba2_byte_terms(
            state_dim=case.head_dim_qk,
            head_dim=case.head_dim_v,
            io_bytes=size,
            state_bytes=size,
            groups_per_head=self._groups(case) / case.num_heads,
        )
        return case.batch * case.num_heads * terms.total(case.seq_len, min(self._chunk(case), case.seq_len))


@register
class Mamba2(_Mamba2Base):
    """Mamba2's SSD scan (`mamba_chunk_scan_combined`), without conv, D or z."""

    name = "mamba2"
    constraints = (
        "param num_groups divides num_heads (default num_heads); chunk_size a power of two (default 256)"
    )

    def available(self) -> str | None:
        return _ssd_reason()

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """x `[B, T, H, P]`, dt `[B, T, H]`, A `[H]` fp32, B and C `[B, T, G, N]`, and chunk_size."""
        gen = generator(case, device)
        dtype = torch_dtype(case.dtype)
        groups = self._groups(case)
        state_shape = (case.batch, case.seq_len, groups, case.head_dim_qk)
        inputs: dict[str, Any] = {
            "x": randn((case.batch, case.seq_len, case.num_heads, case.head_dim_v), gen, device, dtype),
            "dt": _time_steps((case.batch, case.seq_len, case.num_heads), gen, device, dtype),
            "A": -uniform((case.num_heads,), A_MIN, A_MAX, gen, device, torch_dtype("float32")),
            "B": randn(state_shape, gen, device, dtype),
            "C": randn(state_shape, gen, device, dtype),
        }
        grad_if(inputs, ("x", "dt", "A", "B", "C"), case.mode)
        inputs["chunk_size"] = self._chunk(case)
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        ssd = import_ssd_combined()
        return ssd.mamba_chunk_scan_combined(
            inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], inputs["chunk_size"]
        )

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`ssd_reference` of the inputs."""
        return ssd_reference(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"])

    def flops(self, case: Case, mode: str) -> float:
        return mode_flops(self._ssd_flops(case), "mamba2", mode)

    def bytes(self, case: Case, mode: str) -> float:
        return mode_bytes(self._ssd_bytes(case), "mamba2", mode)


@register
class Mamba2SplitConv(_Mamba2Base):
    """Mamba2's fused conv + SSD path (`mamba_split_conv1d_scan_combined`)."""

    name = "mamba2_split_conv"
    default_groups = 1
    constraints = (
        "param num_groups divides num_heads (default 1); chunk_size a power of two (default 256); "
        "needs causal-conv1d"
    )

    def available(self) -> str | None:
        reason = _ssd_reason()
        if reason is not None:
            return reason
        if not is_installed("causal_conv1d"):
            return "causal-conv1d not installed (pip install causal-conv1d, a CUDA build)"
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
        dt0 = _time_steps((heads,), gen, device, fp32)
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
        """Causal depthwise conv + SiLU, softplus time steps, `ssd_reference`, D skip, SiLU(z) gate,
        in float64; `[B, T, H * P]`."""
        import torch
        import torch.nn.functional as F

        zxbcdt = inputs["zxbcdt"].to(torch.float64)
        weight = inputs["conv1d_weight"].to(torch.float64)
        heads, head_dim, groups = inputs["A"].shape[0], inputs["head_dim"], inputs["num_groups"]
        inner, channels = heads * head_dim, weight.shape[0]
        state_dim = (channels - inner) // (2 * groups)
        z, xbc, dt_raw = torch.split(zxbcdt, [inner, channels, heads], dim=-1)
        seq_len = xbc.shape[1]
        conv = F.conv1d(
            xbc.transpose(1, 2),
            weight[:, None, :],
            inputs["conv1d_bias"].to(torch.float64),
            padding=weight.shape[1] - 1,
            groups=channels,
        )
        xbc = F.silu(conv[..., :seq_len]).transpose(1, 2)
        x, b, c = torch.split(xbc, [inner, groups * state_dim, groups * state_dim], dim=-1)
        x = x.unflatten(-1, (heads, head_dim))
        b, c = (t.unflatten(-1, (groups, state_dim)) for t in (b, c))
        dt = F.softplus(dt_raw + inputs["dt_bias"].to(torch.float64))
        y = ssd_reference(x, dt, inputs["A"], b, c) + inputs["D"].to(torch.float64)[:, None] * x
        return (y * F.silu(z.unflatten(-1, (heads, head_dim)))).flatten(-2)

    def flops(self, case: Case, mode: str) -> float:
        inner = case.num_heads * case.head_dim_v
        conv = causal_conv1d_flops(seq_len=case.seq_len, channels=self._conv_channels(case), width=CONV_WIDTH)
        # Per token: softplus(dt + dt_bias) per head (5), D skip (2) and SiLU(z) gate (5) per channel.
        extra = case.seq_len * (5 * case.num_heads + 7 * inner)
        return mode_flops(self._ssd_flops(case) + case.batch * (conv + extra), "mamba2", mode)

    def bytes(self, case: Case, mode: str) -> float:
        size = element_bytes(case.dtype)
        channels = self._conv_channels(case)
        conv = causal_conv1d_bytes(seq_len=case.seq_len, channels=channels, io_bytes=size)
        # z and the raw dt are read from zxbcdt by the scan; the conv output is what the SSD reads.
        extra = case.seq_len * size * (case.num_heads * case.head_dim_v + case.num_heads)
        return mode_bytes(self._ssd_bytes(case) + case.batch * (conv + extra), "mamba2", mode)


@register
class Mamba(Adapter):
    """Mamba's selective scan (`selective_scan_fn`, CUDA extension)."""

    name = "mamba"
    family = "mamba"
    layout = "BDT"
    constraints = (
        f"head_dim_qk is the state dim (<= {MAX_SELECTIVE_SCAN_STATE}); channels = num_heads * head_dim_v; "
        "needs the compiled selective_scan_cuda"
    )

    def available(self) -> str | None:
        if not is_installed("mamba_ssm"):
            return MAMBA_INSTALL
        if not is_installed(MISSING_EXTENSION):
            return (
                "mamba-ssm was built without its CUDA extension selective_scan_cuda "
                "(MAMBA_SKIP_CUDA_BUILD=TRUE); selective_scan_fn needs it"
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
            "delta": _time_steps((case.batch, channels, case.seq_len), gen, device, dtype),
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
        """Per channel d: decay linear attention with q = C, k = delta_d * B, v = u_d and a log decay
        delta_d * A[d] per state channel; plus D u and the SiLU(z) gate; float64, `[B, D, T]`."""
        import torch
        import torch.nn.functional as F

        from tfla_bench.correctness import decay_linear_attention

        u, delta, z = (inputs[name].to(torch.float64) for name in ("u", "delta", "z"))
        b, c = (inputs[name].to(torch.float64).transpose(1, 2) for name in ("B", "C"))
        channels = u.shape[1]
        # Channels play the role of heads: [batch, channels, T, N] keys and queries, values of dim 1.
        queries = c[:, None].expand(-1, channels, -1, -1)
        keys = b[:, None] * delta[..., None]
        log_decay = delta[..., None] * inputs["A"].to(torch.float64)[None, :, None, :]
        y = decay_linear_attention(queries, keys, u[..., None], log_decay)[..., 0]
        y = y + inputs["D"].to(torch.float64)[:, None] * u
        return y * F.silu(z)

    def flops(self, case: Case, mode: str) -> float:
        per_sequence = selective_scan_flops(
            seq_len=case.seq_len, channels=case.num_heads * case.head_dim_v, state_dim=case.head_dim_qk
        )
        return mode_flops(case.batch * per_sequence, "mamba", mode)

    def bytes(self, case: Case, mode: str) -> float:
        per_sequence = selective_scan_bytes(
            seq_len=case.seq_len,
            channels=case.num_heads * case.head_dim_v,
            state_dim=case.head_dim_qk,
            io_bytes=element_bytes(case.dtype),
        )
        return mode_bytes(case.batch * per_sequence, "mamba", mode)
