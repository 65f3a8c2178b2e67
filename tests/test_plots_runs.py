"""Run figures and the measured roofline: axes, labels and lines checked through matplotlib's objects."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest
from synthetic_run import RUNTIME_FACTOR, fig5_rows, headdim_rows, published_value, write_run

from tfla_bench.analyse.compare import compare_run, load_run
from tfla_bench.cli.main import main
from tfla_bench.model.hardware import ACCELERATORS
from tfla_bench.plots.base import render
from tfla_bench.plots.catalog import plot_measured_roofline, plot_run, run_context
from tfla_bench.plots.measured import (
    chunkwise_mlstm_rows,
    measured_plots,
    measured_roofline_figure,
    roofline_fractions,
)
from tfla_bench.plots.runs import (
    chunk_sweep_shapes,
    chunk_tradeoff_figure,
    memory_vs_seq_len_figure,
    published_label,
    run_plots,
    runtime_vs_head_dim_figure,
    runtime_vs_seq_len_figure,
)

matplotlib.use("Agg")

FIG5 = "tfla_fig5_consttoken_rerun_nh16"
FIG5_CSV = "tfla_fig5_consttoken.csv"
H100_H200 = [ACCELERATORS["h100"], ACCELERATORS["h200"]]


@pytest.fixture(scope="module")
def fig5(tmp_path_factory):
    run_dir = write_run(tmp_path_factory.mktemp("runs") / "fig5_consttoken-20250101-000000", fig5_rows())
    run = load_run(run_dir)
    return run, compare_run(run, FIG5)


@pytest.fixture(scope="module")
def headdim(tmp_path_factory):
    run_dir = write_run(
        tmp_path_factory.mktemp("runs") / "fig17_headdim-20250101-000000",
        headdim_rows(),
        spec="fig17_headdim",
        published="tfla_fig17_headdim",
    )
    run = load_run(run_dir)
    return run, compare_run(run, "tfla_fig17_headdim")


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def panels(fig):
    """The figure's panels by title: `forward (fw)`, or `mlstm: forward (fw)` with a row per family."""
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def legend_texts(fig):
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def test_runtime_vs_seq_len_has_a_row_per_family_with_published_dotted(fig5):
    run, comparison = fig5
    fig = runtime_vs_seq_len_figure(run_context(run, comparison))
    by_title = panels(fig)
    # Our kernels' family leads; every family has a fw and a fwbw panel.
    assert fig.axes[0].get_title() == "mlstm: forward (fw)"
    families = {title.split(":")[0] for title in by_title}
    assert families == {"mlstm", "attention", "mamba2", "lightning", "gla"}
    assert {f"{family}: forward + backward (fwbw)" for family in families} <= set(by_title)
    fwbw = by_title["mlstm: forward + backward (fwbw)"]
    assert fwbw.get_ylabel() == "" and by_title["mlstm: forward (fw)"].get_ylabel() == "median runtime [ms]"
    lines = lines_by_label(fwbw)
    # tfla_sig has several chunk sizes in the run, so its label names the chunk of this curve.
    solid = lines["tfla_sig L128"]
    dashed = lines[published_label("tfla_sig L128")]
    assert solid.get_linestyle() == "-" and dashed.get_linestyle() == ":"
    assert dashed.get_color() == solid.get_color()
    assert list(solid.get_xdata()) == [2048, 4096, 8192]
    published = [
        published_value(FIG5_CSV, "chunkwise--triton_xl_chunk_siging", "fwbw", t, 16, 128)[0]
        for t in (2048, 4096, 8192)
    ]
    assert np.asarray(dashed.get_ydata()) == pytest.approx(published)
    assert np.asarray(solid.get_ydata()) == pytest.approx(np.asarray(published) * RUNTIME_FACTOR["tfla_sig"])
    # The other families are grey context behind, and one y axis runs down each column.
    context = [line for line in fwbw.get_lines() if line.get_label() == "_other"]
    assert context and {matplotlib.colors.to_hex(line.get_color()) for line in context} == {"#c8c8c8"}
    assert all(line.get_zorder() < solid.get_zorder() for line in context)
    attention = by_title["attention: forward + backward (fwbw)"]
    assert attention.get_ylim() == fwbw.get_ylim()
    assert "tfla_sig L128" not in lines_by_label(attention)


