"""Joining a run with published numbers: matches, ratios, unmatched rows, roofline normalization, CLI."""

from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
import pytest
from synthetic_run import (
    MEMORY_FACTOR,
    RUNTIME_FACTOR,
    fig5_rows,
    published_value,
    row,
    write_run,
)

from tfla_bench.analyse.compare import (
    compare_run,
    comparison_frame,
    comparison_summary,
    comparison_tables,
    load_run,
    rows_that_matter,
)
from tfla_bench.analyse.published import load_published
from tfla_bench.cli.main import main
from tfla_bench.errors import UserError
from tfla_bench.model.hardware import ACCELERATORS

FIG5 = "tfla_fig5_consttoken_rerun_nh16"
FIG5_CSV = "tfla_fig5_consttoken.csv"


@pytest.fixture(scope="module")
def fig5_run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("runs") / "fig5_consttoken-20250101-000000", fig5_rows())


@pytest.fixture(scope="module")
def comparison(fig5_run):
    return compare_run(load_run(fig5_run), FIG5)


def test_ratios_are_measured_over_published(comparison):
    matched = comparison.matched
    for kernel, factor in RUNTIME_FACTOR.items():
        rows = matched[(matched["kernel"] == kernel) & (matched["status"] == "ok")]
        assert len(rows) >= 6, kernel
        assert rows["runtime_ratio"].to_numpy() == pytest.approx(factor)
        assert rows["memory_ratio"].to_numpy() == pytest.approx(MEMORY_FACTOR)


def test_matched_rows_carry_both_sides_numbers(comparison):
    matched = comparison.matched
    hit = matched[
        (matched["kernel"] == "tfla_sig") & (matched["mode"] == "fwbw") & (matched["seq_len"] == 8192)
    ]
    hit = hit[hit["chunk_size"] == 128]
    assert len(hit) == 1
    published_ms, published_mem = published_value(
        FIG5_CSV, "chunkwise--triton_xl_chunk_siging", "fwbw", 8192, 16, 128
    )
    assert hit["published_ms"].iloc[0] == pytest.approx(published_ms)
    assert hit["published_peak_memory_bytes"].iloc[0] == pytest.approx(published_mem)
    assert hit["measured_ms"].iloc[0] == pytest.approx(published_ms * RUNTIME_FACTOR["tfla_sig"])
    assert hit["published_kernel"].iloc[0] == "chunkwise--triton_xl_chunk_siging"


def test_chunk_size_is_part_of_the_match(comparison):
    sig = comparison.matched[
        (comparison.matched["kernel"] == "tfla_sig") & (comparison.matched["seq_len"] == 8192)
    ]
    for chunk in (64, 128, 256, 512):
        rows = sig[sig["chunk_size"] == chunk]
        expected, _ = published_value(FIG5_CSV, "chunkwise--triton_xl_chunk_siging", "fw", 8192, 16, chunk)
        assert rows[rows["mode"] == "fw"]["published_ms"].iloc[0] == pytest.approx(expected)


def test_failed_rows_are_matched_without_a_ratio(comparison):
    matched = comparison.matched
    crashed = matched[matched["kernel"] == "mlstm_kernels_exp"]
    unavailable = matched[matched["kernel"] == "fa3"]
    unsupported = matched[(matched["kernel"] == "gla") & (matched["mode"] == "fwbw")]
    for rows, status, count in (
        (crashed, "crashed", 6),
        (unavailable, "unavailable", 6),
        (unsupported, "unsupported", 3),
    ):
        assert len(rows) == count
        assert set(rows["status"]) == {status}
        assert rows["runtime_ratio"].isna().all()
        assert rows["published_ms"].notna().all()


def test_rows_without_a_counterpart_are_listed_with_the_reason(comparison):
    only = comparison.measured_only
    assert set(only["kernel"]) == {"sdpa_flash", "lightning2"}
    flash = only[only["kernel"] == "sdpa_flash"]["reason"]
    assert flash.str.contains("params differ: published causal=False, run causal=True").all()
    assert only[only["kernel"] == "lightning2"]["reason"].str.contains("no published lightning_attn2").all()
    # Nothing is dropped: every run row is either matched or listed.
    assert len(comparison.matched) + len(only) == len(fig5_rows())


