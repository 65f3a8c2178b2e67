"""Energy per call: NVML's total-energy counter between two of its updates, with the GPU running
back-to-back calls across both.

The counter (`nvmlDeviceGetTotalEnergyConsumption`, read by `gpustate.Monitor.energy_mj`) is the
GPU board's energy in millijoules since the driver was loaded. It moves in steps: the driver
updates it every 20-100 ms, depending on the GPU. Between two of its updates its rise is exact; what
the series has to find is how many calls the GPU finished between the same two moments. So the
host keeps the GPU busy with calls, polls the counter, and counts the calls done at each update.

The series (`measure_energy`)
-----------------------------
It runs after the timed series of the case (`tfla_bench.measure.timing`), as a series of its own:

1. The device is synchronized and the counter read.
2. Calls are queued back to back, each after the gradients are set to None (host work, no kernel)
   and followed by a marker (`cuda_mark`: a CUDA event) that says whether the GPU has passed it
   (calls shorter than `MARK_S`, on the GPU and on the host, share one); no L2 flush, no spin.
   `QUEUE_S` of calls by the timed series' fastest, or `SLOW_READS` reads of the counter where
   those take longer (at least `MIN_QUEUED`, at most `MAX_QUEUED` calls), stay in flight: the GPU
   does not wait for the host, and the host does not queue seconds of work.
3. Once the queue is full or a read's time after the last poll, and every `POLL_S` while the queue
   stays full, the counter is read and the markers the GPU passed are counted, oldest first; the
   calls seen done at one poll are spread evenly over the time since the poll before. A value of
   the counter that differs from the last is an update made between two polls: it is placed at
   their midpoint on the host's clock, and the calls done then are interpolated between the calls'
   completion times: the midpoint of the two polls' counts where many calls end between two polls,
   the elapsed share of the running call where one call spans many polls (a float count).
4. The window opens at the first update that comes at least `LEAD_S` after the GPU finished its
   first call, and closes at the first later update that is at least `MIN_SERIES_S` after it and
   holds at least `MIN_WINDOW_CALLS` calls by the polls' counts; calls so long that these take
   longer than `MAX_WINDOW_S` close it at the first update past `MAX_WINDOW_S` that holds one call.
   An update seen only after the host was held up between two polls (further apart than
   `SLOW_READS` reads and queued groups of calls) does not bound the window, and the window closes
   only where the counts at its two updates may be off by at most `COUNT_ERROR` of its calls
   together (a counter slow to read gets a longer window). Then no more calls are queued, the ones
   in flight finish, and the device is synchronized.
5. `energy_mj` = the counter's rise over the window / the calls done in it;
   `tokens_per_joule` = batch x seq_len / (energy_mj / 1000).

What one call's energy includes: everything the board drew while the GPU ran the calls, the GPU's
idle (static) power and its memory's included: the GPU's energy while it runs the kernel. The L2
holds what the call before left in it (the timed calls start from a flushed L2). Where the host
queues a call more slowly than the GPU runs it, the GPU idles between calls and that idle time is
charged too, as in any loop of such calls. Otherwise no idle GPU is inside the window: calls run
before it opens and after it closes, and those calls, the synchronization at both ends and the
host's start and stop are not counted. The counter may trail the power it sums (its value at an
update is the energy up to a moment before): the window's energy is then that of an equally long
span a little earlier, which is the same energy while the GPU runs the same calls on both sides;
the calls before the window (at least `LEAD_S`) cover a lag up to that. A GPU at its power cap runs the
series at the capped clock, as a sustained workload does. The series costs `LEAD_S` plus up to two
steps of the counter plus `MIN_SERIES_S` of calls: about 0.15-0.35 s a case (docs/energy.md).

When there is no energy
-----------------------
The cells stay empty, never zero, and `env.json` says why (`measurement.energy.missing`, one line):
the setting is off (`energy = false`), the case ran on the CPU, nvidia-ml-py is not installed or
NVML is unusable, NVML gives no counter for the GPU (`Not Supported`), the counter did not move for
`UPDATE_WAIT_S`, the series reached `MAX_CALLS` before its window closed, or the counter went
backwards over the window (a driver reload resets it). A 64-bit counter in millijoules wraps after
585 million years at 1 kW; a fall is taken as a wrap only when the wrapped rise is one a GPU can
draw in the window's time (`MAX_BOARD_W`), and so is any rise.
"""

