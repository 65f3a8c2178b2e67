"""Our forward kernels' launches: one `Settings` per call signature, whose sites launch the compiled
kernel directly after their first launch, and whose calls without a gradient replay a recorded call
(CPU: a stand-in kernel; the real launcher is on the GPU)."""

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch

from tfla_bench.kernels import chunkwise, launch
from tfla_bench.kernels.config import default_config
from tfla_bench.measure import timing


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


class ThreePointers(StandInKernel):
    """A stand-in kernel with three pointer parameters, a scalar and a constexpr."""

    arg_names = ["a_ptr", "b_ptr", "c_ptr", "n", "A"]
    params = [SimpleNamespace(name=name, default=inspect.Parameter.empty) for name in arg_names]


def test_a_recorded_call_replays_on_new_tensors_and_one_workspace(compiled_launches):
    kernel = ThreePointers()

    def call(x, out):
        scratch, other = torch.empty(2, 100), torch.empty(3)  # 800 and 12 bytes of scratch
        compiled_launches("first", kernel, 8, (x, scratch[1], other, 5), lambda: {"A": 3})
        compiled_launches("second", kernel, 4, (other, scratch[0], out, 6), lambda: {"A": 3})

    x, out = torch.zeros(4), torch.zeros(4)
    compiled_launches.trace = []
    call(x, out)  # the first call, launched through Triton, recorded
    compiled_launches.keep_replay((x, out))
    assert len(kernel.through_triton) == 2 and compiled_launches.trace is None
    replay = compiled_launches.replay
    assert replay.workspace_bytes == 1024 + 512  # two slots, each aligned to 512 bytes
    kernel.direct.clear()
    x, out = torch.full((4,), 2.0), torch.full((4,), 3.0)
    assert replay((x, out))
    first, second = kernel.direct
    head = (1, 1, 1234, "function", "metadata", None, None, None)
    workspace = first[10] - 400  # scratch[1] starts 100 floats into its storage, the workspace's first slot
    assert first == (8, *head, x.data_ptr(), workspace + 400, workspace + 1024, 5, 3)
    assert second == (4, *head, workspace + 1024, workspace, out.data_ptr(), 6, 3)
    assert len(kernel.through_triton) == 2  # nothing more through Triton


def test_no_replay_of_a_call_that_passes_a_view_of_a_known_tensor(compiled_launches):
    kernel, x = ThreePointers(), torch.zeros(8)
    compiled_launches.trace = []
    compiled_launches("first", kernel, 8, (x, x[4:], x, 5), lambda: {"A": 3})
    compiled_launches.keep_replay((x,))
    assert compiled_launches.replay is None and compiled_launches.trace is None


def test_no_replay_of_a_call_with_a_site_that_triton_launches_every_time(compiled_launches):
    kernel, x = StandInKernel(), torch.zeros(4)
    compiled_launches.trace = []
    compiled_launches("output", kernel, 8, (5, x), lambda: {"A": 3})  # a tensor after a scalar
    compiled_launches.keep_replay((x,))
    assert compiled_launches.replay is None


def test_a_replay_launches_nothing_while_a_launch_hook_is_set(compiled_launches):
    from triton import knobs

    kernel, x = ThreePointers(), torch.zeros(4)
    compiled_launches.trace = []
    compiled_launches("first", kernel, 8, (x, x, torch.empty(2), 5), lambda: {"A": 3})
    compiled_launches.keep_replay((x,))

    def hook(metadata) -> None:
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert compiled_launches.replay((x,)) is False
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert not kernel.direct
    assert compiled_launches.replay((x,)) is True and len(kernel.direct) == 1


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("kernel", "options", "with_state"),
    [
        ("tfla", {"gate": "exp"}, False),
        ("tfla", {"gate": "sig"}, False),
        ("tfla", {"gate": "sig", "normalize": True}, True),
        ("tfla", {"gate": "exp"}, True),
        ("limit_chunk", {"chunk_size": 64}, False),
    ],
)
def test_gpu_calls_without_a_gradient_replay_the_first_one(monkeypatch, kernel, options, with_state):
    # The first call of a signature is launched through Triton and recorded; later calls replay it on
    # their own tensors. Each replayed output equals, bit for bit, that of a new signature's first call.
    from mlstm_support import make_inputs, make_state

    from tfla_bench.kernels.limit_chunk import mlstm_limit_chunk
    from tfla_bench.kernels.tfla import mlstm_tfla

    entry = mlstm_tfla if kernel == "tfla" else mlstm_limit_chunk
    gate, normalize = options.get("gate", "exp"), options.get("normalize", False)
    state = [x.cuda() for x in make_state(gate, normalize, 2, 4, 128, 256)] if with_state else None

    def call(seed):
        inputs = [x.cuda() for x in make_inputs(2, 4, 1024, 128, 256, seed=seed)]
        inputs[:3] = [x.bfloat16() for x in inputs[:3]]
        with torch.no_grad():
            return entry(*inputs, initial_state=state and tuple(state), **options)

    monkeypatch.setattr(chunkwise, "_SIGNATURES", {})
    call(20)
    (settings,) = chunkwise._SIGNATURES.values()
    assert settings.launches.replay is not None
    replayed = [call(seed) for seed in (21, 22)]
    assert not torch.equal(replayed[0], replayed[1])
    for seed, h in zip((21, 22), replayed, strict=True):
        monkeypatch.setattr(chunkwise, "_SIGNATURES", {})
        assert torch.equal(h, call(seed))
    # a call that returns the final state runs the forward pass, recording nothing
    monkeypatch.setattr(chunkwise, "_SIGNATURES", {})
    with torch.no_grad():
        inputs = [
            x.cuda().bfloat16() if n < 3 else x.cuda()
            for n, x in enumerate(make_inputs(2, 4, 1024, 128, 256))
        ]
        entry(*inputs, return_final_state=True, **options)
    (settings,) = chunkwise._SIGNATURES.values()
    assert settings.launches.replay is None


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["tfla_sig", "tfla_exp", "limit_chunk"])
def test_gpu_a_replay_captured_in_a_cuda_graph_gives_the_eager_output(kernel):
    # A spec's `cuda_graph` captures warmed-up calls: the capture holds the replay's launches, with the
    # workspace and output from the graph's memory pool.
    from tfla_bench.kernels.limit_chunk import mlstm_limit_chunk
    from tfla_bench.kernels.tfla import mlstm_tfla

    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k = torch.randn(2, 2, 4, 1024, 128, device="cuda", dtype=torch.bfloat16, generator=generator)
    v = torch.randn(2, 4, 1024, 256, device="cuda", dtype=torch.bfloat16, generator=generator)
    i, f = torch.randn(2, 2, 4, 1024, device="cuda", generator=generator)
    f = f + 3
    gate = {"gate": kernel.removeprefix("tfla_")} if kernel != "limit_chunk" else {}
    entry = mlstm_tfla if gate else mlstm_limit_chunk

    def call():
        return entry(q, k, v, i, f, **gate)

    outputs = []
    with torch.no_grad():
        eager = call()
        # as the sweep captures a case: eager calls on a side stream, then the capture (the last output)
        replay = timing.capture_cuda_graph(lambda: outputs.append(call()), lambda: None, warmup_calls=1)
        replay()
    torch.cuda.synchronize()
    assert torch.equal(outputs[-1], eager)
