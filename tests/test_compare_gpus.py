"""`tfla-bench compare-gpus`: the measured speed-up of run B over run A per case against the roofline
model's prediction, on hand-made runs (roofs and counts chosen so each prediction is worked out by
hand below) and on the committed H100 and H200 runs."""

import json
import math
from dataclasses import replace

import pandas as pd
import pytest
from synthetic_run import REPO
from test_diff import row as diff_row
from test_diff import write as write_run

from tfla_bench.adapters.workloads import Case
from tfla_bench.analyse.crossgpu import compare_gpus, kernel_tables, summarize
from tfla_bench.cli.crossgpu import CSV_NAME, FIGURE_NAME, default_out
from tfla_bench.cli.main import main
from tfla_bench.measure.row import ResultRow
from tfla_bench.model.hardware import ACCELERATORS
from tfla_bench.plots.crossgpu import speedup_figure
from tfla_bench.run import rundir

RUNS = REPO / "results" / "runs"
H100_CHUNKS, H200_CHUNKS = (
    RUNS / "tfla_vs_peer_chunks-20261126-215953",
    RUNS / "tfla_vs_peer_chunks-20261129-h200",
)
H100_HEADDIM, H200_HEADDIM = RUNS / "fig17_headdim-20261126-011417", RUNS / "fig17_headdim-20261129-h200"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
# Roofs of the hand-made runs: A's ridge 800 / 3 = 266.7 FLOP/B, B's ridge 900 / 4.5 = 200 FLOP/B.
PEAK_A, BANDWIDTH_A = 800e12, 3.0e12
PEAK_B, BANDWIDTH_B = 900e12, 4.5e12
BYTES = 1e9
# Arithmetic intensities (FLOP/B): below both ridges, above both, and between them.
MEMORY_BOUND, COMPUTE_BOUND, ACROSS = 50.0, 1000.0, 240.0


def roofs(gpu_name: str, peak: float, bandwidth: float) -> dict:
    return {
        "gpu_name": gpu_name,
        "driver": "580.159.04",
        "matmul_flops_per_s": peak,
        "matmul_size": 8192,
        "hbm_bytes_per_s": bandwidth,
        "l2_bytes_per_s": 2 * bandwidth,
        "l2_working_set_bytes": 1 << 24,
        "measured_at": "2026-11-29T06:00:00+00:00",
        "torch": "2.11.0",
    }


def case(seq_len: int, kernel: str = "tfla_sig", dtype: str = "bfloat16") -> Case:
    return Case(kernel, "fw", dtype, 1, seq_len, 8, 128, 128, 64)


def row(case_: Case, median: float, intensity: float | None, status: str = "ok") -> ResultRow:
    """A row of `test_diff` (ci_rel 1%) with FLOPs at `intensity` FLOP/B over `BYTES` (None: no counts)."""
    counts = {} if intensity is None else {"flops": intensity * BYTES, "bytes": BYTES}
    return replace(diff_row(case_, median, ci=0.01, status=status), **counts)


def write(run_dir, rows, gpu_name: str | None, measured: dict | None):
    env = {"gpu_name": gpu_name, "torch": "2.11.0", "git_sha": "abc1234"}
    return write_run(run_dir, rows, {**env, **({"roofs": measured} if measured is not None else {})})


@pytest.fixture
def runs(tmp_path):
    """Run A (H100, measured roofs PEAK_A / BANDWIDTH_A) and run B (H200, PEAK_B / BANDWIDTH_B)."""
    a = write(
        tmp_path / "a",
        [
            row(case(1024), 2.0, MEMORY_BOUND),
            row(case(2048), 3.0, COMPUTE_BOUND),
            row(case(4096), 4.0, ACROSS),
            row(case(1024, kernel="no_counts"), 5.0, None),
            row(case(1024, dtype="float32"), 6.0, MEMORY_BOUND),
            row(case(8192), 7.0, MEMORY_BOUND),
            row(case(16384), 8.0, MEMORY_BOUND),
        ],
        H100,
        roofs(H100, PEAK_A, BANDWIDTH_A),
    )
    b = write(
        tmp_path / "b",
        [
            row(case(1024), 1.6, MEMORY_BOUND),
            row(case(2048), 2.5, COMPUTE_BOUND),
            row(case(4096), 3.5, ACROSS),
            row(case(1024, kernel="no_counts"), 4.0, None),
            row(case(1024, dtype="float32"), 5.0, MEMORY_BOUND),
            row(case(8192), 0.0, MEMORY_BOUND, status="crashed"),
        ],
        H200,
        roofs(H200, PEAK_B, BANDWIDTH_B),
    )
    return a, b


def by_length(comparison, kernel="tfla_sig", dtype="bfloat16") -> dict[int, pd.Series]:
    rows = comparison.rows
    rows = rows[(rows["kernel"] == kernel) & (rows["dtype"] == dtype)]
    return {int(r["seq_len"]): r for _, r in rows.iterrows()}