def test_published_rows_without_a_run_row_are_listed(comparison):
    only = comparison.published_only
    fused = only[only["kernel_name"] == "fused_chunk_gla"]
    assert len(fused) == 16 and fused["reason"].str.startswith("no adapter:").all()
    assert only[only["kernel_name"] == "mamba"]["reason"].str.contains("adapter not in the run").all()
    cudnn = only[only["kernel_name"] == "torch_cudnn"]
    assert set(cudnn["seq_len"]) == {512, 1024, 16384, 32768, 65536}
    assert cudnn["reason"].str.contains("no case at this mode/shape").all()


def test_every_published_row_is_matched_or_listed_once(comparison):
    published = load_published(FIG5)
    matched_rows = set(comparison.matched["published_row"])
    listed_rows = set(comparison.published_only["published_row"])
    assert not matched_rows & listed_rows
    assert matched_rows | listed_rows == set(published.index)
    # tfla_sig and its official peer answer to the same published rows; each run row to one.
    assert comparison.matched["row_id"].is_unique
    frame = comparison_frame(comparison)
    assert set(frame["match"]) == {"matched", "run_only", "published_only"}
    assert (frame["match"] == "published_only").sum() == len(listed_rows)


def test_a_param_that_matches_only_by_default_value(tmp_path):
    # fa3 is causal by default; the paper ran it causal, so a row without the param column matches,
    # and an sdpa_cudnn row left at its default (causal) does not match the paper's non-causal one.
    ms, _ = published_value(FIG5_CSV, "flashattn3", "fw", 8192, 32)
    rows = [
        row("fa3", "fw", batch=8, seq_len=8192, num_heads=32, head_dim_qk=128, head_dim_v=128, median_ms=ms),
        row(
            "sdpa_cudnn",
            "fw",
            batch=8,
            seq_len=8192,
            num_heads=32,
            head_dim_qk=128,
            head_dim_v=128,
            median_ms=1,
        ),
    ]
    comparison = compare_run(load_run(write_run(tmp_path / "run", rows)), FIG5)
    assert list(comparison.matched["kernel"]) == ["fa3"]
    assert comparison.matched["runtime_ratio"].iloc[0] == pytest.approx(1.0)
    assert "run causal=True" in comparison.measured_only["reason"].iloc[0]


def test_a_chunk_size_the_paper_did_not_run_is_explained(tmp_path):
    rows = [
        row("tfla_sig", "fw", batch=8, seq_len=8192, num_heads=16, head_dim_qk=128, head_dim_v=256,
            chunk_size=32, median_ms=5.0, peak_memory_bytes=3e9)
    ]  # fmt: skip
    comparison = compare_run(load_run(write_run(tmp_path / "run", rows)), FIG5)
    assert comparison.matched.empty
    assert (
        "no published row at chunk size 32 (published: 64, 128, 256, 512, 1024, 2048, 4096)"
        in (comparison.measured_only["reason"].iloc[0])
    )


def _bound_ms(flops: float, moved: float, acc) -> float:
    return max(flops / acc.peak_flops_per_s, moved / acc.bandwidth_bytes_per_s) * 1e3


def test_roofline_normalization_sets_an_h200_run_beside_h100_numbers(tmp_path):
    rows = fig5_rows(seq_lens=(8192,))
    run = load_run(write_run(tmp_path / "run", rows, gpu_name="NVIDIA H200"))
    comparison = compare_run(run, FIG5, normalize="roofline")
    assert comparison.measured_accelerator.name == "h200"
    assert comparison.published_accelerator.name == "h100"
    h100, h200 = ACCELERATORS["h100"], ACCELERATORS["h200"]
    ok = comparison.matched[comparison.matched["runtime_ratio"].notna()]
    assert len(ok) > 10
    for _, r in ok.iterrows():
        measured = r["measured_ms"] / _bound_ms(r["flops"], r["bytes"], h200)
        published = r["published_ms"] / _bound_ms(r["flops"], r["bytes"], h100)
        assert r["measured_normalized"] == pytest.approx(measured)
        assert r["published_normalized"] == pytest.approx(published)
        assert r["normalized_ratio"] == pytest.approx(measured / published)
    # A memory-bound case gains the H200's bandwidth: its normalized ratio exceeds the plain one.
    memory_bound = ok[ok["flops"] / ok["bytes"] < h200.intensity_flops_per_byte]
    assert len(memory_bound)
    assert (memory_bound["normalized_ratio"] > memory_bound["runtime_ratio"] * 1.4).all()
    tables = comparison_tables(comparison)
    assert set(tables) == {"fw", "fwbw"}
    assert {"ms/bound (run)", "ms/bound (paper)", "normalized ratio"} <= set(tables["fwbw"].columns)


