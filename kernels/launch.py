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

A direct launch passes each tensor as its address. Given a tensor, Triton's C launcher calls its
`data_ptr` and asks the driver what kind of pointer it is (`cuPointerGetAttribute`, which catches
a CPU tensor); given an integer it takes the address as it is. Our tensors come from PyTorch's CUDA
allocator on the device of the call signature, whose addresses are device addresses. Where the
compiled kernel needs no scratch memory, the launch skips Triton's Python wrapper as well and calls
the C launcher itself.
"""

import os
from collections.abc import Callable
from typing import Any

import torch

# Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined) runs them on the CPU.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DATA_PTR = torch.Tensor.data_ptr


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
            args: the kernel's leading parameters, in order: its tensors first (a site with a tensor
                after a scalar is launched through Triton every time).
            kwargs: makes the other parameters by name (the constexprs) and the launch options
                (`num_warps`, `num_stages`); a parameter left out takes its default. Called only
                where Triton launches, since a direct launch needs none of them.
        """
        entry = self.sites.get(site)
        if entry is not None:
            run, head, metadata, device, pointers, tail, hooks = entry
            if not (hooks[0].calls or hooks[1].calls):
                addresses, scalars = map(DATA_PTR, args[:pointers]), args[pointers:]
                stream = current_stream(device)
                run(grid, 1, 1, stream, *head, metadata, None, None, None, *addresses, *scalars, *tail)
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
        run, head = compiled.run, (compiled.function,)
        scratch = getattr(run, "global_scratch_size", 0) or getattr(run, "profile_scratch_size", 0)
        if getattr(run, "launch", None) is not None and not scratch:
            # The C launcher: the function, then the cooperative-grid and PDL flags and the two scratch
            # buffers (none) that Triton's wrapper adds.
            head = (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None)
            run = run.launch
        pointers = next((n for n, x in enumerate(args) if not isinstance(x, torch.Tensor)), len(args))
        if any(isinstance(x, torch.Tensor) for x in args[pointers:]):
            return  # a tensor after a scalar: Triton launches this site every time
        self.sites[site] = (run, head, compiled.packed_metadata, device, pointers, tail, hooks)
