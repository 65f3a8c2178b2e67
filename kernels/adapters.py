"""Registry adapters for the kernels in this package (mLSTM family, layout `[B, NH, T, D]`).

- `mlstm_torch`: the fully parallel stabilized mLSTM in plain PyTorch (appendix B.1,
  `reference.mlstm_parallel`, computed in float32 or float64), param `gate` = `exp` (default) or
  `sig`; runs on the CPU; `O(T^2)` memory.
- `tfla_exp`, `tfla_sig`: our Triton TFLA xl_chunk kernels (`tfla.mlstm_tfla`) for mLSTMexp and
  mLSTMsig (`tfla_sig` takes param `normalize`, default false); `chunk_size` is the case's (default 128).
- `limit_chunk`: our one-level chunkwise mLSTMexp kernel (`limit_chunk.mlstm_limit_chunk`, FLA style:
  a whole L x L tile per program); `chunk_size` is the case's (default 64); a chunk beyond its on-chip
  limit is unsupported with the limit as the reason.

Inputs are those of the official peer adapters (`baselines/mlstm_kernels.py`), drawn from the same
seeded generator: q, k, v and i standard normal, f standard normal plus 3 (a forget gate of 0.95 on
average, so the state carries across chunks). FLOPs and bytes come from the paper's counts
(`tfla_bench.model.counts`): the parallel formulation for `mlstm_torch`, the chunkwise one for the
TFLA kernels, times batch and heads, with the model's backward factor for `fwbw`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.baselines._common import (
    bool_param,
    cuda_reason,
    element_bytes,
    generator,
    grad_if,
    is_power_of_two,
    randn,
    torch_dtype,
    try_import,
    unknown_params_reason,
)
from tfla_bench.model.counts import mlstm_bytes, mlstm_flops, mode_bytes, mode_flops
from tfla_bench.registry import Adapter, register
from tfla_bench.workloads import Case

if TYPE_CHECKING:
    import torch

FORGET_GATE_BIAS = 3.0
TFLA_DEFAULT_CHUNK = 128
# The limits `mlstm_tfla` enforces (kept here so that importing the adapters needs no Triton).
SEQ_LEN_MULTIPLE = 16
MIN_CHUNK, MAX_CHUNK = 16, 4096
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 1024
REFERENCE_CHUNK = 64


def mlstm_inputs(case: Case, device: str) -> dict[str, Any]:
    """q, k `[B, NH, T, Dqk]`, v `[B, NH, T, Dv]` and gate pre-activations i, f `[B, NH, T]` (case dtype)."""
    gen = generator(case, device)
    dtype = torch_dtype(case.dtype)
    shape_qk = (case.batch, case.num_heads, case.seq_len, case.head_dim_qk)
    gate_shape = (case.batch, case.num_heads, case.seq_len)
    inputs: dict[str, Any] = {
        "q": randn(shape_qk, gen, device, dtype),
        "k": randn(shape_qk, gen, device, dtype),
        "v": randn((case.batch, case.num_heads, case.seq_len, case.head_dim_v), gen, device, dtype),
        "i": randn(gate_shape, gen, device, dtype),
        "f": (randn(gate_shape, gen, device, torch_dtype("float32")) + FORGET_GATE_BIAS).to(dtype),
    }
    grad_if(inputs, ("q", "k", "v", "i", "f"), case.mode)
    return inputs


def mlstm_counts(
    case: Case, mode: str, gate: str, formulation: str, chunk_size: int | None
) -> tuple[float, float]:
    """(FLOPs, bytes) of one call: the model's per-head counts times batch * heads, in `mode`."""
    shape = dict(
        seq_len=case.seq_len, chunk_size=chunk_size, head_dim_qk=case.head_dim_qk, head_dim_v=case.head_dim_v
    )
    size = element_bytes(case.dtype)
    heads = case.batch * case.num_heads
    flops = heads * mlstm_flops(gate, formulation, **shape)
    moved = heads * mlstm_bytes(gate, formulation, qkv_bytes=size, gate_bytes=size, state_bytes=4, **shape)
    return mode_flops(flops, "mlstm", mode), mode_bytes(moved, "mlstm", mode)


def _float64(inputs: dict[str, Any]) -> list[torch.Tensor]:
    import torch

    return [inputs[name].detach().to(torch.float64) for name in ("q", "k", "v", "i", "f")]


