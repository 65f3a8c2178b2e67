"""Test set-up: Triton kernels run under the interpreter when there is no GPU; `gpu` tests need CUDA;
each test has an availability cache of its own; the fixtures that put the test adapters of
`plugin_adapters` into the registry or the environment."""

import os
import tempfile

import pytest
import torch
from plugin_support import registered_test_adapters

from tfla_bench.adapters import availability_cache, registry

if not torch.cuda.is_available():
    # Must be set before any `@triton.jit` function is defined (i.e. before our kernels are imported).
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # The interpreter compiles nothing; a cache of this test run's own keeps what the sweeps under
    # test remember there (`precompile.DONE_FILE`) out of the user's Triton cache and of later runs.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tfla-bench-tests-triton-")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def availability_cache_file(tmp_path_factory, monkeypatch):
    """Each test its own empty availability cache (`registry.availability`), never the user's: a test
    that registers or patches an adapter must not meet answers another test left there."""
    path = tmp_path_factory.mktemp("availability") / "availability.json"
    monkeypatch.setenv(availability_cache.CACHE_FILE_ENV, str(path))
    return path


@pytest.fixture(scope="module")
def plugin_adapters():
    """The test adapters, registered for one test module (`plugin_support`); yields their module.

    A module that needs them everywhere says `pytestmark = pytest.mark.usefixtures("plugin_adapters")`.
    """
    with registered_test_adapters() as module:
        yield module


@pytest.fixture
def plugins(monkeypatch):
    """Name the test adapters in TFLA_BENCH_PLUGINS, as a user would for an unpackaged module."""
    monkeypatch.setenv(registry.PLUGINS_ENV, "plugin_adapters")
