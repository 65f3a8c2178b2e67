"""Measured roofs (`tfla_bench.measure.roofs`, `tfla-bench roofs`, `--gpu measured`): the cache per GPU and
driver, the CPU refusal, and on a GPU the measurement itself."""

from __future__ import annotations

import json

import pytest
import torch

from tfla_bench.cli.main import main
from tfla_bench.cli.roofs import roofs_table
from tfla_bench.errors import UserError
from tfla_bench.measure import roofs

H100 = "NVIDIA H100 80GB HBM3"


def record(gpu_name=H100, driver="580.159.04", matmul=800e12, hbm=3.0e12, measured_at="2026-01-01T00:00:00"):
    return roofs.MeasuredRoofs(
        gpu_name=gpu_name,
        driver=driver,
        matmul_flops_per_s=matmul,
        matmul_size=8192,
        hbm_bytes_per_s=hbm,
        l2_bytes_per_s=8e12,
        l2_working_set_bytes=25_000_000,
        measured_at=measured_at,
        torch="2.11.0",
    )


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "roofs.json"
    monkeypatch.setenv(roofs.ROOFS_FILE_ENV, str(path))
    return path


def test_roofs_are_saved_per_gpu_and_driver(cache):
    old, new = (
        record(driver="570.0", matmul=700e12),
        record(driver="580.0", measured_at="2026-02-01T00:00:00"),
    )
    h200 = record(gpu_name="NVIDIA H200", hbm=4.4e12, measured_at="2026-03-01T00:00:00")
    for item in (old, new, h200):
        roofs.save(item)
    assert roofs.saved(H100, "570.0") == old
    assert roofs.saved(H100, "580.0") == new
    assert roofs.saved("NVIDIA H200", "580.159.04") == h200
    assert roofs.saved(H100, "590.0") is None
    assert roofs.load_saved() == [old, new, h200]
    remeasured = record(driver="570.0", matmul=750e12, measured_at="2026-04-01T00:00:00")
    roofs.save(remeasured)
    assert roofs.saved(H100, "570.0") == remeasured and len(roofs.load_saved()) == 3
    assert set(json.loads(cache.read_text())) == {item.key for item in (old, new, h200)}


def test_cache_path_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(roofs.ROOFS_FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert roofs.cache_path() == tmp_path / "tfla-bench" / "roofs.json"


@pytest.mark.parametrize("text", ["not json", '{"x": {"gpu_name": "A"}}', '{"x": 3}'])
def test_a_broken_cache_file_is_a_user_error(cache, text):
    cache.parent.mkdir(parents=True)
    cache.write_text(text)
    with pytest.raises(UserError, match="measured roofs"):
        roofs.load_saved()


def test_roofs_from_env():
    item = record()
    assert roofs.from_env({"roofs": item.to_dict()}) == item
    assert roofs.from_env({"roofs": {"error": "measuring the roofs failed"}}) is None
    assert roofs.from_env({}) is None


def test_measured_beside_the_datasheet():
    rows = {
        name.split(" (")[0]: (measured, sheet)
        for name, measured, sheet, _ in roofs.versus_datasheet(record())
    }
    assert rows["dense bf16 matmul"] == (pytest.approx(800), pytest.approx(989))
    assert rows["HBM copy, read + write"] == (pytest.approx(3.0), pytest.approx(3.35))
    assert rows["ridge point"][0] == pytest.approx(800e12 / 3e12)
    table = roofs_table(record(gpu_name="Some New GPU"))
    assert "no data sheet" in str(table.title)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_roofs_command_needs_cuda(capsys, cache):
    assert main(["roofs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "needs CUDA" in err[0]
    assert not cache.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA, --gpu measured takes the latest record")
def test_model_gpu_measured(capsys, cache):
    args = ["model", "intensity", "--seq-len", "8192", "--chunk-size", "128", "--head-dim-qk", "128"]
    assert main([*args, "--head-dim-v", "256", "--gpu", "measured"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tfla-bench roofs" in err[0]
    roofs.save(record(matmul=700e12, measured_at="2026-01-01T00:00:00"))
    roofs.save(record(driver="590", matmul=810e12, hbm=3.1e12, measured_at="2026-05-01T00:00:00"))
    assert main([*args, "--head-dim-v", "256", "--gpu", "measured", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["gpu"] == "measured"
    assert payload["peak_flops_per_s"] == 810e12 and payload["bandwidth_bytes_per_s"] == 3.1e12


def test_sweep_measures_roofs_in_a_child_that_fails_cleanly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("checks the failure path on a machine without CUDA")
    outcome = roofs.for_sweep("cuda:0")
    assert set(outcome) == {"error"} and "failed" in outcome["error"]


@pytest.mark.gpu
def test_measure_on_the_gpu(cache, capsys):
    assert main(["roofs", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    measured = roofs.MeasuredRoofs.from_dict(payload)
    assert measured.gpu_name == torch.cuda.get_device_name(0)
    assert 10e12 < measured.matmul_flops_per_s < 5000e12
    assert 0.2e12 < measured.hbm_bytes_per_s < 20e12
    # The L2 working set fits in L2: its copies run faster than the HBM copy.
    assert measured.l2_bytes_per_s > measured.hbm_bytes_per_s
    assert roofs.saved(measured.gpu_name, measured.driver) == measured
    assert roofs.for_sweep("cuda:0") == measured.to_dict()