from __future__ import annotations

import bisect
import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfla_bench.measure.gpustate import Monitor, NoEnergyCounter

# The window's shortest length, between the two updates of the counter that bound it.
MIN_SERIES_S = 0.1
# The fewest calls done inside the window, so that the count's error at its ends (a share of one
# call's energy, where the power changes within a call) is a small share of it.
MIN_WINDOW_CALLS = 20
# Calls so long that MIN_WINDOW_CALLS of them take longer: a window of this length, one call or more.
MAX_WINDOW_S = 1.0
# How long the GPU runs calls before the update that opens the window: the counter's lag.
LEAD_S = 0.02
# The most the count of calls at the window's two updates may be off, as a share of its calls (the
# error is spread evenly up to it, so typically a third of it): the polls around an update, of
# a slow counter or of a host held up, make its time, and so its count, uncertain.
COUNT_ERROR = 0.02
# No update of the counter for this long ends the series without energy.
UPDATE_WAIT_S = 1.0
# The pause between two polls while the queue is full.
POLL_S = 0.0002
# The GPU work kept in flight, by the timed series' fastest call, and the bounds on its calls.
QUEUE_S = 0.01
MIN_QUEUED = 2
MAX_QUEUED = 256
# The work queued covers this many reads of the counter, and polls this many reads apart are usual.
SLOW_READS = 3
# The GPU's or the host's time between two markers, whichever is longer: shorter calls share one.
MARK_S = 0.0002
# The most calls in one series (a call of microseconds whose launch is quicker still).
MAX_CALLS = 100_000
# No GPU board draws more: a larger rise of the counter over a window is not energy.
MAX_BOARD_W = 2_000.0
# The counter's window may be longer than the host's by its lag and the polls' spacing.
RISE_SLACK_S = 0.2
# NVML's counter is an unsigned 64-bit integer.
COUNTER_MODULUS = 2**64
METHOD = (
    "NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption) between two of its updates at "
    f"least {MIN_SERIES_S:g} s and {MIN_WINDOW_CALLS} calls apart, polled while the GPU runs back-to-back "
    "calls (no L2 flush, no spin) that follow the timed calls and continue across both updates; the "
    "calls done at each update counted by CUDA events after each call, interpolated; energy_mj = the "
    "counter's rise / those calls, idle power during the calls included, no idle GPU in the window "
    "(docs/energy.md)"
)
OFF = "turned off (the spec's energy = false, or --no-energy)"
NO_GPU = "no GPU: the energy counter is NVML's, for a CUDA device"


@dataclass(frozen=True)
class Energy:
    """One energy series: the calls done in its window, the host's clock (`time.perf_counter`) at the
    counter's updates that open and close the window, and the counter's rise over it in mJ; or why
    there is no energy.

    Attributes:
        calls: the calls done inside the window, interpolated at its ends (a float).
        started_s, ended_s: when the updates that open and close the window were made, each the
            midpoint of the two polls of the counter around it.
        counted_mj: the counter's rise, None when there is no energy.
        missing: why there is no energy, empty when there is.
    """

    calls: float = 0.0
    started_s: float = 0.0
    ended_s: float = 0.0
    counted_mj: int | None = None
    missing: str = ""

    @property
    def seconds(self) -> float:
        return self.ended_s - self.started_s

    @property
    def per_call_mj(self) -> float | None:
        """The energy of one call in mJ, or None."""
        return self.counted_mj / self.calls if self.counted_mj is not None and self.calls > 0 else None


def host_mark() -> Callable[[], bool]:
    """The marker of a device whose calls are done when they return (the CPU): passed at once."""
    return _passed


def _passed() -> bool:
    return True