def test_runtime_figure_draws_only_ok_rows_and_names_the_rest(fig5):
    run, comparison = fig5
    fig = runtime_vs_seq_len_figure(run_context(run, comparison))
    by_title = panels(fig)
    labels_fw = {label for title, ax in by_title.items() if "(fw)" in title for label in lines_by_label(ax)}
    labels_fwbw = {
        label for title, ax in by_title.items() if "(fwbw)" in title for label in lines_by_label(ax)
    }
    assert "gla" in labels_fw and "gla" not in labels_fwbw  # fwbw unsupported
    assert not any(label.startswith(("fa3", "mlstm_kernels_exp")) for label in labels_fw | labels_fwbw)
    # Rows without a published counterpart get no dashed line.
    assert "sdpa_flash" in labels_fw and published_label("sdpa_flash") not in labels_fw
    note = " ".join(fig.get_supxlabel().split())  # wrapped to the figure's width
    assert "fa3 fw (unavailable)" in note and "mlstm_kernels_exp fwbw (crashed)" in note
    assert "gla fwbw (unsupported)" in note
    texts = legend_texts(fig)
    assert "published (H100)" in texts and "tfla_sig L128" in texts and "other families" in texts
    assert not any(text.startswith("_") for text in texts)
    mlstm_legend = by_title["mlstm: forward + backward (fwbw)"].get_legend()
    assert "sdpa_flash" not in [t.get_text() for t in mlstm_legend.get_texts()]


def test_a_run_of_one_family_keeps_one_panel_per_mode(tmp_path):
    rows = [r for r in fig5_rows() if r["kernel"] in ("tfla_sig", "tfla_exp", "mlstm_kernels_sig")]
    run = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000000", rows))
    fig = runtime_vs_seq_len_figure(run_context(run))
    assert [ax.get_title() for ax in fig.axes] == ["forward (fw)", "forward + backward (fwbw)"]
    assert "other families" not in legend_texts(fig)


def test_points_measured_on_a_throttled_gpu_are_ringed(tmp_path):
    rows = fig5_rows(seq_lens=(2048, 4096, 8192))
    for r in rows:
        r["throttled"] = r["kernel"] == "sdpa_flash" and r["seq_len"] == 8192 and r["status"] == "ok"
    run = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000000", rows))
    fig = runtime_vs_seq_len_figure(run_context(run))
    rings = [line for ax in fig.axes for line in ax.get_lines() if line.get_label() == "_throttled"]
    assert rings and all(list(line.get_xdata()) == [8192] for line in rings)
    assert "ring: GPU throttled (NVML)" in legend_texts(fig)
    memory = memory_vs_seq_len_figure(run_context(run))  # throttling moves timings, not memory
    assert not [line for ax in memory.axes for line in ax.get_lines() if line.get_label() == "_throttled"]
    for r in rows:
        r["throttled"] = False
    calm = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000001", rows))
    fig = runtime_vs_seq_len_figure(run_context(calm))
    assert "ring: GPU throttled (NVML)" not in legend_texts(fig)


def test_the_not_drawn_note_is_wrapped_to_the_figure_width(tmp_path):
    rows = fig5_rows()
    present = {r["kernel"] for r in rows}
    for r in [r for r in rows if r["kernel"] == "fa3"]:
        for name in {"mamba", "mamba2_split_conv", "fa2", "simple_gla", "lightning2"} - present:
            rows.append({**r, "kernel": name})
    run = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000000", rows))
    fig = runtime_vs_seq_len_figure(run_context(run))
    lines = fig.get_supxlabel().splitlines()
    assert len(lines) >= 2 and "mamba2_split_conv fwbw (unavailable)" in " ".join(" ".join(lines).split())
    assert max(len(line) for line in lines) <= fig.get_figwidth() * 19


def test_runtime_axis_turns_log_when_kernels_differ_by_orders_of_magnitude(tmp_path):
    rows = fig5_rows()
    close = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000000", rows))
    for ax in runtime_vs_seq_len_figure(run_context(close)).axes:
        assert ax.get_yscale() == "linear"  # the synthetic kernels lie within 20x of each other
    for r in rows:
        if r["kernel"] == "sdpa_flash":
            r["median_ms"] *= 100  # attention at long sequences against linear RNNs (Fig. 5)
    far = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000001", rows))
    for ax in runtime_vs_seq_len_figure(run_context(far)).axes:
        assert ax.get_yscale() == "log"
    assert [ax.get_yscale() for ax in memory_vs_seq_len_figure(run_context(far)).axes] == ["linear", "linear"]


def test_without_published_data_there_are_no_dotted_lines(fig5):
    run, _ = fig5
    fig = runtime_vs_seq_len_figure(run_context(run, None))
    styles = {line.get_linestyle() for ax in fig.axes for line in ax.get_lines()}
    assert ":" not in styles and "-" in styles


