"""Energy per call: the counter series against a stand-in NVML, the cells and their CSV, the reason in
env.json when there is no energy, the setting, the figure and the report; on a GPU, the counter
against power x time."""

from __future__ import annotations

import bisect
import csv
import json
import math
import sys
import time
import types

import pytest
import torch
from energy_stand_in import ENERGY_ENV, CounterNvml
from hypothesis import given
from hypothesis import strategies as st
from synthetic_run import REPO, SCHEMA, fig5_rows, write_run

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


def monitor_with(monkeypatch, value) -> tuple[gpustate.Monitor, CounterNvml]:
    """A monitor over a stand-in NVML whose counter reads `value(i)` at its i-th read."""
    fake = CounterNvml(value)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return gpustate.Monitor("GPU-1"), fake


def scripted(*values):
    """A counter that reads `values` in order and then keeps the last one."""
    return lambda read: values[min(read, len(values) - 1)]


class Calls:
    """A call and a reset that count themselves, and a sync that counts too."""

    def __init__(self):
        self.calls = self.resets = self.syncs = 0

    def call(self):
        self.calls += 1

    def reset(self):
        self.resets += 1

    def sync(self):
        self.syncs += 1


def series(monitor, calls: Calls, **options) -> energy.Energy:
    return energy.measure_energy(
        calls.call,
        counter=monitor.energy_mj,
        sync=calls.sync,
        per_call_s=options.pop("per_call_s", 0.01),
        awake_w=options.pop("awake_w", 0.0),
        before_each=calls.reset,
        min_s=options.pop("min_s", 0.05),
        **options,
    )


def test_a_counter_that_rises_gives_the_energy_per_call_and_the_tokens_per_joule(monkeypatch):
    # Two reads before an update at the start (2,000 mJ), two before one at the end (12,000 mJ).
    monitor, fake = monitor_with(monkeypatch, scripted(1_000, 1_000, 2_000, 9_000, 9_000, 12_000))
    calls = Calls()
    spent = series(monitor, calls)
    assert calls.calls == calls.resets == 5  # 0.05 s planned from 0.01 s a call
    assert calls.syncs == 2 and fake.reads == 6
    assert spent.counted_mj == 12_000 - 2_000 and spent.missing == ""
    assert spent.per_call_mj == pytest.approx((12_000 - 2_000) / calls.calls)
    assert 0 < spent.seconds < 5
    # the calls end at the sync; the closing update comes after it, with the device idle
    assert spent.started_s < spent.synced_s < spent.ended_s
    cells = energy.row_cells(CASE.batch * CASE.seq_len, spent)
    joules = spent.per_call_mj / 1e3
    assert cells == {"energy_mj": spent.per_call_mj, "tokens_per_joule": pytest.approx(4 * 128 / joules)}


def test_calls_stop_at_the_host_time_when_the_planned_count_would_take_longer():
    calls = Calls()

    def slow():
        calls.call()
        time.sleep(0.01)

    made = energy.back_to_back(slow, None, per_call_s=1e-6, min_s=0.05, max_calls=10**6)
    assert made == calls.calls and 3 <= made <= 6  # 0.05 s of 0.01 s calls, not a million
    assert energy.back_to_back(calls.call, None, per_call_s=1e-9, min_s=10.0, max_calls=7) == 7
    assert energy.back_to_back(calls.call, None, per_call_s=60.0, min_s=0.5) == 1  # at least one


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (scripted(5_000), "the counter did not move over 0."),
        (scripted(10**9, 10**9, 10**9 + 500, 7, 7, 8), "the counter went backwards (1000000500 -> 8 mJ"),
        (scripted(10, 10, 20, 10**12), "more than a GPU draws (2000 W)"),
    ],
    ids=["stuck", "backwards", "too-much"],
)
def test_a_counter_that_does_not_rise_gives_no_energy_and_says_why(monkeypatch, value, reason):
    monitor, _ = monitor_with(monkeypatch, value)
    spent = series(monitor, Calls())
    assert spent.counted_mj is None and spent.per_call_mj is None and reason in spent.missing
    assert energy.row_cells(128, spent) == {"energy_mj": None, "tokens_per_joule": None}