def cuda_mark() -> Callable[[], bool]:
    """A CUDA event recorded on the current stream after the calls queued so far (as the timed calls'
    events are); its `query` says whether the GPU has passed it."""
    # The suite imports torch only where it runs calls; the CLI's paths load no torch.
    import torch

    event = torch.cuda.Event()
    event.record()
    return event.query


def in_flight(per_call_s: float, queue_s: float = QUEUE_S) -> int:
    """How many calls to keep queued: `queue_s` of them by `per_call_s`, within [`MIN_QUEUED`,
    `MAX_QUEUED`]; `MIN_QUEUED` when `per_call_s` is not a positive number (NaN, zero)."""
    if not per_call_s > 0:
        return MIN_QUEUED
    return max(MIN_QUEUED, min(MAX_QUEUED, math.ceil(queue_s / per_call_s)))


class _Calls:
    """The series' calls: queued `per_mark` at a time (fewer once the host takes longer than
    `MARK_S` a group), each group with its marker, and when each call was seen done (host clock)."""

    def __init__(
        self,
        call: Callable[[], Any],
        before_each: Callable[[], None] | None,
        mark: Callable[[], Callable[[], bool]],
        per_mark: int,
    ) -> None:
        self._call, self._before_each, self._mark, self._per_mark = call, before_each, mark, per_mark
        self.queued = 0
        self.pending: collections.deque[tuple[Callable[[], bool], int]] = collections.deque()
        self.done_s: list[float] = []
        self.host_s = math.inf  # the host's quickest time to queue a group and its marker

    @property
    def done(self) -> int:
        return len(self.done_s)

    def queue(self) -> None:
        began_s = time.perf_counter()
        for _ in range(self._per_mark):
            if self._before_each is not None:
                self._before_each()
            self._call()
        self.pending.append((self._mark(), self._per_mark))
        self.queued += self._per_mark
        # A host slower than MARK_S a group polls between fewer calls: fewer share a marker.
        group_s = time.perf_counter() - began_s
        self.host_s = min(self.host_s, group_s)
        if group_s > 0:
            self._per_mark = max(1, min(self._per_mark, math.floor(MARK_S * self._per_mark / group_s)))

    def poll(self, since_s: float, now_s: float) -> None:
        """Count the markers the device passed, oldest first; the calls they close ended after the poll
        at `since_s` and by `now_s`, and are taken as spread evenly over that time."""
        passed = 0
        while self.pending and self.pending[0][0]():
            passed += self.pending.popleft()[1]
        share = (now_s - since_s) / passed if passed else 0.0
        self.done_s.extend(since_s + (index + 0.5) * share for index in range(passed))

    def done_at(self, when_s: float) -> float:
        """The calls done at `when_s` on the host's clock, linear between the completion times of the
        calls around it (one must end before `when_s` and one after)."""
        after = bisect.bisect_right(self.done_s, when_s)
        if not 0 < after < len(self.done_s):
            raise ValueError(f"no call ended on both sides of {when_s}")
        earlier, later = self.done_s[after - 1], self.done_s[after]
        return after + (when_s - earlier) / (later - earlier)


@dataclass(frozen=True)
class _Update:
    """An update of the counter seen by a poll: its value, when it was made (the midpoint of the poll
    before and this one), the calls done then by the midpoint of both polls' counts, and how far that
    count may be off (half the calls done between the polls, or half the share of one call that the
    time between them is)."""

    value: int
    at_s: float
    done: float
    spread: float


