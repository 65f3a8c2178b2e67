"""The timing validation: ncu CSV parsing on CPU; the comparison with independent clocks on a GPU."""

import shutil

import pytest

from tfla_bench.measure import gpustate, ncu, validation
from tfla_bench.measure.validation import NCU_OPTIONS, Check, Split, per_call

GEMM_TOLERANCE = 0.08


def csv_line(*cells: str) -> str:
    return ",".join(f'"{cell}"' for cell in cells)


KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::neg_kernel_cuda>(int, T2, T3)"
PLACE = ("1", "7", "(128, 1, 1)", "(2048, 1, 1)", "0", "9.0", "Command line profiler metrics")
# `ncu --csv --metrics gpu__time_duration.sum`: the details page, one row per kernel and metric.
DETAILS = "\n".join(
    [
        "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
        '==PROF== Profiling "vectorized_elementwise_kernel": 0%....50%....100% - 1 pass',
        csv_line(
            "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value",
        ),
        csv_line("0", "4242", "python3.12", "127.0.0.1", KERNEL, *PLACE, "gpu__time_duration.sum", "usecond",
                 "1,234.56"),
        csv_line("1", "4242", "python3.12", "127.0.0.1", KERNEL, *PLACE, "gpu__time_duration.sum", "nsecond",
                 "987"),
        "==PROF== Disconnected from process 4242",
    ]
)  # fmt: skip


def test_ncu_durations_of_the_details_page_grouped_into_calls(tmp_path):
    kernels = ncu.parse_csv(DETAILS)
    durations_ms = [kernel.duration_ns / 1e6 for kernel in kernels]
    assert durations_ms == pytest.approx([1.23456, 0.000987])
    assert per_call(durations_ms, 1) == pytest.approx([1.235547])
    assert per_call([1.50, 0.02, 1.52, 0.02], 2) == pytest.approx([1.52, 1.54])
    with pytest.raises(ValueError, match="do not split"):
        per_call(durations_ms, 3)


def test_the_ncu_command_carries_the_validation_clock_options(tmp_path):
    line = ncu.command(tmp_path / "ncu", [ncu.DURATION], tmp_path / "log.csv", ["python"], NCU_OPTIONS)
    assert line[line.index("--clock-control") + 1] == "none"
    assert line[line.index("--cache-control") + 1] == "all"
    assert line.index("--cache-control") < line.index("--") < line.index("python")


def test_markdown_marks_rows_more_than_two_percent_apart():
    checks = [
        Check("copy", "256 MB", validation.method("events"), 0.170, 0.004, 0.0, ncu_ms=0.168, graph_ms=0.169),
        Check("copy", "1 MB", validation.method("kernels", clean_flush=True), 0.006, 0.02, 0.0, ncu_ms=0.004),
    ]
    table = validation.markdown(checks, "NVIDIA H100 80GB HBM3")
    lines = table.splitlines()
    assert lines[2].startswith("| op | size | clock, flush | suite ms")
    assert "| events, zeroing |" in lines[4] and "| 1.012 |" in lines[4] and "✗" not in lines[4]
    assert "| kernels, reading |" in lines[5] and "1.500 ✗" in lines[5]


@pytest.mark.gpu
def test_suite_agrees_with_a_back_to_back_graph_far_above_l2_and_the_flush_shows():
    fn, _ = validation.make_op("copy", 512 << 20, "cuda")
    stats = validation.suite_time(fn, "cuda").stats
    # (How often the host fell behind depends on the host: 0 or 1 of the calls on most H100 nodes,
    # 6 of 12 on one busy one, with the median still within 2% of the graph. That the spin keeps
    # host gaps out is checked on a call the host is slow to queue, in the test below.)
    assert stats.median_ms == pytest.approx(validation.graph_time(fn), rel=validation.TOLERANCE)
    # No GEMM here: 100 back-to-back 8192^3 GEMMs run into the power limit (on an H100 the graph was
    # 10% slower per call than the suite's single calls); Nsight Compute is the GEMM's clock.
    small, _ = validation.make_op("copy", 4 << 20, "cuda")
    cold = validation.suite_time(small, "cuda", flush=True).stats.median_ms
    warm = validation.suite_time(small, "cuda", flush=False).stats.median_ms
    assert cold > warm
    # The flush that reads its buffer evicts the copy's data as well.
    assert validation.suite_time(small, "cuda", clean_flush=True).stats.median_ms > warm


