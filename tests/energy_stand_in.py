"""A stand-in GPU energy counter for sweeps on the CPU.

Named in TFLA_BENCH_PLUGINS, this module is imported by every worker of a sweep (a spawned process),
where it gives the CPU device a `gpustate.Monitor` over a stand-in NVML (`CounterNvml`) whose energy
counter follows TFLA_TEST_ENERGY (`ENERGY_COUNTERS`), and tells the worker's device record that the
device has the counter. In the test process itself (not a spawned one) it changes nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable

from test_gpustate import FakeNvml

from tfla_bench.measure import energy, gpustate, worker

ENERGY_ENV = "TFLA_TEST_ENERGY"
# The counter's value at its i-th read: rising 1,000 mJ a read, or stuck.
ENERGY_COUNTERS: dict[str, Callable[[int], int]] = {
    "rises": lambda read: 10**9 + 1_000 * read,
    "stuck": lambda read: 5_000_000,
}


class CounterNvml(FakeNvml):
    """The stand-in NVML of `test_gpustate` with an energy counter: `value(i)` at the i-th read (an
    exception it returns is raised), and an idle GPU, so that settling waits for nothing."""

    def __init__(self, value: Callable[[int], int | Exception]):
        super().__init__()
        self.value = value
        self.reads = 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        value = self.value(self.reads)
        self.reads += 1
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0x1


def _stand_in_monitor(device: str) -> gpustate.Monitor:
    sys.modules["pynvml"] = CounterNvml(ENERGY_COUNTERS[os.environ[ENERGY_ENV]])
    return gpustate.Monitor("GPU-stand-in")


if multiprocessing.parent_process() is not None and os.environ.get(ENERGY_ENV) in ENERGY_COUNTERS:
    worker._monitor = _stand_in_monitor
    energy.unavailable = lambda monitor: None