def test_memory_bound_on_both_gpus_is_predicted_at_the_bandwidth_ratio(runs):
    one = by_length(compare_gpus(*runs))[1024]
    assert one["predicted_speedup"] == pytest.approx(BANDWIDTH_B / BANDWIDTH_A)  # 1.5
    assert (one["a_bound"], one["b_bound"]) == ("memory", "memory")
    assert one["a_roofline_ms"] == pytest.approx(BYTES / BANDWIDTH_A * 1e3)


def test_compute_bound_on_both_gpus_is_predicted_at_the_peak_ratio(runs):
    one = by_length(compare_gpus(*runs))[2048]
    assert one["predicted_speedup"] == pytest.approx(PEAK_B / PEAK_A)  # 1.125
    assert (one["a_bound"], one["b_bound"]) == ("compute", "compute")


def test_a_case_between_the_ridges_is_memory_bound_on_a_and_compute_bound_on_b(runs):
    one = by_length(compare_gpus(*runs))[4096]
    assert (one["a_bound"], one["b_bound"]) == ("memory", "compute")
    # On A its bytes take longer than its FLOPs; on B its FLOPs take longer than its bytes.
    t_a = BYTES / BANDWIDTH_A
    t_b = ACROSS * BYTES / PEAK_B
    assert t_a > ACROSS * BYTES / PEAK_A and t_b > BYTES / BANDWIDTH_B
    assert one["predicted_speedup"] == pytest.approx(t_a / t_b)  # 900 / (3 * 240) = 1.25
    assert one["predicted_speedup"] not in (pytest.approx(1.5), pytest.approx(1.125))


def test_the_measured_speed_up_is_runtime_a_over_runtime_b(runs):
    rows = by_length(compare_gpus(*runs))
    for seq_len, a_ms, b_ms in ((1024, 2.0, 1.6), (2048, 3.0, 2.5), (4096, 4.0, 3.5)):
        one = rows[seq_len]
        assert (one["a_ms"], one["b_ms"]) == (a_ms, b_ms)
        assert one["measured_speedup"] == pytest.approx(a_ms / b_ms)
        assert one["measured_over_predicted"] == pytest.approx(a_ms / b_ms / one["predicted_speedup"])
        assert one["noise"] == pytest.approx(0.02)


def test_cases_without_a_prediction_are_kept_and_counted(runs):
    comparison = compare_gpus(*runs)
    assert len(comparison.rows) == 5
    assert comparison.rows["predicted_speedup"].notna().sum() == 3
    reasons = comparison.no_prediction()
    assert sum(reasons.values()) == 2
    assert any("float32" in reason for reason in reasons)
    assert any("counts" in reason for reason in reasons)
    no_counts = by_length(comparison, kernel="no_counts")[1024]
    assert math.isnan(no_counts["predicted_speedup"]) and no_counts["measured_speedup"] == 1.25
    assert (comparison.not_ok, comparison.only_a, comparison.only_b) == (1, 1, 0)
    summary = summarize(comparison.rows).set_index(["kernel", "mode"])
    assert summary.loc[("tfla_sig", "fw"), "no prediction"] == 1  # the float32 case
    assert summary.loc[("no_counts", "fw"), "no prediction"] == 1
    assert summary.loc[("tfla_sig", "fw"), "predicted"] == pytest.approx(1.25)  # median of 1.5, 1.125, 1.25
    assert "no prediction" in kernel_tables(comparison.rows)["no_counts"].columns


def test_roofs_fall_back_to_the_data_sheet_and_say_so(tmp_path, runs):
    a, _ = runs
    b = write(tmp_path / "b2", [row(case(1024), 1.0, MEMORY_BOUND)], H200, None)
    comparison = compare_gpus(a, b)
    assert (comparison.a.roof.source, comparison.b.roof.source) == ("measured", "datasheet")
    assert "data-sheet roofs (H200)" in comparison.b.describe() and comparison.b.note
    sheet = ACCELERATORS["h200"].bandwidth_bytes_per_s
    assert by_length(comparison)[1024]["predicted_speedup"] == pytest.approx(sheet / BANDWIDTH_A)
    both = compare_gpus(a, b, roofs="datasheet")
    expected = sheet / ACCELERATORS["h100"].bandwidth_bytes_per_s
    assert by_length(both)[1024]["predicted_speedup"] == pytest.approx(expected)


def test_measured_roofs_of_another_gpu_are_not_taken(tmp_path, runs):
    a, _ = runs
    b = write(tmp_path / "b3", [row(case(1024), 1.0, MEMORY_BOUND)], H200, roofs(H100, PEAK_A, BANDWIDTH_A))
    side = compare_gpus(a, b).b
    assert side.roof.source == "datasheet" and H100 in side.note


def test_the_figure_draws_one_panel_per_mode_and_nothing_without_predictions(tmp_path, runs):
    fig = speedup_figure(compare_gpus(*runs))
    assert fig is not None and len(fig.axes) == 1
    only_float32 = [row(case(1024, dtype="float32"), 1.0, MEMORY_BOUND)]
    a = write(tmp_path / "fa", only_float32, H100, None)
    b = write(tmp_path / "fb", only_float32, H200, None)
    assert speedup_figure(compare_gpus(a, b)) is None


