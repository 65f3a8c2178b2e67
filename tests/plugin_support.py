"""Registers the test adapters of `plugin_adapters` for the duration of a test module only.

Other test modules (the correctness gate, family tests) iterate over every registered adapter;
they must never meet an adapter that aborts or hangs. So the test process imports
`plugin_adapters` inside `registered_test_adapters()`, which restores the registry on exit.
Spawned workers import `plugin_adapters` themselves (the runner sends each job with its adapter's
module), and there the adapters stay registered for the worker's short life.
"""

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType

from tfla_bench.adapters import registry


@contextlib.contextmanager
def registered_test_adapters() -> Iterator[ModuleType]:
    """Register the test adapters; yields the `plugin_adapters` module."""
    registry.load()  # the built-ins belong in the saved registry, not in the temporary one
    saved = registry._ADAPTERS
    registry._ADAPTERS = dict(saved)
    try:
        module = importlib.import_module("plugin_adapters")
        for cls in module.ADAPTERS:
            registry.register(cls)
        yield module
    finally:
        registry._ADAPTERS = saved
