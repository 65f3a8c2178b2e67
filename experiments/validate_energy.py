"""Check the energy per call (`tfla_bench.measure.energy`) against NVML's power integrated over time.

python experiments/validate_energy.py OUT [--kernel tfla_sig] [--mode fwbw] [--seconds 0.5,2,10]
    [--lead 0] [--sample-ms 5]      (OUT: the CSV table; docs/energy.md, "Validation", has the H200's)

On one CUDA GPU with nvidia-ml-py: the kernel at the Fig. 5 shape of its family (bf16, B8, 16 heads,
Dqk 128, Dv 256, T 8192, chunk 128 where it takes one), its first call and `WARMUP_S` of calls
made, then, for each series length in `--seconds`, one energy series as the sweep's worker runs it
(`energy.measure_energy`, with that length as its minimum) while a background thread reads NVML's
power every `--sample-ms` ms (`energy.PowerSampler`). The readings are integrated with the trapezoid
rule over the series' own window, from the counter's read that opened it to the one that closed it
(`energy.integrate_mj`). Two readings where the driver has both: `nvmlDeviceGetPowerUsage`, which
NVML documents as the average over the last second on Ampere and later GPUs (GA100 aside), so its
integral trails the calls by up to a second and the longer series show how much that moves the
ratio; and the instantaneous power field (`NVML_FI_DEV_POWER_INSTANT`). The GPU idles `IDLE_S`
between series. With `--lead S`, each series follows S seconds of the same calls back to back, as
the sweep's energy series follows the case's timed calls: the GPU starts it warm, not from idle.

Columns: kernel, mode, calls, seconds (the window), counter_mj (the counter's rise), integrated_mj
(nvmlDeviceGetPowerUsage), ratio (counter / integrated), instant_mj and instant_ratio (empty
without the field), samples (readings inside the window), mean_power_w (counter_mj / seconds / 1000),
and the window's idle tail, from the sync after the calls to the counter's closing update, which the
series charges to its calls: tail_s, tail_mj (the instantaneous power over it), tail_share (tail_mj /
counter_mj: how far the series' energy per call exceeds the calls' own) and tail_w (its mean power);
then head_w, the mean power over the window's first tail_s (a field that trails the calls reads it
near idle, a GPU whose power outlasts its calls near full), and idle_w, over the idle pad before the
window; the last five empty without the instantaneous field. Then what the series charges now:
awake_w (the awake power the worker measures once, `energy.calibrate` over spins), charged_mj (the
counter's rise less awake_w x tail_s), and against the calls' own energy by the field, calls_mj
(the field integrated from the window's opening to `LAG_S` past its close, which holds all the calls
however late the field reports them, less idle_w over that span's time outside the calls),
charged_ratio (charged_mj / calls_mj) and counter_calls_ratio (counter_mj / calls_mj: the series
before its tail was taken off); the last three empty without the field or with a lead, whose calls
the field still reports inside the window. Last, lead_s and per_call_mj (charged_mj / calls): a
series as long as the longest asked for is the steady state that the shorter ones are held to.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.errors import UserError
from tfla_bench.measure import energy, gpustate, timing
from tfla_bench.measure.worker import awake_calibration, clear_grads, grad_leaves, make_step

WARMUP_S = 2.0  # calls before the first series: compiled, autotuned, the GPU at its working clock
IDLE_S = 2.0  # idle before each series, so each starts from the same state
PAD_S = 1.5  # readings before and after each series, so they cover its window
IDLE_READ_S = PAD_S - 0.1  # the idle power is read over the pad before a series, its start left out
LAG_S = 0.5  # past the window's close, the field still reports the calls (it trails them by about 50 ms)
COLUMNS = (
    "kernel",
    "mode",
    "calls",
    "seconds",
    "counter_mj",
    "integrated_mj",
    "ratio",
    "instant_mj",
    "instant_ratio",
    "samples",
    "mean_power_w",
    "tail_s",
    "tail_mj",
    "tail_share",
    "tail_w",
    "head_w",
    "idle_w",
    "awake_w",
    "charged_mj",
    "calls_mj",
    "charged_ratio",
    "counter_calls_ratio",
    "lead_s",
    "per_call_mj",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit code 2, as every command of the suite
        self.exit(2, f"error: {message}\n")


def seconds_list(text: str) -> list[float]:
    """`0.5,2,10` as positive, finite seconds."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds such as 0.5,2,10, got {text!r}") from None
    if not values or not all(0 < value < 3600 for value in values):
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 3600), got {text!r}")
    return values


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the CSV file to write")
    parser.add_argument("--kernel", default="tfla_sig", help="an adapter of the suite (tfla-bench list)")
    parser.add_argument("--mode", choices=("fw", "fwbw"), default="fwbw")
    parser.add_argument("--seconds", type=seconds_list, default=[0.5, 2.0, 10.0], help="series lengths")
    parser.add_argument("--lead", type=float, default=0.0, help="seconds of calls right before each series")
    parser.add_argument("--sample-ms", type=float, default=5.0, help="the pause between power readings")
    args = parser.parse_args(argv)
    if not 0 <= args.lead <= 60:
        parser.error(f"argument --lead: expected seconds in [0, 60], got {args.lead}")
    if not 0.1 <= args.sample_ms <= 1000:
        parser.error(f"argument --sample-ms: expected milliseconds in [0.1, 1000], got {args.sample_ms}")
    return args


