"""Energy per call: NVML's total-energy counter read around a series of back-to-back calls, or
around the timed calls less what ran beside them (`window`, `calibrate`, `charge`; docs/energy.md,
"Around the timed calls").

The counter (`nvmlDeviceGetTotalEnergyConsumption`, read by `gpustate.Monitor.energy_mj`) is the
GPU board's energy in millijoules since the driver was loaded. It moves in steps: the driver
updates it every 20-100 ms, depending on the GPU. One call is far shorter than a step, so the
worker reads the counter around a series of calls that lasts at least the `energy_s` setting, and divides.

The series (`measure_energy`)
-----------------------------
It runs after the timed series of the case (`tfla_bench.measure.timing`), as a series of its own:

1. The device is synchronized, then the counter is read every `TICK_POLL_S` until its value changes
   (at most `TICK_WAIT_S`): the series starts right after an update of the counter, so the energy
   it counts begins where the calls begin, not up to one step earlier.
2. Calls back to back, each after the gradients are set to None (host work, no kernel), without
   the L2 flush and the spin that precede every timed call: neither is charged to the kernel. The
   calls stop once the count planned from the timed series' fastest call would last the series'
   length (the `energy_s` setting, `MIN_SERIES_S` by default), or once that much of the host's time
   has passed (a call whose launch takes longer than its kernel), or at `MAX_CALLS`.
3. The device is synchronized, and the counter is read until its next update (at most
   `TICK_WAIT_S`), so the step that holds the end of the last call is counted.
4. The window's idle tail, from the sync that found the calls done to that update (up to one step
   of the counter), is charged at the awake GPU's power (`calibrate`, once per worker) and taken off:
   `energy_mj` = (the counter's rise - awake power x tail) / calls; `tokens_per_joule` = batch x
   seq_len / (energy_mj / 1000).

What one call's energy includes: everything the board drew while the calls ran, the GPU's idle
(static) power and its memory's included: the GPU's energy while it runs the kernel. The L2 holds
what the call before left in it (the timed calls start from a flushed L2). Where the host queues a
call more slowly than the GPU runs it, the GPU idles between calls and that idle time is charged
too, as in any loop of such calls. The idle tail after the last call is not: left in, it was about
3% of a 0.5 s series on an H200 (docs/energy.md, "Validation"). A GPU at its power cap runs the
series at the capped clock, as a sustained workload does.

When there is no energy
-----------------------
The cells stay empty, never zero, and `env.json` says why (`measurement.energy.missing`, one line):
the setting is off (`energy = false`), the case ran on the CPU, nvidia-ml-py is not installed or
NVML is unusable, NVML gives no counter for the GPU (`Not Supported`), the awake power that the
tail is charged at could not be measured, the counter did not move over the series, or it went
backwards (a driver reload resets it). A 64-bit counter in millijoules wraps after 585 million years
at 1 kW; a fall is taken as a wrap only when the wrapped rise is one a GPU can draw in the series'
time (`MAX_BOARD_W`), and so is any rise.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tfla_bench.measure.gpustate import Monitor, NoEnergyCounter

# The shortest series of calls the counter is read around (the `energy_s` setting's default): long
# enough that its per-call energy repeats within 1% on an H200, short enough that the GPU runs it at
# the clock it ran the timed calls at, before its power cap sets in (docs/energy.md, "Validation").
MIN_SERIES_S = 0.25
# The most calls in one series (a call of microseconds whose launch is quicker still).
MAX_CALLS = 100_000
# How long to wait for an update of the counter at each end of the series, and how often to look.
TICK_WAIT_S = 0.2
TICK_POLL_S = 0.001
# No GPU board draws more: a larger rise of the counter over a series is not energy.
MAX_BOARD_W = 2_000.0
# The flushes timed on the GPU for the length of the calibration's series of them.
FLUSH_PROBE = 10
# The largest share of the counter's rise around the timed calls that may be charged to what ran
# beside them; above it, the case's energy comes from a series of its own.
MAX_OUTSIDE_SHARE = 0.2
# NVML's counter is an unsigned 64-bit integer.
COUNTER_MODULUS = 2**64
# What env.json says of each method; `{series_s}` is the series' shortest length (`energy_s`).
METHODS = {
    "series": (
        "NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption), read after an update of it "
        "before and after at least {series_s:g} s of back-to-back calls that follow the timed calls "
        "(no L2 flush, no spin), the device synchronized at both ends; energy_mj = (its rise - the awake "
        "GPU's power, measured once per worker, x the idle tail from the sync after the calls to the "
        "counter's closing update) / calls, idle power during the calls included (docs/energy.md)"
    ),
    "around": (
        "NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption), read after an update of it "
        "before and after the timed calls, the device synchronized at both ends; energy_mj = (its rise - "
        "the L2 flushes' energy - the awake GPU's power x the window's time outside the calls and "
        "flushes) / calls, both measured once per worker; a case timed again under its power cap, or "
        f"whose flushes, spins and idle GPU drew more than {MAX_OUTSIDE_SHARE:.0%} of the rise, from "
        "at least {series_s:g} s of back-to-back calls of its own (docs/energy.md)"
    ),
}
OFF = "turned off (the spec's energy = false, or --no-energy)"
NO_GPU = "no GPU: the energy counter is NVML's, for a CUDA device"
T = TypeVar("T")


@dataclass(frozen=True)
class Energy:
    """The counter read around some calls: how many, the host's clock (`time.perf_counter`) at the
    reads that open and close the window, the counter's rise over it in mJ, and the part of that rise
    charged to what ran beside the calls; or why there is no energy.

    Attributes:
        calls: the calls made in the window.
        started_s, ended_s: when the reads that opened and closed the window returned.
        counted_mj: the counter's rise, None when there is no energy.
        missing: why there is no energy, empty when there is.
        outside_mj: what the L2 flushes, the spins and the idle GPU drew in the window (`charge`);
            for a series of its own (`measure_energy`), the awake GPU over the window's idle tail.
        method: `series` or `around` (`tfla_bench.measure.settings.ENERGY_METHODS`).
        synced_s: when the device was found done with the calls (the sync after them returned): the
            window's rest, to `ended_s`, is the idle device waiting for the counter's next update.
    """

    calls: int = 0
    started_s: float = 0.0
    ended_s: float = 0.0
    counted_mj: int | None = None
    missing: str = ""
    outside_mj: float = 0.0
    method: str = "series"
    synced_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.ended_s - self.started_s

    @property
    def tail_s(self) -> float:
        """The window's idle tail: from the sync that found the calls done to the closing read."""
        return max(self.ended_s - self.synced_s, 0.0) if self.synced_s else 0.0

    @property
    def per_call_mj(self) -> float | None:
        """The energy of one call in mJ, or None."""
        if self.counted_mj is None or not self.calls:
            return None
        return (self.counted_mj - self.outside_mj) / self.calls

    @property
    def outside_share(self) -> float | None:
        """The share of the counter's rise charged to what ran beside the calls, or None."""
        return self.outside_mj / self.counted_mj if self.counted_mj else None


