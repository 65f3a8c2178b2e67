"""The GPU's state around each case, read through NVML (`nvidia-ml-py`, imported lazily).

Before and after each case the worker reads the SM and memory clocks, the temperature, the power
draw and the clock-event (throttle) reasons. A row measured while a reason other than idling or
the application clock setting held (power cap, thermal or hardware slowdown) is flagged
`throttled`. Only reads: clocks and power limits are never changed. Without the package or a
driver every reading is None and `env.json` carries one note saying why. The monitor also reads
NVML's total-energy counter for `tfla_bench.measure.energy` (`Monitor.energy_mj`).

Before each case the worker first waits for the GPU to settle (`Monitor.settle`): a kernel that
draws the GPU's full power leaves it at its power cap, with lowered clocks, for a while after it
ends, and a case started then is measured at clocks that depend on the case before it. Waiting
until no throttling reason holds and the SM clock is back where it idled makes every case start
from the same state, so its throttling, if any, is its own.

A case whose own power cap (or slowdown) sets in during its timed calls is timed again
(`set_in`): the cap took tens to hundreds of milliseconds to set in, so part of the first series
ran at the full clock and part at the capped one, and its median fell in one group or the other
depending on when the cap came (`sdpa_cudnn` fw at 512 steps, Fig. 5: 0.978 or 1.04-1.07 ms from
run to run). The first series' calls count as warm-up and the row's note says so. The first series
asks NVML after each batch of calls whether the cap has set in (`CapWatch`) and ends there when it
has, so a case of long calls spends one call, not its whole series, before it is timed again. By default
(`power_cap = "gaps"`) the second series starts from a settled GPU and leaves it idle after each
call for as long as the call took, so it is busy half the time: calls shorter than the cap's
reaction time run at (nearly) the full clock, and longer ones each start from a GPU that is not
capped. With `power_cap = "again"` it runs at once, back to back, at the capped clock, which
depends on the GPU's temperature and history: on an H100, in two runs of four starts (two cool, two
hot each), `sdpa_cudnn` fw at 8192 steps took 13.52-13.98 ms under `again` and 12.47-12.53 ms under `gaps`
(`results/validation/gpu-disturbances-h100.md`). `gaps` times a kernel as a workload with idle time
between its calls sees it, not a sustained one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# NVML's clock-event reason bits (nvml.h, nvmlClocksEventReason*), named as the row shows them.
REASONS = {
    0x1: "idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
THROTTLING = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})
COLUMNS = ("sm_mhz", "mem_mhz", "temp_c", "power_w", "throttle")
SETTLE_MAX_S = 1.0
SETTLE_POLL_S = 0.005


class NoEnergyCounter(Exception):
    """NVML's total-energy counter cannot be read; the message says why."""


@dataclass(frozen=True)
class Reading:
    """One NVML reading of one GPU."""

    sm_mhz: int
    mem_mhz: int
    temp_c: int
    power_w: float
    throttle: str

    @property
    def throttled(self) -> bool:
        return throttling(self.throttle)


def throttling(names: str) -> bool:
    """Whether reason names as `reason_names` joins them hold a throttling one."""
    return bool(THROTTLING & set(names.split("+")))


def reason_names(mask: int) -> str:
    """A clock-event reason bit mask as names joined by `+` (`none` for 0, unknown bits in hex)."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    if rest:
        names.append(hex(rest))
    return "+".join(names) or "none"


class Monitor:
    """NVML handle of one CUDA device; every reading returns None when NVML cannot be used (the energy
    counter, `energy_mj`, raises and says why).

    Args:
        uuid: the device's UUID as torch reports it (`torch.cuda.get_device_properties(d).uuid`),
            which names the same GPU whatever `CUDA_VISIBLE_DEVICES` says.
    """

    def __init__(self, uuid: str) -> None:
        self.note: str | None = None
        self._unusable = ""  # why NVML cannot be used, for the note and the energy counter
        self._nvml: Any = None
        self._handle: Any = None
        try:
            # NVML is optional (nvidia-ml-py).
            import pynvml
        except ImportError:
            self._unusable = "nvidia-ml-py is not installed"
        else:
            try:
                pynvml.nvmlInit()
                name = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(name)
            except pynvml.NVMLError as exc:
                self._unusable = f"NVML unusable ({exc})"
        if self._unusable:
            self.note = f"{self._unusable}: no clocks, temperature, power or throttle per row"
            return
        self._nvml = pynvml
        first = self.read()
        self._idle_sm_mhz = first.sm_mhz if first is not None else 0

    def settle(self, max_s: float = SETTLE_MAX_S, poll_s: float = SETTLE_POLL_S) -> float | None:
        """Wait until the GPU shows no throttling reason and is idle or back at the highest SM clock
        this monitor has read (the clock it keeps between cases), for at most `max_s` seconds;
        return the seconds waited (None without NVML). Call it with nothing running on the GPU."""
        if self._nvml is None:
            return None
        start = time.monotonic()
        while True:
            reading = self.read()
            waited = time.monotonic() - start
            if reading is None:
                return waited
            if not reading.throttled:
                self._idle_sm_mhz = max(self._idle_sm_mhz, reading.sm_mhz)
                # An idle GPU lowers its clock and raises it again at the next kernel.
                if reading.sm_mhz == self._idle_sm_mhz or "idle" in reading.throttle.split("+"):
                    return waited
            if waited >= max_s:
                return waited
            time.sleep(poll_s)

    def throttled(self) -> bool:
        """Whether a throttling reason holds now (one NVML call; False without NVML)."""
        if self._nvml is None:
            return False
        try:
            return throttling(reason_names(_reasons(self._nvml)(self._handle)))
        except self._nvml.NVMLError:
            return False

    def read(self) -> Reading | None:
        """The current clocks, temperature, power and clock-event reasons."""
        if self._nvml is None:
            return None
        nvml, handle = self._nvml, self._handle
        try:
            reasons = _reasons(nvml)
            return Reading(
                sm_mhz=nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                mem_mhz=nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
                temp_c=nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                throttle=reason_names(reasons(handle)),
            )
        except nvml.NVMLError:
            return None

    def energy_mj(self) -> int:
        """NVML's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`): the GPU's energy in
        millijoules since the driver was loaded.

        Raises:
            NoEnergyCounter: NVML is not usable here, or gives no counter for this GPU (its error,
                e.g. `Not Supported`, in the message).
        """
        if self._nvml is None:
            raise NoEnergyCounter(self._unusable)
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except self._nvml.NVMLError as exc:
            raise NoEnergyCounter(f"NVML gives no energy counter for this GPU ({exc})") from None

    def limits(self) -> dict[str, Any]:
        """For env.json: the clocks' maxima and the power limit, or the note saying why there are none."""
        if self._nvml is None:
            return {"note": self.note}
        nvml, handle = self._nvml, self._handle
        try:
            return {
                "max_sm_mhz": nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
                "max_mem_mhz": nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM),
                "power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3,
            }
        except nvml.NVMLError as exc:
            return {"note": f"NVML did not give the limits: {exc}"}


