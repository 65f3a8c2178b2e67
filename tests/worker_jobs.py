"""Jobs that ask a spawned worker about its own process (`tfla_bench.measure.worker.WorkerJob`)."""

import os
from dataclasses import dataclass

from tfla_bench.adapters.workloads import Case


@dataclass(frozen=True)
class EnvironmentJob:
    """Answers the worker's value of the environment variable `name` (None when unset)."""

    case: Case
    name: str
    adapter_module: str = "tfla_bench.baselines.sdpa_math"

    def run(self, adapter: object, device: str) -> str | None:
        return os.environ.get(self.name)


@dataclass(frozen=True)
class ProcessJob:
    """Answers the worker's process id and whether the module `module` is imported there."""

    case: Case
    module: str
    adapter_module: str = "tfla_bench.baselines.sdpa_math"

    def run(self, adapter: object, device: str) -> tuple[int, bool]:
        import sys

        return os.getpid(), self.module in sys.modules
