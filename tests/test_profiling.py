"""Measured bytes under Nsight Compute (`tfla-bench profile`, `tfla_bench.run.profiling`): profile.csv beside
results.csv, its join, the measured intensity, the flag above the measured roof, figures and report.

A fake `ncu` (`fake_ncu.py`) stands in for Nsight Compute on CPU; the GPU test uses the real one.
"""

from __future__ import annotations

import dataclasses
import json
import math

import fake_ncu
import pandas as pd
import pytest
import torch
from synthetic_run import fig5_rows, write_run

from tfla_bench.adapters.workloads import Case
from tfla_bench.analyse.compare import load_run
from tfla_bench.analyse.report import build_report
from tfla_bench.cli.main import main
from tfla_bench.measure import ncu, roofs
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.roofs import MeasuredRoofs
from tfla_bench.model.hardware import ACCELERATORS
from tfla_bench.plots.base import render
from tfla_bench.plots.catalog import run_context
from tfla_bench.plots.measured import PROFILE_LINK, measured_plots
from tfla_bench.run import profiling, rundir, specs

SAMPLE_KERNELS = ncu.parse_csv(fake_ncu.SAMPLE.read_text())
SAMPLE_BYTES = sum(k.dram_read_bytes + k.dram_write_bytes for k in SAMPLE_KERNELS)


def roofs_record(matmul=800e12, hbm=3.0e12) -> MeasuredRoofs:
    return MeasuredRoofs(
        gpu_name="NVIDIA H100 80GB HBM3",
        driver="580.159.04",
        matmul_flops_per_s=matmul,
        matmul_size=8192,
        hbm_bytes_per_s=hbm,
        l2_bytes_per_s=8e12,
        l2_working_set_bytes=25_000_000,
        measured_at="2026-01-01T00:00:00+00:00",
        torch="2.11.0",
    )


@pytest.fixture
def run_dir(tmp_path):
    """A Fig. 5-like run at T=8192 with its spec.json, as a sweep leaves it."""
    directory = write_run(tmp_path / "fig5-20260101-000000", fig5_rows(seq_lens=(8192,)))
    written = pd.read_csv(directory / "results.csv")
    written["chunk_size"] = written["chunk_size"].astype("Int64")  # as the runner writes it: "128"
    written.to_csv(directory / "results.csv", index=False)
    spec = specs.load_spec(specs.Path("experiments/smoke.toml"))
    (directory / "spec.json").write_text(json.dumps(spec.to_dict()))
    return directory


