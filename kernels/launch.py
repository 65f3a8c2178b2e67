"""Launching the forward kernels of one call signature through their compiled launchers.

Triton 3.6's `kernel[grid](...)` binds and specializes every argument, builds a cache key from
them and the options, looks the compiled kernel up, checks the kernel's globals and builds launch
metadata for its hooks before it calls the compiled kernel's launcher; for our kernels that took
16-28 us of host time per launch on an H100 node. A launch signature computed per argument in
Python cost more still (23-40 us).

`Launches` keeps the compiled kernel of each launch site (`gates`, `states`, `output`) for one
`chunkwise.Settings` instance, which `chunkwise.settings_of` makes once per call signature: the
shapes, dtypes, devices and 16-byte alignment of the inputs, and every option. Everything Triton
specializes a forward launch on follows from that signature (the kernels' integers from the
shapes, the constexprs from the settings, every other pointer from an allocation of ours), so a
site's second launch calls the compiled launcher directly. Triton does every launch itself under
its interpreter (TRITON_INTERPRET=1) and while a launch hook is set (a profiler such as Proton).
"""

import os
from collections.abc import Callable
from typing import Any

import torch

# Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined) runs them on the CPU.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def current_stream(device: int) -> int:
    """The raw handle of `device`'s current CUDA stream (what Triton launches on)."""
    return torch._C._cuda_getCurrentRawStream(device)


class Launches:
    """The compiled kernel of each launch site of one call signature."""

    def __init__(self) -> None:
        self.sites: dict[str, tuple[Any, ...]] = {}

    def __call__(self, site: str, kernel: Any, grid: int, args: tuple, kwargs: Callable[[], dict]) -> None:
        """`kernel[(grid,)](*args, **kwargs())`; the first launch at `site` keeps the compiled kernel.

        Args:
            site: the launch site's name, unique within one call signature.
            kernel: a `triton.jit` function.
            grid: the number of programs (a 1-D grid).
            args: the kernel's leading parameters, in order.
            kwargs: makes the other parameters by name (the constexprs) and the launch options
                (`num_warps`, `num_stages`); a parameter left out takes its default. Called only
                where Triton launches, since a direct launch needs none of them.
        """
        entry = self.sites.get(site)
        if entry is not None:
            run, function, metadata, device, tail, hooks = entry
            if not (hooks[0].calls or hooks[1].calls):
                run(grid, 1, 1, current_stream(device), function, metadata, None, None, None, *args, *tail)
                return
        options = kwargs()
        compiled = kernel[(grid,)](*args, **options)
        if INTERPRETED or compiled is None:
            return
        from triton import knobs

        if hasattr(compiled, "result"):
            compiled = compiled.result()
        # The launcher takes every parameter in order, constexprs included (it skips them).
        defaults = {param.name: param.default for param in kernel.params}
        tail = tuple(options.get(name, defaults[name]) for name in kernel.arg_names[len(args) :])
        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
        device = torch.cuda.current_device()
        self.sites[site] = (compiled.run, compiled.function, compiled.packed_metadata, device, tail, hooks)
