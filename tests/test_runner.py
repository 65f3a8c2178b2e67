"""The measurement core and the sweep runner on CPU, with test adapters that crash, hang and fail."""

import _thread
import csv
import dataclasses
import io
import json
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from worker_jobs import EnvironmentJob, ProcessJob

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.cli.main import main
from tfla_bench.errors import UserError
from tfla_bench.kernels import config as kernel_config
from tfla_bench.measure import gpustate, settings, timing, worker
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.settings import MeasureSettings
from tfla_bench.measure.worker import measure_case
from tfla_bench.run import phases, rundir, runner, specs

pytestmark = pytest.mark.usefixtures("plugin_adapters")

ENV_KEYS = {
    "gpu_name",
    "gpu_count",
    "sm_count",
    "gpu_memory_bytes",
    "driver",
    "cuda",
    "torch",
    "triton",
    "python",
    "packages",
    "git_sha",
    "host",
    "spec",
    "published",
    "started_at",
    "measurement",
}
KERNELS = [
    "sdpa_math",
    "test_abort",
    "test_raise",
    "test_oom",
    "test_sleep",
    "test_unavailable",
    "test_counting",
]
TIMEOUT_S = 4.0


def tiny_spec(kernels: list[str], modes: list[str], seq_len: list[int] | None = None) -> specs.Spec:
    raw = {
        "name": "runner-test",
        "kernels": kernels,
        "modes": modes,
        "dtype": "float32",
        "warmup": 1,
        "reps": 2,
        "timeout_s": TIMEOUT_S,
        "published": "nothing",
        "shape": {"batch": 1, "seq_len": seq_len or [16], "num_heads": 2, "head_dim_qk": 8, "head_dim_v": 8},
    }
    return specs.parse_spec(raw, "test")


@pytest.fixture(scope="module")
def sweep(plugin_adapters, tmp_path_factory):
    """One sweep over every failure kind, one case each."""
    spec = tiny_spec(KERNELS, ["fw"])
    cases = specs.expand(spec)
    run_dir = tmp_path_factory.mktemp("run") / "sweep"
    report = runner.run_sweep(spec, cases, run_dir, devices=["cpu"])
    return spec, cases, report


def by_kernel(rows):
    grouped = {}
    for row in rows:
        grouped.setdefault(row.case.kernel, []).append(row)
    return grouped


def test_every_failure_becomes_a_row_and_the_sweep_goes_on(sweep):
    _, cases, report = sweep
    rows = by_kernel(report.rows)
    assert len(report.rows) == len(cases) == len(KERNELS)
    assert {r.status for r in rows["test_abort"]} == {"crashed"}
    assert all("SIGABRT" in r.error and "about to abort" in r.error for r in rows["test_abort"])
    assert {r.status for r in rows["test_sleep"]} == {"timeout"}
    assert all(f"{TIMEOUT_S:g} s" in r.error for r in rows["test_sleep"])
    assert {(r.status, r.error) for r in rows["test_unavailable"]} == {
        ("unavailable", "needs the package frobnicate")
    }
    assert {r.status for r in rows["test_oom"]} == {"oom"}
    assert {(r.status, r.error) for r in rows["test_raise"]} == {
        ("error", "ValueError: block size 96 is not a power of two")
    }
    # Cases after the crash and the hang ran on replacement workers.
    for kernel in ("sdpa_math", "test_counting"):
        for row in rows[kernel]:
            assert row.status == "ok" and row.device == "cpu"
            assert 0 < row.min_ms <= row.p20_ms <= row.median_ms <= row.p80_ms
            assert row.first_call_s > 0 and row.tflops == pytest.approx(row.flops / row.median_ms / 1e9)
            assert row.gbps == pytest.approx(row.bytes / row.median_ms / 1e6)
            # Memory is not measured on CPU: empty, not zero.
            assert row.peak_memory_bytes is None and row.peak_memory_above_inputs_bytes is None
            assert "not measured" in row.note
    assert report.decided == 1 and report.dispatched == len(cases) - 1
    # one process per adapter that ran: the crash and the hang ended processes that the next
    # adapter would have left anyway
    assert report.worker_starts == 6


def test_csv_schema_and_env_json(sweep):
    spec, _, report = sweep
    with (report.run_dir / "results.csv").open(newline="") as handle:
        header = next(csv.reader(handle))
    assert header == list(row_schema.CASE_COLUMNS) + list(row_schema.METRIC_COLUMNS)
    for column in ("median_ms", "p20_ms", "p80_ms", "min_ms", "first_call_s", "peak_memory_bytes", "error"):
        assert column in header
    env = json.loads((report.run_dir / "env.json").read_text())
    assert ENV_KEYS <= set(env)
    assert env["spec"] == "runner-test" and env["published"] == "nothing"
    assert env["measurement"]["reps"] == 2 and env["measurement"]["clock"] == "time.perf_counter"
    assert env["measurement"]["autotune_cache"] == worker.autotune_cache_setting()
    assert env["measurement"]["kernel_configs"]["entries"] == len(kernel_config.TUNED_CONFIGS)
    assert env["torch"] == torch.__version__ and env["gpu_count"] == 0
    assert [info["device"] for info in env["device_infos"]] == ["cpu"]
    assert env["device_infos"][0]["uuid"] is None
    assert "torch" in env["packages"] and "fla-core" in env["packages"]
    assert (report.run_dir / "worker-0.log").exists()
    assert specs.parse_spec(json.loads((report.run_dir / "spec.json").read_text()), "x") == specs.parse_spec(
        spec.to_dict(), "x"
    )