def test_a_wrap_past_two_to_the_64_is_unwrapped(monkeypatch):
    top = energy.COUNTER_MODULUS - 1_000
    monitor, _ = monitor_with(monkeypatch, scripted(top - 5, top, top, 4_000))
    spent = series(monitor, Calls())
    assert spent.counted_mj == 5_000 and spent.missing == ""


@given(
    start=st.integers(0, 2**64 - 1),
    end=st.integers(0, 2**64 - 1),
    seconds=st.floats(0.0, 1e4),
    calls=st.integers(1, 10**6),
)
def test_an_energy_is_never_zero_negative_or_infinite(start, end, seconds, calls):
    rise, missing = energy.rise_mj(start, end, seconds)
    assert (rise is None) == bool(missing)
    cells = energy.row_cells(256, energy.Energy(calls, 0.0, seconds, rise, missing))
    if rise is None:
        assert cells == {"energy_mj": None, "tokens_per_joule": None}
    else:
        assert 0 < rise <= energy.MAX_BOARD_W * 1e3 * (seconds + energy.TICK_WAIT_S)
        assert 0 < cells["energy_mj"] < math.inf and 0 < cells["tokens_per_joule"] < math.inf


def test_without_nvml_or_its_counter_no_call_runs_and_the_reason_is_nvmls(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    calls = Calls()
    spent = series(gpustate.Monitor("GPU-1"), calls)
    assert spent.missing == "nvidia-ml-py is not installed" and calls.calls == 0
    assert energy.unavailable(gpustate.Monitor("GPU-1")) == "nvidia-ml-py is not installed"

    fake = CounterNvml(lambda read: CounterNvml.NVMLError("Not Supported"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    spent = series(gpustate.Monitor("GPU-1"), calls)
    assert spent.missing == "NVML gives no energy counter for this GPU (Not Supported)" and calls.calls == 0
    assert energy.unavailable(gpustate.Monitor("GPU-1")) == spent.missing
    assert energy.unavailable(None) == energy.NO_GPU


@pytest.mark.parametrize("enabled", [True, False])
def test_the_worker_puts_the_cells_in_the_row_unless_the_setting_is_off(monkeypatch, enabled):
    monitor, fake = monitor_with(monkeypatch, lambda read: 10**6 + 1_000 * read)
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


def test_a_run_from_before_the_series_length_was_recorded_resumes_at_the_length_it_measured(
    tmp_path, monkeypatch
):
    _sweep(tmp_path, monkeypatch, "rises", seq_len=(16, 32))
    run = tmp_path / "run"
    # As such a run wrote them: neither its spec.json nor its attempt's record names energy_s.
    table = json.loads((run / rundir.SPEC).read_text())
    env = json.loads((run / rundir.ENV).read_text())
    del table["energy_s"], env["spec_record"]["energy_s"]
    (run / rundir.SPEC).write_text(json.dumps(table))
    (run / rundir.ENV).write_text(json.dumps(env))
    lines = (run / rundir.RESULTS).read_text().splitlines(keepends=True)
    (run / rundir.RESULTS).write_text("".join(lines[:2]))
    assert main(["sweep", "--resume", str(run)]) == 0  # no "spec.json was edited"
    resumed = json.loads((run / rundir.ENV).read_text())["resumed"][-1]
    assert "at least 0.5 s of back-to-back" in resumed["measurement"]["energy"]["method"]
    assert len(rundir.read_results(run / rundir.RESULTS).rows) == 2


def test_a_sweep_whose_counter_does_not_move_says_why_in_env_json(tmp_path, monkeypatch):
    (row,) = _sweep(tmp_path, monkeypatch, "stuck").rows
    assert row.status == "ok" and row.energy_mj is None and row.tokens_per_joule is None
    missing = json.loads((tmp_path / "run" / rundir.ENV).read_text())["measurement"]["energy"]["missing"]
    # The awake power, measured before the first series, finds the counter standing still first.
    assert missing.startswith("no awake power to take the series' idle tail off (the spins' window: ")
    assert "the counter did not move over " in missing and f"(first: {row.case.key})" in missing


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
            per_call_s=fastest,
            awake_w=0.0,
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


class Board:
    """A GPU board in simulated time for the method that reads around the timed calls: it draws
    `awake_w` while the host waits or a spin runs, `flush_w` during a flush and `call_w` during a
    call, and its counter shows the energy at its last update (every `step_s`), as NVML's does."""

    def __init__(self, awake_w=90.0, flush_w=400.0, call_w=600.0, step_s=0.02):
        self.awake_w, self.flush_w, self.call_w, self.step_s = awake_w, flush_w, call_w, step_s
        self.points = [(0.0, 0.0)]  # (seconds, mJ so far)

    def now(self) -> float:
        return self.points[-1][0]

    def draw(self, seconds: float, watts: float) -> None:
        t, mj = self.points[-1]
        self.points.append((t + seconds, mj + watts * seconds * 1e3))

    def sleep(self, seconds: float) -> None:
        self.draw(seconds, self.awake_w)

    def counter(self) -> int:
        update = math.floor(self.now() / self.step_s) * self.step_s
        index = bisect.bisect_right([t for t, _ in self.points], update) - 1
        t0, mj0 = self.points[index]
        if index + 1 == len(self.points):
            return int(mj0)
        t1, mj1 = self.points[index + 1]
        return int(mj0 + (mj1 - mj0) * (update - t0) / (t1 - t0))

    def gpu_seconds(self, fn, calls: int) -> float:
        began = self.now()
        for _ in range(calls):
            fn()
        return self.now() - began


@pytest.fixture
def board(monkeypatch) -> Board:
    board = Board()
    monkeypatch.setattr(energy, "time", type("Clock", (), {"perf_counter": board.now, "sleep": board.sleep}))
    return board


def test_around_the_timed_calls_the_calibration_takes_out_flushes_spins_and_the_tail(board):
    spin_s, flush_s, call_s = 1e-3, 80e-6, 5e-3
    calibration = energy.calibrate(
        counter=board.counter,
        sync=lambda: None,
        spin=lambda: board.sleep(spin_s),
        spin_s=spin_s,
        flush=lambda: board.draw(flush_s, board.flush_w),
        gpu_seconds=board.gpu_seconds,
    )
    assert calibration.missing == ""
    assert calibration.awake_w == pytest.approx(board.awake_w, rel=0.01)
    assert calibration.flush_s == pytest.approx(flush_s)
    assert calibration.flush_mj == pytest.approx(board.flush_w * flush_s * 1e3, rel=0.02)

    def timed_series(calls=60) -> None:  # 0.34 s: each call after a flush and a 0.5 ms spin
        for _ in range(calls):
            board.draw(flush_s, board.flush_w)
            board.sleep(0.5e-3)
            board.draw(call_s, board.call_w)

    _, opened = energy.window(timed_series, counter=board.counter, sync=lambda: None)
    spent = energy.charge(opened, 60, 60 * call_s, 60, calibration)
    assert spent.method == "around" and 0 < spent.outside_share < energy.MAX_OUTSIDE_SHARE
    assert spent.per_call_mj == pytest.approx(board.call_w * call_s * 1e3, rel=0.01)
    # Everything in the window charged to the calls would be about 3% too much here.
    assert opened.counted_mj / 60 > 1.02 * board.call_w * call_s * 1e3


@pytest.mark.parametrize("call_s", [5e-3, 0.07])
def test_the_series_takes_its_idle_tail_off_at_the_awake_power(board, call_s):
    board.step_s = 0.1  # an H200's counter moves every 0.1 s or so
    calls = []

    def call() -> None:
        calls.append(1)
        board.draw(call_s, board.call_w)

    common = dict(counter=board.counter, sync=lambda: None, per_call_s=call_s, min_s=0.25)
    spent = energy.measure_energy(call, awake_w=board.awake_w, **common)
    own_mj = board.call_w * call_s * 1e3
    assert spent.calls == len(calls) and 0 < spent.tail_s <= board.step_s + 1e-9
    assert spent.outside_mj == pytest.approx(board.awake_w * spent.tail_s * 1e3)
    assert spent.per_call_mj == pytest.approx(own_mj, rel=0.01)
    # Left in, the tail is charged to the calls: here up to a tenth of a second at the awake power.
    whole = energy.measure_energy(call, awake_w=0.0, **common)
    assert whole.per_call_mj == pytest.approx(own_mj + board.awake_w * whole.tail_s * 1e3 / whole.calls)


def test_without_the_awake_power_a_series_gives_no_energy_and_env_json_says_why(monkeypatch):
    monitor, _ = monitor_with(monkeypatch, lambda read: 10**6 + 1_000 * read)
    monkeypatch.setattr(worker, "_monitor", lambda device: monitor)
    monkeypatch.setattr(worker, "_CALIBRATIONS", {})
    failed = energy.Calibration(missing="the spins' window: the counter did not move over 0.52 s")
    monkeypatch.setattr(worker, "_calibration", lambda device, monitor, flush: failed)
    result = worker.measure_case(registry.get("sdpa_math"), CASE, MeasureSettings(warmup=1, reps=3), "cpu")
    assert result.row.status == "ok" and result.row.energy_mj is None and result.row.tokens_per_joule is None
    assert result.energy_missing == (
        "no awake power to take the series' idle tail off "
        "(the spins' window: the counter did not move over 0.52 s)"
    )


def test_the_series_lasts_the_energy_s_setting_and_env_json_names_it(monkeypatch):
    monitor, _ = monitor_with(monkeypatch, lambda read: 10**6 + 1_000 * read)
    monkeypatch.setattr(worker, "_monitor", lambda device: monitor)
    monkeypatch.setattr(worker, "_calibration", lambda device, monitor, flush: energy.Calibration(5.0))
    lengths = []
    measured = energy.measure_energy

    def spy(call, **options):
        lengths.append(options["min_s"])
        return measured(call, **options)

    monkeypatch.setattr(energy, "measure_energy", spy)
    chosen = MeasureSettings(warmup=1, reps=3, energy_s=0.05)
    result = worker.measure_case(registry.get("sdpa_math"), CASE, chosen, "cpu")
    assert lengths == [0.05] and result.row.energy_mj > 0 and result.energy.outside_mj > 0
    assert specs.parse_spec({**_spec_table(), "energy_s": 2}, "t").measurement.energy_s == 2.0
    assert "at least 0.25 s of back-to-back" in energy.env_record(True, None, "series", 0.25)["method"]
    expected = r"^spec.toml: key 'energy_s': expected a finite number in \(0, 600\] seconds"
    with pytest.raises(UserError, match=expected):
        specs.parse_spec({**_spec_table(), "energy_s": 0}, "spec.toml")


def test_a_calibration_whose_counter_does_not_move_says_so_and_charges_nothing(board):
    board.awake_w = 0.0  # the counter stands still over the spins
    calibration = energy.calibrate(
        counter=board.counter,
        sync=lambda: None,
        spin=lambda: board.sleep(1e-3),
        spin_s=1e-3,
        flush=lambda: board.draw(80e-6, board.flush_w),
        gpu_seconds=board.gpu_seconds,
    )
    assert calibration.missing == "the spins' window: the counter did not move over 0.45 s"
    spent = energy.charge(energy.Energy(0, 0.0, 1.0, 500_000), 10, 0.5, 10, calibration)
    assert spent.outside_mj == 0 and spent.missing == calibration.missing


def _around(monkeypatch, calibration: energy.Calibration, reps=3, **settings):
    monitor, _ = monitor_with(monkeypatch, lambda read: 10**6 + 1_000 * read)
    monkeypatch.setattr(worker, "_monitor", lambda device: monitor)
    monkeypatch.setattr(worker, "_calibration", lambda device, monitor, flush: calibration)
    chosen = MeasureSettings(warmup=1, reps=reps, energy_method="around", **settings)
    return worker.measure_case(registry.get("sdpa_math"), CASE, chosen, "cpu")


def test_the_worker_reads_the_counter_around_the_timed_calls(monkeypatch):
    result = _around(monkeypatch, energy.Calibration(awake_w=0.0))
    # The window opens at the counter's second read and closes at its fourth: a rise of 2,000 mJ.
    assert result.row.status == "ok" and result.energy.method == "around"
    assert result.row.energy_mj == pytest.approx(2_000 / 3) and "energy" not in result.row.note


def test_where_the_window_cannot_be_charged_the_case_gets_a_series_and_says_why(monkeypatch):
    result = _around(monkeypatch, energy.Calibration(missing="the spins' window: no time"))
    assert result.energy.method == "series" and result.row.energy_mj > 0
    assert result.row.note.endswith(
        "; energy from calls of its own: no calibration (the spins' window: no time)"
    )
    # An awake power that charges more than the whole rise to the window outside the calls: 0.7 s of
    # a 1 s window at 10 kW against a rise of 2,000 mJ. (Through `measure_case` on a CPU, that window
    # is wall time, and three calls' median times three can fill it, leaving nothing to charge.)
    awake = energy.Calibration(awake_w=10_000.0)
    monkeypatch.setattr(worker, "_calibration", lambda device, monitor, flush: awake)
    opened = energy.Energy(calls=3, started_s=0.0, ended_s=1.0, counted_mj=2_000, method="around")
    stats = types.SimpleNamespace(median_ms=100.0, reps=3)
    spent, note = worker._charged(opened, stats, None, "cpu", None)
    assert spent is None
    drew = "flushes, spins and the idle GPU drew 350000% of the timed calls' window"
    assert note == f"{worker.OWN_SERIES}: {drew}"


def test_the_energy_method_goes_through_the_one_checker_and_names_itself_in_env_json():
    table = {**_spec_table(), "energy_method": "around"}
    assert specs.parse_spec(table, "test").measurement.energy_method == "around"
    assert specs.parse_spec(_spec_table(), "test").measurement.energy_method == "series"
    with pytest.raises(
        UserError, match=r"^spec.toml: key 'energy_method': expected one of around, series, got 'x'$"
    ):
        specs.parse_spec({**_spec_table(), "energy_method": "x"}, "spec.toml")
    assert "before and after the timed calls" in energy.env_record(True, None, "around")["method"]
    assert "back-to-back calls that follow" in energy.env_record(True, None)["method"]


def _comparison():
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        import compare_energy_methods as compare
    finally:
        sys.path.pop(0)
    return compare


def test_the_methods_comparison_keeps_the_cases_asked_for_and_says_one_line_otherwise(capsys, monkeypatch):
    compare = _comparison()
    args = compare.parse(["out.csv", "--kernel", "tfla_sig,fa3", "--seq-len", "512", "--no-l2-flush"])
    kept, settings = compare.cases(args)
    assert {(case.kernel, case.mode, case.seq_len) for case in kept} == {
        (kernel, mode, 512) for kernel in ("tfla_sig", "fa3") for mode in ("fw", "fwbw")
    }
    assert settings.l2_flush is False and compare.cases(compare.parse(["out.csv"]))[1].l2_flush is True
    with pytest.raises(UserError, match="no case of fig5_consttoken is kept"):
        compare.cases(compare.parse(["out.csv", "--seq-len", "3"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compare.main(["out.csv"]) == 2
    assert capsys.readouterr().err == "error: comparing the energy methods needs a CUDA GPU\n"


def test_a_window_whose_closing_read_fails_keeps_what_ran_and_runs_it_once(monkeypatch):
    monitor, _ = monitor_with(monkeypatch, scripted(10, 20, gpustate.NoEnergyCounter("NVML went away")))
    ran = []
    result, opened = energy.window(
        lambda: ran.append(1) or "stats", counter=monitor.energy_mj, sync=lambda: None
    )
    assert result == "stats" and ran == [1]
    assert opened.counted_mj is None and opened.missing == "NVML went away"


def test_the_workers_calibration_is_kept_once_it_succeeded_and_measured_again_when_it_failed(monkeypatch):
    monkeypatch.setattr(worker, "_CALIBRATIONS", {})
    stuck, _ = monitor_with(monkeypatch, lambda read: 5_000)
    failed = worker._calibration("cpu", stuck, None)
    assert failed.missing.startswith("the spins' window: the counter did not move over")
    rising, fake = monitor_with(monkeypatch, lambda read: 10**6 + 1_000 * read)
    kept = worker._calibration("cpu", rising, None)
    assert kept.missing == "" and kept.awake_w > 0 and kept.flush_mj == 0
    reads = fake.reads
    assert worker._calibration("cpu", rising, None) is kept and fake.reads == reads

    def boom():
        raise RuntimeError("CUDA out of memory")

    broken = worker._calibration("cpu", rising, boom)  # another key: with flushes
    assert broken.missing == "it failed: RuntimeError: CUDA out of memory"
    assert ("cpu", True) not in worker._CALIBRATIONS


def test_the_methods_comparison_sets_each_methods_two_measurements_side_by_side(monkeypatch):
    compare = _comparison()
    methods = []

    def measured(adapter, case, settings, device):
        methods.append(settings.energy_method)
        mj = {"series": [100.0, 102.0], "around": [97.0, 95.0]}[settings.energy_method]
        value = mj[methods.count(settings.energy_method) - 1]
        window = energy.Energy(
            50, 0.0, 0.5, int(value * 50), outside_mj=5.0 * 50, method=settings.energy_method
        )
        row = worker.ResultRow(case=case, family="mlstm", status="ok", median_ms=1.0, energy_mj=value)
        return worker.Measurement(
            row, calls_s=0.4 if settings.energy_method == "around" else 0.9, energy=window
        )

    monkeypatch.setattr(compare.worker, "measure_case", measured)
    row = compare.compare(CASE, MeasureSettings(energy=False))
    assert methods == ["series", "around", "around", "series"]
    assert row["series_mj"] == 101.0 and row["around_mj"] == 96.0 and row["ratio"] == round(96 / 101, 4)
    assert row["series_spread"] == round(2 / 101, 4) and row["around_spread"] == round(2 / 96, 4)
    assert row["series_call_ms"] == 10.0 and row["series_s"] == 0.9 and row["around_s"] == 0.4
    assert row["outside_share"] == round((250 / 4850 + 250 / 4750) / 2, 4)  # each window's share, averaged
    assert row["note"] == ""


@pytest.mark.parametrize("method", ["series", "around"])
def test_a_case_whose_first_series_was_unsettled_is_timed_again_with_energy_from_its_own_calls(
    monkeypatch, method
):
    monitor, _ = monitor_with(monkeypatch, lambda read: 10**6 + 1_000 * read)
    monkeypatch.setattr(worker, "_monitor", lambda device: monitor)
    monkeypatch.setattr(worker, "_calibration", lambda device, monitor, flush: energy.Calibration(0.0))
    disturbed = timing.TimingStats(16.1, 9.1, 21.0, 8.9, 52, ci_rel=0.24, stop="budget")
    settled = timing.TimingStats(9.2, 9.1, 9.3, 9.0, 90, ci_rel=0.004, stop="ci")
    series = [disturbed, settled]
    monkeypatch.setattr(timing, "time_calls", lambda *args, **options: series.pop(0))
    chosen = MeasureSettings(warmup=1, energy_method=method)
    row = worker.measure_case(registry.get("sdpa_math"), CASE, chosen, "cpu").row
    assert row.status == "ok" and not series, row.error
    assert (row.median_ms, row.reps, row.warmup, row.stop) == (9.2, 90, 1 + 52, "ci")
    assert "timed again: its first 52 calls ran out of their time budget" in row.note
    assert row.energy_mj > 0
    assert ("energy from calls of its own: timed again" in row.note) == (method == "around")
