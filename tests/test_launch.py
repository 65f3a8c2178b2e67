"""Our forward kernels' launches: one `Settings` per call signature, whose sites launch the compiled
kernel directly after their first launch (CPU: a stand-in kernel; the real launcher is on the GPU)."""

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch

from tfla_bench.kernels import chunkwise, launch
from tfla_bench.kernels.config import default_config


class StandInKernel:
    """What `Launches` uses of a `triton.jit` function: `kernel[grid](...)`, `params`, `arg_names`."""

    arg_names = ["x_ptr", "n", "A", "B"]
    params = [SimpleNamespace(name=name, default=inspect.Parameter.empty) for name in ("x_ptr", "n", "A")]
    params.append(SimpleNamespace(name="B", default=7))

    def __init__(self) -> None:
        self.through_triton: list[tuple] = []
        self.direct: list[tuple] = []
        self.compiled = SimpleNamespace(run=self._run, function="function", packed_metadata="metadata")

    def _run(self, *args) -> None:
        self.direct.append(args)

    def __getitem__(self, grid):
        def through_triton(*args, **kwargs):
            self.through_triton.append((grid, args, kwargs))
            return self.compiled

        return through_triton


@pytest.fixture
def compiled_launches(monkeypatch):
    """`Launches` as on a GPU: not interpreted, stream 1234 on device 0."""
    monkeypatch.setattr(launch, "INTERPRETED", False)
    monkeypatch.setattr(launch, "current_stream", lambda device: 1234 + device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return launch.Launches()


def test_a_site_launches_its_compiled_kernel_directly_from_its_second_launch(compiled_launches):
    kernel, x = StandInKernel(), torch.zeros(4)
    for grid in (8, 16):
        compiled_launches("output", kernel, grid, (x, 5), lambda: {"A": 3, "num_warps": 4})
    assert kernel.through_triton == [((8,), (x, 5), {"A": 3, "num_warps": 4})]
    # grid, 1, 1, the stream, the function, its metadata, no launch metadata or hooks, then every
    # parameter in order, a tensor as its address: the constexprs too, B at its default (the options
    # are not parameters)
    expected = (16, 1, 1, 1234, "function", "metadata", None, None, None, x.data_ptr(), 5, 3, 7)
    assert kernel.direct == [expected]


class StandInLauncher:
    """Triton's `CudaLauncher` as `Launches` reads it: the C launcher and what Triton's wrapper adds."""

    launch_cooperative_grid, launch_pdl, profile_scratch_size = False, True, 0

    def __init__(self, global_scratch_size: int) -> None:
        self.global_scratch_size = global_scratch_size
        self.wrapped: list[tuple] = []
        self.launched: list[tuple] = []

    def __call__(self, *args) -> None:
        self.wrapped.append(args)

    def launch(self, *args) -> None:
        self.launched.append(args)


@pytest.mark.parametrize("scratch", [0, 128])
def test_a_kernel_without_scratch_memory_skips_tritons_wrapper(compiled_launches, scratch):
    kernel, x = StandInKernel(), torch.zeros(4)
    launcher = kernel.compiled.run = StandInLauncher(scratch)
    for _ in range(2):
        compiled_launches("output", kernel, 8, (x, 5), lambda: {"A": 3})
    common = ("metadata", None, None, None, x.data_ptr(), 5, 3, 7)
    if scratch:  # Triton's wrapper allocates the scratch memory
        assert launcher.wrapped == [(8, 1, 1, 1234, "function", *common)] and not launcher.launched
    else:  # the cooperative-grid and PDL flags, then no scratch buffers
        assert launcher.launched == [(8, 1, 1, 1234, "function", False, True, None, None, *common)]
        assert not launcher.wrapped


def test_a_launch_hook_sends_every_launch_through_triton(compiled_launches):
    from triton import knobs

    kernel, x = StandInKernel(), torch.zeros(4)
    compiled_launches("output", kernel, 8, (x, 5), lambda: {"A": 3})

    def hook(metadata) -> None:
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        compiled_launches("output", kernel, 8, (x, 5), lambda: {"A": 3})
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(kernel.through_triton) == 2 and not kernel.direct


def test_the_interpreter_runs_every_launch_through_triton(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRETED", True)
    kernel, launches = StandInKernel(), launch.Launches()
    for _ in range(2):
        launches("output", kernel, 8, (torch.zeros(4), 5), lambda: {"A": 3})
    assert len(kernel.through_triton) == 2 and not launches.sites


def test_one_settings_per_call_signature(monkeypatch):
    monkeypatch.setattr(chunkwise, "_SIGNATURES", {})
    made = []

    def make():
        made.append(1)
        return chunkwise.Settings(
            "sig", 16, 1e-6, False, default_config("tfla", 16, 16, 16, torch.float32, "sig")
        )

    x = torch.zeros(2, 64)
    first = chunkwise.settings_of(("tfla", 16), (x,), make)
    assert chunkwise.settings_of(("tfla", 16), (torch.ones(2, 64),), make) is first  # another tensor alike
    assert chunkwise.settings_of(("tfla", 32), (x,), make) is not first  # another option
    assert chunkwise.settings_of(("tfla", 16), (x.double(),), make) is not first  # another dtype
    assert chunkwise.settings_of(("tfla", 16), (x.flatten()[2:],), make) is not first  # 8-byte aligned
    assert len(made) == 4
    # arguments that are not tensors, or options that cannot be hashed: made (and checked) every time
    chunkwise.settings_of(("tfla", 16), ("not a tensor",), make)
    chunkwise.settings_of(("tfla", [16]), (x,), make)
    assert len(made) == 6
    # a copy with other settings has launches of its own
    assert dataclasses.replace(first, final_state=True).launches is not first.launches


def test_a_second_call_of_a_signature_computes_its_own_inputs(monkeypatch):
    from tfla_bench.kernels.tfla import mlstm_tfla

    def inputs(seed):
        generator = torch.Generator().manual_seed(seed)
        q, k = torch.randn(2, 1, 2, 32, 16, generator=generator)
        v = torch.randn(1, 2, 32, 16, generator=generator)
        i, f = torch.randn(2, 1, 2, 32, generator=generator)
        return q, k, v, i, f + 3

    monkeypatch.setattr(chunkwise, "_SIGNATURES", {})
    mlstm_tfla(*inputs(0), gate="exp", chunk_size=16)
    again = mlstm_tfla(*inputs(1), gate="exp", chunk_size=16)  # the settings of the first call
    assert len(chunkwise._SIGNATURES) == 1
    monkeypatch.setattr(chunkwise, "_SIGNATURES", {})
    assert torch.equal(again, mlstm_tfla(*inputs(1), gate="exp", chunk_size=16))


def test_a_site_with_a_tensor_after_a_scalar_launches_through_triton(compiled_launches):
    kernel, x = StandInKernel(), torch.zeros(4)
    for _ in range(2):
        compiled_launches("output", kernel, 8, (5, x), lambda: {"A": 3})
    assert len(kernel.through_triton) == 2 and not kernel.direct
