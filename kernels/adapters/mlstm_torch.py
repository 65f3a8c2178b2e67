"""`mlstm_torch`: the fully parallel stabilized mLSTM in plain PyTorch (appendix B.1,
`reference.mlstm_parallel`, in the inputs' dtype), param `gate` = `exp` (default) or `sig`; runs on
the CPU; `O(T^2)` memory. Its gate reference is the chunkwise formulation: another algorithm, the
same function."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfla_bench.adapters.mlstm import MlstmAdapter, float64_inputs, mlstm_counts, mlstm_inputs
from tfla_bench.adapters.registry import DOTTED, PlotStyle, register
from tfla_bench.adapters.support import unknown_params_reason
from tfla_bench.adapters.workloads import Case

if TYPE_CHECKING:
    import torch

REFERENCE_CHUNK = 64


@register
class MlstmTorch(MlstmAdapter):
    """The fully parallel stabilized mLSTM in PyTorch (appendix B.1); param `gate` (exp or sig)."""

    name = "mlstm_torch"
    cpu_capable = True
    precompile = "none"  # plain PyTorch
    plot_style = PlotStyle("#525252", DOTTED, "x")
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

        h, _ = mlstm_chunkwise(*float64_inputs(inputs), gate=inputs["gate"], chunk_size=REFERENCE_CHUNK)
        return h

    def flops(self, case: Case, mode: str) -> float:
        return mlstm_counts(case, mode, self._gate(case), "parallel", None)[0]

    def bytes(self, case: Case, mode: str) -> float:
        return mlstm_counts(case, mode, self._gate(case), "parallel", None)[1]