def _window(
    calls: _Calls,
    counter: Callable[[], int],
    per_call_s: float,
    min_s: float,
    max_calls: int,
    queue_s: float,
    lead_s: float = LEAD_S,
) -> tuple[_Update, _Update] | str:
    """Queue calls and poll until the updates that open and close the window (the module docstring,
    steps 2-4); or why there is no window."""
    began_s = time.perf_counter()
    value = counter()
    polled_s = moved_s = time.perf_counter()
    # A counter that takes milliseconds to read (NVML does on some hosts) needs more work queued to
    # cover a poll, and its polls are that far apart: the quickest read so far says how slow it is.
    read_s = polled_s - began_s
    queued_at_move = 0
    opening: _Update | None = None
    while True:
        # Calls until the queue is full or a poll is due, a read's time after the last (where reads
        # are slow, the host spends about as long queuing as reading).
        queued = in_flight(per_call_s, max(queue_s, SLOW_READS * read_s))
        room = calls.queued - calls.done < queued and calls.queued < max_calls
        while calls.queued - calls.done < queued and calls.queued < max_calls:
            calls.queue()
            if time.perf_counter() - polled_s >= max(POLL_S, read_s):
                break
        if not room:
            time.sleep(POLL_S)
        reading_s = time.perf_counter()
        read = counter()
        now_s = time.perf_counter()
        read_s = min(read_s, now_s - reading_s)
        done_before = calls.done
        calls.poll(polled_s, now_s)
        if read != value:
            between = calls.done - done_before
            # Calls of known length that end less than twice between two polls: the share of one.
            share = min(1.0, (now_s - polled_s) / per_call_s) if per_call_s > 0 else 1.0
            spread = between / 2 if between > 1 else share / 2
            update = _Update(read, (polled_s + now_s) / 2, (done_before + calls.done) / 2, spread)
            # Polls further apart than a few reads and queued calls (a host held up) blur an update.
            usual = now_s - polled_s <= max(COUNT_ERROR * min_s, SLOW_READS * (read_s + calls.host_s))
            if opening is None:
                # The GPU has run calls for LEAD_S: a lagging counter's value is the calls' energy too.
                if usual and done_before and update.at_s - calls.done_s[0] >= lead_s:
                    opening = update
            elif usual and _closes(opening, update, min_s):
                return opening, update
            value, moved_s, queued_at_move = read, now_s, calls.queued
        elif now_s - moved_s > UPDATE_WAIT_S:
            return rise_mj(value, read, now_s - moved_s, calls.queued - queued_at_move)[1]
        if calls.queued >= max_calls and not calls.pending:
            return f"the counter's window did not close within {max_calls} calls"
        polled_s = now_s


def _closes(opening: _Update, update: _Update, min_s: float) -> bool:
    """Whether `update` closes the window that `opening` opened (the module docstring, step 4)."""
    span_s, inside = update.at_s - opening.at_s, update.done - opening.done
    enough = inside >= MIN_WINDOW_CALLS or (span_s >= MAX_WINDOW_S and inside >= 1)
    return span_s >= min_s and enough and opening.spread + update.spread <= COUNT_ERROR * inside


def _finish(calls: _Calls, closing_s: float) -> None:
    """Let the calls in flight end, seen by polls, with one more call where none ends after
    `closing_s` (a host that queues more slowly than the GPU runs)."""
    if not calls.pending and calls.done_s[-1] <= closing_s:
        calls.queue()
    polled_s = time.perf_counter()
    while calls.pending:
        time.sleep(POLL_S)
        now_s = time.perf_counter()
        calls.poll(polled_s, now_s)
        polled_s = now_s


def rise_mj(start: int, end: int, seconds: float, calls: float) -> tuple[int | None, str]:
    """The counter's rise from `start` to `end` over a window of `seconds` and `calls`, or None and why
    it is not an energy (it did not move, went backwards, or rose more than a GPU can draw)."""
    most = MAX_BOARD_W * 1e3 * (seconds + RISE_SLACK_S)
    rise = end - start
    if rise < 0 and rise + COUNTER_MODULUS <= most:
        rise += COUNTER_MODULUS  # a wrap past 2**64: the only fall a GPU can make in this time
    if rise < 0:
        return None, (
            f"the counter went backwards ({start} -> {end} mJ over {seconds:.2f} s): the driver was "
            "reloaded or the counter reset"
        )
    if rise == 0:
        count = calls if isinstance(calls, int) else f"{calls:.1f}"
        return None, f"the counter did not move over {count} calls in {seconds:.2f} s"
    if rise > most:
        most_w = f"{MAX_BOARD_W:g} W"
        return None, f"the counter rose {rise} mJ in {seconds:.2f} s, more than a GPU draws ({most_w})"
    return rise, ""


