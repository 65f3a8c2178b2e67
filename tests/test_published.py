"""The published data sets, the kernel mapping, and the paper-figure specs that answer to them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from synthetic_run import fig5_rows, write_cases_as_run, write_run

from tfla_bench.adapters import registry
from tfla_bench.analyse.compare import compare_run, load_run
from tfla_bench.analyse.published import (
    PUBLISHED_COLUMNS,
    PUBLISHED_DIR_ENV,
    UNMAPPED,
    list_published,
    load_published,
    mapping_for_adapter,
    mapping_for_published,
    mapping_table,
    mappings,
    published_cases,
    published_dir,
)
from tfla_bench.cli.main import main
from tfla_bench.errors import UserError
from tfla_bench.run import specs

REPO = Path(__file__).resolve().parent.parent
SHARED_README_LINES = ("Source: GitHub repository **NX-AI/mlstm_kernels**", "zeroes a 256e6-byte buffer")
PAPER_SPECS = sorted((REPO / "experiments").glob("fig*.toml"))
# Spec cases without a published counterpart, on purpose (see the spec files' comments).
EXPECTED_RUN_ONLY = {
    # The paper measured neither LightningAttention-2 nor FlashAttention-4 at these shapes; its
    # FlashAttention 2 curve is torch's (`sdpa_flash`), so the flash-attn package's `fa2` has no
    # published counterpart.
    "fig5_consttoken": {"lightning2", "fa4", "fa2"},
    "fig6_chunk_tradeoff": {"limit_chunk", "mlstm_kernels_limit"},
}


def test_published_folder_holds_the_shared_csvs_and_readme():
    folder = published_dir()
    assert folder == REPO / "results" / "published"
    csvs = sorted(p.name for p in folder.glob("*.csv"))
    assert len(csvs) == 8
    readme = (folder / "README.md").read_text()
    for line in SHARED_README_LINES:
        assert line in readme


def test_load_published_by_figure_name_and_by_file_stem():
    by_figure = load_published("tfla_fig5_consttoken_rerun_nh16")
    by_stem = load_published("tfla_fig5_consttoken")
    assert set(by_figure["figure"]) == {"tfla_fig5_consttoken_rerun_nh16"}
    pd.testing.assert_frame_equal(by_figure, by_stem)
    assert set(PUBLISHED_COLUMNS) <= set(by_figure.columns)
    raw = pd.read_csv(REPO / "results" / "published" / "tfla_fig5_consttoken.csv")
    assert len(by_figure) == len(raw)


def test_every_figure_name_is_listed_and_loads():
    sets = list_published()
    assert "tfla_fig17_headdim" in sets and "tfla_consttoken_original_nh8" in sets
    for name in sets:
        assert len(load_published(name)) > 0


def test_unknown_published_name_is_a_user_error_listing_the_known_ones():
    with pytest.raises(UserError, match="tfla_fig6_chunk_tradeoff"):
        load_published("fig99")


def test_published_csv_with_missing_columns_is_a_user_error(tmp_path, monkeypatch):
    shutil.copy(REPO / "results" / "published" / "tfla_fig6_chunk_tradeoff.csv", tmp_path)
    broken = pd.read_csv(tmp_path / "tfla_fig6_chunk_tradeoff.csv").drop(columns=["runtime_ms"])
    broken.to_csv(tmp_path / "tfla_fig6_chunk_tradeoff.csv", index=False)
    monkeypatch.setenv(PUBLISHED_DIR_ENV, str(tmp_path))
    with pytest.raises(UserError, match="lacks columns: runtime_ms"):
        load_published("tfla_fig6_chunk_tradeoff")


def test_empty_published_folder_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv(PUBLISHED_DIR_ENV, str(tmp_path))
    with pytest.raises(UserError, match="no published CSVs"):
        list_published()


def test_every_published_kernel_is_mapped_or_listed_as_unmapped():
    names = set()
    for path in (REPO / "results" / "published").glob("*.csv"):
        names |= set(pd.read_csv(path)["kernel_name"])
    mapped = {m.published_kernel for m in mappings()}
    assert names <= mapped | set(UNMAPPED)
    assert not mapped & set(UNMAPPED)


def test_mapping_of_the_main_published_kernels():
    siging = mapping_for_published("chunkwise--triton_xl_chunk_siging")
    assert siging.adapters == ("tfla_sig", "mlstm_kernels_sig") and siging.uses_chunk_size
    assert mapping_for_published("torch_cudnn").params == {"causal": False}
    assert mapping_for_published("torch_flash").adapters == ("sdpa_flash",)
    assert mapping_for_published("flashattn3").params == {"causal": True}
    # The published "mamba2" is the fused-conv layer, "mamba2_noconv" the bare SSD scan.
    assert mapping_for_published("mamba2").adapters == ("mamba2_split_conv",)
    assert mapping_for_published("mamba2_noconv").adapters == ("mamba2",)
    assert mapping_for_adapter("lightning2").published_kernel == "lightning_attn2"
    assert mapping_for_published("fused_chunk_gla") is None
    assert mapping_for_adapter("sdpa_math") is None


def test_mapping_table_lists_mapped_and_unmapped_kernels():
    table = mapping_table()
    assert set(table["published_kernel"]) == {m.published_kernel for m in mappings()} | set(UNMAPPED)
    unmapped = table[table["adapters"] == ""]
    assert set(unmapped["published_kernel"]) == set(UNMAPPED)


def test_mapped_adapters_are_registered():
    known = {adapter.name for adapter in registry.adapters()}
    named = {adapter for m in mappings() for adapter in m.adapters}
    assert named <= known, f"mapped adapters missing from the registry: {sorted(named - known)}"


def test_published_cases_expand_rows_per_adapter():
    published = load_published("tfla_fig5_consttoken_rerun_nh16")
    cases = published_cases(published)
    siging = published[published["kernel_name"] == "chunkwise--triton_xl_chunk_siging"]
    sig_cases = cases[cases["published_kernel"] == "chunkwise--triton_xl_chunk_siging"]
    assert len(sig_cases) == 2 * len(siging)
    assert set(sig_cases["kernel"]) == {"tfla_sig", "mlstm_kernels_sig"}
    assert set(sig_cases["chunk_size"].dropna()) == set(siging["chunk_size"].astype(int))
    cudnn = cases[cases["kernel"] == "sdpa_cudnn"]
    assert all(p == {"causal": False} for p in cudnn["required_params"])
    assert cudnn["chunk_size"].isna().all()
    # fused_chunk_gla has no adapter, so none of its rows become cases.
    assert "fused_chunk_gla" not in set(cases["published_kernel"])
    row = published[(published["kernel_name"] == "torch_cudnn") & (published["seq_len"] == 8192)]
    case = cudnn[(cudnn["seq_len"] == 8192) & (cudnn["mode"] == row["mode"].iloc[0])]
    assert case["published_ms"].iloc[0] == pytest.approx(row["runtime_ms"].iloc[0])
    assert case["batch"].iloc[0] == 8


@pytest.mark.parametrize("path", PAPER_SPECS, ids=lambda p: p.stem)
def test_paper_spec_names_a_published_data_set_and_the_papers_settings_with_adaptive_reps(path):
    spec = specs.load_spec(path)
    published = load_published(spec.published)
    assert spec.dtypes == ("bfloat16",)
    assert set(spec.modes) == {"fw", "fwbw"}
    assert spec.measurement.grad == "sum" and spec.measurement.l2_flush
    # Adaptive reps by default; the paper's fixed counts are given on the command line (spec comments).
    assert (spec.measurement.warmup, spec.measurement.reps) == (None, None)
    assert all(o.warmup is None and o.reps is None for o in spec.overrides.values())
    assert "--reps" in Path(path).read_text()
    seq_lens = spec.shape["seq_len"] if isinstance(spec.shape["seq_len"], list) else [spec.shape["seq_len"]]
    assert set(seq_lens) <= set(published["seq_len"])


def test_the_six_paper_data_sets_have_a_spec():
    named = {specs.load_spec(path).published for path in PAPER_SPECS}
    assert named == {
        "tfla_fig5_consttoken_rerun_nh16",
        "tfla_consttoken_original_nh8",
        "tfla_fig6_chunk_tradeoff",
        "tfla_fig15_fla_appendix",
        "tfla_fig16_lightning_appendix",
        "tfla_fig17_headdim",
    }


@pytest.mark.parametrize("path", PAPER_SPECS, ids=lambda p: p.stem)
def test_every_case_of_a_paper_spec_has_a_published_counterpart(path, tmp_path):
    spec = specs.load_spec(path)
    run_dir = write_cases_as_run(tmp_path / spec.name, specs.expand(spec), spec.published)
    comparison = compare_run(load_run(run_dir), spec.published)
    run_only = set(comparison.measured_only["kernel"])
    assert run_only == EXPECTED_RUN_ONLY.get(spec.name, set()), comparison.measured_only[["kernel", "reason"]]
    # Every published curve the paper plots (a row with a plot_label) is reproduced by some case.
    published_only = comparison.published_only
    plotted_missing = published_only[
        published_only["plot_label"].notna() & (published_only["kernel_name"] != "fused_chunk_gla")
    ]
    assert plotted_missing.empty, plotted_missing[["kernel_name", "seq_len", "num_heads", "chunk_size"]]


def test_cli_compare_unknown_published_exits_2(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", fig5_rows(seq_lens=(8192,)))
    assert main(["compare", str(run_dir), "--published", "fig99"]) == 2
    assert "unknown published data set 'fig99'" in capsys.readouterr().err