def mlstm_reference(inputs: dict[str, Any], gate: str, normalize: bool = False) -> torch.Tensor:
    """`reference.mlstm_parallel` in float64 on an mLSTM adapter's inputs (eps 1e-6, as the kernels)."""
    from tfla_bench.kernels.reference import mlstm_parallel

    h, _ = mlstm_parallel(*_float64(inputs), gate=gate, normalize=normalize)
    return h


@register
class MlstmTorch(Adapter):
    """The fully parallel stabilized mLSTM in PyTorch (appendix B.1); param `gate` (exp or sig)."""

    name = "mlstm_torch"
    family = "mlstm"
    layout = "BHTD"
    cpu_capable = True
    constraints = "param gate = exp (default) or sig; O(T^2) memory"
    known_params = ("gate", "seed")

    def _gate(self, case: Case) -> str:
        return str(case.param("gate", "exp"))

    def check(self, case: Case) -> str | None:
        reason = unknown_params_reason(case, self.name, self.known_params)
        if reason is not None:
            return reason
        if self._gate(case) not in ("exp", "sig"):
            return f"param gate must be exp or sig, got {self._gate(case)!r}"
        return None

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """The mLSTM inputs (module docstring) and the gate."""
        return mlstm_inputs(case, device) | {"gate": self._gate(case)}

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        from tfla_bench.kernels.reference import mlstm_parallel

        h, _ = mlstm_parallel(*(inputs[name] for name in ("q", "k", "v", "i", "f")), gate=inputs["gate"])
        return h

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The chunkwise formulation (appendix B.2) in float64: a different algorithm, same function."""
        from tfla_bench.kernels.reference import mlstm_chunkwise

        h, _ = mlstm_chunkwise(*_float64(inputs), gate=inputs["gate"], chunk_size=REFERENCE_CHUNK)
        return h

    def flops(self, case: Case, mode: str) -> float:
        return mlstm_counts(case, mode, self._gate(case), "parallel", None)[0]

    def bytes(self, case: Case, mode: str) -> float:
        return mlstm_counts(case, mode, self._gate(case), "parallel", None)[1]


class ChunkwiseMlstmAdapter(Adapter):
    """What every chunkwise mLSTM adapter shares (ours and the official peers): the mLSTM inputs plus
    the chunk size (and, for an mLSTMsig kernel, the `normalize` param, default false), the float64
    reference of `gate`, and the model's chunkwise counts at the chunk the kernel runs (`chunk`: the
    case's, else `default_chunk`)."""

    family = "mlstm"
    layout = "BHTD"
    uses_chunk_size = True
    gate = "exp"
    default_chunk = TFLA_DEFAULT_CHUNK

    @property
    def known_params(self) -> tuple[str, ...]:
        return ("normalize", "seed") if self.gate == "sig" else ("seed",)

    def chunk(self, case: Case) -> int:
        """The chunk size the kernel runs."""
        return case.chunk_size if case.chunk_size is not None else self.default_chunk

    def params_reason(self, case: Case) -> str | None:
        """Why the case's params are wrong for this kernel (unknown names, a non-boolean `normalize`)."""
        reason = unknown_params_reason(case, self.name, self.known_params)
        if reason is None and self.gate == "sig":
            try:
                bool_param(case, "normalize", False)
            except ValueError as exc:
                return str(exc)
        return reason

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """The mLSTM inputs (module docstring), the chunk size and, for mLSTMsig, `normalize`."""
        inputs = mlstm_inputs(case, device) | {"chunk_size": self.chunk(case)}
        if self.gate == "sig":
            inputs["normalize"] = bool_param(case, "normalize", False)
        return inputs

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return mlstm_reference(inputs, self.gate, inputs.get("normalize", False))

    def flops(self, case: Case, mode: str) -> float:
        return mlstm_counts(case, mode, self.gate, "chunkwise", self.chunk(case))[0]

    def bytes(self, case: Case, mode: str) -> float:
        return mlstm_counts(case, mode, self.gate, "chunkwise", self.chunk(case))[1]


