"""The Mamba adapters' shared parts (`mamba-ssm` 2.3.2.post1): `Mamba2Adapter`, the base of Mamba2's SSD
kernels, and the constants and input factories it shares with Mamba's selective scan.

Case conventions (as in the published CSVs): num_heads H, head_dim_qk = the SSM state dim N,
head_dim_v = the head dim P (Mamba: inner channels = H * P, the paper used H = 1).

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
from typing import TYPE_CHECKING

from tfla_bench.adapters.registry import Adapter, GateShape
from tfla_bench.adapters.support import (
    cuda_reason,
    element_bytes,
    int_param,
    is_installed,
    torch_dtype,
    uniform,
    unknown_params_reason,
)
from tfla_bench.adapters.workloads import Case
from tfla_bench.errors import exception_line
from tfla_bench.kernels.contract import is_power_of_two
from tfla_bench.model.families import mamba2_byte_terms, mamba2_flop_terms

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


def ssd_reason() -> str | None:
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


def time_steps(shape: tuple[int, ...], gen: torch.Generator, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Time steps log-uniform in [DT_MIN, DT_MAX], Mamba's dt initialization range."""
    log_dt = uniform(shape, math.log(DT_MIN), math.log(DT_MAX), gen, device, torch_dtype("float32"))
    return log_dt.exp().to(dtype)


class Mamba2Adapter(Adapter):
    """Mamba2's SSD kernels: layout `[B, T, H, P]`, param `num_groups`, chunk size (default 256), SSD
    counts; the gate runs 4 chunks of 128."""

    family = "mamba2"
    packages = ("mamba-ssm",)
    layout = "BTHD"
    gate_shape = GateShape(batch=2, seq_len=512, num_heads=4, head_dim_qk=32, head_dim_v=64, chunk_size=128)
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