@pytest.fixture
def no_ncu_on_path(tmp_path, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def profile_frame(run_dir) -> pd.DataFrame:
    return pd.read_csv(run_dir / rundir.PROFILE)


def test_a_case_sums_its_kernels_and_weights_the_tensor_pipe_by_duration():
    row = row_schema.ResultRow(case=Case("k", "fw", "bfloat16", 1, 64, 1, 8, 8), family="x", status="ok")
    row.flops = 1e9
    kernels = [
        ncu.KernelMetrics(
            0, "a", dram_read_bytes=100, dram_write_bytes=50, duration_ns=1000, tensor_pipe_pct=60
        ),
        ncu.KernelMetrics(
            1, "b", dram_read_bytes=10, dram_write_bytes=40, duration_ns=3000, tensor_pipe_pct=20
        ),
    ]
    profile = profiling.summarize(row, kernels)
    assert (profile.measured_bytes, profile.gpu_time_ms, profile.kernels) == (200, 0.004, 2)
    assert profile.tensor_pipe_pct == pytest.approx((60 * 1000 + 20 * 3000) / 4000)
    assert profile.measured_intensity == pytest.approx(1e9 / 200)
    partial = profiling.summarize(row, [kernels[0], dataclasses.replace(kernels[1], dram_write_bytes=None)])
    assert partial.measured_bytes is None and partial.measured_intensity is None
    untensored = profiling.summarize(row, [dataclasses.replace(kernels[0], tensor_pipe_pct=None)])
    assert untensored.tensor_pipe_pct is None and "tensor-pipe" in untensored.error


def test_without_ncu_profile_is_one_error_line_and_writes_nothing(run_dir, no_ncu_on_path, capsys):
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    assert main(["profile", str(run_dir), "--seq-len", "8192", "--mode", "fw"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ncu not found on PATH") and len(captured.err.splitlines()) == 1
    assert "Traceback" not in captured.out + captured.err and "roofs" not in captured.out
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before


def profile_fw_args(run_dir, fake_ncu_path) -> list[str]:
    """`profile` of the run's fw rows of tfla_sig and sdpa_cudnn under the fake ncu."""
    return [
        "profile",
        str(run_dir),
        "--kernel",
        "tfla_sig,sdpa_cudnn",
        "--mode",
        "fw",
        "--ncu-path",
        str(fake_ncu_path),
    ]


def test_profiled_rows_get_measured_bytes_and_intensity(run_dir, tmp_path):
    fake = fake_ncu.install(tmp_path, "sample")
    assert main(profile_fw_args(run_dir, fake)) == 0
    frame = load_run(run_dir).results
    profiled = frame[frame["profile_status"] == "ok"]
    assert set(profiled["kernel"]) == {"tfla_sig", "sdpa_cudnn"} and (profiled["mode"] == "fw").all()
    assert profiled["measured_bytes"].tolist() == pytest.approx([SAMPLE_BYTES] * len(profiled))
    assert profiled["measured_intensity"].tolist() == pytest.approx(list(profiled["flops"] / SAMPLE_BYTES))
    assert (profiled["profiled_kernels"] == len(SAMPLE_KERNELS)).all()
    # ncu would lock the clocks to base; every profile leaves them as they are.
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls and all(call[call.index("--clock-control") + 1] == "none" for call in calls)
    # The sdpa row carries param_causal: the join matched it on that column too.
    assert profiled.loc[profiled["kernel"] == "sdpa_cudnn", "param_causal"].tolist() == [False]
    assert len(list((run_dir / rundir.NCU).glob("*.csv"))) == len(profiled)
    check = profiling.roof_check(frame, None)
    placed = check[check["intensity_basis"] == "measured"]
    assert len(placed) == len(profiled)
    assert placed["measured_intensity"].tolist() == pytest.approx(list(placed["flops"] / SAMPLE_BYTES))
    assert placed["bytes_ratio"].tolist() == pytest.approx(list(placed["bytes"] / SAMPLE_BYTES))
    assert not check["above_roof"].any()


@pytest.mark.parametrize("failing", ["empty", "not_permitted"])
def test_profiling_again_replaces_a_case_and_keeps_the_others(run_dir, tmp_path, capsys, failing):
    (tmp_path / "failing").mkdir()
    bad, sample = fake_ncu.install(tmp_path / "failing", failing), fake_ncu.install(tmp_path, "sample")
    ncu_path = ["--kernel", "tfla_sig", "--ncu-path"]
    assert main(["profile", str(run_dir), "--mode", "fw", *ncu_path, str(sample)]) == 0
    reports = {path.name: path.read_bytes() for path in (run_dir / rundir.NCU).iterdir()}
    assert main(["profile", str(run_dir), *ncu_path, str(bad)]) == 0
    # A profile that fails replaces no earlier one, nor its ncu report, and says so.
    assert " ".join(capsys.readouterr().out.split()).count("its earlier profile is kept") == 4
    assert {path.name: path.read_bytes() for path in (run_dir / rundir.NCU).iterdir()} == reports
    assert main(["profile", str(run_dir), "--mode", "fwbw", *ncu_path, str(sample)]) == 0
    statuses = profile_frame(run_dir).groupby("mode")["profile_status"].agg(set).to_dict()
    assert statuses == {"fw": {"ok"}, "fwbw": {"ok"}}
    assert len(profile_frame(run_dir)) == 2 * 4  # tfla_sig at chunks 64, 128, 256, 512 per mode


def test_a_stopped_profile_keeps_the_cases_it_finished(run_dir, tmp_path):
    fake = fake_ncu.install(tmp_path, "sample")
    rows = profiling.select_rows(rundir.read_results(run_dir / rundir.RESULTS).rows, ["tfla_sig"], [], ["fw"])

    def stop_after_the_first(profile):
        raise KeyboardInterrupt  # as a kill or Ctrl-C between two cases

    with pytest.raises(KeyboardInterrupt):
        profiling.profile_rows(
            run_dir,
            rows,
            fake,
            grad_of=lambda name: "sum",
            module_of=lambda name: "tfla_bench.kernels.adapters.tfla_sig",
            timeout_s=60,
            on_profile=stop_after_the_first,
        )
    kept = profile_frame(run_dir)
    assert len(rows) > 1 and len(kept) == 1
    assert kept["profile_status"].tolist() == ["ok"] and kept["measured_bytes"].tolist() == [SAMPLE_BYTES]


@pytest.mark.parametrize(
    ("saved_gpus", "recorded"),
    [
        ((("NVIDIA H100 80GB HBM3", "580.00"), ("NVIDIA H100 80GB HBM3", "590.00")), 0),  # its driver
        ((("NVIDIA H100 80GB HBM3", "570.00"), ("NVIDIA H100 80GB HBM3", "590.00")), 1),  # latest, else
        ((("NVIDIA H200", "580.00"),), None),  # another GPU's roofs are never taken
    ],
)
def test_profile_records_the_saved_roofs_of_the_runs_gpu(
    run_dir, tmp_path, monkeypatch, capsys, saved_gpus, recorded
):
    monkeypatch.setenv(roofs.ROOFS_FILE_ENV, str(tmp_path / "roofs.json"))
    records = [
        dataclasses.replace(roofs_record(), gpu_name=gpu, driver=driver, measured_at=f"2026-0{i + 1}-01")
        for i, (gpu, driver) in enumerate(saved_gpus)
    ]
    for record in records:
        roofs.save(record)
    assert roofs.from_env(json.loads((run_dir / "env.json").read_text())) is None
    fake = fake_ncu.install(tmp_path, "empty")
    assert main(["profile", str(run_dir), "--kernel", "tfla_sig", "--ncu-path", str(fake)]) == 0
    env = json.loads((run_dir / "env.json").read_text())
    assert roofs.from_env(env) == (None if recorded is None else records[recorded])
    out = capsys.readouterr().out
    assert ("measured under driver" in out) == (recorded == 1)
    assert env["gpu_name"] == "NVIDIA H100 80GB HBM3"


def test_not_permitted_is_asked_once_and_every_row_says_why(run_dir, tmp_path):
    fake = fake_ncu.install(tmp_path, "not_permitted")
    assert main(["profile", str(run_dir), "--ncu-path", str(fake)]) == 0
    assert len(fake_ncu.calls(tmp_path)) == 1
    profiled = profile_frame(run_dir)
    assert len(profiled) > 1 and set(profiled["profile_status"]) == {"not_permitted"}
    assert profiled["profile_error"].str.contains("ERR_NVGPUCTRPERM").all()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--kernel", "nope"], "--kernel nope: the run has no row of it (its rows: "),
        (["--seq-len", "7"], "--seq-len 7: the run has no row of it (its rows: "),
        (["--mode", "bw"], "--mode"),
        (["--seq-len", "x"], "--seq-len"),
        (["--ncu-path", "/no/such/ncu"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_dir, capsys, args, words):
    assert main(["profile", str(run_dir), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and words in err[0]
    assert not (run_dir / rundir.PROFILE).exists()


def test_an_ncu_path_that_is_no_program_is_one_line_and_exit_2(run_dir, tmp_path, capsys):
    text = tmp_path / "ncu"
    text.write_text("not a program\n")
    text.chmod(0o644)
    assert main(["profile", str(run_dir), "--ncu-path", str(text)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--ncu-path {text}: not executable (mode 644)" in err
    assert main(["profile", str(run_dir), "--ncu-path", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--ncu-path {tmp_path}: is a folder; give the ncu program" in err
    assert not (run_dir / rundir.PROFILE).exists()


def test_not_a_run_directory(tmp_path, capsys):
    assert main(["profile", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def _frame(achieved_tflops, model_intensity, measured_intensity):
    flops = 1e12
    median_ms = flops / (achieved_tflops * 1e12) * 1e3
    measured = flops / measured_intensity if measured_intensity else math.nan
    return pd.DataFrame(
        {
            "kernel": ["k"],
            "mode": ["fw"],
            "status": ["ok"],
            "median_ms": [median_ms],
            "flops": [flops],
            "bytes": [flops / model_intensity],
            "measured_bytes": [measured],
            "profile_status": ["ok" if measured_intensity else None],
        }
    )


@pytest.mark.parametrize(
    ("achieved", "model_i", "measured_i", "above", "basis"),
    [
        (500, 1000, None, False, "model"),  # under the 800 TFLOP/s compute roof
        (900, 1000, None, True, "model"),  # above the compute roof: the FLOP count or timing is wrong
        (100, 1000, 20, True, "measured"),  # the model places it under the roof, ncu's bytes above (60)
        (50, 10, 20, False, "measured"),  # above the roof at the model's intensity (30), under at ncu's (60)
    ],
)
def test_flag_above_the_measured_roof(achieved, model_i, measured_i, above, basis):
    check = profiling.roof_check(_frame(achieved, model_i, measured_i), roofs_record(800e12, 3e12))
    assert check["intensity_basis"].tolist() == [basis]
    assert check["above_roof"].tolist() == [above]
    intensity = measured_i or model_i
    assert check["roof_flops_per_s"].iloc[0] == pytest.approx(min(800e12, 3e12 * intensity))


def test_bytes_by_kernel_names_kernels_the_model_misses():
    table = pd.DataFrame(
        {
            "kernel": ["a", "a", "b", "c"],
            "mode": ["fw"] * 4,
            "bytes_ratio": [1.1, 1.15, 0.7, math.nan],
        }
    )
    summary = profiling.bytes_by_kernel(table).set_index("kernel")
    assert list(summary.index) == ["a", "b"]
    assert summary.loc["a", "cases"] == 2 and summary.loc["a", "median"] == pytest.approx(1.125)
    assert summary["model_off"].to_dict() == {"a": False, "b": True}


@pytest.fixture
def profiled_run(run_dir, tmp_path):
    """The run with measured roofs so low that every point lies above them, and its fw rows profiled."""
    env = json.loads((run_dir / "env.json").read_text())
    env["roofs"] = roofs_record(matmul=5e12, hbm=0.05e12).to_dict()
    (run_dir / "env.json").write_text(json.dumps(env))
    fake = fake_ncu.install(tmp_path, "sample")
    assert main(profile_fw_args(run_dir, fake)) == 0
    return load_run(run_dir)


def test_figures_draw_the_measured_roofs_and_link_profiled_points(profiled_run):
    context = run_context(profiled_run, None, [ACCELERATORS["h100"]])
    figures = {plot.name: fig for plot, fig in render(measured_plots(context), context)}
    assert "roofline_profiled_fw" in figures and "roofline_profiled_fwbw" not in figures
    for name in ("measured_roofline_fw", "roofline_profiled_fw"):
        ax = figures[name].axes[0]
        labels = [line.get_label() for line in ax.get_lines()]
        assert any(label.startswith("measured: 5 TFLOP/s, HBM 0.05 TB/s") for label in labels)
        assert any("L2 8.00 TB/s" in label for label in labels)
        legend = [text.get_text() for text in figures[name].legends[0].get_texts()]
        assert any("above the measured roof" in text for text in legend)
    ax = figures["roofline_profiled_fw"].axes[0]
    profiled = profiled_run.results[profiled_run.results["profile_status"] == "ok"]
    links = [line for line in ax.get_lines() if line.get_gid() == PROFILE_LINK]
    assert len(links) == len(profiled)
    ends = sorted(float(line.get_xdata()[1]) for line in links)
    assert ends == pytest.approx(sorted(profiled["flops"] / SAMPLE_BYTES))


def test_report_shows_roofs_bytes_and_flags(profiled_run):
    page = build_report(profiled_run, None)
    for table_id in ("measured-roofs", "above-roof", "bytes-model-vs-measured"):
        assert f'id="{table_id}"' in page
    assert "lie above the measured roof" in page
    headline = page[page.index('<section id="headline">') : page.index('<section id="figures">')]
    finding = headline[headline.index("lie above the measured roof") :].split("</li>")[0]
    assert "<code>tfla-bench model flops</code>" in finding
    # Points placed by the model's bytes are sent to ncu first, with the run and kernels filled in.
    check = profiling.roof_check(profiled_run.results, roofs.from_env(profiled_run.env))
    above = check[check["above_roof"]]
    by_model = sorted(above.loc[above["intensity_basis"] == "model", "kernel"].unique())
    assert by_model and f"<code>tfla-bench profile {profiled_run.run_dir} -k " in finding
    summary = profiling.bytes_by_kernel(profiling.roof_check(profiled_run.results, None))
    off = summary[summary["model_off"]]
    assert not off.empty
    for kernel in off["kernel"]:
        assert kernel in page.split("off by more than 20%")[1].split("</p>")[0]


def test_report_without_roofs_says_why(run_dir):
    page = build_report(load_run(run_dir), None)
    assert "No measured roofs" in page and 'id="bytes-model-vs-measured"' not in page


def test_sweep_flags(capsys):
    assert main(["sweep", "experiments/smoke.toml", "--no-roofs", "--ncu", "--dry-run"]) == 0
    assert main(["sweep", "experiments/smoke.toml", "--ncu", "--ncu-path", "/no/such/ncu", "--dry-run"]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a quick CPU sweep; the GPU test below uses ncu")
def test_sweep_ncu_profiles_every_ok_case_after_timing(tmp_path, capsys):
    fake = fake_ncu.install(tmp_path, "sample")
    out = tmp_path / "smoke"
    args = ["sweep", "experiments/smoke.toml", "--out", str(out), "--kernel", "sdpa_math"]
    assert main([*args, "--ncu", "--ncu-path", str(fake)]) == 0
    frame = load_run(out).results
    ok = frame[frame["status"] == "ok"]
    assert len(ok) == 4 and (ok["profile_status"] == "ok").all()
    assert len(fake_ncu.calls(tmp_path)) == len(ok)
    assert ok["measured_bytes"].tolist() == pytest.approx([SAMPLE_BYTES] * len(ok))
    assert (ok["median_ms"] > 0).all()
    capsys.readouterr()
    assert main(["profile", str(out), "--ncu-path", str(fake)]) == 0
    assert "roofs" not in capsys.readouterr().out  # a CPU run has no GPU whose roofs apply


@pytest.mark.skipif(torch.cuda.is_available(), reason="a quick CPU sweep")
def test_sweep_ncu_without_ncu_says_so_once_and_keeps_the_rows(tmp_path, no_ncu_on_path, capsys):
    out = tmp_path / "smoke"
    args = ["sweep", "experiments/smoke.toml", "--out", str(out), "--kernel", "sdpa_math", "--seq-len", "128"]
    assert main([*args, "--ncu"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("ncu not found") == 1
    assert not (out / rundir.PROFILE).exists()
    assert {row.status for row in rundir.read_results(out / rundir.RESULTS).rows} == {"ok"}


@pytest.mark.gpu
def test_profile_a_gpu_run_under_the_real_ncu(tmp_path, capsys):
    if ncu.locate(None) is None:
        pytest.skip("ncu is not on PATH")
    out = tmp_path / "smoke"
    assert main(["sweep", "experiments/smoke.toml", "--out", str(out), "--kernel", "sdpa_math", "--ncu"]) == 0
    frame = load_run(out).results
    chosen = frame[frame["status"] == "ok"]
    assert chosen["profile_status"].notna().all()
    if (chosen["profile_status"] == "not_permitted").all():
        pytest.skip("profiling not permitted on this machine (ERR_NVGPUCTRPERM)")
    profiled = chosen[chosen["profile_status"] == "ok"]
    assert not profiled.empty and (profiled["measured_bytes"] > 0).all()
    assert (profiled["profiled_kernels"] >= 1).all()
    # The timings are the sweep's: the profiled call never replaces them.
    assert (profiled["median_ms"] > 0).all()
    assert torch.cuda.is_available()
