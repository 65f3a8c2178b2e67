"""NVML readings per row: the reason names, the throttle flag, a stand-in NVML, and NVML absent."""

import sys
import types

import pytest

from tfla_bench.measure import gpustate
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.gpustate import Monitor, Reading


def test_reason_names_and_the_throttle_flag():
    assert gpustate.reason_names(0) == "none"
    assert gpustate.reason_names(0x1 | 0x4) == "idle+sw_power_cap"
    assert gpustate.reason_names(0x1000) == "0x1000"
    assert Reading(1980, 2619, 60, 500.0, "sw_power_cap").throttled
    assert Reading(1980, 2619, 60, 500.0, "hw_thermal+sw_thermal").throttled
    assert not Reading(345, 2619, 30, 70.0, "idle").throttled
    assert not Reading(1980, 2619, 60, 500.0, "none").throttled


def test_row_cells_name_every_gpu_state_column():
    before = Reading(1980, 2619, 40, 120.0, "none")
    after = Reading(1755, 2619, 71, 690.0, "sw_power_cap")
    cells = gpustate.row_cells(before, after)
    assert set(cells) == set(row_schema.GPU_STATE_COLUMNS)
    assert cells["sm_mhz_after"] == 1755 and cells["throttle_after"] == "sw_power_cap" and cells["throttled"]
    assert gpustate.row_cells(None, None)["throttled"] is None


def test_nvml_absent_gives_empty_readings_and_one_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    monitor = Monitor("GPU-1234")
    assert monitor.read() is None
    assert "nvidia-ml-py is not installed" in monitor.limits()["note"]


