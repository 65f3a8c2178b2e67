"""Energy per call: the series against a simulated GPU and its counter, the cells and their CSV, the reason in
env.json when there is no energy, the setting, the figure and the report; on a GPU, the counter
against power x time."""

from __future__ import annotations

import bisect
import csv
import json
import math
import sys
import time

import pytest
import torch
from energy_stand_in import ENERGY_ENV, CounterNvml
from hypothesis import given
from hypothesis import strategies as st
from synthetic_run import SCHEMA, fig5_rows, write_run

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.analyse import report
from tfla_bench.analyse.compare import load_run
from tfla_bench.cli.main import main
from tfla_bench.errors import UserError
from tfla_bench.measure import energy, gpustate, timing, worker
from tfla_bench.measure.settings import MeasureSettings
from tfla_bench.plots.base import render
from tfla_bench.plots.catalog import run_context
from tfla_bench.plots.runs import energy_vs_seq_len_figure, run_plots, runtime_vs_seq_len_figure
from tfla_bench.run import rundir, runner, specs

CASE = Case("sdpa_math", "fw", "float32", 4, 128, 2, 32, 64)
QUEUE_S = 0.03  # the simulated GPU's work in flight (`SimulatedGpu.measure`)


def monitor_with(monkeypatch, value) -> tuple[gpustate.Monitor, CounterNvml]:
    """A monitor over a stand-in NVML whose counter reads `value(i)` at its i-th read."""
    fake = CounterNvml(value)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return gpustate.Monitor("GPU-1"), fake


class SimulatedGpu:
    """A GPU on the host's clock. A queued call runs `call_s` at `call_w` from when the host has queued
    it (which takes the host `launch_s`) or the call before it ends, whichever is later; the GPU idles
    at `idle_w` otherwise. Its counter sums that power from `offset` mJ, modulo 2**64, and is updated
    every `step_s`, each update `lag_s` behind (the energy up to `lag_s` before it); `shift(elapsed_s)`
    is added to it (a reset, a jump); a read takes `read_s`."""

    def __init__(self, call_s, *, call_w=300.0, idle_w=60.0, step_s=0.02, lag_s=0.0, launch_s=0.0, **counter):
        self.call_s, self.call_w, self.idle_w, self.launch_s = call_s, call_w, idle_w, launch_s
        self.step_s, self.lag_s = step_s, lag_s
        self.offset, self.shift = counter.get("offset", 10**9), counter.get("shift")
        self.read_s = counter.get("read_s", 0.0)
        self.began_s = time.perf_counter()
        self.starts, self.ends, self.busy_before = [], [], [0.0]
        self.most_ahead_s = 0.0  # the most queued work the GPU had ahead of it when a call was queued
        self.marks = 0

    def call(self):
        queued_s = time.perf_counter()
        while time.perf_counter() - queued_s < self.launch_s:
            pass
        now_s = time.perf_counter()
        start_s = max(now_s, self.ends[-1]) if self.ends else now_s
        self.starts.append(start_s)
        self.ends.append(start_s + self.call_s)
        self.busy_before.append(self.busy_before[-1] + self.call_s)
        self.most_ahead_s = max(self.most_ahead_s, self.ends[-1] - now_s)

    def mark(self):
        self.marks += 1
        end_s = self.ends[-1] if self.ends else -math.inf
        return lambda: time.perf_counter() >= end_s

    def sync(self):
        while self.ends and time.perf_counter() < self.ends[-1]:
            time.sleep(1e-4)

    def busy_s(self, until_s):
        """The GPU's time running calls up to `until_s`."""
        ended = bisect.bisect_right(self.ends, until_s)
        running = ended < len(self.starts) and self.starts[ended] < until_s
        return self.busy_before[ended] + (until_s - self.starts[ended] if running else 0.0)

    def counter(self):
        time.sleep(self.read_s)
        elapsed_s = time.perf_counter() - self.began_s
        steps = math.floor(elapsed_s / self.step_s)  # 0 for a counter that is never updated
        updated_s = self.began_s + (self.step_s * steps if steps else 0.0) - self.lag_s
        idle_j = self.idle_w * (updated_s - self.began_s)
        joules = idle_j + (self.call_w - self.idle_w) * self.busy_s(updated_s)
        shift = self.shift(elapsed_s) if self.shift else 0
        return (self.offset + int(joules * 1e3) + shift) % energy.COUNTER_MODULUS

    @property
    def call_mj(self):
        return self.call_w * self.call_s * 1e3

    @property
    def calls(self):
        return len(self.starts)

    def measure(self, **options) -> energy.Energy:
        # QUEUE_S of calls in flight: the 2 shared cores of a test machine can hold this process up for
        # longer than the default's, and a GPU left idle inside the window is not the method's error.
        return energy.measure_energy(
            self.call,
            counter=self.counter,
            sync=self.sync,
            mark=self.mark,
            per_call_s=self.call_s,
            **{"queue_s": QUEUE_S, **options},
        )