def test_roofline_normalization_needs_a_known_gpu(tmp_path):
    run = load_run(write_run(tmp_path / "run", fig5_rows(seq_lens=(8192,)), gpu_name="NVIDIA RTX 4090"))
    with pytest.raises(UserError, match="not in the model's accelerator table"):
        compare_run(run, FIG5, normalize="roofline")
    plain = compare_run(run, FIG5)
    assert plain.measured_accelerator is None and len(plain.matched)


def test_comparison_tables_per_mode(comparison):
    tables = comparison_tables(comparison)
    assert set(tables) == {"fw", "fwbw"}
    fwbw = tables["fwbw"]
    assert list(fwbw.columns[:8]) == ["kernel", "B", "T", "H", "Dqk", "Dv", "L", "status"]
    assert (fwbw["kernel"] == fwbw["kernel"].sort_values().to_numpy()).all()
    gla = fwbw[fwbw["kernel"] == "gla"]
    assert gla["status"].str.contains("unsupported").all()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: (d / "results.csv").unlink(), "no results.csv"),
        (lambda d: (d / "env.json").unlink(), "has no env.json"),
        (lambda d: (d / "results.csv").write_text(""), "is empty"),
        (lambda d: _drop_column(d, "status"), "lacks status"),
        (lambda d: _keep_header_only(d), "has no readable result rows"),
    ],
    ids=["no-results", "no-env", "empty-csv", "missing-column", "header-only"],
)
def test_bad_run_directories_are_user_errors_and_exit_2(tmp_path, capsys, mutate, message):
    run_dir = write_run(tmp_path / "run", fig5_rows(seq_lens=(8192,)))
    mutate(run_dir)
    with pytest.raises(UserError, match=message):
        load_run(run_dir)
    for command in ("compare", "plot", "report"):
        assert main([command, str(run_dir)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and message in err and len(err.splitlines()) == 1


def _drop_column(run_dir, column):
    df = pd.read_csv(run_dir / "results.csv").drop(columns=[column])
    df.to_csv(run_dir / "results.csv", index=False)


def _keep_header_only(run_dir):
    header = (run_dir / "results.csv").read_text().splitlines()[0]
    (run_dir / "results.csv").write_text(header + "\n")


def test_cli_missing_run_directory_exits_2(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_cli_bad_normalize_exits_2(fig5_run, capsys):
    assert main(["compare", str(fig5_run), "--normalize", "peak"]) == 2
    assert "--normalize must be one of none, roofline" in capsys.readouterr().err


def test_cli_without_a_published_data_set_exits_2(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", fig5_rows(seq_lens=(8192,)), published=None)
    assert main(["compare", str(run_dir)]) == 2
    assert "names no published data set" in capsys.readouterr().err
    assert main(["compare", str(run_dir), "--published", "none"]) == 2


def test_cli_compare_prints_tables_and_writes_json_and_csv(fig5_run, tmp_path, capsys):
    json_path, csv_path = tmp_path / "out" / "c.json", tmp_path / "out" / "c.csv"
    code = main(
        [
            "compare",
            str(fig5_run),
            "--normalize",
            "roofline",
            "--json",
            str(json_path),
            "--csv",
            str(csv_path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    # The synthetic ratios are one factor per kernel: the summary says it all, no row stands out.
    assert out.index("summary: runtime ratio run / published") < out.index("every matched row lies within")
    assert "NVIDIA H100 80GB HBM3" in out and "SXM assumed" in out
    assert "run rows without a published counterpart" in out and "published rows without a run row" in out
    data = json.loads(json_path.read_text())
    assert data["published"] == FIG5 and data["normalize"] == "roofline"
    assert data["published_accelerator"]["name"] == "h100"
    assert {r["kernel"] for r in data["run_only"]} == {"sdpa_flash", "lightning2"}
    sig = [r for r in data["matched"] if r["kernel"] == "tfla_sig" and r["status"] == "ok"]
    assert all(math.isclose(r["runtime_ratio"], RUNTIME_FACTOR["tfla_sig"]) for r in sig)
    crashed = [r for r in data["matched"] if r["status"] == "crashed"]
    assert crashed and all(r["runtime_ratio"] is None for r in crashed)
    frame = pd.read_csv(csv_path)
    assert set(frame["match"]) == {"matched", "run_only", "published_only"}


def test_summary_gives_each_kernel_its_median_ratio_and_why_rows_have_none(comparison):
    summary = comparison_summary(comparison).set_index(["kernel", "mode"])
    for kernel, factor in RUNTIME_FACTOR.items():
        for mode in ("fw", "fwbw"):
            if (kernel, mode) in summary.index and summary.loc[(kernel, mode), "compared"]:
                assert math.isclose(summary.loc[(kernel, mode), "median ratio"], factor), kernel
    crashed = summary.loc[("mlstm_kernels_exp", "fw")]
    assert crashed["compared"] == 0 and crashed["not compared"].startswith("run crashed ×")
    assert crashed["rows"] == int(crashed["not compared"].split("×")[1])
    ours = comparison_summary(comparison, {"tfla_sig"})
    assert set(ours["kernel"]) == {"tfla_sig"}


def test_the_row_furthest_from_1_names_its_shape(comparison):
    matched = comparison.matched.copy()
    sig = matched.index[(matched["kernel"] == "tfla_sig") & (matched["mode"] == "fw")]
    far = sig[0]
    matched.loc[far, "runtime_ratio"] = 3.0
    summary = comparison_summary(dataclasses.replace(comparison, matched=matched))
    row = summary[(summary["kernel"] == "tfla_sig") & (summary["mode"] == "fw")].iloc[0]
    assert row["max"] == 3.0 and row["furthest from 1"].endswith(": 3")
    assert f"T{int(matched.loc[far, 'seq_len'])}" in row["furthest from 1"]


def test_rows_that_matter_are_those_off_their_kernels_median(comparison):
    # The synthetic ratios are one factor per kernel: no row stands out until one is moved.
    assert rows_that_matter(comparison).matched["runtime_ratio"].notna().sum() == 0
    matched = comparison.matched.copy()
    moved = matched.index[matched["runtime_ratio"].notna()][0]
    matched.loc[moved, "runtime_ratio"] *= 1.2
    shown = rows_that_matter(dataclasses.replace(comparison, matched=matched)).matched
    assert list(shown.index[shown["runtime_ratio"].notna()]) == [moved]
    # A kernel that never ran is left to the summary; it is no row that stands out.
    never = shown.groupby(["kernel", "mode"])["runtime_ratio"].count()
    assert (never > 0).all() or shown.empty


def test_cli_compare_writes_compare_csv_into_the_run_and_says_when_it_replaces_one(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", fig5_rows(seq_lens=(4096, 8192)))
    assert main(["compare", str(run_dir)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    written = run_dir / "compare.csv"
    assert f"wrote {written}" in out and "replaced" not in out
    frame = pd.read_csv(written)
    assert set(frame["match"]) == {"matched", "run_only", "published_only"}
    assert main(["compare", str(run_dir)]) == 0
    assert "(replaced the previous one)" in " ".join(capsys.readouterr().out.split())


def test_cli_compare_all_prints_every_matched_row(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", fig5_rows(seq_lens=(4096, 8192)))
    assert main(["compare", str(run_dir)]) == 0
    short = capsys.readouterr().out
    assert main(["compare", str(run_dir), "--all"]) == 0
    full = capsys.readouterr().out
    rows = len(compare_run(load_run(run_dir), FIG5).matched)
    assert "fw: every row" in full and "rows that stand out" not in full
    assert full.count("│ tfla_sig ") > short.count("│ tfla_sig ")
    assert "--all prints them" in short or f"--all: all {rows}" in short
