"""`tfla-bench diff` on hand-made run directories: matching, verdicts, summary, threshold, exit codes."""

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tfla_bench.adapters.workloads import Case
from tfla_bench.analyse.diff import diff_runs, run_spread, verdict
from tfla_bench.cli.main import main
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.row import ResultRow
from tfla_bench.run import rundir

ENV = {
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "packages": {"fla-core": "0.6.0"},
}


def case(kernel: str, seq_len: int, mode: str = "fw", **params) -> Case:
    return Case(kernel, mode, "bfloat16", 65536 // seq_len, seq_len, 16, 128, 256, 128, params=params)


def row(
    case_: Case,
    median: float,
    ci: float | None = 0.005,
    status: str = "ok",
    device: str = "cuda:0",
    throttled: bool | None = None,
) -> ResultRow:
    ok = status == "ok"
    return ResultRow(
        case=case_,
        family="mlstm",
        status=status,
        median_ms=median if ok else None,
        p20_ms=median * 0.9 if ok else None,
        p80_ms=median * 1.1 if ok else None,
        ci_rel=ci if ok else None,
        error="" if ok else "boom",
        device=device if ok else "",
        throttled=throttled,
    )


def write(run_dir, rows, env=ENV):
    run_dir.mkdir(parents=True)
    rundir.rewrite_results(run_dir / "results.csv", rows, row_schema.columns_for([r.case for r in rows]))
    (run_dir / "env.json").write_text(json.dumps(env))
    return run_dir


@pytest.fixture
def runs(tmp_path):
    a = write(
        tmp_path / "a",
        [
            row(case("tfla_sig", 1024), 1.00),
            row(case("tfla_sig", 2048), 2.00),
            row(case("tfla_sig", 4096), 4.00),
            row(case("sdpa_flash", 1024, causal=False), 3.00),
            row(case("sdpa_flash", 1024, causal=True), 1.50),  # same shape, other params: its own case
            row(case("gla", 1024), 5.00),
            row(case("mamba2", 1024), 7.00),
        ],
    )
    b = write(
        tmp_path / "b",
        [
            row(case("tfla_sig", 1024), 0.80),  # faster
            row(case("tfla_sig", 2048), 2.01),  # within the noise: same
            row(case("tfla_sig", 4096), 4.40),  # slower by 10%
            row(case("sdpa_flash", 1024, causal=False), 3.09, ci=None),  # p20..p80 noise: same
            row(case("sdpa_flash", 1024, causal=True), 1.50),
            row(case("gla", 1024), 0.0, status="crashed"),
            row(case("lightning2", 1024), 2.00),
        ],
        env={**ENV, "gpu_name": "NVIDIA H200", "packages": {"fla-core": "0.7.0"}},
    )
    return a, b


def test_rows_match_by_case_with_noise_aware_verdicts(runs):
    result = diff_runs(*runs)
    got = {(r.kernel, r.seq_len, r.params): (r.verdict, r.ratio) for r in result.rows.itertuples()}
    assert got[("tfla_sig", 1024, "")] == ("faster", pytest.approx(0.8))
    assert got[("tfla_sig", 2048, "")][0] == "same"
    assert got[("tfla_sig", 4096, "")] == ("slower", pytest.approx(1.1))
    assert got[("sdpa_flash", 1024, "causal=False")][0] == "same"  # 3% change, 10% p20..p80 half-spread
    assert got[("sdpa_flash", 1024, "causal=True")] == ("same", pytest.approx(1.0))
    assert got[("gla", 1024, "")][0] == "not comparable" and math.isnan(got[("gla", 1024, "")][1])
    assert result.rows.set_index("kernel").loc["gla", "reason"] == "crashed in B"
    assert list(result.only_a["kernel"]) == ["mamba2"] and list(result.only_b["kernel"]) == ["lightning2"]


def test_summary_is_the_geometric_mean_per_kernel_and_mode(runs):
    summary = diff_runs(*runs).summary.set_index("kernel")
    assert summary.loc["tfla_sig", "geomean_ratio"] == pytest.approx((0.8 * 2.01 / 2 * 1.1) ** (1 / 3))
    assert summary.loc["tfla_sig", ["cases", "faster", "slower", "same"]].tolist() == [3, 1, 1, 1]
    assert summary.loc["gla", "cases"] == 0 and summary.loc["gla", "not comparable"] == 1


def test_agreement_counts_the_cases_within_2_and_5_percent(runs, capsys):
    # ok in both: tfla_sig 0.80, 1.005, 1.10; sdpa_flash 1.03, 1.00 (gla crashed in B: not counted)
    agree = diff_runs(*runs).agreement()
    assert agree["cases"] == 5
    assert agree["within_2pct"] == pytest.approx(2 / 5)
    assert agree["within_5pct"] == pytest.approx(3 / 5)
    assert agree["max_deviation"] == pytest.approx(0.2)
    assert main(["diff", str(runs[0]), str(runs[1])]) == 0
    assert "5 case(s) ok in both: 40.0% within 2%, 60.0% within 5%, largest |B/A - 1| 20.0%" in (
        capsys.readouterr().out
    )


def test_agreement_per_device_and_without_throttled_cases(tmp_path, capsys):
    one_gpu = write(
        tmp_path / "one",
        [row(case("tfla_sig", t), 1.0, throttled=False) for t in (512, 1024, 2048, 4096)],
    )
    two_gpus = write(
        tmp_path / "two",
        [
            row(case("tfla_sig", 512), 1.01, device="cuda:0", throttled=False),
            row(case("tfla_sig", 1024), 1.04, device="cuda:0", throttled=False),
            row(case("tfla_sig", 2048), 1.00, device="cuda:1", throttled=False),
            row(case("tfla_sig", 4096), 0.90, device="cuda:1", throttled=True),  # under a power cap
        ],
    )
    result = diff_runs(one_gpu, two_gpus)
    by_device = result.agreement_by_device()
    assert list(by_device) == ["cuda:0 in A, cuda:0 in B", "cuda:0 in A, cuda:1 in B"]
    assert by_device["cuda:0 in A, cuda:0 in B"]["within_2pct"] == pytest.approx(0.5)
    assert by_device["cuda:0 in A, cuda:1 in B"]["max_deviation"] == pytest.approx(0.1)
    unthrottled = result.agreement_unthrottled()
    assert unthrottled["cases"] == 3 and unthrottled["max_deviation"] == pytest.approx(0.04)
    from tfla_bench.analyse.diff import HOLLOW, ratio_figure

    fig = ratio_figure(result, "two GPUs / one")
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["tfla_sig", f"hollow: {HOLLOW}"]
    faces = [
        line.get_markerfacecolor()
        for ax in fig.axes
        for line in ax.get_lines()
        if line.get_marker() != "None"
    ]
    assert "none" in faces and any(face != "none" for face in faces)  # the throttled case alone is hollow
    assert diff_runs(one_gpu, one_gpu).agreement_by_device() == {}
    assert diff_runs(one_gpu, one_gpu).agreement_unthrottled() is None
    assert main(["diff", str(one_gpu), str(two_gpus)]) == 0
    out = capsys.readouterr().out
    assert "cuda:0 in A, cuda:1 in B: 2 case(s), 50.0% within 2%" in out
    assert "1 case(s) measured under a power, thermal or hardware slowdown in A or B; the other 3:" in out


def test_different_gpus_and_versions_are_named(runs):
    warnings = diff_runs(*runs).warnings
    assert any("gpu_name" in w and "H200" in w for w in warnings)
    assert any("fla-core" in w and "0.6.0" in w and "0.7.0" in w for w in warnings)
    assert len(warnings) == 2
    a, b = runs
    (a / "spec.json").write_text(json.dumps({"name": "t", "rel_ci": 0.01, "timeout_s": 60}))
    (b / "spec.json").write_text(
        json.dumps({"name": "t", "rel_ci": 0.01, "timeout_s": 90, "power_cap": "gaps"})
    )
    warnings = diff_runs(a, b).warnings
    assert warnings[2:] == ["measurement setting power_cap differs: A not recorded, B gaps"]
    # A run from before the energy method was a setting read its energy from a series.
    (b / "spec.json").write_text(json.dumps({"name": "t", "rel_ci": 0.01, "energy_method": "series"}))
    assert diff_runs(a, b).warnings[2:] == []
    (b / "spec.json").write_text(json.dumps({"name": "t", "rel_ci": 0.01, "energy_method": "around"}))
    assert diff_runs(a, b).warnings[2:] == ["measurement setting energy_method differs: A series, B around"]
    # ... and a series of at least 0.5 s, before its length was a setting.
    (a / "spec.json").write_text(json.dumps({"name": "t", "rel_ci": 0.01, "energy_s": 0.5}))
    (b / "spec.json").write_text(json.dumps({"name": "t", "rel_ci": 0.01}))
    assert diff_runs(a, b).warnings[2:] == []
    (a / "spec.json").write_text(json.dumps({"name": "t", "rel_ci": 0.01, "energy_s": 0.25}))
    assert diff_runs(a, b).warnings[2:] == ["measurement setting energy_s differs: A 0.25, B 0.5"]


def test_verdict_edges():
    assert (
        verdict(1.015, 0.02) == "same" and verdict(1.03, 0.02) == "slower" and verdict(0.9, 0.05) == "faster"
    )


def test_cli_threshold_exit_codes_and_outputs(runs, tmp_path, capsys):
    a, b = runs
    assert main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "warning:" in out and "geometric mean" in out and "1 case(s) in run A only" in out
    assert main(["diff", str(a), str(b), "--threshold", "5"]) == 1
    assert "1 case(s) slower by more than 5%" in capsys.readouterr().out
    assert main(["diff", str(a), str(b), "--threshold", "15"]) == 0
    json_path, csv_path, png = tmp_path / "d.json", tmp_path / "d.csv", tmp_path / "d.png"
    assert (
        main(["diff", str(a), str(b), "--json", str(json_path), "--csv", str(csv_path), "--plot", str(png)])
        == 0
    )
    record = json.loads(json_path.read_text())
    assert {"rows", "summary", "only_a", "only_b", "warnings"} <= set(record) and len(record["rows"]) == 6
    assert len(pd.read_csv(csv_path)) == 6
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_no_matching_case_or_no_run_is_one_line_and_exit_2(runs, tmp_path, capsys, monkeypatch):
    a, _ = runs
    other = write(tmp_path / "other", [row(case("mamba", 8192), 1.0)])
    assert main(["diff", str(a), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no case of") and "\n" not in err
    assert main(["diff", str(a), str(tmp_path / "missing")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["diff", str(a), str(a), "--threshold", "-1"]) == 2
    assert main(["diff", str(a), str(a), "--plot", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    # PGF needs a TeX system to measure its text; where none is installed it is refused first, the
    # other outputs unwritten
    monkeypatch.setattr(shutil, "which", lambda name: None)
    outputs = ["--json", str(tmp_path / "d.json"), "--plot", str(tmp_path / "d.pgf")]
    assert main(["diff", str(a), str(a), *outputs]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--plot" in err and "expected a file name ending in one of" in err
    assert "pgf" not in err.split("one of")[1] and not (tmp_path / "d.json").exists()


def test_the_plot_runs_along_the_column_that_varies(tmp_path):
    from tfla_bench.analyse.diff import ratio_figure

    def head_dim_case(dim):
        return Case("tfla_sig", "fwbw", "bfloat16", 8, 8192, 16, dim, dim, 128)

    a = write(tmp_path / "a", [row(head_dim_case(d), 1.0) for d in (64, 128, 256)])
    b = write(tmp_path / "b", [row(head_dim_case(d), 1.1) for d in (64, 128, 256)])
    (ax,) = ratio_figure(diff_runs(a, b), "t").axes
    assert ax.get_xlabel() == "head dim v [elements]" and ax.get_title() == "forward + backward (fwbw)"


RUNS = Path(__file__).resolve().parents[1] / "results" / "runs"
DATA = Path(__file__).resolve().parent / "data"
# Two back-to-back sweeps on one machine: Fig. 5 on an H100 (the second with the first's Triton
# cache) and on an H200 (each right after `make gpu`), and the smoke spec on a 2-core CPU that other
# processes shared.
BACK_TO_BACK = [
    (RUNS / "fig5_consttoken-20261126-184403", RUNS / "fig5_consttoken-20261126-185202"),
    (RUNS / "fig5_consttoken-20261203-h200-a", RUNS / "fig5_consttoken-20261203-h200-b"),
    (DATA / "smoke-cpu-a", DATA / "smoke-cpu-b"),
]


@pytest.mark.parametrize(("a", "b"), BACK_TO_BACK, ids=["h100-gaps", "h200-again", "cpu"])
def test_the_gate_stays_quiet_on_two_back_to_back_runs(a, b, capsys):
    assert main(["diff", str(a), str(b), "--threshold", "5"]) == 0, capsys.readouterr().out


def test_a_real_ten_percent_slowdown_at_a_stable_case_fails_the_gate(tmp_path, capsys):
    a, b = BACK_TO_BACK[0]
    slowed = tmp_path / "slowed"
    shutil.copytree(b, slowed)
    rows = pd.read_csv(slowed / "results.csv")
    at = (rows["kernel"] == "tfla_sig") & (rows["mode"] == "fwbw") & (rows["seq_len"] == 8192)
    assert at.sum() == 1 and rows.loc[at, "ci_rel"].item() < 0.01  # a stable case
    for column in ("median_ms", "p20_ms", "p80_ms", "min_ms"):
        rows.loc[at, column] *= 1.10
    rows.to_csv(slowed / "results.csv", index=False)
    assert main(["diff", str(a), str(slowed), "--threshold", "5"]) == 1
    out = capsys.readouterr().out
    assert "1 case(s) slower by more than 5%" in out and "tfla_sig" in out


def test_the_spread_between_runs_needs_enough_cases_and_leaves_throttled_ones_out():
    ten = pd.DataFrame({"verdict": ["same"] * 10, "throttled": [False] * 10, "ratio": [1.0] * 9 + [3.0]})
    assert run_spread(ten) == 0.0  # nine of ten cases agree exactly: no spread
    spread = run_spread(ten.assign(ratio=[0.8, 1.2] * 5))
    assert spread > 0.2  # every case moved by 20%: the machine, not the code
    assert run_spread(ten.assign(throttled=[True] + [False] * 9, ratio=[0.8, 1.2] * 5)) == 0.0
