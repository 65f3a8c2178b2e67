"""Launching our Triton kernels for a fraction of the host time of `kernel[grid](...)`.

Triton 3.6's `kernel[grid](*args, **kwargs)` binds every argument, specializes each one, builds a
cache key from them and the options, looks the compiled kernel up, checks the kernel's globals and
only then calls the compiled kernel's launcher. A forward call of ours launches three kernels and a
backward five, so that path was most of a call's host time (`experiments/launch_overhead.py` times
both paths for every launch of a call).

`launch(kernel, grid, *args, **kwargs)` sends the first launch with a given signature through Triton
and keeps the compiled kernel it returns; later launches with that signature call its launcher
directly. The signature holds the current device and everything Triton compiles for: the dtype and
16-byte alignment of every tensor argument, for every integer whether it is 1, divisible by 16 and
within 32 or 64 bits, the type of every other positional argument, and every keyword argument (the
constexprs, `num_warps`, `num_stages`). Triton goes on doing every launch under the interpreter
(TRITON_INTERPRET=1) and while a launch hook is set (a profiler such as Proton).
"""

import os
from typing import Any

import torch

# Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined) runs them on the CPU.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
ALIGNMENT = 16  # Triton's pointer and integer specialization: divisible by 16 or not


def _signature(value: Any) -> Any:
    """What Triton specializes a positional argument on."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % ALIGNMENT == 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value == 1, value % ALIGNMENT == 0, -(2**31) <= value < 2**31, -(2**63) <= value < 2**63
    return type(value)


class _Launcher:
    """The compiled kernels of one `triton.jit` function, by launch signature."""

    def __init__(self, kernel: Any) -> None:
        from triton import knobs
        from triton.runtime import driver

        self.runtime = knobs.runtime
        self.kernel = kernel
        self.names = kernel.arg_names
        self.defaults = {param.name: param.default for param in kernel.params}
        self.driver = driver.active
        self.compiled: dict[tuple, tuple[Any, tuple]] = {}

    def __call__(self, grid: tuple[int, ...], args: tuple, kwargs: dict[str, Any]) -> None:
        device = self.driver.get_current_device()  # a compiled kernel is loaded on one device
        key = (device, tuple(_signature(arg) for arg in args), tuple(kwargs.items()))
        entry = self.compiled.get(key)
        if entry is None or self.runtime.launch_enter_hook is not None:
            compiled = self.kernel[grid](*args, **kwargs)
            if hasattr(compiled, "result"):
                compiled = compiled.result()
            # The launcher takes every parameter in order, constexprs included (it skips them).
            rest = tuple(kwargs.get(name, self.defaults[name]) for name in self.names[len(args) :])
            self.compiled[key] = (compiled, rest)
            return
        compiled, rest = entry
        stream = self.driver.get_current_stream(device)
        grid_y = grid[1] if len(grid) > 1 else 1
        grid_z = grid[2] if len(grid) > 2 else 1
        compiled.run(
            grid[0], grid_y, grid_z, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *args, *rest,
        )  # fmt: skip


_LAUNCHERS: dict[Any, _Launcher] = {}


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """`kernel[grid](*args, **kwargs)`, with Triton's per-launch work done once per signature.

    Args:
        kernel: a `triton.jit` function.
        grid: the launch grid, a tuple of one to three ints.
        args: the kernel's leading parameters, in order (tensors, ints, floats).
        kwargs: the other parameters by name (constexprs) and the launch options (`num_warps`,
            `num_stages`); a parameter left out takes its default.
    """
    if INTERPRETED:
        kernel[grid](*args, **kwargs)
        return
    launcher = _LAUNCHERS.get(kernel)
    if launcher is None:
        launcher = _LAUNCHERS[kernel] = _Launcher(kernel)
    launcher(grid, args, kwargs)
