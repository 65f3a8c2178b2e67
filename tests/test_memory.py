"""`memory.release`: what a failed case leaves behind is freed before the next one (CPU)."""

import gc
import weakref

import pytest
import torch

from tfla_bench.measure import memory
from tfla_bench.run.precompile import sharded_autotuning

pytestmark = pytest.mark.usefixtures("plugin_adapters")


def test_release_drops_the_arguments_a_failed_autotuned_call_kept(plugin_adapters):
    kernel = plugin_adapters.fill_block_kernel()
    out = torch.zeros(256, dtype=torch.int32)
    alive = weakref.ref(out)

    def grid(meta):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB.")

    # as in a precompile run (on the CPU the autotuner cannot time; there each config runs once)
    with sharded_autotuning(0, 1), pytest.raises(torch.cuda.OutOfMemoryError):
        kernel[grid](out, 256)
    del out
    gc.collect()
    assert alive() is not None and kernel.nargs is not None  # Triton kept the failed call's arguments
    memory.release("cpu")
    assert kernel.nargs is None and alive() is None
    assert memory.drop_autotuner_arguments() == 0  # nothing left to drop


def test_an_autotuner_never_called_is_left_alone(plugin_adapters):
    import triton
    import triton.language as tl

    @triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"])
    @triton.heuristics({"EVEN": lambda args: args["n"] % 2 == 0})
    @triton.jit
    def never_called(out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, BLOCK), BLOCK)

    globals()["never_called"] = never_called  # a module attribute, as a library's kernels are
    try:
        assert not hasattr(never_called, "nargs")
        memory.release("cpu")  # must not fail on it
        assert memory.drop_autotuner_arguments() == 0
    finally:
        del globals()["never_called"]


def test_a_call_that_returns_leaves_nothing_to_drop(plugin_adapters):
    out = torch.zeros(256, dtype=torch.int32)
    with sharded_autotuning(0, 1):
        plugin_adapters.fill_block_kernel()[lambda meta: (256 // meta["BLOCK"],)](out, 256)
    assert out.unique().tolist() == [16] and memory.drop_autotuner_arguments() == 0
