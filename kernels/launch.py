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

A call that needs no gradient and returns no final state is the same launches with other addresses.
`Launches` records the launches of one such call (`trace`, `keep_replay`) as a `Replay`, which later
calls of the signature run instead of the forward pass's Python: one allocation in place of the
pass's scratch tensors (the chunk states, the log gates and their sums, the output kernel's rows),
each at the offset it will keep in that workspace, and the compiled launchers called with addresses
worked out from the call's own tensors. On an H100 node the forward pass spent about 20 us in
allocations and 20 us in Python besides its three launches (16 us).
"""

from collections.abc import Callable
from typing import Any

import torch

from tfla_bench.kernels import contract

# Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined) runs them on the CPU.
INTERPRETED = contract.interpreted()
DATA_PTR = torch.Tensor.data_ptr
# Where a replay's workspace places each scratch tensor: PyTorch's CUDA allocator aligns every block
# to 512 bytes, so a scratch tensor keeps the alignment that Triton specialized its kernel on.
WORKSPACE_ALIGN = 512


def current_stream(device: int) -> int:
    """The raw handle of `device`'s current CUDA stream (what Triton launches on)."""
    return torch._C._cuda_getCurrentRawStream(device)


class Launches:
    """The compiled kernel of each launch site of one call signature."""

    def __init__(self) -> None:
        self.sites: dict[str, tuple[Any, ...]] = {}
        # While a call is recorded: each launch's site entry, grid and arguments (None: not recording).
        self.trace: list[tuple[tuple[Any, ...] | None, int, tuple]] | None = None
        self.replay: Replay | None = None  # the recorded call (`keep_replay`)

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
            run, head, device, pointers, tail, hooks = entry
            if not (hooks[0].calls or hooks[1].calls):
                addresses, scalars = map(DATA_PTR, args[:pointers]), args[pointers:]
                stream = current_stream(device)
                run(grid, 1, 1, stream, *head, *addresses, *scalars, *tail)
                if self.trace is not None:
                    self.trace.append((entry, grid, args))
                return
        self._through_triton(site, kernel, grid, args, kwargs)
        if self.trace is not None:
            self.trace.append((self.sites.get(site), grid, args))

    def _through_triton(self, site: str, kernel: Any, grid: int, args: tuple, kwargs: Callable) -> None:
        """`kernel[(grid,)](...)`; keeps the compiled kernel of `site` where it can be launched directly."""
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
        # What precedes the kernel's parameters: the launcher's head, the metadata, no launch metadata
        # and no hooks.
        head = (*head, compiled.packed_metadata, None, None, None)
        self.sites[site] = (run, head, device, pointers, tail, hooks)

    def keep_replay(self, known: tuple[torch.Tensor, ...]) -> None:
        """End the recording that `trace = []` began: keep the recorded call as `replay` where every
        launch was direct-capable and each tensor argument is one of `known` (the call's inputs and
        outputs, in a fixed order) or scratch memory that no other tensor of `known` shares.

        A scratch tensor's address becomes an offset into the replay's workspace: its storage's slot
        (in the order first seen, each aligned to `WORKSPACE_ALIGN`) plus its offset in that storage.
        """
        trace, self.trace = self.trace, None
        if not trace or any(entry is None for entry, _, _ in trace):
            return
        known_storages = {x.untyped_storage().data_ptr() for x in known}
        slots: dict[int, int] = {}  # scratch storage address -> its offset in the workspace
        size = 0
        launches = []
        for (run, head, _, pointers, tail, _), grid, args in trace:
            bases = []
            for x in args[:pointers]:
                index = next((n for n, y in enumerate(known) if x is y), None)
                if index is not None:
                    bases.append((index, 0))
                    continue
                storage = x.untyped_storage()
                start = storage.data_ptr()
                if start in known_storages:
                    return  # a view of an input or output: its address follows no rule of ours
                if start not in slots:
                    slots[start] = size
                    size += -(-storage.nbytes() // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
                bases.append((len(known), slots[start] + x.data_ptr() - start))
            launches.append((run, grid, head, tuple(bases), args[pointers:] + tail))
        _, _, device, _, _, hooks = trace[0][0]  # the same for every site of a call signature
        self.replay = Replay(launches, size, device, hooks)


class Replay:
    """The launches of one recorded call (`Launches.keep_replay`), run again on other tensors."""

    def __init__(self, launches: list[tuple], workspace_bytes: int, device: int, hooks: tuple) -> None:
        self.launches = launches
        self.workspace_bytes = workspace_bytes
        self.device = device
        self.hooks = hooks

    def __call__(self, known: tuple[torch.Tensor, ...]) -> bool:
        """Launch the recorded kernels on `known` (alike the recorded call's) and a new workspace;
        False, launching nothing, while a launch hook is set (Triton must launch then)."""
        if self.hooks[0].calls or self.hooks[1].calls:
            return False
        workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=known[0].device)
        bases = (*map(DATA_PTR, known), workspace.data_ptr())
        stream = current_stream(self.device)
        for run, grid, head, pointers, rest in self.launches:
            run(grid, 1, 1, stream, *head, *[bases[index] + offset for index, offset in pointers], *rest)
        return True
