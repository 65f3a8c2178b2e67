"""Test-only adapters (CPU) that crash, hang, fail or count their calls.

Importing this module registers them. Tests import it only through
`plugin_support.registered_test_adapters()`, which removes them again afterwards. Spawned workers
inherit `sys.path` (pytest puts `tests/` on it) and import this module themselves, because the
runner sends each job with the module of its adapter; the CLI tests also name it in
`TFLA_BENCH_PLUGINS`, as a user would name an unpackaged adapter module.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from tfla_bench.adapters.registry import Adapter, register
from tfla_bench.adapters.workloads import Case


class _Tiny(Adapter):
    """y = x * w elementwise on `[B, H, T, Dv]`; x (and w) receive gradients in fwbw."""

    family = "test"
    cpu_capable = True
    constraints = "test adapter"

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        shape = (case.batch, case.num_heads, case.seq_len, case.head_dim_v)
        grad = case.mode == "fwbw"
        dtype = getattr(torch, case.dtype)
        return {
            "x": torch.randn(shape, device=device, dtype=dtype).requires_grad_(grad),
            "w": torch.randn(shape, device=device, dtype=dtype).requires_grad_(grad),
        }

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["x"] * inputs["w"]

    def flops(self, case: Case, mode: str) -> float:
        elements = case.batch * case.num_heads * case.seq_len * case.head_dim_v
        return float(elements if mode == "fw" else 3 * elements)

    def bytes(self, case: Case, mode: str) -> float:
        return 3.0 * 4 * case.batch * case.num_heads * case.seq_len * case.head_dim_v


@register
class Abort(_Tiny):
    """Kills its process like a failed LLVM assertion (with `TFLA_TEST_ABORT_SEQ_LEN` set, only at
    that sequence length)."""

    name = "test_abort"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        only = os.environ.get("TFLA_TEST_ABORT_SEQ_LEN")
        if only and inputs["x"].shape[2] != int(only):
            return inputs["x"] * inputs["w"]
        print("test_abort: about to abort", flush=True)
        os.abort()


@register
class Sleep(_Tiny):
    """Hangs like an endless autotune."""

    name = "test_sleep"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        time.sleep(3600)
        return inputs["x"]


@register
class Slow(_Tiny):
    """Takes a tenth of a second per call, so a sweep of a few cases lasts long enough to be stopped
    halfway."""

    name = "test_slow"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        time.sleep(0.1)
        return inputs["x"] * inputs["w"]


@register
class SlowToCompile(_Tiny):
    """Takes `TFLA_TEST_COMPILE_S` seconds (default 5) per call in a process of raised niceness (a
    precompile process beside a measuring one), as a long compile would; no time elsewhere."""

    name = "test_slow_to_compile"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        if os.nice(0) > 0:
            time.sleep(float(os.environ.get("TFLA_TEST_COMPILE_S", "5")))
        return inputs["x"] * inputs["w"]


@register
class Unavailable(_Tiny):
    """Its library is missing."""

    name = "test_unavailable"

    def available(self) -> str | None:
        return "needs the package frobnicate"


@register
class Oom(_Tiny):
    """Runs out of device memory (raised on purpose, so it also happens on CPU)."""

    name = "test_oom"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 GiB.")


@register
class OomOnce(_Tiny):
    """Runs out of device memory on its first call only, counted across processes by creating the
    file named by `TFLA_TEST_OOM_MARK` (as a large case would when other processes share the GPU)."""

    name = "test_oom_once"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        try:
            os.close(os.open(os.environ["TFLA_TEST_OOM_MARK"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return inputs["x"] * inputs["w"]
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB.")


@register
class Unsettled(_Tiny):
    """Takes 1 ms and 12 ms by turns: no series of its calls settles (`timing.unsettled`)."""

    name = "test_unsettled"
    precompile = "none"
    calls = 0

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        Unsettled.calls += 1
        time.sleep(0.012 if Unsettled.calls % 2 else 0.001)
        return inputs["x"] * inputs["w"]


@register
class Wavering(_Tiny):
    """Takes 5 ms twice, then 5.3 ms: a short series of its calls runs out of its time budget with the
    median's interval at about +-6% (the median one of the 5 ms calls, the upper bound one of the
    5.3 ms ones), wider than `runner.BESIDE_UNSETTLED_CI` but not `timing.unsettled`."""

    name = "test_wavering"
    precompile = "none"
    calls = 0

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        Wavering.calls += 1
        time.sleep(0.0053 if Wavering.calls % 3 == 0 else 0.005)
        return inputs["x"] * inputs["w"]


@register
class Raise(_Tiny):
    """Raises an ordinary exception with a multi-line message."""

    name = "test_raise"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        raise ValueError("while launching the kernel:\nblock size 96 is not a power of two")


@register
class OutOfResources(_Tiny):
    """Refused by Triton as a config that needs more shared memory than the GPU has."""

    name = "test_out_of_resources"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        from triton.runtime.errors import OutOfResources

        raise OutOfResources(237568, 232448, "shared memory")


@register
class Chunked(_Tiny):
    """Takes a chunk size, which must not exceed the sequence length."""

    name = "test_chunked"
    family = "test_chunked_family"
    uses_chunk_size = True
    modes = ("fw",)
    dtypes = ("float32",)

    def check(self, case: Case) -> str | None:
        if case.chunk_size is None or case.chunk_size > case.seq_len:
            return f"chunk_size {case.chunk_size} must be <= seq_len {case.seq_len}"
        return None


class _CountingMul(torch.autograd.Function):
    """x * w that counts its forward and backward calls and keeps the last upstream gradient."""

    forwards = 0
    backwards = 0
    last_grad: torch.Tensor | None = None

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        _CountingMul.forwards += 1
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _CountingMul.backwards += 1
        _CountingMul.last_grad = grad.detach().clone()
        x, w = ctx.saved_tensors
        return grad * w, grad * x


@register
class Counting(_Tiny):
    """Counts calls (in-process tests) and keeps its last inputs for inspection."""

    name = "test_counting"
    counter = _CountingMul
    last_inputs: dict[str, Any] | None = None

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        inputs = super().make_inputs(case, device)
        Counting.last_inputs = inputs
        return inputs

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        return _CountingMul.apply(inputs["x"], inputs["w"])

    @staticmethod
    def reset() -> None:
        _CountingMul.forwards = 0
        _CountingMul.backwards = 0
        _CountingMul.last_grad = None


_fill_block = None


def fill_block_kernel() -> Any:
    """A Triton kernel autotuned over BLOCK in (16, 32, 64, 128) that writes the BLOCK it ran with
    (defined on first use, so importing this module does not need Triton)."""
    global _fill_block
    if _fill_block is None:
        import triton
        import triton.language as tl

        @triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64, 128)], key=["n"])
        @triton.jit
        def fill_block(out_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offsets, BLOCK, mask=offsets < n)

        _fill_block = fill_block
    return _fill_block


@register
class Autotuned(_Tiny):
    """Launches `fill_block_kernel` and appends the BLOCK it ran with to the file named by
    `TFLA_TEST_BLOCK_LOG` (so a test sees which config each worker chose)."""

    name = "test_autotuned"
    autotuned = True
    modes = ("fw",)

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        out = torch.zeros(256, dtype=torch.int32, device=inputs["x"].device)
        fill_block_kernel()[lambda meta: (256 // meta["BLOCK"],)](out, 256)
        with open(os.environ["TFLA_TEST_BLOCK_LOG"], "a") as log:
            log.write(f"{out[0].item()}\n")
        return inputs["x"]


@register
class ProcessA(_Tiny):
    """Appends its name and process id to the file named by `TFLA_TEST_PID_LOG` at each case (so a
    test sees which process measured which case)."""

    name = "test_process_a"

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        with open(os.environ["TFLA_TEST_PID_LOG"], "a") as log:
            log.write(f"{self.name} {os.getpid()}\n")
        return super().make_inputs(case, device)


@register
class ProcessB(ProcessA):
    """`ProcessA` under another name."""

    name = "test_process_b"


ADAPTERS = (
    Abort,
    Sleep,
    Slow,
    SlowToCompile,
    Unavailable,
    Oom,
    OomOnce,
    Unsettled,
    Wavering,
    Raise,
    Chunked,
    Counting,
    Autotuned,
    ProcessA,
    ProcessB,
)