class FakeNvml(types.ModuleType):
    """Just the NVML calls the monitor makes, answering like an H100 under its power cap."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 2, 0

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__("pynvml")
        self.uuids = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.uuids.append(uuid)
        return "handle"

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1755 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 66

    def nvmlDeviceGetPowerUsage(self, handle):
        return 699_500

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0x4


def test_a_reading_through_nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monitor = Monitor("1234-abcd")
    assert fake.uuids == ["GPU-1234-abcd"]
    reading = monitor.read()
    assert reading == Reading(1755, 2619, 66, pytest.approx(699.5), "sw_power_cap") and reading.throttled
    assert monitor.limits() == {"max_sm_mhz": 1980, "max_mem_mhz": 2619, "power_limit_w": 700.0}


def test_nvml_errors_become_notes_not_crashes(monkeypatch):
    fake = FakeNvml()

    def refuse(uuid):
        raise fake.NVMLError("Not Found")

    fake.nvmlDeviceGetHandleByUUID = refuse
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monitor = Monitor("GPU-1")
    assert monitor.read() is None and "NVML unusable (Not Found)" in monitor.limits()["note"]


class Cooling(FakeNvml):
    """An H100 that idled at 1980 MHz, then leaves its power cap: `capped` more readings capped at
    1500 MHz, then `ramp` unthrottled readings below its idle clock, then idle at 1980 MHz."""

    def __init__(self, capped, ramp):
        super().__init__()
        self.script = [(1980, 0x1)] + [(1500, 0x4)] * capped + [(1890, 0x0)] * ramp + [(1980, 0x1)]
        self.reads = 0

    def _now(self):
        return self.script[min(self.reads, len(self.script) - 1)]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self._now()[0] if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        reasons = self._now()[1]
        self.reads += 1  # the reasons are the last call of a reading
        return reasons


def test_settle_waits_for_the_cap_to_lift_and_the_clock_to_return(monkeypatch):
    fake = Cooling(capped=3, ramp=2)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monitor = Monitor("GPU-1")  # reads once: the idle clock
    waited = monitor.settle(max_s=5.0, poll_s=0.001)
    assert 0 < waited < 5.0
    assert fake.reads == 1 + 3 + 2 + 1  # through the capped and the ramping readings to the idle one
    assert monitor.settle(max_s=5.0, poll_s=0.001) < 0.01  # already settled: one reading


def test_settle_gives_up_after_its_limit(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", Cooling(capped=10**6, ramp=0))
    assert 0.05 <= Monitor("GPU-1").settle(max_s=0.05, poll_s=0.001) < 1.0


def test_settle_without_nvml_waits_for_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert Monitor("GPU-1").settle() is None


class ScriptedMonitor:
    """Readings in order; `settle` counts its calls."""

    def __init__(self, *readings):
        self.readings = iter(readings)
        self.settled = 0

    def settle(self):
        self.settled += 1
        return 0.25

    def read(self):
        return next(self.readings)


FULL = Reading(1980, 2619, 50, 300.0, "none")
CAPPED = Reading(1755, 2619, 60, 690.0, "sw_power_cap")


@pytest.mark.parametrize("policy", ["gaps", "again"])
def test_retime_times_a_case_again_only_when_its_cap_set_in(policy):
    first = types.SimpleNamespace(reps=7, median_ms=1.0)
    calls = []

    def series(**options):
        calls.append(options)
        return types.SimpleNamespace(reps=5, median_ms=0.9)

    kept = gpustate.retime(series, first, ScriptedMonitor(FULL), FULL, policy)
    assert kept.stats is first and kept.after == FULL and not calls and kept.note == ""
    assert gpustate.retime(series, first, None, FULL, policy).stats is first and not calls
    # Capped already before the series: its own cap did not set in.
    assert gpustate.retime(series, first, ScriptedMonitor(CAPPED), CAPPED, policy).stats is first

    monitor = ScriptedMonitor(CAPPED, FULL)
    again = gpustate.retime(series, first, monitor, FULL, policy)
    assert again.stats.median_ms == 0.9 and again.warmup == 7 and again.after == FULL
    assert "SM 1980 -> 1755 MHz" in again.note
    if policy == "gaps":
        assert calls == [{"idle_gap": 1.0}] and monitor.settled == 1 and again.settle_s == 0.25
        assert again.note.endswith("an idle gap after each call")
    else:
        assert calls == [{}] and monitor.settled == 0 and again.settle_s == 0.0
        assert again.note.startswith("timed again under sw_power_cap")


class ThrottleMonitor(ScriptedMonitor):
    """`throttled` answers in order (False once they run out); `read` after the series reads CAPPED."""

    def __init__(self, answers):
        super().__init__(CAPPED, FULL)
        self.answers = list(answers)
        self.asked = 0

    def throttled(self):
        self.asked += 1
        return self.answers.pop(0) if self.answers else False


def test_a_fired_cap_watch_times_the_case_again_and_asks_no_more():
    monitor = ThrottleMonitor([False, False, True])
    watch = gpustate.CapWatch(monitor, FULL)
    assert [watch(), watch(), watch(), watch()] == [False, False, True, True]
    assert watch.fired and monitor.asked == 3

    first = types.SimpleNamespace(reps=3, median_ms=5.0)
    again = gpustate.retime(lambda **options: "second", first, monitor, FULL, "gaps", watch)
    assert again.stats == "second" and again.warmup == 3 and "sw_power_cap set in" in again.note


def test_the_cap_watch_never_fires_for_a_gpu_throttled_before_the_case_or_without_nvml():
    monitor = ThrottleMonitor([True, True])
    for watch in (
        gpustate.CapWatch(monitor, CAPPED),
        gpustate.CapWatch(None, FULL),
        gpustate.CapWatch(monitor, None),
    ):
        assert not watch() and not watch.fired
    assert monitor.asked == 0


def test_a_fired_watch_times_the_case_again_even_when_the_reading_after_shows_no_cap():
    watch = gpustate.CapWatch(ThrottleMonitor([True]), FULL)
    assert watch()
    first = types.SimpleNamespace(reps=1, median_ms=5.0)
    monitor = ScriptedMonitor(FULL, FULL)  # the cap lifted before the reading after the series
    again = gpustate.retime(lambda **options: "second", first, monitor, FULL, "gaps", watch)
    assert again.stats == "second" and again.note.startswith(
        "a throttling reason set in (SM 1980 -> 1980 MHz"
    )


@pytest.mark.parametrize("policy", ["gaps", "again"])
def test_the_energy_series_of_a_capped_case_runs_before_the_settle_and_only_then(policy):
    order = []
    first = types.SimpleNamespace(reps=7, median_ms=1.0)

    class Settling(ScriptedMonitor):
        def settle(self):
            order.append("settle")
            return super().settle()

    def series(**options):
        order.append("series")
        return first

    def energy_series():
        order.append("energy")

    gpustate.retime(series, first, Settling(FULL), FULL, policy, before_again=energy_series)
    assert order == []  # not capped: nothing runs again
    gpustate.retime(series, first, Settling(CAPPED, FULL), FULL, policy, before_again=energy_series)
    assert order == (["energy", "settle", "series"] if policy == "gaps" else ["energy", "series"])