def copy_run(source, run_dir):
    """A copy of a finished run's results, spec and env, to resume."""
    run_dir.mkdir()
    for name in ("results.csv", "spec.json", "env.json"):
        (run_dir / name).write_bytes((source / name).read_bytes())
    return run_dir


def test_resume_reruns_nothing_finished(sweep, tmp_path):
    spec, cases, report = sweep
    run_dir = copy_run(report.run_dir, tmp_path / "copy")
    again = runner.run_sweep(spec, cases, run_dir, resume=True, devices=["cpu"])
    assert again.dispatched == 0 and again.worker_starts == 0
    assert again.decided == 1  # the unavailable row is decided again (free), nothing else
    assert sorted(r.case.key for r in again.rows) == sorted(c.key for c in cases)
    assert {r.case.key: r.status for r in again.rows} == {r.case.key: r.status for r in report.rows}
    env = json.loads((run_dir / "env.json").read_text())
    assert len(env["resumed"]) == 1

    # Drop the sdpa_math rows as if the run had been interrupted: only those cases run again.
    kept = [r for r in again.rows if r.case.kernel != "sdpa_math"]
    rundir.rewrite_results(run_dir / "results.csv", kept, rundir.read_results(run_dir / "results.csv").header)
    third = runner.run_sweep(spec, cases, run_dir, resume=True, devices=["cpu"])
    assert third.dispatched == 1 and third.worker_starts == 1
    assert {r.case.kernel for r in third.rows if r.status == "ok"} == {"sdpa_math", "test_counting"}
    assert len(third.rows) == len(cases)


def test_a_resume_with_the_runs_own_spec_leaves_its_spec_json_as_it_was(sweep, tmp_path):
    """spec.json of an older version, which named no `energy_method`, gains no setting on a resume,
    and the spec its first attempt recorded stays the one it recorded."""
    _, cases, report = sweep
    run_dir = copy_run(report.run_dir, tmp_path / "copy")
    recorded = json.loads((run_dir / "spec.json").read_text())
    assert recorded.pop("energy_method") == settings.BEFORE_RECORDED["energy_method"]
    (run_dir / "spec.json").write_text(json.dumps(recorded))
    before = (run_dir / "spec.json").read_bytes()
    first = json.loads((run_dir / "env.json").read_text())["spec_record"]
    spec = runner.load_run_spec(run_dir)
    assert runner.check_run_dir(run_dir, spec, resume=True, cuda=False) is None
    runner.run_sweep(spec, cases, run_dir, resume=True, devices=["cpu"])
    assert (run_dir / "spec.json").read_bytes() == before
    env = json.loads((run_dir / "env.json").read_text())
    assert env["spec_record"] == first and len(env["resumed"]) == 1


def test_resume_keeps_every_finished_line_byte_for_byte_in_spec_order(sweep, tmp_path):
    """A resume rewrites results.csv (a torn line dropped, the kept rows first): every finished row
    comes back as it was written (NaN cells, a number's digits, its line ending), and the finished
    run lists its rows in the spec's order, however they were ordered before."""
    spec, cases, report = sweep
    run_dir = copy_run(report.run_dir, tmp_path / "copy")
    path = run_dir / "results.csv"
    header, *lines = path.read_bytes().decode().splitlines(keepends=True)
    column = next(csv.reader([header])).index("median_ms")
    edited = []
    for line, median in zip(lines, ["nan", "NaN", "1.50", "", "2e-3", "3", "4"], strict=False):
        cells = next(csv.reader([line]))
        cells[column] = median
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerow(cells)  # as an editor saves it: LF endings
        edited.append(out.getvalue())
    by_kernel = {next(csv.reader([line]))[0]: line for line in edited}
    finished = [line for kernel, line in by_kernel.items() if kernel not in ("sdpa_math", "test_unavailable")]
    # Out of the spec's order, without the sdpa_math row (it runs again), the unavailable row (decided
    # again) last.
    path.write_bytes((header + "".join(reversed(finished)) + by_kernel["test_unavailable"]).encode())
    again = runner.run_sweep(spec, cases, run_dir, resume=True, devices=["cpu"])
    assert again.dispatched == 1 and again.kept == len(finished)
    text = path.read_bytes().decode()
    assert text.startswith(header) and all(line in text for line in finished)
    assert [row.case.key for row in again.rows] == [case.key for case in cases]
    assert sum(row.median_ms != row.median_ms for row in again.rows) == sum(
        "nan" in line.lower() for line in finished
    )