def test_memory_vs_seq_len_in_gigabytes(fig5):
    run, comparison = fig5
    fig = memory_vs_seq_len_figure(run_context(run, comparison))
    ax = fig.axes[1]
    assert ax.get_ylabel() == "peak memory [GB]"
    line = lines_by_label(ax)[published_label("sdpa_cudnn")]
    expected = [published_value(FIG5_CSV, "torch_cudnn", "fwbw", t, 32)[1] / 1e9 for t in (2048, 4096, 8192)]
    assert np.asarray(line.get_ydata()) == pytest.approx(expected)


def test_chunk_tradeoff_at_the_swept_shape(fig5):
    run, comparison = fig5
    shapes = chunk_sweep_shapes(run.results)
    assert shapes == [{"batch": 8, "seq_len": 8192, "num_heads": 16, "head_dim_qk": 128, "head_dim_v": 256}]
    fig = chunk_tradeoff_figure(run_context(run, comparison), shapes[0])
    assert len(fig.axes) == 4  # runtime and memory, for fw and fwbw
    runtime_ax, memory_ax = fig.axes[2], fig.axes[3]
    assert runtime_ax.get_xlabel() == "chunk size L" and runtime_ax.get_ylabel() == "median runtime [ms]"
    assert memory_ax.get_ylabel() == "peak memory [GB]"
    sig = lines_by_label(runtime_ax)["tfla_sig"]
    assert list(sig.get_xdata()) == [64, 128, 256, 512]
    paper = lines_by_label(memory_ax)[published_label("tfla_sig")]
    assert np.all(np.diff(paper.get_ydata()) < 0)  # a larger chunk materializes fewer states
    assert "chunk size" in fig.get_suptitle()


def test_runtime_vs_head_dim(headdim, fig5):
    run, comparison = headdim
    fig = runtime_vs_head_dim_figure(run_context(run, comparison))
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("head dim Dv")
    lines = lines_by_label(ax)
    assert list(lines["tfla_sig"].get_xdata()) == [64, 128, 256]
    published = pd.read_csv("results/published/tfla_fig17_headdim.csv")
    expected = published[
        (published["kernel_name"] == "chunkwise--triton_xl_chunk_siging")
        & (published["mode"] == "fw")
        & (published["chunk_size"] == 256)
        & published["head_dim_v"].isin([64, 128, 256])
    ].sort_values("head_dim_v")["runtime_ms"]
    assert np.asarray(lines[published_label("tfla_sig")].get_ydata()) == pytest.approx(expected.to_numpy())
    # A const-token run sweeps no head dim, and a head-dim run no sequence length.
    assert runtime_vs_head_dim_figure(run_context(*fig5)) is None
    assert runtime_vs_seq_len_figure(run_context(run, comparison)) is None


def test_a_kernel_with_one_ok_point_is_named_in_the_note(tmp_path):
    rows = headdim_rows()
    for r in rows:
        if r["kernel"] == "tfla_exp" and r["mode"] == "fw" and r["head_dim_v"] > 64:
            r.update(status="crashed", median_ms=float("nan"), peak_memory_bytes=float("nan"))
    run_dir = tmp_path / "fig17_headdim-20250101-000000"
    write_run(run_dir, rows, spec="fig17_headdim", published=None)
    fig = runtime_vs_head_dim_figure(run_context(load_run(run_dir)))
    assert "tfla_exp" not in lines_by_label(fig.axes[0]) and "tfla_exp" in lines_by_label(fig.axes[1])
    note = " ".join(fig.get_supxlabel().split())
    assert "fewer than 2 ok points" in note and "tfla_exp fw (crashed, ok)" in note


def test_run_figures_and_plot_run_write_pngs(fig5, tmp_path):
    run, comparison = fig5
    context = run_context(run, comparison)
    assert {plot.name for plot, _ in render(run_plots(context), context)} == {
        "runtime_vs_seq_len",
        "memory_vs_seq_len",
        "chunk_tradeoff_B8_T8192_H16_Dqk128_Dv256",
    }
    paths = plot_run(run.run_dir, tmp_path / "figs")
    assert sorted(p.name for p in paths) == sorted(
        ["runtime_vs_seq_len.png", "memory_vs_seq_len.png", "chunk_tradeoff_B8_T8192_H16_Dqk128_Dv256.png"]
    )
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_writes_beside_the_run(headdim, capsys):
    run, _ = headdim
    assert main(["plot", str(run.run_dir), "--published", "none"]) == 0
    assert (run.run_dir / "figures" / "runtime_vs_head_dim.png").is_file()
    assert "wrote" in capsys.readouterr().out


