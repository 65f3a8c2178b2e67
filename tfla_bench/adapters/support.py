"""What adapter modules share besides the registry: availability probes, seeded input factories
and case-param parsers (for built-in and third-party adapters alike).

Nothing here imports torch or a third-party library at module import time; the adapter modules
must import on a machine without CUDA and without the libraries they wrap.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import TYPE_CHECKING

from tfla_bench.adapters.workloads import parse_bool
from tfla_bench.errors import exception_line

if TYPE_CHECKING:
    # torch takes seconds to import; `list` and `check` reasons need none of it.
    import torch

    from tfla_bench.adapters.workloads import Case

CUDA_MISSING = "CUDA not available (no GPU visible or a CPU-only torch build)"


def is_installed(top_level: str) -> bool:
    """Whether the top-level module `top_level` can be found, without importing it."""
    try:
        return importlib.util.find_spec(top_level) is not None
    except (ImportError, ValueError):
        # ValueError: a module object without a spec in sys.modules; treat it as not importable.
        return False


def cuda_reason() -> str | None:
    """None if a CUDA device is usable, else why not."""
    # torch takes seconds to import; `list` and `check` reasons need none of it.
    import torch

    return None if torch.cuda.is_available() else CUDA_MISSING


def capability() -> tuple[int, int]:
    """Compute capability (major, minor) of the current CUDA device."""
    # torch takes seconds to import; `list` and `check` reasons need none of it.
    import torch

    return torch.cuda.get_device_capability()


def device_label() -> str:
    """`sm90 (NVIDIA H100 80GB HBM3)` for the current CUDA device."""
    # torch takes seconds to import; `list` and `check` reasons need none of it.
    import torch

    major, minor = capability()
    return f"sm{major}{minor} ({torch.cuda.get_device_name()})"


def try_import(module_name: str) -> tuple[ModuleType | None, str | None]:
    """Import `module_name`; return `(module, None)` or `(None, reason)` with the error's last line.

    Any exception counts: a broken install (missing CUDA extension, incompatible Triton) raises
    more than ImportError, and `available()` must report it rather than raise.
    """
    try:
        return importlib.import_module(module_name), None
    except Exception as exc:  # reported as the reason, never hidden
        return None, f"import {module_name} failed: {exception_line(exc)}"


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called `name` (`bfloat16`, `float16`, `float32`)."""
    # torch takes seconds to import; `list` and `check` reasons need none of it.
    import torch

    return getattr(torch, name)


def element_bytes(dtype_name: str) -> int:
    """Bytes per element of the dtype called `dtype_name`."""
    return {"bfloat16": 2, "float16": 2, "float32": 4}[dtype_name]


def generator(case: Case, device: str) -> torch.Generator:
    """A generator on `device` seeded from `case.params["seed"]` (default 0), so inputs repeat."""
    # torch takes seconds to import; `list` and `check` reasons need none of it.
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(int(case.param("seed", 0)))
    return gen


def randn(shape: tuple[int, ...], gen: torch.Generator, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Standard-normal tensor drawn in fp32 (same values for every dtype) and cast to `dtype`."""
    # torch takes seconds to import; `list` and `check` reasons need none of it.
    import torch

    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def uniform(
    shape: tuple[int, ...], low: float, high: float, gen: torch.Generator, device: str, dtype: torch.dtype
) -> torch.Tensor:
    """Uniform tensor on [low, high) drawn in fp32 and cast to `dtype`."""
    # torch takes seconds to import; `list` and `check` reasons need none of it.
    import torch

    values = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
    return (low + (high - low) * values).to(dtype)


def qkv(case: Case, gen: torch.Generator, device: str, layout: str) -> dict[str, torch.Tensor]:
    """q, k (head dim Dqk) and v (Dv), standard normal in the case's dtype, drawn in that order from
    `gen`; batch, head and time axes in the order of `layout` (`BHTD` or `BTHD`), the head dim last."""
    sizes = {"B": case.batch, "H": case.num_heads, "T": case.seq_len}
    lead = tuple(sizes[axis] for axis in layout[:3])
    dtype = torch_dtype(case.dtype)
    return {
        "q": randn((*lead, case.head_dim_qk), gen, device, dtype),
        "k": randn((*lead, case.head_dim_qk), gen, device, dtype),
        "v": randn((*lead, case.head_dim_v), gen, device, dtype),
    }


def grad_if(tensors: dict[str, torch.Tensor], names: tuple[str, ...], mode: str) -> None:
    """Mark `names` in `tensors` as requiring gradients when `mode` is fwbw."""
    if mode == "fwbw":
        for name in names:
            tensors[name].requires_grad_(True)


def bool_param(case: Case, name: str, default: bool) -> bool:
    """`case.params[name]` as a bool (true/false, also as strings from the command line).

    Raises:
        ValueError: the value is not a boolean; `check` turns it into the reason.
    """
    value = case.param(name, default)
    if isinstance(value, bool):
        return value
    flag = parse_bool(value) if isinstance(value, str) else None
    if flag is not None:
        return flag
    raise ValueError(f"param {name} must be true or false, got {value!r}")


def int_param(case: Case, name: str, default: int) -> int:
    """`case.params[name]` as a positive int (also from a string).

    Raises:
        ValueError: the value is not a positive integer; `check` turns it into the reason.
    """
    value = case.param(name, default)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"param {name} must be a positive integer, got {value!r}")
    return value


def unknown_params_reason(case: Case, adapter_name: str, known: tuple[str, ...]) -> str | None:
    """The reason `case.params` holds a key `adapter_name` does not take (a typo in a spec), or None."""
    unknown = sorted(set(case.params) - set(known))
    if unknown:
        return f"unknown param(s) {', '.join(unknown)}; {adapter_name} takes: {', '.join(known)}"
    return None