def power_readers(uuid: str) -> dict[str, Callable[[], float | None]]:
    """NVML's power readings of the GPU in watts: `average` (nvmlDeviceGetPowerUsage) and, where the
    driver has the field, `instant` (NVML_FI_DEV_POWER_INSTANT)."""
    # NVML is optional (nvidia-ml-py); this script needs it.
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    field = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)

    def average() -> float | None:
        try:
            return pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3
        except pynvml.NVMLError:
            return None  # a reading NVML refused is left out, not a stopped sampler

    def instant() -> float | None:
        try:
            (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [field])
            if value.nvmlReturn != pynvml.NVML_SUCCESS:
                return None
            kinds = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal")
            return getattr(value.value, kinds[value.valueType]) / 1e3
        except (pynvml.NVMLError, IndexError, AttributeError):
            return None  # no such field on this driver: the instant columns stay empty

    readers: dict[str, Callable[[], float | None]] = {"average": average}
    if field is not None and instant() is not None:
        readers["instant"] = instant
    return readers


def workload(kernel: str, mode: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """The call of `kernel` at its Fig. 5 shape, and its gradient reset; a `UserError` where it cannot run."""
    adapter = registry.get(kernel)
    chunk = 128 if adapter.uses_chunk_size else None
    case = Case(kernel, mode, "bfloat16", 8, 8192, 16, 128, 256, chunk)
    reason = adapter.available() or adapter.check(case)
    if reason:
        raise UserError(f"{kernel} cannot run here: {reason}")
    torch.manual_seed(0)
    inputs = adapter.make_inputs(case, "cuda")
    leaves = grad_leaves(inputs)
    return make_step(adapter, inputs, mode, "fixed"), functools.partial(clear_grads, leaves)


def series_row(
    step: Callable[[], Any],
    reset: Callable[[], None],
    monitor: gpustate.Monitor,
    readers: dict[str, Callable[[], float | None]],
    seconds: float,
    per_call_s: float,
    sample_s: float,
    awake_w: float,
    lead_s: float,
) -> dict[str, Any]:
    """One energy series of `seconds` with NVML's power read beside it: the table's numbers."""
    time.sleep(IDLE_S)
    with contextlib.ExitStack() as stack:
        samplers = {
            name: stack.enter_context(energy.PowerSampler(read, sample_s)) for name, read in readers.items()
        }
        time.sleep(PAD_S)
        if lead_s:
            energy.back_to_back(step, reset, per_call_s, lead_s, max_calls=10**9)
        spent = energy.measure_energy(
            step,
            counter=monitor.energy_mj,
            sync=torch.cuda.synchronize,
            per_call_s=per_call_s,
            awake_w=awake_w,
            before_each=reset,
            min_s=seconds,
            max_calls=10**9,
        )
        time.sleep(PAD_S)
    if spent.counted_mj is None:
        raise UserError(f"the energy counter gave no energy: {spent.missing}")
    window = (spent.started_s, spent.ended_s)
    try:
        integrated = {name: energy.integrate_mj(s.samples, *window) for name, s in samplers.items()}
    except ValueError as exc:
        raise UserError(f"NVML's power readings around the {seconds:g} s series: {exc}") from None
    instant = integrated.get("instant")
    tail_s = spent.ended_s - spent.synced_s

    def field_mj(start_s: float, end_s: float) -> float | None:
        """The instantaneous field integrated from `start_s` to `end_s`, None without the field."""
        return None if instant is None else energy.integrate_mj(samplers["instant"].samples, start_s, end_s)

    tail = field_mj(spent.synced_s, spent.ended_s)
    # The field's mean over the window's first `tail_s` and over the idle pad before it: a field that
    # trails the calls reads the head near idle; a GPU whose power outlasts its calls reads it full.
    head = field_mj(spent.started_s, spent.started_s + tail_s)
    idle = field_mj(spent.started_s - IDLE_READ_S, spent.started_s)
    charged = spent.counted_mj - spent.outside_mj
    calls = None
    if idle is not None and not lead_s:
        # Everything the calls drew, however late the field reports it, less the idle GPU beside them.
        span_s = spent.ended_s + LAG_S - spent.started_s
        outside_s = span_s - (spent.synced_s - spent.started_s)
        calls = field_mj(spent.started_s, spent.ended_s + LAG_S) - idle / IDLE_READ_S * outside_s
    return {
        "calls": spent.calls,
        "seconds": round(spent.seconds, 4),
        "counter_mj": spent.counted_mj,
        "integrated_mj": round(integrated["average"], 1),
        "ratio": round(spent.counted_mj / integrated["average"], 4),
        "instant_mj": "" if instant is None else round(instant, 1),
        "instant_ratio": "" if instant is None else round(spent.counted_mj / instant, 4),
        "samples": sum(spent.started_s < t < spent.ended_s for t, _ in samplers["average"].samples),
        "mean_power_w": round(spent.counted_mj / spent.seconds / 1e3, 1),
        "tail_s": round(tail_s, 4),
        "tail_mj": "" if tail is None else round(tail, 1),
        "tail_share": "" if tail is None else round(tail / spent.counted_mj, 4),
        "tail_w": "" if tail is None or tail_s <= 0 else round(tail / tail_s / 1e3, 1),
        "head_w": "" if head is None or tail_s <= 0 else round(head / tail_s / 1e3, 1),
        "idle_w": "" if idle is None else round(idle / IDLE_READ_S / 1e3, 1),
        "awake_w": round(awake_w, 1),
        "charged_mj": round(charged, 1),
        "calls_mj": "" if calls is None else round(calls, 1),
        "charged_ratio": "" if calls is None else round(charged / calls, 4),
        "counter_calls_ratio": "" if calls is None else round(spent.counted_mj / calls, 4),
        "lead_s": lead_s,
        "per_call_mj": round(charged / spent.calls, 2),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("error: the energy validation needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        monitor = gpustate.device_monitor("cuda:0")
        assert monitor is not None
        monitor.energy_mj()
        readers = power_readers(str(torch.cuda.get_device_properties(0).uuid))
        step, reset = workload(args.kernel, args.mode)
    except (UserError, gpustate.NoEnergyCounter, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    reset()
    timing.time_first_call(step, "cuda")
    timing.warm_up(step, "cuda", calls=None, seconds=WARMUP_S, before_each=reset)
    fastest = timing.time_standalone(step, "cuda", warmup_calls=1, reset=reset).min_ms / 1e3
    awake = awake_calibration("cuda:0", monitor)  # as the sweep's worker measures it
    if awake.missing:
        print(f"error: the awake power: {awake.missing}", file=sys.stderr)
        return 1
    rows = []
    sample_s = args.sample_ms / 1e3
    for seconds in args.seconds:
        try:
            row = series_row(
                step, reset, monitor, readers, seconds, fastest, sample_s, awake.awake_w, args.lead
            )
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        rows.append({"kernel": args.kernel, "mode": args.mode, **row})
        print(", ".join(f"{key} {row[key]}" for key in COLUMNS[2:]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{torch.cuda.get_device_name()}: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
