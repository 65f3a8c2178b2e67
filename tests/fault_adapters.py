"""Test-only adapters (CPU) whose worker segfaults or writes garbage to its output;
`plugin_adapters.Sleep` is the one that hangs.

Only the fault-injection suite names this module, in `TFLA_BENCH_PLUGINS` of the sweeps it starts in
subprocesses: importing it registers these adapters (and those of `plugin_adapters`), which no
in-process test may meet.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

import torch
from plugin_adapters import _Tiny

from tfla_bench.adapters.registry import register


@register
class Segfault(_Tiny):
    """Reads address 0, as a kernel with a bad pointer would."""

    name = "test_segfault"

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        ctypes.string_at(0)
        return inputs["x"]


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
