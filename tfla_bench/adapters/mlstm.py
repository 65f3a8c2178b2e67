"""The mLSTM adapter family (layout `[B, NH, T, D]`): what our kernels' adapters and the official
peers (`tfla_bench.baselines.mlstm_kernels_*`) share.

- `MlstmAdapter`: the family, layout and gate shape;
- `ChunkwiseMlstmAdapter`: inputs, chunk size, float64 reference and chunkwise counts of every
  chunkwise mLSTM kernel, with the published series each answers to (`XL_CHUNK_SIG`, ...);
- `OwnKernelAdapter`: availability (CUDA, or any device under Triton's interpreter, whose rows
  say they are no speed claim) and shape rules of our Triton kernels (`limit_chunk` and
  `TflaAdapter`, our TFLA xl_chunk kernels' limits and call for `tfla_exp` and `tfla_sig`).

All mLSTM adapters draw the same inputs from the same seeded generator: q, k, v and i standard
normal, f standard normal plus 3 (a forget gate of 0.95 on average, so the state carries across
chunks). FLOPs and bytes come from the paper's counts
(`tfla_bench.model.counts`): the parallel formulation for `mlstm_torch`, the chunkwise one for the
TFLA kernels, times batch and heads, with the model's backward factor for `fwbw`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.registry import NO_SPEED_CLAIM, Adapter, GateShape, PublishedSeries
from tfla_bench.adapters.support import (
    bool_param,
    cuda_reason,
    element_bytes,
    generator,
    grad_if,
    qkv,
    randn,
    torch_dtype,
    try_import,
    unknown_params_reason,
)
from tfla_bench.adapters.workloads import Case
from tfla_bench.kernels import contract
from tfla_bench.kernels.contract import MAX_CHUNK, MAX_HEAD_DIM, MIN_CHUNK, MIN_HEAD_DIM, SEQ_LEN_MULTIPLE
from tfla_bench.model.counts import LINEAR_RNN_BACKWARD, mlstm_bytes, mlstm_flops

if TYPE_CHECKING:
    # torch takes seconds to import; an adapter's facts (name, limits) need none of it.
    import torch

FORGET_GATE_BIAS = 3.0
INTERPRETER_NOTE = f"timed in Triton's interpreter (TRITON_INTERPRET=1): {NO_SPEED_CLAIM}"
TFLA_DEFAULT_CHUNK = 128

# The paper's series of the TFLA kernels: ours rank first, the official peers (rank 1) next.
XL_CHUNK_SIG = PublishedSeries(
    "chunkwise--triton_xl_chunk_siging",
    uses_chunk_size=True,
    note="TFLA mLSTMsig (two-level chunkwise), normalize=False in every TFLA run",
)
XL_CHUNK_EXP = PublishedSeries(
    "chunkwise--triton_xl_chunk", uses_chunk_size=True, note="TFLA mLSTMexp (two-level chunkwise)"
)
LIMIT_CHUNK = PublishedSeries(
    "chunkwise--triton_limit_chunk",
    uses_chunk_size=True,
    note="mLSTMexp with FLA-style one-level chunkwise parallelism (chunk 64 in the paper)",
)


def mlstm_inputs(case: Case, device: str) -> dict[str, Any]:
    """q, k `[B, NH, T, Dqk]`, v `[B, NH, T, Dv]` and gate pre-activations i, f `[B, NH, T]` (case dtype)."""
    gen = generator(case, device)
    dtype = torch_dtype(case.dtype)
    gate_shape = (case.batch, case.num_heads, case.seq_len)
    inputs: dict[str, Any] = qkv(case, gen, device, "BHTD")
    inputs["i"] = randn(gate_shape, gen, device, dtype)
    inputs["f"] = (randn(gate_shape, gen, device, torch_dtype("float32")) + FORGET_GATE_BIAS).to(dtype)
    grad_if(inputs, ("q", "k", "v", "i", "f"), case.mode)
    return inputs


def mlstm_counts(
    case: Case, mode: str, gate: str, formulation: str, chunk_size: int | None, state_bytes: int = 4
) -> tuple[float, float]:
    """(FLOPs, bytes) of one call: the model's per-head counts times batch * heads, in `mode`, with
    `state_bytes` per element of the chunk states in HBM."""
    shape = dict(
        seq_len=case.seq_len, chunk_size=chunk_size, head_dim_qk=case.head_dim_qk, head_dim_v=case.head_dim_v
    )
    size = element_bytes(case.dtype)
    heads = case.batch * case.num_heads
    flops = heads * mlstm_flops(gate, formulation, **shape)
    moved = heads * mlstm_bytes(
        gate, formulation, qkv_bytes=size, gate_bytes=size, state_bytes=state_bytes, **shape
    )
    return LINEAR_RNN_BACKWARD.total_flops(flops, mode), LINEAR_RNN_BACKWARD.total_bytes(moved, mode)


def float64_inputs(inputs: dict[str, Any]) -> list[torch.Tensor]:
    """q, k, v, i, f of an mLSTM adapter's inputs, detached, in float64."""
    # torch takes seconds to import; an adapter's facts (name, limits) need none of it.
    import torch

    return [inputs[name].detach().to(torch.float64) for name in ("q", "k", "v", "i", "f")]


