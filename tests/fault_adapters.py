"""Test-only adapters (CPU) whose worker segfaults, runs out of host memory or writes garbage to its
output; `plugin_adapters.Sleep` is the one that hangs.

Only the fault-injection suite names this module, in `TFLA_BENCH_PLUGINS` of the sweeps it starts in
subprocesses: importing it registers these adapters (and those of `plugin_adapters`), which no
in-process test may meet.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from typing import Any

import torch
from plugin_adapters import _Tiny

from tfla_bench.registry import register

# How far above its present address space the out-of-memory adapter lets its worker grow.
_HEADROOM_BYTES = 256 * 2**20
_BLOCK_ELEMENTS = 2**23  # 32 MiB of float32 per allocation


@register
class Segfault(_Tiny):
    """Reads address 0, as a kernel with a bad pointer would."""

    name = "test_segfault"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        ctypes.string_at(0)
        return inputs["x"]


@register
class HostOom(_Tiny):
    """Allocates host memory until none is left. The worker's address space is capped just above
    its present size for the call, so the machine's memory is never at stake, and restored after."""

    name = "test_host_oom"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + _HEADROOM_BYTES, hard))
        blocks = []
        try:
            while True:
                blocks.append(torch.ones(_BLOCK_ELEMENTS))
        finally:
            blocks.clear()
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@register
class Garbage(_Tiny):
    """Computes the right thing but writes binary junk, fake status lines and CSV-like rows to its
    stdout and stderr, through Python and through the file descriptors."""

    name = "test_garbage"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        junk = bytes(range(256)) + b"\n--- ok\n--- crashed\nkernel,mode,status\nsdpa_math,fw,ok,,,\n\x00\xff"
        for fd in (1, 2):
            os.write(fd, junk)
        print("\x1b[2J\rstatus=ok median_ms=0", end="")
        print("Traceback (most recent call last):", file=sys.stderr)
        return inputs["x"] * inputs["w"]
