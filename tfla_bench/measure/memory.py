"""Peak device memory of one call: `torch.cuda.max_memory_allocated` after a reset.

Reported twice: absolute (everything the process holds during the call: inputs, the upstream
gradient, outputs, saved activations, gradients, kernel workspaces) and above what was allocated
right after `make_inputs`. The caching allocator's reserved-but-free memory is not counted. On CPU
nothing is measured: the values are None (empty cells), never zero.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tfla_bench.measure.timing import is_cuda, synchronize


@dataclass(frozen=True)
class PeakMemory:
    """Peak allocated bytes of one call; None where not measured (CPU)."""

    peak_bytes: int | None
    above_inputs_bytes: int | None


def allocated_bytes(device: str) -> int | None:
    """Bytes currently allocated by tensors on `device`; None on CPU."""
    if not is_cuda(device):
        return None
    synchronize(device)
    return torch.cuda.memory_allocated(device)


def measure_peak(fn: Callable[[], Any], device: str, inputs_bytes: int | None) -> PeakMemory:
    """Run `fn` once and return its peak allocated memory.

    Args:
        fn: the call to measure.
        device: `cpu` or a CUDA device.
        inputs_bytes: `allocated_bytes` right after the inputs were made.
    """
    if not is_cuda(device) or inputs_bytes is None:
        return PeakMemory(None, None)
    gc.collect()
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return PeakMemory(peak, peak - inputs_bytes)


def release(device: str) -> None:
    """Free what the last case left behind, so the next case starts from an empty allocator.

    That includes the arguments a Triton autotuner keeps when its call fails (`drop_autotuner_arguments`).
    What survives the collection (modules, compiled kernels, library caches) is moved out of the
    collector's sight (`gc.freeze`), so the next collections, here and in `measure_peak`, look only
    at the objects made since. A full collection walks every object the imported libraries made:
    80 ms with torch, Triton, mlstm_kernels and lightning_attn imported (300,000 objects, on a
    CPU machine), twice per case.
    """
    drop_autotuner_arguments()
    gc.collect()
    gc.freeze()
    if is_cuda(device):
        torch.cuda.empty_cache()


def drop_autotuner_arguments() -> int:
    """Forget the arguments of every Triton autotuner's last call; returns how many it dropped.

    Triton 3.6's `Autotuner.run` keeps its call's arguments in `nargs` and drops them only when the
    call returns. A call that raises (out of memory, for instance) leaves them: the inputs and
    intermediate tensors of that call stay allocated, and a process that goes on to the next case
    (a sweep's worker, a precompile run) holds them in its memory share. The autotuners are found
    among the attributes of the loaded modules, through their `fn` chain (heuristics around an
    autotuner, an autotuner around heuristics): a few milliseconds per call.
    """
    autotuner_module = sys.modules.get("triton.runtime.autotuner")
    jit_module = sys.modules.get("triton.runtime.jit")
    if autotuner_module is None or jit_module is None:
        return 0
    autotuner, kernel_interface = autotuner_module.Autotuner, jit_module.KernelInterface
    dropped = 0
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            # By type only: `isinstance` would ask lazy objects for their `__class__`.
            while issubclass(type(value), kernel_interface):
                # An autotuner gets `nargs` on its first call; one never called has none.
                if issubclass(type(value), autotuner) and getattr(value, "nargs", None) is not None:
                    value.nargs = None
                    dropped += 1
                value = getattr(value, "fn", None)
    return dropped