@pytest.mark.parametrize(
    "gpu",
    [
        dict(call_s=1e-3),
        dict(call_s=1e-3, lag_s=0.015),
        dict(call_s=3e-3, step_s=0.05, lag_s=0.01),
        dict(call_s=0.03, lag_s=0.01),  # longer than a step of the counter
        dict(call_s=2e-5, launch_s=2e-4, idle_w=0.0),  # the host queues a call 10x slower than it runs
    ],
    ids=["steady", "lagging", "slower-counter", "long-calls", "launch-bound"],
)
def test_the_counter_between_two_updates_gives_the_energy_per_call(gpu):
    gpu = SimulatedGpu(**gpu)
    spent = gpu.measure()
    assert spent.missing == ""
    assert spent.per_call_mj == pytest.approx(gpu.call_mj, rel=0.01)
    # The window: from one update to another at least MIN_SERIES_S and MIN_WINDOW_CALLS later.
    # (MIN_WINDOW_CALLS by the polls' counts: long calls' interpolated count may be one less.)
    assert spent.calls > energy.MIN_WINDOW_CALLS - 1 and energy.MIN_SERIES_S <= spent.seconds
    # Up to a step longer, or a few where updates seen after a held-up host are skipped.
    assert spent.seconds <= max(energy.MIN_SERIES_S, energy.MIN_WINDOW_CALLS * gpu.call_s) + 0.15
    assert gpu.began_s < spent.started_s < spent.ended_s < gpu.ends[-1]  # calls on both sides
    assert gpu.calls > spent.calls  # and calls outside it, which run but are not counted
    # Only a bounded queue of work ahead of the GPU.
    # (QUEUE_S, or three reads of the counter where one was slow: tens of ms, never seconds.)
    assert gpu.most_ahead_s <= max(QUEUE_S, 0.05) + 2 * gpu.call_s


@pytest.mark.parametrize(("step_s", "most_s"), [(0.02, 0.25), (0.05, 0.35)])
def test_a_short_step_of_the_counter_gives_a_short_series(step_s, most_s):
    gpu = SimulatedGpu(call_s=1e-3, step_s=step_s)
    spent = gpu.measure()
    assert spent.per_call_mj == pytest.approx(gpu.call_mj, rel=0.01)
    # The GPU's time on the series: LEAD_S and a step to the opening update, MIN_SERIES_S and a step
    # to the closing one (another where a held-up host skips one), and the queue: far less than the
    # 0.5 s of calls and up to two steps of a series read around back-to-back calls.
    assert gpu.calls * gpu.call_s < most_s