def test_a_spec_json_edited_between_a_run_and_its_resume_is_refused_unless_forced(sweep, tmp_path):
    spec, _, report = sweep
    run_dir = copy_run(report.run_dir, tmp_path / "copy")
    recorded = json.loads((run_dir / "spec.json").read_text())
    (run_dir / "spec.json").write_text(json.dumps({**recorded, "reps": 7}))
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    edited = runner.load_run_spec(run_dir)
    with pytest.raises(UserError, match=r"spec.json was edited after the run wrote it, at reps: 7 here"):
        runner.check_run_dir(run_dir, edited, resume=True)
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before
    forced = runner.check_run_dir(run_dir, edited, resume=True, force=True)
    assert forced == "spec.json edited at reps: 7 here, 2 in the run"
    runner.run_sweep(edited, specs.expand(edited), run_dir, resume=True, forced=forced, devices=["cpu"])
    assert runner.check_run_dir(run_dir, edited, resume=True) is None  # the new attempt recorded it


def test_resolve_run_dir_refuses_existing_results(sweep, tmp_path):
    spec, _, report = sweep
    assert runner.resolve_run_dir("x", report.run_dir, None) == (report.run_dir, False)
    with pytest.raises(UserError, match="already holds results"):
        runner.check_run_dir(report.run_dir, spec, resume=False)
    assert runner.resolve_run_dir("x", None, report.run_dir) == (report.run_dir, True)
    assert runner.resolve_run_dir("x", tmp_path / "new", None) == (tmp_path / "new", False)
    assert (tmp_path / "new").is_dir()
    with pytest.raises(UserError, match="not a run directory"):
        runner.resolve_run_dir("x", None, tmp_path)
    assert runner.default_run_dir("smoke").parent == Path("runs")


def counting_case(mode: str) -> Case:
    return Case(
        "test_counting", mode, "float32", batch=1, seq_len=8, num_heads=2, head_dim_qk=4, head_dim_v=4
    )


@pytest.mark.parametrize("grad", ["fixed", "sum"])
def test_fwbw_calls_backward_every_time_and_never_accumulates(plugin_adapters, grad):
    adapter = registry.get("test_counting")
    adapter.reset()
    settings = MeasureSettings(warmup=3, reps=4, grad=grad)
    measured = measure_case(adapter, counting_case("fwbw"), settings, "cpu")
    result = measured.row
    assert result.status == "ok", result.error
    calls = 1 + settings.warmup + settings.reps  # first call, warmup, timed (no memory call on CPU)
    counter = plugin_adapters.Counting.counter
    assert counter.forwards == counter.backwards == calls
    assert 0 < measured.calls_s < 60  # the warm-up and timed calls' wall time
    inputs = plugin_adapters.Counting.last_inputs
    upstream = counter.last_grad
    if grad == "sum":
        assert torch.equal(upstream, torch.ones_like(upstream))
    # One backward's gradient, not `calls` of them summed up.
    assert torch.allclose(inputs["x"].grad, upstream * inputs["w"].detach())
    assert torch.allclose(inputs["w"].grad, upstream * inputs["x"].detach())


def test_fixed_upstream_gradient_is_made_once(plugin_adapters):
    adapter = registry.get("test_counting")
    seen = []
    original = plugin_adapters._CountingMul.backward

    def spy(ctx, grad):
        seen.append(grad.detach().clone())
        return original(ctx, grad)

    plugin_adapters._CountingMul.backward = staticmethod(spy)
    try:
        measure_case(adapter, counting_case("fwbw"), MeasureSettings(warmup=1, reps=2), "cpu")
    finally:
        plugin_adapters._CountingMul.backward = staticmethod(original)
    assert len(seen) == 4
    assert all(torch.equal(g, seen[0]) for g in seen) and not torch.equal(seen[0], torch.ones_like(seen[0]))


def test_fw_never_calls_backward(plugin_adapters):
    adapter = registry.get("test_counting")
    adapter.reset()
    result = measure_case(adapter, counting_case("fw"), MeasureSettings(warmup=1, reps=2), "cpu").row
    assert result.status == "ok"
    assert plugin_adapters.Counting.counter.forwards == 4
    assert plugin_adapters.Counting.counter.backwards == 0


class CappingMonitor:
    """A stand-in NVML monitor: full clock before a case, the power cap from its first timed calls on;
    no energy counter, so no energy series adds calls to the count."""

    def __init__(self, caps: bool, seen_early: bool = False):
        later = gpustate.Reading(1755, 2619, 60, 690.0, "sw_power_cap") if caps else None
        full = gpustate.Reading(1980, 2619, 50, 300.0, "none")
        self.readings = iter([full, later or full, later or full])
        self.seen_early = caps and seen_early

    def settle(self):
        return 0.0

    def throttled(self):  # asked after each batch of the first series
        return self.seen_early

    def read(self):
        return next(self.readings)

    def energy_mj(self):
        raise gpustate.NoEnergyCounter("NVML gives no energy counter for this GPU (Not Supported)")