@pytest.mark.gpu
def test_the_spin_keeps_host_gaps_out_of_a_python_heavy_call():
    fn, _ = validation.make_op("tiny", 0, "cuda")
    with_spin = validation.suite_time(fn, "cuda", flush=False, spin=True).stats
    without = validation.suite_time(fn, "cuda", flush=False, spin=False).stats
    # Without the spin the GPU waits for the host inside nearly every call; with it, in few of them
    # (17% of the calls on an H100, where the host's queueing time varies from call to call).
    assert without.host_gap_share > 0.5 and with_spin.host_gap_share < without.host_gap_share / 2
    assert with_spin.median_ms < without.median_ms


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu) on PATH")
def test_suite_agrees_with_nsight_compute(tmp_path):
    # ncu's cache control leaves a clean, empty L2: the flush that reads its buffer is its match.
    # The GEMM draws the GPU's full power. Timed back to back it ran at the power cap, 9-17% above
    # ncu's lone replays on one H100 node (0.3% on another); timed again with idle gaps once the
    # cap sets in, the sweep's default, it was 0.999-1.014 of ncu in four validation runs and 5.9%
    # above in one run of this test, on H100s: the idle gaps leave it below the cap, not always at
    # the full clock. So the GEMM gets `GEMM_TOLERANCE`, below the back-to-back excess.
    monitor = gpustate.device_monitor("cuda")
    for op, size, tolerance in (("copy", 256 << 20, validation.TOLERANCE), ("gemm", 8192, GEMM_TOLERANCE)):
        fn, _ = validation.make_op(op, size, "cuda")
        suite = validation.suite_time(fn, "cuda", monitor=monitor, clean_flush=True).stats.median_ms
        ncu_ms = validation.ncu_time(op, size, ncu.locate(None), tmp_path / f"{op}.csv")
        assert suite == pytest.approx(ncu_ms, rel=tolerance), op


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu) on PATH")
def test_the_kernels_clock_agrees_with_nsight_compute_at_every_size(tmp_path):
    # The event bracket adds about 2.5 us that a small copy cannot hide; the GPU's activity record
    # does not. But the record's call also holds the GPU's gap between the spin's end and the copy's
    # start, 1.1-1.4 us in one series and 2.0-2.3 us in the next on H100s (the validation's second
    # table): below 64 MB the ratio moved between runs (0.908-0.979 of ncu at 1 MB, 0.934-0.983 at
    # 4 MB, 0.957-1.017 at 16 MB), and one series with the long gap was 1.31x ncu at 1 MB. So from
    # 64 MB up the call agrees within 2%, and below it the copy's own span is checked: ncu's time
    # holds it and a dispatch of 1.1-1.3 us (measured), so it lies between the span and the span
    # plus 2.5 us. The copies are the clock check: a GEMM's time depends on its power state.
    from tfla_bench.measure import timing

    for mb in validation.COPY_SIZES_MB:
        fn, _ = validation.make_op("copy", mb << 20, "cuda")
        ncu_ms = validation.ncu_time("copy", mb << 20, ncu.locate(None), tmp_path / f"copy-{mb}.csv")
        if mb >= 64:
            suite = validation.suite_time(fn, "cuda", clean_flush=True, clock="kernels").stats
            assert suite.median_ms == pytest.approx(ncu_ms, rel=validation.TOLERANCE), mb
        else:
            _, spans = validation.dispatch_split(fn, "cuda")
            span_ms = timing.percentile(spans, 50) / 1e6
            assert span_ms < ncu_ms < span_ms + 2.5e-3, mb
    # The flush still makes an in-L2 copy slower on this clock.
    small, _ = validation.make_op("copy", 4 << 20, "cuda")
    cold = validation.suite_time(small, "cuda", clock="kernels").stats.median_ms
    assert cold > validation.suite_time(small, "cuda", flush=False, clock="kernels").stats.median_ms


def test_the_validation_script_needs_a_gpu(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert validation.main([]) == 2
    assert capsys.readouterr().err.startswith("error: the timing validation needs a CUDA GPU")


def test_the_split_table_gives_each_part_and_their_sum_per_call():
    split = Split("1 MB", gaps_ns=[1000, 2000, 1000], spans_ns=[1800, 1800, 1900], ncu_ms=0.00309)
    lines = validation.split_markdown([split]).splitlines()
    assert lines[2] == "| copy | gap after the spin | copy's own span | sum: the kernels clock | ncu |"
    # The sum is taken per call, then its percentiles: 2.8, 3.8 and 2.9 us.
    assert lines[4] == "| 1 MB | 1.00 / 1.00 / 1.60 | 1.80 / 1.80 / 1.86 | 2.84 / 2.90 / 3.44 | 3.09 |"