def test_calls_shorter_than_a_marker_share_one_unless_the_host_is_slower():
    gpu = SimulatedGpu(call_s=2e-5, idle_w=0.0)  # the host queues a call in microseconds
    spent = gpu.measure()
    assert spent.missing == "" and spent.per_call_mj == pytest.approx(gpu.call_mj, rel=0.01)
    assert gpu.marks <= gpu.calls / 2
    slow_host = SimulatedGpu(call_s=2e-5, launch_s=2e-4, idle_w=0.0)
    spent = slow_host.measure()
    assert spent.per_call_mj == pytest.approx(slow_host.call_mj, rel=0.01)
    assert slow_host.marks >= slow_host.calls - energy.MARK_S / slow_host.call_s  # one a call after the first


def test_a_counter_slow_to_read_gives_the_energy_within_the_count_error():
    # As seen on an H200 in a sandbox: 100 ms steps, 4 ms a read of NVML's counter.
    gpu = SimulatedGpu(call_s=1.4e-3, step_s=0.1, lag_s=0.005, read_s=0.004)
    spent = gpu.measure(queue_s=energy.QUEUE_S)
    assert spent.missing == "" and spent.per_call_mj == pytest.approx(gpu.call_mj, rel=energy.COUNT_ERROR)
    # The work queued covers the reads: SLOW_READS of them, not the default QUEUE_S.
    assert gpu.most_ahead_s > energy.QUEUE_S + gpu.call_s


def test_calls_longer_than_the_window_close_it_after_max_window_s():
    gpu = SimulatedGpu(call_s=0.09, step_s=0.05)
    spent = gpu.measure()
    assert spent.missing == "" and spent.per_call_mj == pytest.approx(gpu.call_mj, rel=0.01)
    assert energy.MAX_WINDOW_S <= spent.seconds < energy.MAX_WINDOW_S + 0.06 and spent.calls < 13


def test_the_calls_in_flight_are_the_queue_time_of_the_fastest_call_within_bounds():
    assert energy.in_flight(1e-3) == math.ceil(energy.QUEUE_S / 1e-3)
    assert energy.in_flight(1.0) == energy.MIN_QUEUED
    assert energy.in_flight(1e-9) == energy.MAX_QUEUED
    assert energy.in_flight(math.nan) == energy.in_flight(0.0) == energy.MIN_QUEUED


@pytest.mark.parametrize(
    ("gpu", "reason"),
    [
        (dict(step_s=math.inf), "the counter did not move over "),
        (dict(shift=lambda s: -(10**9) if s > 0.08 else 0), "the counter went backwards ("),
        (dict(shift=lambda s: 10**12 if s > 0.08 else 0), "more than a GPU draws (2000 W)"),
    ],
    ids=["stuck", "backwards", "jump"],
)
def test_a_counter_that_does_not_rise_gives_no_energy_and_says_why(gpu, reason):
    gpu = SimulatedGpu(call_s=1e-3, **gpu)
    spent = gpu.measure()
    assert spent.counted_mj is None and spent.per_call_mj is None and reason in spent.missing
    assert energy.row_cells(128, spent) == {"energy_mj": None, "tokens_per_joule": None}
    # A counter that does not move stops the series after UPDATE_WAIT_S of calls, not later.
    assert gpu.calls * gpu.call_s < energy.UPDATE_WAIT_S + 0.1


def test_a_series_that_reaches_max_calls_before_its_window_closes_says_so():
    gpu = SimulatedGpu(call_s=1e-3)
    spent = gpu.measure(max_calls=10)
    assert spent.per_call_mj is None and spent.missing == "the counter's window did not close within 10 calls"
    assert gpu.calls == 10


def test_a_wrap_past_two_to_the_64_is_unwrapped():
    gpu = SimulatedGpu(call_s=1e-3, offset=energy.COUNTER_MODULUS - 15_000)  # wraps after 50 ms at 300 W
    spent = gpu.measure()
    assert spent.missing == "" and spent.per_call_mj == pytest.approx(gpu.call_mj, rel=0.01)