def mlstm_reference(inputs: dict[str, Any], gate: str, normalize: bool = False) -> torch.Tensor:
    """`reference.mlstm_parallel` in float64 on an mLSTM adapter's inputs (eps 1e-6, as the kernels)."""
    # our kernels import torch and Triton; only a call needs them.
    from tfla_bench.kernels.reference import mlstm_parallel

    h, _ = mlstm_parallel(*float64_inputs(inputs), gate=gate, normalize=normalize)
    return h


class MlstmAdapter(Adapter):
    """The mLSTM family: layout `[B, NH, T, D]`; the gate runs 4 chunks of 64 with Dqk != Dv."""

    family = "mlstm"
    layout = "BHTD"
    gate_shape = GateShape(batch=2, seq_len=256, num_heads=2, head_dim_qk=64, head_dim_v=128, chunk_size=64)


class ChunkwiseMlstmAdapter(MlstmAdapter):
    """What every chunkwise mLSTM adapter shares (ours and the official peers): the mLSTM inputs plus
    the chunk size (and, for an mLSTMsig kernel, the `normalize` param, default false), the float64
    reference of `gate`, and the model's chunkwise counts at the chunk the kernel runs (`chunk`: the
    case's, else `default_chunk`)."""

    uses_chunk_size = True
    gate = "exp"
    default_chunk = TFLA_DEFAULT_CHUNK

    @property
    def known_params(self) -> tuple[str, ...]:
        return ("normalize", "seed") if self.gate == "sig" else ("seed",)

    @property
    def param_defaults(self) -> dict[str, Any]:  # type: ignore[override]
        """mLSTMsig's `normalize` is false unless a case sets it, as in all the paper's TFLA runs."""
        return {"normalize": False} if self.gate == "sig" else {}

    def chunk(self, case: Case) -> int:
        """The chunk size the kernel runs."""
        return case.chunk_size if case.chunk_size is not None else self.default_chunk

    def params_reason(self, case: Case) -> str | None:
        """Why the case's params are wrong for this kernel (unknown names, a non-boolean `normalize`)."""
        reason = unknown_params_reason(case, self.name, self.known_params)
        if reason is None and self.gate == "sig":
            try:
                bool_param(case, "normalize", self.param_defaults["normalize"])
            except ValueError as exc:
                return str(exc)
        return reason

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """The mLSTM inputs (module docstring), the chunk size and, for mLSTMsig, `normalize`."""
        inputs = mlstm_inputs(case, device) | {"chunk_size": self.chunk(case)}
        if self.gate == "sig":
            inputs["normalize"] = bool_param(case, "normalize", self.param_defaults["normalize"])
        return inputs

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return mlstm_reference(inputs, self.gate, inputs.get("normalize", False))

    def state_bytes(self, case: Case) -> int:
        """Bytes per element of the chunk states the kernel keeps in HBM: float32 (the official kernels)."""
        return 4

    def flops(self, case: Case, mode: str) -> float:
        return mlstm_counts(case, mode, self.gate, "chunkwise", self.chunk(case), self.state_bytes(case))[0]

    def bytes(self, case: Case, mode: str) -> float:
        return mlstm_counts(case, mode, self.gate, "chunkwise", self.chunk(case), self.state_bytes(case))[1]