def next_update(counter: Callable[[], int], wait_s: float = TICK_WAIT_S, poll_s: float = TICK_POLL_S) -> int:
    """The counter's value once it has changed from its first read, or that value after `wait_s`."""
    first = counter()
    deadline = time.perf_counter() + wait_s
    while time.perf_counter() < deadline:
        time.sleep(poll_s)
        value = counter()
        if value != first:
            return value
    return first


def back_to_back(
    call: Callable[[], Any],
    before_each: Callable[[], None] | None,
    per_call_s: float,
    min_s: float = MIN_SERIES_S,
    max_calls: int = MAX_CALLS,
) -> int:
    """Queue calls until `per_call_s` says they last `min_s`, or `min_s` of the host's time has passed,
    or `max_calls`; at least one. Returns the number of calls."""
    # A time that is not a positive number (NaN, zero) plans nothing: the host's time stops the calls.
    planned = max_calls if not per_call_s > 0 else max(1, min(max_calls, math.ceil(min_s / per_call_s)))
    calls = 0
    began = time.perf_counter()
    while calls < planned and (calls == 0 or time.perf_counter() - began < min_s):
        if before_each is not None:
            before_each()
        call()
        calls += 1
    return calls


def rise_mj(start: int, end: int, seconds: float) -> tuple[int | None, str]:
    """The counter's rise from `start` to `end` over a window of `seconds`, or None and why it is not
    an energy (it did not move, went backwards, or rose more than a GPU can draw)."""
    most = MAX_BOARD_W * 1e3 * (seconds + TICK_WAIT_S)
    rise = end - start
    if rise < 0 and rise + COUNTER_MODULUS <= most:
        rise += COUNTER_MODULUS  # a wrap past 2**64: the only fall a GPU can make in this time
    if rise < 0:
        return None, (
            f"the counter went backwards ({start} -> {end} mJ over {seconds:.2f} s): the driver was "
            "reloaded or the counter reset"
        )
    if rise == 0:
        return None, f"the counter did not move over {seconds:.2f} s"
    if rise > most:
        most_w = f"{MAX_BOARD_W:g} W"
        return None, f"the counter rose {rise} mJ in {seconds:.2f} s, more than a GPU draws ({most_w})"
    return rise, ""