@given(
    start=st.integers(0, 2**64 - 1),
    end=st.integers(0, 2**64 - 1),
    seconds=st.floats(0.0, 1e4),
    calls=st.floats(1e-3, 1e6),
)
def test_an_energy_is_never_zero_negative_or_infinite(start, end, seconds, calls):
    rise, missing = energy.rise_mj(start, end, seconds, calls)
    assert (rise is None) == bool(missing)
    cells = energy.row_cells(256, energy.Energy(calls, 0.0, seconds, rise, missing))
    if rise is None:
        assert cells == {"energy_mj": None, "tokens_per_joule": None}
    else:
        assert 0 < rise <= energy.MAX_BOARD_W * 1e3 * (seconds + energy.RISE_SLACK_S)
        assert 0 < cells["energy_mj"] < math.inf and 0 < cells["tokens_per_joule"] < math.inf


def test_without_nvml_or_its_counter_no_call_runs_and_the_reason_is_nvmls(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    gpu = SimulatedGpu(call_s=1e-3)

    def series():
        monitor = gpustate.Monitor("GPU-1")
        return energy.measure_energy(
            gpu.call, counter=monitor.energy_mj, sync=gpu.sync, mark=gpu.mark, per_call_s=1e-3
        )

    spent = series()
    assert spent.missing == "nvidia-ml-py is not installed" and gpu.calls == 0
    assert energy.unavailable(gpustate.Monitor("GPU-1")) == "nvidia-ml-py is not installed"

    fake = CounterNvml(lambda read: CounterNvml.NVMLError("Not Supported"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    spent = series()
    assert spent.missing == "NVML gives no energy counter for this GPU (Not Supported)" and gpu.calls == 0
    assert energy.unavailable(gpustate.Monitor("GPU-1")) == spent.missing
    assert energy.unavailable(None) == energy.NO_GPU


@pytest.mark.parametrize("enabled", [True, False])
def test_the_worker_puts_the_cells_in_the_row_unless_the_setting_is_off(monkeypatch, enabled):
    # A counter that moves at every read, at 300 W of the host's time.
    monitor, fake = monitor_with(monkeypatch, lambda read: 10**6 + int(300 * time.perf_counter() * 1e3))
    monkeypatch.setattr(worker, "_monitor", lambda device: monitor)
    settings = MeasureSettings(warmup=1, reps=3, energy=enabled)
    result = worker.measure_case(registry.get("sdpa_math"), CASE, settings, "cpu")
    row = result.row
    assert row.status == "ok", row.error
    if enabled:
        assert row.energy_mj > 0 and result.energy_missing == ""
        assert row.tokens_per_joule == pytest.approx(CASE.batch * CASE.seq_len / (row.energy_mj / 1e3))
    else:
        assert row.energy_mj is None and row.tokens_per_joule is None and fake.reads == 0


def test_the_setting_goes_through_the_one_checker():
    assert specs.parse_spec({**_spec_table(), "energy": False}, "test").measurement.energy is False
    assert specs.parse_spec(_spec_table(), "test").measurement.energy is True
    with pytest.raises(UserError, match=r"^spec.toml: key 'energy': expected true or false, got 'no'$"):
        specs.parse_spec({**_spec_table(), "energy": "no"}, "spec.toml")


def test_env_json_keeps_the_first_reason_of_the_latest_attempt(tmp_path):
    first = {"measurement": {"energy": energy.env_record(True, None)}}
    rundir.write_json(tmp_path / rundir.ENV, {**first, "resumed": [json.loads(json.dumps(first))]})
    rundir.update_env(tmp_path, lambda env: energy.tell_missing(env, "the counter did not move"))
    rundir.update_env(tmp_path, lambda env: energy.tell_missing(env, "a later reason"))
    env = rundir.read_env(tmp_path)
    assert env["resumed"][-1]["measurement"]["energy"]["missing"] == "the counter did not move"
    assert env["measurement"]["energy"]["missing"] is None
    assert energy.env_record(False, "anything")["missing"] == energy.OFF


def _spec_table(seq_len=(16,)) -> dict:
    return {
        "name": "energy-test",
        "kernels": ["sdpa_math"],
        "modes": ["fw"],
        "dtype": "float32",
        "warmup": 1,
        "reps": 2,
        "shape": {"batch": 2, "seq_len": list(seq_len), "num_heads": 2, "head_dim_qk": 8, "head_dim_v": 8},
    }


def _sweep(tmp_path, monkeypatch, counter: str, *, resume=False, seq_len=(16,)):
    """A CPU sweep whose workers read the stand-in counter `counter` (`energy_stand_in`)."""
    monkeypatch.setenv(registry.PLUGINS_ENV, "energy_stand_in")
    monkeypatch.setenv(ENERGY_ENV, counter)
    spec = specs.parse_spec(_spec_table(seq_len), "test")
    return runner.run_sweep(spec, specs.expand(spec), tmp_path / "run", resume=resume, devices=["cpu"])


def test_a_sweep_writes_the_cells_which_survive_the_csv_and_a_resume(tmp_path, monkeypatch):
    report = _sweep(tmp_path, monkeypatch, "rises", seq_len=(16, 32))
    first, second = sorted(report.rows, key=lambda row: row.case.seq_len)
    for row in (first, second):
        assert row.status == "ok" and row.energy_mj > 0
        tokens = row.case.batch * row.case.seq_len
        assert row.tokens_per_joule == pytest.approx(tokens / (row.energy_mj / 1e3))
    env = json.loads((tmp_path / "run" / rundir.ENV).read_text())
    assert env["measurement"]["energy"] == energy.env_record(True, None)
    csv_path = tmp_path / "run" / rundir.RESULTS
    with csv_path.open() as handle:
        cells = list(csv.DictReader(handle))
    assert {cell["energy_mj"] for cell in cells} == {str(first.energy_mj), str(second.energy_mj)}
    # A sweep stopped after its first row, then resumed: the kept row keeps its cells to the digit.
    lines = csv_path.read_text().splitlines(keepends=True)
    kept = next(line for line in lines[1:] if line.startswith("sdpa_math,fw,float32,2,16,"))
    csv_path.write_text(lines[0] + kept)
    resumed = _sweep(tmp_path, monkeypatch, "rises", resume=True, seq_len=(16, 32))
    again = {row.case.seq_len: row for row in resumed.rows}
    assert again[16].energy_mj == first.energy_mj and again[16].tokens_per_joule == first.tokens_per_joule
    assert again[32].energy_mj > 0 and kept in csv_path.read_text()


def test_a_sweep_whose_counter_does_not_move_says_why_in_env_json(tmp_path, monkeypatch):
    (row,) = _sweep(tmp_path, monkeypatch, "stuck").rows
    assert row.status == "ok" and row.energy_mj is None and row.tokens_per_joule is None
    missing = json.loads((tmp_path / "run" / rundir.ENV).read_text())["measurement"]["energy"]["missing"]
    assert missing.startswith("the counter did not move over ") and f"(first: {row.case.key})" in missing


def test_a_cpu_sweep_says_there_is_no_gpu_counter(tmp_path):
    spec = specs.parse_spec(_spec_table(), "test")
    (row,) = runner.run_sweep(spec, specs.expand(spec), tmp_path / "run", devices=["cpu"]).rows
    assert row.status == "ok" and row.energy_mj is None
    env = json.loads((tmp_path / "run" / rundir.ENV).read_text())
    assert env["measurement"]["energy"]["missing"] == energy.NO_GPU and env["device_info"]["no_energy"]


def test_an_older_results_csv_without_the_columns_loads_and_resumes_with_them(tmp_path):
    old_columns = [c for c in SCHEMA if c not in ("energy_mj", "tokens_per_joule")]
    run_dir = write_run(tmp_path / "fig5_consttoken-20250101-000000", fig5_rows())
    frame = [dict(zip(old_columns, [r.get(c, "") for c in old_columns], strict=True)) for r in _read(run_dir)]
    with (run_dir / rundir.RESULTS).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=old_columns)
        writer.writeheader()
        writer.writerows(frame)
    read = rundir.read_results(run_dir / rundir.RESULTS)
    assert read.rows and all(row.energy_mj is None and row.tokens_per_joule is None for row in read.rows)
    context = run_context(load_run(run_dir))
    assert "energy_vs_seq_len" not in {plot.name for plot, _ in render(run_plots(context), context)}
    cases = [row.case for row in read.rows]
    _, kept, columns = runner.resume_plan(cases, run_dir / rundir.RESULTS, (), _Quiet())
    assert {"energy_mj", "tokens_per_joule"} <= set(columns)
    assert len(kept) == sum(row.finished for row in read.rows) > 0


class _Quiet:
    def print(self, *args, **kwargs):
        pass


def _read(run_dir):
    with (run_dir / rundir.RESULTS).open() as handle:
        return list(csv.DictReader(handle))


def _with_energy(rows, watts=500.0):
    """The rows with the energy of `watts` drawn for each ok row's median (mJ = ms x W)."""
    for row in rows:
        if row["status"] == "ok":
            row["energy_mj"] = row["median_ms"] * watts
            row["tokens_per_joule"] = row["batch"] * row["seq_len"] / (row["energy_mj"] / 1e3)
    return rows


def _lines(fig):
    """Per panel title, the drawn lines' label, colour, style and marker."""
    return {
        ax.get_title(): sorted(
            (line.get_label(), str(line.get_color()), line.get_linestyle(), str(line.get_marker()))
            for line in ax.get_lines()
            if not line.get_label().startswith("_")
        )
        for ax in fig.axes
        if ax.get_title()
    }


def test_the_energy_figure_draws_the_runtime_figures_lines_per_token(tmp_path):
    run = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000000", _with_energy(fig5_rows())))
    context = run_context(run)
    assert "energy_vs_seq_len" in {plot.name for plot, _ in render(run_plots(context), context)}
    energy_fig, runtime_fig = energy_vs_seq_len_figure(context), runtime_vs_seq_len_figure(context)
    assert _lines(energy_fig) == _lines(runtime_fig) and _lines(energy_fig)
    assert energy_fig.axes[0].get_ylabel() == "GPU energy per token [µJ]"
    # Every point: the runtime's point x 500 W over the run's 65,536 tokens, in uJ.
    runtime_y = _ydata(runtime_fig)
    for key, values in _ydata(energy_fig).items():
        assert list(values) == pytest.approx([ms * 500.0 * 1e3 / 65536 for ms in runtime_y[key]])


def _ydata(fig):
    return {
        (ax.get_title(), line.get_label()): line.get_ydata()
        for ax in fig.axes
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def test_without_energy_cells_there_is_no_energy_figure_and_the_report_leaves_it_out(tmp_path, monkeypatch):
    # The page's figures by name, without encoding each as PNG (matplotlib's layout takes seconds).
    monkeypatch.setattr(report, "figure_html", lambda number, name, caption, fig: f'<figure id="fig-{name}">')
    rows = [row for row in fig5_rows(seq_lens=(2048, 4096)) if row["kernel"] in ("tfla_sig", "sdpa_cudnn")]
    plain = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000000", rows))
    assert energy_vs_seq_len_figure(run_context(plain)) is None
    page = report.build_report(plain, None, accelerators=[])
    assert 'id="fig-runtime_vs_seq_len"' in page
    assert 'id="fig-energy_vs_seq_len"' not in page and "<th>energy_mj</th>" not in page
    with_energy = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000001", _with_energy(rows)))
    page = report.build_report(with_energy, None, accelerators=[])
    assert 'id="fig-energy_vs_seq_len"' in page and "<th>energy_mj</th>" in page


def test_power_samples_integrate_to_energy():
    ramp = [(t / 10, 100.0 + 10.0 * t) for t in range(21)]  # 100 W rising to 300 W over 2 s
    assert energy.integrate_mj(ramp, 0.0, 2.0) == pytest.approx(400_000.0)
    assert energy.integrate_mj(ramp, 0.05, 0.15) == pytest.approx(0.1 * 110.0 * 1e3)
    with pytest.raises(ValueError, match="do not cover"):
        energy.integrate_mj(ramp, -1.0, 1.0)
    with energy.PowerSampler(lambda: 250.0, interval_s=0.001) as sampler:
        time.sleep(0.2)
    (start, _), (end, _) = sampler.samples[1], sampler.samples[-2]
    assert len(sampler.samples) >= 10
    assert energy.integrate_mj(sampler.samples, start, end) == pytest.approx(250.0 * (end - start) * 1e3)


@pytest.mark.gpu
def test_on_a_gpu_the_counter_agrees_with_power_times_time_within_a_loose_factor():
    pytest.importorskip("pynvml")
    monitor = gpustate.device_monitor("cuda:0")
    reason = energy.unavailable(monitor)
    if reason:
        pytest.skip(reason)
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def call():
        torch.matmul(a, b)

    fastest = timing.time_standalone(call, "cuda", warmup_calls=10).min_ms / 1e3

    def watts():
        reading = monitor.read()
        return reading.power_w if reading is not None else None

    with energy.PowerSampler(watts, interval_s=0.005) as sampler:
        time.sleep(1.0)
        spent = energy.measure_energy(
            call,
            counter=monitor.energy_mj,
            sync=torch.cuda.synchronize,
            mark=energy.cuda_mark,
            per_call_s=fastest,
            min_s=3.0,
        )
        time.sleep(1.5)
    assert spent.missing == "" and spent.counted_mj > 0 and spent.calls > 10
    integrated = energy.integrate_mj(sampler.samples, spent.started_s, spent.ended_s)
    assert 0.5 < spent.counted_mj / integrated < 2.0


@pytest.mark.gpu
def test_a_gpu_sweep_row_has_energy_or_env_json_says_why(tmp_path):
    table = {**_spec_table(), "dtype": "bfloat16"}
    table["shape"] = {"batch": 4, "seq_len": 1024, "num_heads": 8, "head_dim_qk": 64, "head_dim_v": 64}
    spec = specs.parse_spec(table, "test")
    (row,) = runner.run_sweep(spec, specs.expand(spec), tmp_path / "run", devices=["cuda:0"]).rows
    missing = json.loads((tmp_path / "run" / rundir.ENV).read_text())["measurement"]["energy"]["missing"]
    assert row.status == "ok"
    if row.energy_mj is None:
        assert missing
    else:
        assert missing is None and row.energy_mj > 0 and row.tokens_per_joule > 0


@pytest.mark.parametrize("flag", ["--energy", "--no-energy"])
def test_the_run_command_turns_energy_on_and_off(tmp_path, monkeypatch, flag):
    monkeypatch.setenv(registry.PLUGINS_ENV, "energy_stand_in")
    monkeypatch.setenv(ENERGY_ENV, "rises")
    shape = ["--seq-len", "16", "--batch", "2", "--heads", "2", "--head-dim-qk", "8"]
    flags = ["--mode", "fw", "--dtype", "float32", "--warmup", "1", "--reps", "2", "--no-roofs"]
    assert main(["run", "--kernel", "sdpa_math", *shape, *flags, flag, "--out", str(tmp_path / "r")]) == 0
    (row,) = rundir.read_results(tmp_path / "r" / rundir.RESULTS).rows
    env = json.loads((tmp_path / "r" / rundir.ENV).read_text())
    assert env["measurement"]["energy"]["enabled"] is (flag == "--energy")
    assert (row.energy_mj is not None) is (flag == "--energy")