class OwnKernelAdapter(ChunkwiseMlstmAdapter):
    """Our Triton kernels of this package: CUDA (or Triton's interpreter) and `kernel_module` to run;
    chunk sizes a power of two of at least `MIN_CHUNK` (and at most `max_chunk`, None: no bound) not
    above T; head dims multiples of 16 in [`MIN_HEAD_DIM`, `MAX_HEAD_DIM`]."""

    kernel_module = ""
    config_kernel = "tfla"  # the kernel's name in `tfla_bench.kernels.config`
    max_chunk: int | None = None
    packages = ("tfla-bench", "triton")

    def state_bytes(self, case: Case) -> int:
        """Bytes per element of the chunk states in HBM: float32 or the input dtype, by the kernel's
        rule (`tfla_bench.kernels.config.float32_states`) at the config it runs on this GPU."""
        # torch takes seconds to import; an adapter's facts (name, limits) need none of it.
        import torch

        # our kernels import torch and Triton; only a call needs them.
        from tfla_bench.kernels import config as kconfig

        gpu = kconfig.gpu_target(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        dims = (case.head_dim_qk, case.head_dim_v)
        config = kconfig.config_for(
            self.config_kernel, *dims, self.chunk(case), torch_dtype(case.dtype), self.gate, gpu
        )
        wide = kconfig.float32_states(self.config_kernel, self.gate, case.head_dim_qk, config)
        return 4 if wide else element_bytes(case.dtype)

    @property
    def cpu_capable(self) -> bool:  # type: ignore[override]
        """Under Triton's interpreter the kernels run on the CPU (slowly: `row_note`)."""
        return contract.interpreted()

    def available(self) -> str | None:
        if not contract.interpreted():
            reason = cuda_reason()
            if reason is not None:
                return f"{reason}; TRITON_INTERPRET=1 runs it on the CPU in Triton's interpreter (slow)"
        _, reason = try_import(self.kernel_module)
        return reason

    def row_note(self) -> str:
        return INTERPRETER_NOTE if contract.interpreted() else ""

    def dtype_reason(self, dtype: str) -> str | None:
        # The interpreter runs the kernels in NumPy, which has no bfloat16: Triton 3.6 either fails
        # (`get_bf16`) or computes garbage (relative errors of 1e8), depending on the kernel.
        if dtype == "bfloat16" and contract.interpreted():
            return "Triton's interpreter (TRITON_INTERPRET=1) cannot run bfloat16; use float32 or float16"
        return None

    def shape_reason(self, case: Case) -> str | None:
        """Why the case's dtype, chunk size or head dims break the rules above, or None."""
        chunk = self.chunk(case)
        reason = self.dtype_reason(case.dtype) or contract.chunk_reason(chunk, self.max_chunk)
        if reason is None and chunk > case.seq_len:
            reason = f"chunk_size {chunk} is larger than seq_len {case.seq_len}"
        for name, dim in (("head_dim_qk", case.head_dim_qk), ("head_dim_v", case.head_dim_v)):
            reason = reason or contract.head_dim_reason(name, dim)
        return reason


class TflaAdapter(OwnKernelAdapter):
    """Our TFLA xl_chunk Triton kernels (`tfla_bench.kernels.tfla.mlstm_tfla`)."""

    kernel_module = "tfla_bench.kernels.tfla"
    max_chunk = MAX_CHUNK
    constraints = (
        f"T % {SEQ_LEN_MULTIPLE} == 0; chunk a power of two in [{MIN_CHUNK}, {MAX_CHUNK}], <= T (default "
        f"{TFLA_DEFAULT_CHUNK}); head dims multiples of 16 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    )

    def check(self, case: Case) -> str | None:
        reason = self.params_reason(case)
        if reason is not None:
            return reason
        if case.seq_len % SEQ_LEN_MULTIPLE:
            return f"seq_len must be a multiple of {SEQ_LEN_MULTIPLE}, got {case.seq_len}"
        return self.shape_reason(case)

    def _kwargs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        kwargs = {"gate": self.gate, "chunk_size": inputs["chunk_size"]}
        return kwargs | ({"normalize": inputs["normalize"]} if self.gate == "sig" else {})

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        # our kernels import torch and Triton; only a call needs them.
        from tfla_bench.kernels.tfla import mlstm_tfla

        return mlstm_tfla(*(inputs[name] for name in ("q", "k", "v", "i", "f")), **self._kwargs(inputs))