def measure_energy(
    call: Callable[[], Any],
    *,
    counter: Callable[[], int],
    sync: Callable[[], None],
    per_call_s: float,
    awake_w: float,
    before_each: Callable[[], None] | None = None,
    min_s: float = MIN_SERIES_S,
    max_calls: int = MAX_CALLS,
) -> Energy:
    """One energy series of `call` (the module docstring).

    Args:
        call: the call (a kernel launch, forward + backward, or a CUDA graph replay).
        counter: reads the energy counter in mJ (`Monitor.energy_mj`); raises `NoEnergyCounter`.
        sync: waits for the device (`timing.synchronize`).
        per_call_s: the time of one call, for the number of calls (the timed series' fastest).
        awake_w: the awake GPU's power in W (`Calibration.awake_w`), charged over the idle tail.
        before_each: state reset before each call (gradients to None); no GPU work.
        min_s, max_calls: `back_to_back`'s.
    """
    calls, opened = window(
        lambda: back_to_back(call, before_each, per_call_s, min_s, max_calls), counter=counter, sync=sync
    )
    tail_mj = awake_w * 1e3 * opened.tail_s if opened.counted_mj is not None else 0.0
    return dataclasses.replace(opened, calls=calls or 0, outside_mj=tail_mj)


def window(
    run: Callable[[], T], *, counter: Callable[[], int], sync: Callable[[], None]
) -> tuple[T | None, Energy]:
    """Run `run` inside a window of the counter that opens and closes on an idle device, each end
    right after one of the counter's updates: what `run` returned, and the window (its `calls` left
    at zero for the caller to set). Where the opening read finds no counter (`NoEnergyCounter`),
    `run` is not called: None, and the window says why; where only the closing read fails, `run`'s
    result and why the window has no energy."""
    try:
        sync()
        start = next_update(counter)
    except NoEnergyCounter as exc:
        return None, Energy(missing=str(exc))
    started_s = time.perf_counter()
    result = run()
    sync()
    synced_s = time.perf_counter()
    try:
        end = next_update(counter)
    except NoEnergyCounter as exc:
        return result, Energy(0, started_s, time.perf_counter(), missing=str(exc), synced_s=synced_s)
    ended_s = time.perf_counter()
    rise, missing = rise_mj(start, end, ended_s - started_s)
    return result, Energy(0, started_s, ended_s, rise, missing=missing, synced_s=synced_s)


@dataclass(frozen=True)
class Calibration:
    """What a GPU draws in a timed series beside the calls (`calibrate`): its power while awake with
    one spin kernel running (the spins before the calls, the GPU waiting for the host, the tail of
    the window), and one L2 flush's energy and time; or why there is none.

    Attributes:
        awake_w: the board's power over back-to-back spins, in W.
        flush_mj, flush_s: one flush's energy (its awake share included) and its time on the GPU;
            zero without flushes.
        missing: why there is no calibration, empty when there is.
    """

    awake_w: float = 0.0
    flush_mj: float = 0.0
    flush_s: float = 0.0
    missing: str = ""


def calibrate(
    *,
    counter: Callable[[], int],
    sync: Callable[[], None],
    spin: Callable[[], None],
    spin_s: float,
    flush: Callable[[], None] | None,
    gpu_seconds: Callable[[Callable[[], None], int], float],
    min_s: float = MIN_SERIES_S,
) -> Calibration:
    """Measure a `Calibration`: one window around `min_s` of back-to-back spins (`spin` queues one of
    `spin_s`), then, with `flush`, one around `min_s` of back-to-back flushes timed on the GPU
    (`gpu_seconds(fn, calls)` queues `calls` of `fn` between two GPU timestamps and returns the
    seconds between them). About 2 x (`min_s` + a step of the counter)."""
    _, awake = window(lambda: back_to_back(spin, None, spin_s, min_s), counter=counter, sync=sync)
    if awake.counted_mj is None or awake.seconds <= 0:
        return Calibration(missing=f"the spins' window: {awake.missing or 'no time'}")
    awake_w = awake.counted_mj / 1e3 / awake.seconds
    if flush is None:
        return Calibration(awake_w)
    flush_s = gpu_seconds(flush, FLUSH_PROBE) / FLUSH_PROBE
    count = max(1, min(MAX_CALLS, math.ceil(min_s / flush_s))) if flush_s > 0 else FLUSH_PROBE
    busy_s, flushes = window(lambda: gpu_seconds(flush, count), counter=counter, sync=sync)
    if flushes.counted_mj is None or busy_s is None:
        return Calibration(missing=f"the flushes' window: {flushes.missing}")
    flush_mj = (flushes.counted_mj - awake_w * 1e3 * max(flushes.seconds - busy_s, 0.0)) / count
    if not flush_mj > 0:
        return Calibration(missing=f"the flushes' window left them no energy ({flush_mj:.3g} mJ each)")
    return Calibration(awake_w, flush_mj, busy_s / count)