def _reasons(nvml: Any) -> Callable[[Any], int]:
    """NVML's call for the clock-event reasons (renamed from throttle reasons in newer bindings)."""
    return getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )


def device_monitor(device: str) -> Monitor | None:
    """The NVML monitor of a CUDA device, None on the CPU."""
    # torch takes seconds to import; only this path needs it.
    import torch

    if not device.startswith("cuda"):
        return None
    # A torch without `uuid` gives an empty name, which NVML refuses: the monitor then carries a note.
    return Monitor(str(getattr(torch.cuda.get_device_properties(device), "uuid", "")))


def set_in(before: Reading | None, after: Reading | None) -> bool:
    """Whether a throttling reason holds in `after` that did not in `before` (False without either)."""
    return before is not None and after is not None and after.throttled and not before.throttled


class CapWatch:
    """The first series' `stop_early` (`timing.time_calls`): after each batch of calls, whether a
    throttling reason holds that did not in `before`, the reading before the case. It then ends the
    series, whose calls only count as warm-up once `retime` times the case again, and remembers that
    it did (`fired`). Never fires without a monitor or a reading, or when `before` was throttled."""

    def __init__(self, monitor: Monitor | None, before: Reading | None) -> None:
        self.monitor = monitor if before is not None and not before.throttled else None
        self.fired = False

    def __call__(self) -> bool:
        if self.monitor is not None and not self.fired:
            self.fired = self.monitor.throttled()
        return self.fired


@dataclass(frozen=True)
class Retimed:
    """The outcome of `retime`: the series to keep and the reading after it; where the case was timed
    again, the first series' calls (now warm-up), the wait to settle before the second and the note."""

    stats: Any
    after: Reading | None
    warmup: int = 0
    settle_s: float = 0.0
    note: str = ""


def retime(
    series: Callable[..., Any],
    stats: Any,
    monitor: Monitor | None,
    before: Reading | None,
    policy: str,
    watch: CapWatch | None = None,
    after: Reading | None = None,
    before_again: Callable[[], None] | None = None,
) -> Retimed:
    """Time a case again if its power cap (or a slowdown) set in during its first series (`set_in`,
    or `watch` fired and ended that series early).

    Args:
        series: runs one timed series; `series(idle_gap=1.0)` with an idle gap after each call as
            long as the call (`timing.time_calls`).
        stats: the first series' `TimingStats`.
        monitor: the GPU's monitor (None: no reading, nothing timed again).
        before: the reading before the first series.
        policy: `gaps` (settle, then the series with idle gaps) or `again` (the series at once, back
            to back, at the capped clock); the module docstring says why.
        watch: the first series' `stop_early`, if it had one.
        after: the reading right after the first series, read now when None.
        before_again: run once the case is to be timed again, before the settle: the worker's
            energy series, at the clock the cap set, so that one settle covers its heat as well.
    """
    if after is None and monitor is not None:
        after = monitor.read()
    fired = watch is not None and watch.fired
    if monitor is None or before is None or not (fired or set_in(before, after)):
        return Retimed(stats, after)
    warmup = "during the first timed calls, which count as warm-up"
    sm_after = after.sm_mhz if after is not None else "?"
    throttle = after.throttle if after is not None and after.throttled else "a throttling reason"
    clocks = f"(SM {before.sm_mhz} -> {sm_after} MHz {warmup})"
    if before_again is not None:
        before_again()
    if policy == "gaps":
        settle_s = monitor.settle() or 0.0
        again = series(idle_gap=1.0)
        gaps = "timed again from a settled GPU, an idle gap after each call"
        note = f"{throttle} set in {clocks}: {gaps}"
    else:
        settle_s, again = 0.0, series()
        note = f"timed again under {throttle} {clocks}"
    return Retimed(again, monitor.read(), stats.reps, settle_s, note)


def row_cells(before: Reading | None, after: Reading | None) -> dict[str, Any]:
    """The row's `<column>_before`, `<column>_after` and `throttled` cells (None where not read)."""
    cells: dict[str, Any] = {}
    for suffix, reading in (("before", before), ("after", after)):
        for column in COLUMNS:
            cells[f"{column}_{suffix}"] = getattr(reading, column) if reading is not None else None
    readings = [reading for reading in (before, after) if reading is not None]
    cells["throttled"] = any(reading.throttled for reading in readings) if readings else None
    return cells