def measure_energy(
    call: Callable[[], Any],
    *,
    counter: Callable[[], int],
    sync: Callable[[], None],
    mark: Callable[[], Callable[[], bool]],
    per_call_s: float,
    before_each: Callable[[], None] | None = None,
    min_s: float = MIN_SERIES_S,
    max_calls: int = MAX_CALLS,
    queue_s: float = QUEUE_S,
    lead_s: float = LEAD_S,
) -> Energy:
    """One energy series of `call` (the module docstring).

    Args:
        call: the call (a kernel launch, forward + backward, or a CUDA graph replay).
        counter: reads the energy counter in mJ (`Monitor.energy_mj`); raises `NoEnergyCounter`.
        sync: waits for the device (`timing.synchronize`).
        mark: queues a marker after the calls queued so far and returns whether the device has
            passed it (`cuda_mark`; `host_mark` for a device whose calls end when they return).
        per_call_s: the time of one call, for the calls kept in flight (the timed series' fastest).
        before_each: state reset before each call (gradients to None); no GPU work.
        min_s: the window's shortest length (`MIN_SERIES_S`).
        max_calls: the most calls queued before the window closes (`MAX_CALLS`).
        queue_s: the work kept in flight, by `per_call_s` (`in_flight`).
        lead_s: how long the GPU runs calls before the update that opens the window (`LEAD_S`).

    Examples::

        spent = measure_energy(step, counter=monitor.energy_mj, sync=torch.cuda.synchronize,
                               mark=cuda_mark, per_call_s=stats.min_ms / 1e3)
        spent.per_call_mj  # None, and spent.missing says why, where there is no energy
    """
    # Calls shorter than MARK_S share a marker: a marker per call would slow the host's loop of them.
    per_mark = max(1, min(MAX_QUEUED, math.floor(MARK_S / per_call_s))) if per_call_s > 0 else 1
    calls = _Calls(call, before_each, mark, per_mark)
    try:
        sync()
        window = _window(calls, counter, per_call_s, min_s, max_calls, queue_s, lead_s)
    except NoEnergyCounter as exc:
        sync()
        return Energy(missing=str(exc))
    if isinstance(window, str):
        sync()
        return Energy(missing=window)
    opening, closing = window
    _finish(calls, closing.at_s)
    sync()
    counted = calls.done_at(closing.at_s) - calls.done_at(opening.at_s)
    rise, missing = rise_mj(opening.value, closing.value, closing.at_s - opening.at_s, counted)
    return Energy(counted, opening.at_s, closing.at_s, rise, missing)


class PowerSampler:
    """Power readings every `interval_s` in a background thread, each with the host's clock
    (`time.perf_counter`): the check of the counter against power x time (`integrate_mj`,
    `experiments/validate_energy.py`). A reading of None (NVML said no) is skipped.

    Args:
        read: one power reading in watts (e.g. NVML's `nvmlDeviceGetPowerUsage` / 1000).
        interval_s: the pause between two readings.

    Examples::

        with PowerSampler(read_watts) as sampler:
            series = measure_energy(call, counter=..., sync=..., mark=cuda_mark, per_call_s=...)
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


def env_record(enabled: bool, missing: str | None) -> dict[str, Any]:
    """`env.json`'s `measurement.energy`: whether it is on, the method, and why the cells are empty
    (None while nothing says so; a sweep sets it at the first row without energy)."""
    return {"enabled": enabled, "method": METHOD, "missing": OFF if not enabled else missing}


def tell_missing(env: dict[str, Any], reason: str) -> bool:
    """Set `measurement.energy.missing` of an `env.json` record to `reason` unless it holds a reason
    already; whether it changed."""
    entry = env.setdefault("measurement", {}).setdefault("energy", {})
    if not isinstance(entry, dict) or entry.get("missing"):
        return False
    entry["missing"] = reason
    return True