def test_cli_on_the_committed_chunk_sweeps_writes_csv_and_figure(tmp_path, capsys):
    out = tmp_path / "chunks"
    assert main(["compare-gpus", str(H100_CHUNKS), str(H200_CHUNKS), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.index("measured roofs") < printed.index("median speed-up") < printed.index("per case")
    assert (out / FIGURE_NAME).stat().st_size > 10_000
    table = pd.read_csv(out / CSV_NAME)
    results_a = rundir.read_results(H100_CHUNKS / "results.csv").rows
    results_b = {r.case.key: r for r in rundir.read_results(H200_CHUNKS / "results.csv").rows}
    assert len(table) == len(results_b) and set(table["kernel"]) == {r.case.kernel for r in results_a}
    env_a, env_b = (json.loads((run / "env.json").read_text())["roofs"] for run in (H100_CHUNKS, H200_CHUNKS))
    memory = table[(table["a_bound"] == "memory") & (table["b_bound"] == "memory")]
    assert len(memory) > 0
    ratio = env_b["hbm_bytes_per_s"] / env_a["hbm_bytes_per_s"]
    assert memory["predicted_speedup"].to_numpy() == pytest.approx(ratio)
    first = results_a[0]
    expected = first.median_ms / results_b[first.case.key].median_ms
    match = table[(table["kernel"] == first.case.kernel) & (table["chunk_size"] == first.case.chunk_size)]
    assert match[match["mode"] == first.case.mode]["measured_speedup"].iloc[0] == pytest.approx(expected)


def test_cli_on_the_committed_head_dim_sweeps_as_json(tmp_path, capsys):
    out = tmp_path / "headdim"
    assert main(["compare-gpus", str(H100_HEADDIM), str(H200_HEADDIM), "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["a"]["gpu_name"] == H100 and result["b"]["gpu_name"] == H200
    assert result["a"]["roofs"] == result["b"]["roofs"] == "measured"
    h100_rows = len(rundir.read_results(H100_HEADDIM / "results.csv").rows)
    h200_rows = rundir.read_results(H200_HEADDIM / "results.csv").rows  # all ok, all measured on the H100 too
    assert result["cases"] == len(result["rows"]) == len(h200_rows)
    assert result["only_a"] == h100_rows - len(h200_rows) > 0
    assert {row["kernel"] for row in result["summary"]} == {row.case.kernel for row in h200_rows}
    assert sorted(result["written"]) == sorted(str(out / name) for name in (CSV_NAME, FIGURE_NAME))
    assert "commit differs" in captured.err


def test_the_default_output_folder_is_in_run_b_named_after_run_a(tmp_path, runs):
    a, b = runs
    assert main(["compare-gpus", str(a), str(b)]) == 0
    assert (default_out(a, b) / CSV_NAME).is_file() and default_out(a, b).parent == b


def test_two_runs_on_one_gpu_are_compared_with_a_warning(tmp_path, runs, capsys):
    a, _ = runs
    same = write(
        tmp_path / "same", [row(case(1024), 1.0, MEMORY_BOUND)], H100, roofs(H100, PEAK_A, BANDWIDTH_A)
    )
    assert main(["compare-gpus", str(a), str(same), "--out", str(tmp_path / "o")]) == 0
    assert f"both runs measured on {H100}" in capsys.readouterr().out
    assert pd.read_csv(tmp_path / "o" / CSV_NAME)["predicted_speedup"].tolist() == [1.0]


@pytest.mark.parametrize(
    ("mistake", "says"),
    [
        ("a folder that is not there", "no such run directory"),
        ("a folder without results.csv", "not a run directory"),
        ("no case in both runs", "no case"),
        ("a run without a GPU name", "no GPU"),
        ("an unknown --roofs", "--roofs"),
        ("--roofs measured for a run without them", "no measured roofs"),
        ("a GPU neither measured nor in the model", "not in the model"),
    ],
)
def test_a_mistake_is_one_line_and_exit_2_and_writes_nothing(tmp_path, runs, capsys, mistake, says):
    a, b = runs

    def other(gpu_name: str | None, seq_len: int = 1024) -> str:
        return str(write(tmp_path / "other", [row(case(seq_len), 1.0, MEMORY_BOUND)], gpu_name, None))

    args = {
        "a folder that is not there": lambda: [str(tmp_path / "missing"), str(b)],
        "a folder without results.csv": lambda: [str(a), str(tmp_path)],
        "no case in both runs": lambda: [str(a), other(H200, seq_len=64)],
        "a run without a GPU name": lambda: [str(a), other(None)],
        "an unknown --roofs": lambda: [str(a), str(b), "--roofs", "bogus"],
        "--roofs measured for a run without them": lambda: [str(a), other(H200), "--roofs", "measured"],
        "a GPU neither measured nor in the model": lambda: [str(a), other("Odd GPU")],
    }[mistake]()
    out = tmp_path / "out"
    assert main(["compare-gpus", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]
    assert not out.exists()
