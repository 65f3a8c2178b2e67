"""Nsight Compute's CSV and the ncu runner (`tfla_bench.measure.ncu`), with a fake `ncu` on CPU.

`tests/data/ncu_sample.csv` is ncu's `--csv --page details --print-units base` output; a file made by
a real ncu on the GPU replaces it (see `tfla_bench.measure.ncu`), so its tests check what holds for any such
file rather than its numbers.
"""

from __future__ import annotations

import csv
import io

import fake_ncu
import pytest

from tfla_bench.errors import UserError
from tfla_bench.measure import ncu


def test_parser_reads_every_launch_of_the_sample_file():
    text = fake_ncu.SAMPLE.read_text()
    kernels = ncu.parse_csv(text)
    assert kernels and [k.launch_id for k in kernels] == sorted({k.launch_id for k in kernels})
    for kernel in kernels:
        assert kernel.name
        assert kernel.dram_read_bytes is not None and kernel.dram_read_bytes >= 0
        assert kernel.dram_write_bytes is not None and kernel.dram_write_bytes >= 0
        assert kernel.duration_ns is not None and kernel.duration_ns > 0
    # The same sums, read independently with the csv module (base units: byte, nsecond).
    header = next(i for i, line in enumerate(text.splitlines()) if line.startswith('"ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(text.splitlines()[header:]))))
    for metric, field in ((ncu.DRAM_READ, "dram_read_bytes"), (ncu.DRAM_WRITE, "dram_write_bytes")):
        expected = sum(float(r["Metric Value"].replace(",", "")) for r in rows if r["Metric Name"] == metric)
        assert sum(getattr(k, field) for k in kernels) == pytest.approx(expected)


HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Metric Name","Metric Unit","Metric Value"'
)


def _line(launch: int, kernel: str, metric: str, unit: str, value: str) -> str:
    return ",".join(f'"{cell}"' for cell in (launch, 7, "python3", "node", kernel, metric, unit, value))


def test_parser_converts_units_separators_and_prefers_the_hopper_tensor_metric():
    hmma, tensor = ncu.TENSOR_PIPE[1], ncu.TENSOR_PIPE[0]
    text = "\n".join(
        [
            "==PROF== Connected to process 7",
            HEADER,
            _line(0, "k<a, b>", ncu.DRAM_READ, "Mbyte", "1,500.5"),
            _line(0, "k<a, b>", ncu.DRAM_WRITE, "Kbyte", "2"),
            _line(0, "k<a, b>", ncu.DURATION, "usecond", "3.5"),
            _line(0, "k<a, b>", hmma, "%", "10"),
            _line(0, "k<a, b>", tensor, "%", "60"),
            _line(1, "fill", ncu.DRAM_READ, "byte", "n/a"),
            "==PROF== Disconnected from process 7",
        ]
    )
    first, second = ncu.parse_csv(text)
    assert first.name == "k<a, b>"
    assert first.dram_read_bytes == pytest.approx(1500.5e6)
    assert first.dram_write_bytes == pytest.approx(2e3)
    assert first.duration_ns == pytest.approx(3500)
    assert first.tensor_pipe_pct == 60
    assert second.dram_read_bytes is None and second.tensor_pipe_pct is None


def test_parser_finds_the_columns_by_name():
    text = "\n".join(
        [
            '"Metric Name","Metric Unit","Metric Value","Kernel Name","ID"',
            f'"{ncu.DRAM_READ}","byte","10","k","3"',
            f'"{ncu.DRAM_WRITE}","byte","20","k","3"',
        ]
    )
    (kernel,) = ncu.parse_csv(text)
    assert (kernel.launch_id, kernel.dram_read_bytes, kernel.dram_write_bytes) == (3, 10, 20)


def test_parser_without_a_csv_gives_no_kernels():
    assert ncu.parse_csv("==PROF== Connected\n==WARNING== No kernels were profiled.\n") == []


def test_command_profiles_only_between_profiler_start_and_stop(tmp_path):
    line = ncu.command(tmp_path / "ncu", ncu.METRICS, tmp_path / "log.csv", ["python", "-m", "x"])
    assert line[line.index("--profile-from-start") + 1] == "off"
    assert line[line.index("--page") + 1] == "details" and "--csv" in line
    assert line[line.index("--print-units") + 1] == "base"
    assert line[line.index("--") + 1 :] == ["python", "-m", "x"]
    assert set(line[line.index("--metrics") + 1].split(",")) == set(ncu.METRICS)


def test_profile_reads_the_log_file(tmp_path):
    fake = fake_ncu.install(tmp_path, "sample")
    kernels = ncu.profile(fake, ["python", "-c", "pass"], tmp_path / "log.csv", timeout_s=60)
    assert kernels == ncu.parse_csv(fake_ncu.SAMPLE.read_text())


def test_profile_collects_the_metrics_asked_for(tmp_path):
    fake = fake_ncu.install(tmp_path, "sample")
    ncu.profile(fake, ["python"], tmp_path / "log.csv", timeout_s=60, metrics=[ncu.DURATION])
    (call,) = fake_ncu.calls(tmp_path)
    assert call[call.index("--metrics") + 1] == ncu.DURATION


def test_profile_drops_a_metric_this_ncu_does_not_know(tmp_path):
    fake = fake_ncu.install(tmp_path, "unknown_metric")
    kernels = ncu.profile(fake, ["python"], tmp_path / "log.csv", timeout_s=60)
    assert kernels
    first, second = (call[call.index("--metrics") + 1].split(",") for call in fake_ncu.calls(tmp_path))
    assert ncu.TENSOR_PIPE[1] in first and ncu.TENSOR_PIPE[1] not in second
    assert ncu.DRAM_READ in second


@pytest.mark.parametrize(
    ("mode", "status", "words"),
    [("not_permitted", "not_permitted", "ERR_NVGPUCTRPERM"), ("empty", "no_kernels", "no kernel")],
)
def test_profile_failures_carry_a_status_and_a_reason(tmp_path, mode, status, words):
    fake = fake_ncu.install(tmp_path, mode)
    with pytest.raises(ncu.NcuError) as caught:
        ncu.profile(fake, ["python"], tmp_path / "log.csv", timeout_s=60)
    assert caught.value.status == status and words in caught.value.reason


def test_locate(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ncu.locate(None) is None
    fake = fake_ncu.install(tmp_path, "sample")
    assert ncu.locate(None) == fake
    with pytest.raises(UserError, match="no such file"):
        ncu.locate(tmp_path / "missing" / "ncu")


def test_parser_reads_a_real_h100_file_in_ncu_default_units():
    """`tests/data/ncu_h100_gemm.csv`: ncu 2025.3.1 on an H100 80GB HBM3, one bf16 4096^3 `torch.matmul`
    (`--csv --page details`, no `--print-units base`: durations in `ns`, thousands separators)."""
    (gemm,) = ncu.parse_csv((fake_ncu.SAMPLE.parent / "ncu_h100_gemm.csv").read_text())
    assert gemm.name.startswith("nvjet_sm90")
    assert gemm.dram_read_bytes == 150_447_616
    assert gemm.dram_write_bytes == 28_032_768
    assert gemm.duration_ns == 178_624
    assert gemm.tensor_pipe_pct == pytest.approx(94.42)