def test_roofline_fraction_is_bound_over_measured(fig5):
    run, _ = fig5
    fractions = roofline_fractions(run, H100_H200)
    ok = run.results[(run.results["status"] == "ok")]
    assert len(fractions) == len(ok)
    h100, h200 = H100_H200
    for _, r in fractions.iterrows():
        bound = max(r["flops"] / h100.peak_flops_per_s, r["bytes"] / h100.bandwidth_bytes_per_s) * 1e3
        assert r["gpu"] == "h100"
        assert r["fraction"] == pytest.approx(bound / r["median_ms"])
        bound_h200 = max(r["flops"] / h200.peak_flops_per_s, r["bytes"] / h200.bandwidth_bytes_per_s) * 1e3
        assert r["fraction_h200"] == pytest.approx(bound_h200 / r["median_ms"])
    assert (fractions["fraction_h200"] <= fractions["fraction_h100"] + 1e-12).all()


def test_measured_roofline_places_mlstm_points_under_both_roofs(fig5):
    run, _ = fig5
    rows = chunkwise_mlstm_rows(run.results)
    assert set(rows["kernel"]) == {"tfla_sig", "tfla_exp", "limit_chunk"}
    fig = measured_roofline_figure(run_context(run, None, H100_H200), "fw")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "arithmetic intensity [FLOP/byte]"
    assert ax.get_ylabel() == "performance [TFLOP/s]"
    roofs = lines_by_label(ax)
    h100_roof = roofs["H100 SXM roofline"]
    assert "H200 roofline" in roofs
    assert max(h100_roof.get_ydata()) == pytest.approx(989.0)
    points = {c.get_label(): c for c in ax.collections}
    sig = rows[(rows["kernel"] == "tfla_sig") & (rows["mode"] == "fw")]
    offsets = points["tfla_sig (measured)"].get_offsets()
    assert len(offsets) == len(sig)
    assert sorted(offsets[:, 1]) == pytest.approx(sorted(sig["achieved_flops_per_s"] / 1e12))
    chunk_labels = {t.get_text() for t in ax.texts}
    assert {"L=64", "L=128", "L=256", "L=512"} <= chunk_labels


def test_plot_measured_roofline_writes_every_figure_and_the_fraction_csv(fig5, tmp_path):
    run, _ = fig5
    context = run_context(run, None, H100_H200)
    figures = {plot.name: fig for plot, fig in render(measured_plots(context), context)}
    slug = "B8_T8192_H16_Dqk128_Dv256"
    assert set(figures) == {
        "measured_roofline_fw",
        "measured_roofline_fwbw",
        f"measured_vs_theory_{slug}_fw",
        f"measured_vs_theory_{slug}_fwbw",
        f"flops_vs_chunk_{slug}_fw",
        f"flops_vs_chunk_{slug}_fwbw",
        "roofline_fraction",
    }
    theory = figures[f"measured_vs_theory_{slug}_fw"].axes[0]
    labels = set(lines_by_label(theory))
    assert {"H100 SXM lower", "H100 SXM upper", "H200 lower", "H200 upper", "tfla_sig measured"} <= labels
    lower, upper = lines_by_label(theory)["H100 SXM lower"], lines_by_label(theory)["H100 SXM upper"]
    assert np.all(np.asarray(lower.get_ydata()) < np.asarray(upper.get_ydata()))
    rates = figures[f"flops_vs_chunk_{slug}_fw"].axes
    assert [ax.get_title() for ax in rates] == ["FLOP/s (measured)", "FLOPs (model)", "runtime (measured)"]
    fraction_ax = figures["roofline_fraction"].axes[0]
    assert "fraction of the roofline bound on H100 SXM" in fraction_ax.get_xlabel()
    assert {t.get_text() for t in fraction_ax.get_yticklabels()} >= {"tfla_sig", "sdpa_cudnn", "mamba2"}

    paths = plot_measured_roofline(run, tmp_path / "roofline", H100_H200)
    assert {p.name for p in paths} == {f"{name}.png" for name in figures} | {"roofline_fraction.csv"}
    csv = pd.read_csv(tmp_path / "roofline" / "roofline_fraction.csv")
    assert {"fraction", "fraction_h100", "fraction_h200", "bound_ms"} <= set(csv.columns)