class _TFLAAdapter(ChunkwiseMlstmAdapter):
    """Our TFLA xl_chunk Triton kernels (`tfla_bench.kernels.tfla.mlstm_tfla`)."""

    constraints = (
        f"T % {SEQ_LEN_MULTIPLE} == 0; chunk a power of two in [{MIN_CHUNK}, {MAX_CHUNK}], <= T (default "
        f"{TFLA_DEFAULT_CHUNK}); head dims multiples of 16 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    )

    def available(self) -> str | None:
        reason = cuda_reason()
        if reason is not None:
            return reason
        _, reason = try_import("tfla_bench.kernels.tfla")
        return reason

    def check(self, case: Case) -> str | None:
        reason = self.params_reason(case)
        if reason is not None:
            return reason
        if case.seq_len % SEQ_LEN_MULTIPLE:
            return f"seq_len must be a multiple of {SEQ_LEN_MULTIPLE}, got {case.seq_len}"
        chunk = self.chunk(case)
        if not (is_power_of_two(chunk) and MIN_CHUNK <= chunk <= MAX_CHUNK):
            return f"chunk_size must be a power of two in [{MIN_CHUNK}, {MAX_CHUNK}], got {chunk}"
        if chunk > case.seq_len:
            return f"chunk_size {chunk} is larger than seq_len {case.seq_len}"
        for name, dim in (("head_dim_qk", case.head_dim_qk), ("head_dim_v", case.head_dim_v)):
            if not (MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM and dim % 16 == 0):
                return f"{name} must be a multiple of 16 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {dim}"
        return None

    def _kwargs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        kwargs = {"gate": self.gate, "chunk_size": inputs["chunk_size"]}
        return kwargs | ({"normalize": inputs["normalize"]} if self.gate == "sig" else {})

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        from tfla_bench.kernels.tfla import mlstm_tfla

        return mlstm_tfla(*(inputs[name] for name in ("q", "k", "v", "i", "f")), **self._kwargs(inputs))


@register
class TFLAExp(_TFLAAdapter):
    """Our TFLA mLSTMexp kernels (xl_chunk)."""

    name = "tfla_exp"


@register
class TFLASig(_TFLAAdapter):
    """Our TFLA mLSTMsig kernels (xl_chunk); param `normalize` (default false)."""

    name = "tfla_sig"
    gate = "sig"
    constraints = _TFLAAdapter.constraints + "; param normalize (default false)"


LIMIT_CHUNK_DEFAULT_CHUNK = 64


@register
class LimitChunk(ChunkwiseMlstmAdapter):
    """Our one-level chunkwise mLSTMexp kernel (`tfla_bench.kernels.limit_chunk.mlstm_limit_chunk`)."""

    name = "limit_chunk"
    default_chunk = LIMIT_CHUNK_DEFAULT_CHUNK  # the paper's limit_chunk runs
    constraints = (
        f"chunk a power of two >= {MIN_CHUNK}, <= T (default {LIMIT_CHUNK_DEFAULT_CHUNK}) whose L x L tile "
        "fits on chip: <= 128 for bf16/fp16, <= 64 for fp32; head dims multiples of 16 in "
        f"[{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    )

    def available(self) -> str | None:
        reason = cuda_reason()
        if reason is not None:
            return reason
        _, reason = try_import("tfla_bench.kernels.limit_chunk")
        return reason

    def check(self, case: Case) -> str | None:
        """Parameter, chunk and head-dim rules, then the kernel's on-chip limit (`unsupported_reason`)."""
        reason = self.params_reason(case)
        if reason is not None:
            return reason
        chunk = self.chunk(case)
        if not (is_power_of_two(chunk) and chunk >= MIN_CHUNK):
            return f"chunk_size must be a power of two >= {MIN_CHUNK}, got {chunk}"
        if chunk > case.seq_len:
            return f"chunk_size {chunk} is larger than seq_len {case.seq_len}"
        for name, dim in (("head_dim_qk", case.head_dim_qk), ("head_dim_v", case.head_dim_v)):
            if not (MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM and dim % 16 == 0):
                return f"{name} must be a multiple of 16 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {dim}"
        module, reason = try_import("tfla_bench.kernels.limit_chunk")
        if module is None:
            return reason
        return module.unsupported_reason(chunk, case.head_dim_qk, case.head_dim_v, torch_dtype(case.dtype))

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        from tfla_bench.kernels.limit_chunk import mlstm_limit_chunk

        qkvif = (inputs[name] for name in ("q", "k", "v", "i", "f"))
        return mlstm_limit_chunk(*qkvif, chunk_size=inputs["chunk_size"])