@pytest.mark.parametrize("power_cap", ["again", "gaps"])
@pytest.mark.parametrize("caps", [True, False])
def test_a_case_whose_power_cap_sets_in_while_timed_is_timed_again(
    plugin_adapters, monkeypatch, caps, power_cap
):
    monkeypatch.setattr(worker, "_monitor", lambda device: CappingMonitor(caps))
    gaps = []
    monkeypatch.setattr(timing.time, "sleep", gaps.append)
    adapter = registry.get("test_counting")
    adapter.reset()
    settings = MeasureSettings(warmup=1, reps=3, power_cap=power_cap)
    result = measure_case(adapter, counting_case("fw"), settings, "cpu").row
    assert result.status == "ok", result.error
    counter = plugin_adapters.Counting.counter
    if caps:
        # The first series' three calls became warm-up; three more were timed.
        assert (result.warmup, result.reps, counter.forwards) == (4, 3, 1 + 1 + 3 + 3)
        assert "(SM 1980 -> 1755 MHz during the first timed calls, which count as warm-up)" in result.note
        assert result.sm_mhz_after == 1755 and result.throttled
        if power_cap == "gaps":  # an idle gap between the calls of the second series only
            assert "sw_power_cap set in (SM 1980" in result.note
            assert "timed again from a settled GPU, an idle gap after each call" in result.note
            assert len(gaps) == 2
        else:
            assert "timed again under sw_power_cap" in result.note and not gaps
    else:
        assert (result.warmup, result.reps, counter.forwards) == (1, 3, 1 + 1 + 3)
        assert "timed again" not in result.note and not gaps


def test_a_first_series_stops_at_the_batch_where_its_power_cap_is_seen(plugin_adapters, monkeypatch):
    monkeypatch.setattr(worker, "_monitor", lambda device: CappingMonitor(caps=True, seen_early=True))
    monkeypatch.setattr(timing.time, "sleep", lambda seconds: None)
    adapter = registry.get("test_counting")
    adapter.reset()
    settings = MeasureSettings(warmup=1, reps=3, power_cap="gaps")
    result = measure_case(adapter, counting_case("fw"), settings, "cpu").row
    assert result.status == "ok", result.error
    # The first series stopped after its first batch, one call, which became warm-up.
    assert (result.warmup, result.reps, plugin_adapters.Counting.counter.forwards) == (2, 3, 1 + 1 + 1 + 3)
    assert "sw_power_cap set in (SM 1980 -> 1755 MHz" in result.note


def test_percentiles_and_summary():
    stats = timing.summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (stats.median_ms, stats.min_ms, stats.reps) == (3.0, 1.0, 5)
    assert stats.p20_ms == pytest.approx(1.8) and stats.p80_ms == pytest.approx(4.2)
    assert timing.percentile([7.0], 80) == 7.0


def test_decide_in_the_parent():
    spec = tiny_spec(["sdpa_math", "sdpa_flash", "test_chunked", "test_counting"], ["fw", "fwbw"])
    cases = specs.expand(spec)
    decided, to_run = runner.plan(cases, cuda=False, failed_check={"test_counting": "gate: rel. RMS 0.3"})
    status = {(r.case.kernel, r.case.mode): (r.status, r.error) for r in decided}
    assert status[("sdpa_flash", "fw")] == ("unavailable", "needs CUDA")
    assert (
        status[("test_chunked", "fwbw")][0] == "unsupported"
        and "mode fwbw" in status[("test_chunked", "fwbw")][1]
    )
    assert status[("test_chunked", "fw")] == ("unsupported", "chunk_size None must be <= seq_len 16")
    assert status[("test_counting", "fwbw")] == ("failed_check", "gate: rel. RMS 0.3")
    assert {p.case.kernel for p in to_run} == {"sdpa_math"}
    assert all(p.flops > 0 and p.bytes > 0 for p in to_run)


def test_the_note_without_cuda_names_what_runs_and_what_the_interpreter_would_run(monkeypatch):
    def notes(kernels):
        spec = tiny_spec(kernels, ["fw"])
        return runner.sweep_notes(specs.expand(spec), cuda=False)[0]

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    line = notes(["sdpa_math", "sdpa_flash", "tfla_sig"])
    assert line.startswith("no CUDA device: only CPU-capable adapters run (sdpa_math); the others get status")
    assert line.endswith("; TRITON_INTERPRET=1 runs tfla_sig in Triton's CPU interpreter")
    assert notes(["sdpa_math"]) == "no CUDA device: only CPU-capable adapters run (sdpa_math)"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert notes(["sdpa_math", "tfla_sig"]) == (
        "no CUDA device: only CPU-capable adapters run (sdpa_math, tfla_sig)"
    )


def test_sharding_is_stable_and_spread():
    keys = [f"k{i}" for i in range(200)]
    first = [runner.shard_of(key, 4) for key in keys]
    assert first == [runner.shard_of(key, 4) for key in keys]
    assert set(first) == {0, 1, 2, 3}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_devices_without_cuda():
    assert runner.select_devices(None) == ["cpu"]
    with pytest.raises(UserError, match="no CUDA device"):
        runner.select_devices("2")


