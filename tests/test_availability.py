"""The plan's availability checks: each adapter asked in a worker of its own (CPU)."""

import pytest

from tfla_bench.availability import availability
from tfla_bench.workloads import Case

pytestmark = pytest.mark.usefixtures("plugin_adapters")


def cases(*kernels):
    return [Case(kernel, mode, "float32", 1, 16, 1, 8, 8) for kernel in kernels for mode in ("fw", "fwbw")]


def test_each_adapter_is_asked_in_its_own_worker_and_a_crash_or_a_hang_costs_only_it(
    plugin_adapters, tmp_path, monkeypatch
):
    monkeypatch.setenv(plugin_adapters.CHECK_FAULTS_ENV, "1")
    kernels = ("test_slow", "test_unavailable", "test_check_aborts", "test_check_hangs")
    reasons = availability(cases(*kernels), ["cpu"], tmp_path, timeout_s=15, in_workers=True)
    assert list(reasons) == list(kernels)
    assert reasons["test_slow"] is None
    assert reasons["test_unavailable"] == "needs the package frobnicate"
    assert reasons["test_check_aborts"].startswith("its availability check crashed: worker died (SIGABRT)")
    hung = "its availability check gave no answer: no result after 15 s"
    assert reasons["test_check_hangs"].startswith(hung)
    assert sorted(path.name for path in tmp_path.iterdir()) == [f"plan-{i}.log" for i in range(4)]


def test_on_cpu_the_adapters_are_asked_in_this_process(tmp_path):
    reasons = availability(cases("test_slow", "test_unavailable"), ["cpu"], tmp_path)
    assert reasons == {"test_slow": None, "test_unavailable": "needs the package frobnicate"}
    assert list(tmp_path.iterdir()) == []