def charge(opened: Energy, calls: int, calls_s: float, flushes: int, calibration: Calibration) -> Energy:
    """The energy of `calls` timed calls that took `calls_s` on the GPU in all, read in the window
    `opened` with `flushes` L2 flushes beside them: `calibration`'s flush energy for each flush, and
    its awake power over the rest of the window (spins, the GPU waiting for the host, the tail),
    charged outside the calls."""
    if opened.counted_mj is None or calibration.missing:
        missing = opened.missing or calibration.missing
        return dataclasses.replace(opened, calls=calls, method="around", missing=missing)
    rest_s = max(opened.seconds - calls_s - flushes * calibration.flush_s, 0.0)
    outside = flushes * calibration.flush_mj + calibration.awake_w * 1e3 * rest_s
    return dataclasses.replace(opened, calls=calls, outside_mj=outside, method="around")


class PowerSampler:
    """Power readings every `interval_s` in a background thread, each with the host's clock
    (`time.perf_counter`): the check of the counter against power x time (`integrate_mj`,
    `experiments/validate_energy.py`). A reading of None (NVML said no) is skipped.

    Args:
        read: one power reading in watts (e.g. NVML's `nvmlDeviceGetPowerUsage` / 1000).
        interval_s: the pause between two readings.

    Examples::

        with PowerSampler(read_watts) as sampler:
            series = measure_energy(call, counter=..., sync=..., per_call_s=...)
        integrate_mj(sampler.samples, series.started_s, series.ended_s)
    """

    def __init__(self, read: Callable[[], float | None], interval_s: float = 0.005) -> None:
        self.read = read
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            watts = self.read()
            if watts is not None:
                self.samples.append((time.perf_counter(), watts))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PowerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def integrate_mj(samples: list[tuple[float, float]], start_s: float, end_s: float) -> float:
    """The energy in mJ of `(time_s, watts)` samples from `start_s` to `end_s`: the trapezoid rule,
    power linear between samples and interpolated at both ends of the window.

    Raises:
        ValueError: the samples do not cover the window, or are not in time order.
    """
    times = [t for t, _ in samples]
    if len(samples) < 2 or times[0] > start_s or times[-1] < end_s or start_s > end_s:
        raise ValueError("the power samples do not cover the window")
    if any(later < earlier for earlier, later in zip(times, times[1:], strict=False)):
        raise ValueError("the power samples are not in time order")
    inside = [(t, w) for t, w in samples if start_s < t < end_s]
    points = [(start_s, _power_at(samples, start_s)), *inside, (end_s, _power_at(samples, end_s))]
    joules = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(points, points[1:], strict=False))
    return joules * 1e3


def _power_at(samples: list[tuple[float, float]], when: float) -> float:
    """The power at `when`, linear between the samples around it (inside their span)."""
    after = next(index for index, (t, _) in enumerate(samples) if t >= when)
    (t1, w1), (t0, w0) = samples[after], samples[max(after - 1, 0)]
    return w1 if t1 == t0 else w0 + (w1 - w0) * (when - t0) / (t1 - t0)


def row_cells(tokens: int, energy: Energy) -> dict[str, float | None]:
    """The row's `energy_mj` and `tokens_per_joule` cells for a call over `tokens` tokens (None when
    there is no energy)."""
    per_call = energy.per_call_mj
    if per_call is None or not math.isfinite(per_call) or per_call <= 0:
        return {"energy_mj": None, "tokens_per_joule": None}
    return {"energy_mj": per_call, "tokens_per_joule": tokens / (per_call / 1e3)}


def unavailable(monitor: Monitor | None) -> str | None:
    """Why a worker's device has no energy counter (None: it has one), for `env.json`."""
    if monitor is None:
        return NO_GPU
    try:
        monitor.energy_mj()
    except NoEnergyCounter as exc:
        return str(exc)
    return None


def env_record(
    enabled: bool, missing: str | None, method: str = "series", series_s: float = MIN_SERIES_S
) -> dict[str, Any]:
    """`env.json`'s `measurement.energy`: whether it is on, the method, and why the cells are empty
    (None while nothing says so; a sweep sets it at the first row without energy)."""
    described = METHODS[method].format(series_s=series_s)
    return {"enabled": enabled, "method": described, "missing": OFF if not enabled else missing}


def tell_missing(env: dict[str, Any], reason: str) -> bool:
    """Set `measurement.energy.missing` of an `env.json` record to `reason` unless it holds a reason
    already; whether it changed."""
    entry = env.setdefault("measurement", {}).setdefault("energy", {})
    if not isinstance(entry, dict) or entry.get("missing"):
        return False
    entry["missing"] = reason
    return True