def test_broken_entry_point_becomes_an_unavailable_adapter(monkeypatch):
    class Entry:
        name = "broken_plugin"
        value = "missing_pkg.adapters"

        def load(self):
            raise ModuleNotFoundError("No module named 'missing_pkg'")

    monkeypatch.setattr(registry, "_ADAPTERS", dict(registry._ADAPTERS))
    monkeypatch.setattr(registry, "entry_points", lambda group: [Entry()])
    registry.load_entry_points()
    adapter = registry.get("broken_plugin")
    assert adapter.available() == (
        "plugin 'missing_pkg.adapters' failed to load: ModuleNotFoundError: No module named 'missing_pkg'"
    )


def test_plugins_env_imports_modules(monkeypatch, tmp_path):
    (tmp_path / "extra_adapters_for_test.py").write_text(
        "from plugin_adapters import _Tiny\nfrom tfla_bench.adapters.registry import register\n\n"
        "@register\nclass Extra(_Tiny):\n    name = 'test_extra'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_ADAPTERS", dict(registry._ADAPTERS))
    monkeypatch.setenv(registry.PLUGINS_ENV, "extra_adapters_for_test")
    assert registry.get("test_extra").family == "test"
    monkeypatch.setenv(registry.PLUGINS_ENV, "no_such_module_here")
    with pytest.raises(UserError, match="cannot import adapter module 'no_such_module_here'"):
        registry.load()


def test_ctrl_c_keeps_rows_and_kills_workers(tmp_path):
    spec = tiny_spec(["sdpa_math", "test_sleep"], ["fw"])
    spec = spec.with_measurement(timeout_s=120.0)
    csv_path = tmp_path / "run" / "results.csv"

    def press_ctrl_c_after_first_row():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(rundir.read_results(csv_path).rows) < 1:
            time.sleep(0.1)
        time.sleep(0.5)  # the worker is now inside test_sleep
        _thread.interrupt_main()

    threading.Thread(target=press_ctrl_c_after_first_row, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        runner.run_sweep(spec, specs.expand(spec), tmp_path / "run", devices=["cpu"])
    assert [(r.case.kernel, r.status) for r in rundir.read_results(csv_path).rows] == [("sdpa_math", "ok")]
    assert multiprocessing.active_children() == []


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
def test_gpu_sweep_records_memory_and_device_facts(tmp_path, cuda_graph):
    raw = tiny_spec(["sdpa_math", "sdpa_cudnn"], ["fw", "fwbw"], seq_len=[256]).to_dict()
    raw.update(dtype="bfloat16", cuda_graph=cuda_graph, timeout_s=300.0)
    raw["shape"].update(head_dim_qk=64, head_dim_v=64)
    spec = specs.parse_spec(raw, "gpu test")
    report = runner.run_sweep(spec, specs.expand(spec), tmp_path / "run", devices=["cuda:0"])
    for row in report.rows:
        assert row.status == "ok", row.error
        assert row.device == "cuda:0" and row.note == ""
        assert row.peak_memory_bytes > row.peak_memory_above_inputs_bytes > 0
        assert 0 < row.min_ms <= row.median_ms
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["gpu_name"] and env["sm_count"] > 0 and env["gpu_memory_bytes"] > 0
    assert env["device_infos"][0]["uuid"].startswith("GPU-")
    assert env["measurement"]["clock"] == "cuda_events" and env["measurement"]["flush_bytes"] >= 256_000_000


def test_a_kernel_that_keeps_crashing_the_same_way_is_not_rerun(tmp_path):
    spec = tiny_spec(["test_abort", "sdpa_math"], ["fw"], seq_len=[16, 32, 48, 64])
    cases = specs.expand(spec)
    report = runner.run_sweep(spec, cases, tmp_path / "run", devices=["cpu"])
    aborts = [row for row in report.rows if row.case.kernel == "test_abort"]
    assert [row.status for row in aborts] == ["crashed"] * 4
    ran, skipped = aborts[: worker.CRASH_REPEATS], aborts[worker.CRASH_REPEATS :]
    assert all("SIGABRT" in row.error and not row.error.startswith("not run") for row in ran)
    assert all(
        row.error.startswith("not run: the previous 2 cases") and "SIGABRT" in row.error for row in skipped
    )
    # the first process, one after each crash but the last, and sdpa_math's own
    assert report.worker_starts == worker.CRASH_REPEATS + 1
    assert {row.status for row in report.rows if row.case.kernel == "sdpa_math"} == {"ok"}


def test_a_kernel_that_kept_crashing_in_the_precompile_is_not_run_by_the_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    spec = tiny_spec(["test_abort", "sdpa_math"], ["fw"], seq_len=[16, 32, 48])
    cases = specs.expand(spec)
    report = runner.run_sweep(spec, cases, tmp_path / "run", devices=["cpu"], precompile_processes=1)
    aborts = [row for row in report.rows if row.case.kernel == "test_abort"]
    assert [row.status for row in aborts] == ["crashed"] * 3
    assert all(
        row.error.startswith("not run: the precompile's runs of this kernel kept crashing the same way")
        and "SIGABRT" in row.error
        for row in aborts
    )
    assert report.worker_starts == 1  # sdpa_math's; the decided adapter gets none, and nothing crashed
    assert {row.status for row in report.rows if row.case.kernel == "sdpa_math"} == {"ok"}
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    [crashed] = env["precompile"]["crashed"]  # one error, with the cases it stopped
    assert "SIGABRT" in crashed["error"] and crashed["cases"] == sorted(row.case.key for row in aborts)


def test_each_adapter_measures_in_a_process_of_its_own(tmp_path, monkeypatch):
    log = tmp_path / "pids.log"
    monkeypatch.setenv("TFLA_TEST_PID_LOG", str(log))
    spec = tiny_spec(["test_process_a", "test_process_b", "sdpa_math"], ["fw", "fwbw"])
    report = runner.run_sweep(spec, specs.expand(spec), tmp_path / "run", devices=["cpu"])
    assert {row.status for row in report.rows} == {"ok"}
    pids: dict[str, set[str]] = {}
    for line in log.read_text().splitlines():
        name, pid = line.split()
        pids.setdefault(name, set()).add(pid)
    # both cases of an adapter in one process, each adapter in another one
    assert len(pids["test_process_a"]) == len(pids["test_process_b"]) == 1
    assert pids["test_process_a"] != pids["test_process_b"]
    assert report.worker_starts == 3
    assert multiprocessing.active_children() == []


def test_git_sha_named_in_the_env_wins_over_a_stale_checkout(monkeypatch):
    from tfla_bench.measure import envinfo

    monkeypatch.setenv(envinfo.GIT_SHA_ENV, "0123abcd")
    assert envinfo._git_state() == {"git_sha": "0123abcd", "git_dirty": None}
    monkeypatch.delenv(envinfo.GIT_SHA_ENV)
    state = envinfo._git_state()
    assert state["git_sha"] != "0123abcd" and set(state) == {"git_sha", "git_dirty"}


def test_rows_record_the_calls_made_and_why_timing_stopped(sweep):
    _, _, report = sweep
    for row in by_kernel(report.rows)["test_counting"]:
        assert (row.warmup, row.reps, row.stop) == (1, 2, "fixed")
        assert row.ci_rel == float("inf")  # two calls give no finite interval for the median
        # On CPU the host's clock times the calls and NVML is not asked.
        assert row.host_gap_share is None and row.throttled is None and row.sm_mhz_before is None


def test_adaptive_timing_is_the_default(plugin_adapters):
    adapter = registry.get("test_counting")
    settings = MeasureSettings(budget_s=0.2, warmup_s=0.01)
    result = measure_case(adapter, counting_case("fw"), settings, "cpu").row
    assert result.status == "ok", result.error
    assert result.stop in ("ci", "budget", "max") and result.reps >= settings.min_reps
    assert result.warmup >= 1 and result.ci_rel >= 0
    if result.stop == "ci":
        assert result.ci_rel <= settings.rel_ci


def test_new_columns_round_trip_through_the_csv(tmp_path):
    case = counting_case("fw")
    row = row_schema.ResultRow(
        case=case,
        family="test",
        status="ok",
        median_ms=1.0,
        reps=12,
        ci_rel=0.004,
        stop="ci",
        host_gap_share=0.25,
        sm_mhz_before=1980,
        throttle_before="sw_power_cap",
        power_w_after=612.5,
        throttled=True,
    )
    path = tmp_path / "results.csv"
    rundir.rewrite_results(path, [row], row_schema.columns_for([case]))
    assert rundir.read_results(path).rows == [row]


def test_timings_json_says_where_the_time_went(sweep):
    _, cases, report = sweep
    record = phases.read(report.run_dir)
    assert set(record["phases_s"]) == {"plan", "workers", "measuring"}
    assert record["wall_s"] >= record["phases_s"]["measuring"] > 0
    # The sleeping kernel ran into its timeout; adapters are listed by their seconds, most first.
    assert record["adapters"]["test_sleep"]["seconds"] >= TIMEOUT_S
    seconds = [entry["seconds"] for entry in record["adapters"].values()]
    assert seconds == sorted(seconds, reverse=True)
    entries = record["adapters"].values()
    assert all(0 <= entry["first_call_s"] + entry["calls_s"] <= entry["seconds"] for entry in entries)
    assert sum(entry["cases"] for entry in record["adapters"].values()) == report.dispatched
    # Every adapter of the sweep has its share of the plan, and the shares fit in the plan phase.
    assert {case.kernel for case in cases} <= set(record["adapters"])
    plan_s = [entry["plan_s"] for entry in record["adapters"].values()]
    assert all(s >= 0 for s in plan_s) and sum(plan_s) <= record["phases_s"]["plan"]
    table = phases.rows(record)
    assert table[-1] == {"part": "wall", "seconds": record["wall_s"], "cases": None, "share": 1.0}


def test_timings_split_an_adapters_time_into_first_calls_and_precompile_runs():
    clock = phases.PhaseClock()
    clock.add_precompile("k", 3.0)
    clock.add_precompile("k", 4.0)
    clock.add_plan("k", 0.5)
    clock.add_case("k", 2.0, first_call_s=1.5, calls_s=0.25)
    clock.add_case("k", 1.0, first_call_s=None)  # a crashed case has no first call
    clock.add_case("j", 0.5, first_call_s=0.25, calls_s=0.125)
    record = clock.to_dict()
    assert record["adapters"] == {
        "k": {
            "seconds": 3.0,
            "cases": 2,
            "first_call_s": 1.5,
            "calls_s": 0.25,
            "precompile_s": 7.0,
            "plan_s": 0.5,
        },
        "j": {
            "seconds": 0.5,
            "cases": 1,
            "first_call_s": 0.25,
            "calls_s": 0.125,
            "precompile_s": 0.0,
            "plan_s": 0.0,
        },
    }
    table = phases.rows(record)
    assert table[0]["part"] == "outside the phases"  # no phase ran: the whole wall time
    assert table[0]["seconds"] == pytest.approx(record["wall_s"], abs=1e-3)
    row = table[1]
    assert (row["part"], row["first_call_s"], row["calls_s"], row["precompile_s"], row["plan_s"]) == (
        "adapter k",
        1.5,
        0.25,
        7.0,
        0.5,
    )


def test_a_resumed_run_keeps_the_earlier_timings(tmp_path):
    clock = phases.PhaseClock()
    with clock.phase("measuring"):
        clock.add_case("k", 0.5)
    clock.write(tmp_path)
    again = phases.PhaseClock()
    again.write(tmp_path)
    record = phases.read(tmp_path)
    assert record["phases_s"] == {} and record["earlier"][0]["adapters"] == {
        "k": {
            "seconds": 0.5,
            "cases": 1,
            "first_call_s": 0.0,
            "calls_s": 0.0,
            "precompile_s": 0.0,
            "plan_s": 0.0,
        }
    }
    assert phases.read(tmp_path / "missing") is None


def test_the_timings_table_of_a_resumed_run_shows_every_attempt_and_their_total():
    first = {
        "wall_s": 300.0,
        "phases_s": {"measuring": 290.0},
        "adapters": {"k": {"seconds": 290.0, "cases": 3}},
    }
    second = {
        "wall_s": 100.0,
        "phases_s": {"measuring": 90.0},
        "adapters": {"k": {"seconds": 90.0, "cases": 1}},
    }
    table = phases.rows({**second, "earlier": [first]})
    assert [row["attempt"] for row in table] == [1, 1, 1, 1, 2, 2, 2, 2, "all"]
    assert (table[1]["part"], table[1]["seconds"]) == ("outside the phases", 10.0)
    assert table[2] == {
        "attempt": 1,
        "part": "adapter k",
        "seconds": 290.0,
        "cases": 3,
        "share": 290.0 / 300.0,
        "first_call_s": None,  # a record written before first calls were counted
        "calls_s": None,
        "precompile_s": None,
        "plan_s": None,
    }
    assert table[-1] == {"attempt": "all", "part": "wall", "seconds": 400.0, "cases": None, "share": 1.0}


@pytest.mark.gpu
def test_a_gpu_row_records_host_gaps_and_the_gpu_state(tmp_path):
    spec = specs.parse_spec(
        {
            "name": "gpu-state",
            "kernels": ["sdpa_math"],
            "modes": ["fw"],
            "dtype": "bfloat16",
            "shape": {"batch": 4, "seq_len": 1024, "num_heads": 8, "head_dim_qk": 64, "head_dim_v": 64},
        },
        "test",
    )
    report = runner.run_sweep(spec, specs.expand(spec), tmp_path / "run", devices=["cuda:0"])
    (row,) = report.rows
    assert row.status == "ok" and row.stop in ("ci", "budget", "max") and row.reps >= 5
    assert row.host_gap_share is not None and 0 <= row.host_gap_share <= 1
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert "not installed" in env["nvml"]["note"] and row.sm_mhz_before is None
    else:
        assert env["nvml"]["max_sm_mhz"] > 0 and row.sm_mhz_before > 0 and row.throttled in (True, False)


@pytest.mark.parametrize(("environment", "expected"), [(None, "1"), ("0", "0")])
def test_workers_keep_autotuner_choices_on_disk_unless_the_environment_says_otherwise(
    environment, expected, tmp_path, monkeypatch
):
    if environment is None:
        monkeypatch.delenv(worker.AUTOTUNE_CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(worker.AUTOTUNE_CACHE_ENV, environment)
    (case,) = specs.expand(tiny_spec(["sdpa_math"], ["fw"], seq_len=[16]))
    process = worker.Worker("cpu", tmp_path / "worker.log")
    try:
        assert process.call(EnvironmentJob(case, worker.AUTOTUNE_CACHE_ENV), timeout_s=120) == expected
    finally:
        process.stop()
    assert worker.autotune_cache_setting() == expected


def test_a_switch_goes_on_in_the_oldest_spare_which_imported_its_adapters_module(tmp_path):
    (case,) = specs.expand(tiny_spec(["sdpa_math"], ["fw"], seq_len=[16]))
    process = worker.Worker("cpu", tmp_path / "worker.log")
    try:
        first, _ = process.call(ProcessJob(case, "plugin_adapters"), timeout_s=120)
        process.start_spare("test_counting", "plugin_adapters")
        process.start_spare("sdpa_math", "tfla_bench.baselines.sdpa_math")
        process.switch()
        second, imported = process.call(ProcessJob(case, "plugin_adapters"), timeout_s=120)
        process.switch()
        third, _ = process.call(ProcessJob(case, "plugin_adapters"), timeout_s=120)
        process.switch()  # no spare left: a fresh process at the next call
        fourth, _ = process.call(ProcessJob(case, "plugin_adapters"), timeout_s=120)
    finally:
        process.stop()
    assert len({first, second, third, fourth}) == 4 and imported
    assert process.starts == 4
    assert multiprocessing.active_children() == []


def test_the_time_outside_the_phases_leaves_out_what_ran_beside_them():
    clock = phases.PhaseClock()
    with clock.phase("measuring"), clock.phase("precompile", beside=True):
        time.sleep(0.05)
    clock.add_phase("precompile_wait", 0.04)
    record = clock.to_dict()
    assert record["beside"] == ["precompile", "precompile_wait"]
    assert 0 <= phases.outside_s(record) < 0.02
    # A record written before `beside` was kept: the phases of a GPU sweep of 421 s whose precompile
    # ran beside its measuring.
    older = {
        "wall_s": 421.47,
        "phases_s": {
            "plan": 0.3,
            "roofs": 3.659,
            "workers": 4.259,
            "precompile_wait": 275.885,
            "precompile": 352.464,
            "measuring": 410.072,
        },
    }
    assert phases.outside_s(older) == pytest.approx(3.18)
    sequential = {"wall_s": 10.0, "phases_s": {"precompile": 4.0, "measuring": 5.0}}  # on the CPU
    assert phases.outside_s(sequential) == pytest.approx(1.0)


@pytest.mark.parametrize("to", ["parent", "child"])
def test_a_ctrl_c_while_a_worker_process_starts_leaves_no_traceback(to, tmp_path, monkeypatch, capfd):
    """The Ctrl-C comes right after the spawn: to the parent, before it writes the new process's
    start-up data (that process read an EOFError); or to the new process as Python starts there."""
    spawned: list[int] = []
    spawn = multiprocessing.util.spawnv_passfds

    def spawn_then_ctrl_c(path, args, passfds):
        pid = spawn(path, args, passfds)
        if "--multiprocessing-fork" in args:  # the worker, not multiprocessing's resource tracker
            spawned.append(pid)
            os.kill(os.getpid() if to == "parent" else pid, signal.SIGINT)
        return pid

    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", spawn_then_ctrl_c)
    process = worker.Worker("cpu", tmp_path / "worker.log")
    try:
        if to == "parent":
            with pytest.raises(KeyboardInterrupt):
                process.launch()
            assert not os.path.exists(f"/proc/{spawned[0]}")  # killed and reaped, not left to read
        else:
            process.launch()
            assert process.wait_ready(timeout_s=120) is None  # the Ctrl-C was the parent's to act on
    finally:
        process.stop()
    captured = capfd.readouterr()
    log = tmp_path / "worker.log"
    assert "Traceback" not in captured.err + captured.out + (log.read_text() if log.exists() else "")


def test_a_resume_of_another_selection_plans_kept_rows_and_lists_every_row_in_spec_order(
    plugin_adapters, tmp_path, capsys
):
    spec = dataclasses.replace(tiny_spec(["sdpa_math"], ["fw"], seq_len=[16, 32]), published=None)
    cases = specs.expand(spec)
    run_dir = tmp_path / "run"
    runner.run_sweep(spec, [case for case in cases if case.seq_len == 32], run_dir, devices=["cpu"])
    path = run_dir / "results.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines, lines[1]]))  # a row repeated word for word
    capsys.readouterr()
    assert main(["sweep", "--resume", str(run_dir), "--seq-len", "16,32", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert out.count("kept: ok") == 1 and out.count(" run ") == 1, out
    assert "1 row(s) repeat an earlier row word for word; a resume keeps each once" in err
    short = [case for case in cases if case.seq_len == 16]
    runner.run_sweep(spec, short, run_dir, resume=True, devices=["cpu"])
    assert [row.case.key for row in rundir.read_results(path).rows] == [case.key for case in cases]


def test_no_note_of_what_runs_when_nothing_is_left_to_run():
    assert runner.sweep_notes([], cuda=False) == []


def test_a_resume_says_it_keeps_rows_of_a_kernel_no_adapter_knows(plugin_adapters, tmp_path, capsys):
    spec = dataclasses.replace(tiny_spec(["sdpa_math"], ["fw"], seq_len=[16]), published=None)
    run_dir = tmp_path / "run"
    runner.run_sweep(spec, specs.expand(spec), run_dir, devices=["cpu"])
    path = run_dir / "results.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines, lines[1].replace("sdpa_math", "nosuch", 1)]))
    capsys.readouterr()
    assert main(["sweep", "--resume", str(run_dir)]) == 0
    err = " ".join(capsys.readouterr().err.split())  # the console wraps its lines
    assert "rows of nosuch, which no adapter here knows; kept as they are, and never run again" in err
    assert [row.case.kernel for row in rundir.read_results(path).rows].count("nosuch") == 1
