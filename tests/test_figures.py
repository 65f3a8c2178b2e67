"""Figures read at a glance: styles from kernel and params, one registry, the 2.5:1 limit, labels
that never overlap, CPU runs without a GPU roof, GPUs that stay apart in the model figures."""

from __future__ import annotations

import itertools
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import matplotlib
import pytest
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.ticker import NullLocator
from synthetic_run import fig5_rows, headdim_rows, write_run

from tfla_bench.adapters import registry
from tfla_bench.adapters.registry import PlotStyle
from tfla_bench.analyse.compare import compare_run, load_run
from tfla_bench.analyse.report import REPORT_DPI
from tfla_bench.model.hardware import ACCELERATORS, Accelerator
from tfla_bench.plots.base import (
    HBM,
    MAX_ASPECT,
    MEASURED,
    FigureContext,
    Label,
    Roof,
    drop_minor_ticks,
    new_figure,
    place_labels,
    png_bytes,
    render,
)
from tfla_bench.plots.catalog import GROUPS, plots, run_context
from tfla_bench.plots.style import accelerator_style, resolve_style, row_style

H100_H200 = [ACCELERATORS["h100"], ACCELERATORS["h200"]]
MLSTM = ("tfla_sig", "tfla_exp", "limit_chunk", "mlstm_kernels_sig", "mlstm_kernels_exp")


def look(style):
    return (style.color, style.linestyle, style.marker, style.fillstyle)


@pytest.mark.parametrize(
    ("kernel", "family", "params", "other"),
    [
        ("sdpa_flash", "attention", {"causal": True}, {"causal": False}),
        ("sdpa_cudnn", "attention", {"param_causal": "True"}, {"param_causal": "False"}),
        ("tfla_sig", "mlstm", {}, {"normalize": True}),
        ("mamba2", "mamba2", {}, {"impl": "split"}),
    ],
)
def test_differing_params_give_differing_colours(kernel, family, params, other):
    assert row_style(kernel, family, params).color != row_style(kernel, family, other).color
    assert look(row_style(kernel, family, other)) == look(row_style(kernel, family, dict(other)))


def test_default_params_and_unset_params_look_the_same():
    base = row_style("sdpa_flash", "attention", {})
    assert look(base) == look(row_style("sdpa_flash", "attention", {"causal": True, "seed": 3}))
    assert look(base) == look(row_style("sdpa_flash", "attention", {"param_causal": float("nan")}))


def test_non_causal_is_a_lighter_tint_with_hollow_markers():
    causal = row_style("sdpa_flash", "attention", {})
    free = row_style("sdpa_flash", "attention", {"causal": False})
    assert free.fillstyle == "none" and causal.fillstyle == "full"
    assert sum(int(free.color[i : i + 2], 16) for i in (1, 3, 5)) > sum(
        int(causal.color[i : i + 2], 16) for i in (1, 3, 5)
    )


def test_ours_and_the_peer_share_a_hue_per_gate_and_differ_by_line_style():
    for ours, peer in (("tfla_sig", "mlstm_kernels_sig"), ("tfla_exp", "mlstm_kernels_exp")):
        a, b = row_style(ours, "mlstm"), row_style(peer, "mlstm")
        assert a.color == b.color and a.linestyle == "-" and b.linestyle == "--"
    assert row_style("tfla_sig", "mlstm").color != row_style("tfla_exp", "mlstm").color


def test_the_five_mlstm_kernels_are_told_apart():
    looks = [look(row_style(k, "mlstm")) for k in MLSTM]
    assert len(set(looks)) == len(MLSTM)
    hues = {row_style(k, "mlstm").color for k in ("tfla_sig", "tfla_exp", "limit_chunk")}
    assert len(hues) == 3


def test_families_have_their_own_palettes():
    groups = {
        "mlstm": ("tfla_sig", "tfla_exp", "limit_chunk", "mlstm_kernels_limit"),
        "attention": ("sdpa_flash", "sdpa_cudnn", "sdpa_math", "fa2", "fa3"),
        "mamba2": ("mamba2", "mamba2_split_conv", "mamba"),
        "gla": ("gla", "simple_gla"),
    }
    colors = {family: {row_style(k, family).color for k in kernels} for family, kernels in groups.items()}
    for a, b in itertools.combinations(colors.values(), 2):
        assert not a & b


def test_an_adapter_without_a_style_takes_its_family_palette_and_its_own_base_when_given():
    plugin = resolve_style(None, "gla", "my_gla")
    assert plugin == resolve_style(None, "gla", "my_gla")
    assert plugin.color in {registry.get(name).plot_style.color for name in ("gla", "simple_gla")}
    own = resolve_style(PlotStyle("#123456", "--", "D"), "gla", "my_gla")
    assert (own.color, own.linestyle, own.marker) == ("#123456", "--", "D")


def test_h100_and_h200_differ_in_colour_line_style_and_marker():
    h100, h200 = (accelerator_style(a) for a in H100_H200)
    assert h100.color != h200.color and h100.linestyle != h200.linestyle and h100.marker != h200.marker


def test_a_figure_wider_than_the_limit_is_refused():
    with pytest.raises(ValueError, match="2.5"):
        new_figure(13, 4)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    run_dir = write_run(tmp_path_factory.mktemp("runs") / "fig5_consttoken-20250101-000000", fig5_rows())
    run = load_run(run_dir)
    return run_context(run, compare_run(run, "tfla_fig5_consttoken_rerun_nh16"), H100_H200)


def test_every_registered_figure_is_at_most_2_5_to_1_and_has_a_caption(synthetic, tmp_path):
    headdim = load_run(write_run(tmp_path / "fig17", headdim_rows(), spec="fig17_headdim", published=None))
    drawn = render(plots(synthetic, list(GROUPS)), synthetic)
    drawn += render(plots(run_context(headdim), ["run"]), run_context(headdim))
    names = {plot.name for plot, _ in drawn}
    assert {"runtime_vs_seq_len", "runtime_vs_head_dim", "fig22_roofline", "roofline_fraction"} <= names
    assert any(name.startswith("measured_vs_theory_") for name in names)
    for plot, fig in drawn:
        width, height = fig.get_size_inches()
        assert width / height <= MAX_ASPECT + 1e-9, plot.name
        assert len(plot.caption) > 40 and plot.caption.endswith("."), plot.name
        for ax in fig.axes:
            if ax.get_visible() and ax.get_ylabel():
                assert "[" in ax.get_ylabel(), (plot.name, ax.get_ylabel())


def test_run_figures_name_their_gpu_and_dtype(synthetic):
    for plot, fig in render(plots(synthetic, ["run", "measured"]), synthetic):
        text = fig.get_suptitle() + " ".join(ax.get_title() for ax in fig.axes)
        assert "NVIDIA H100 80GB HBM3" in text and "bfloat16" in text, plot.name


def test_a_cpu_run_is_labelled_cpu_and_drawn_against_no_roof(tmp_path):
    run = load_run(write_run(tmp_path / "fig5_consttoken-20250101-000000", fig5_rows(), gpu_name=None))
    context = run_context(run, None, H100_H200)
    assert context.roofs == ()
    drawn = dict((plot.name, fig) for plot, fig in render(plots(context, ["run", "measured"]), context))
    assert "roofline_fraction" not in drawn and "measured_roofline_fw" not in drawn  # no roof, no roofline
    assert "on CPU" in drawn["runtime_vs_seq_len"].get_suptitle()
    theory = drawn["measured_vs_theory_B8_T8192_H16_Dqk128_Dv256_fw"]
    assert not any("H100" in line.get_label() for ax in theory.axes for line in ax.get_lines())


def test_direct_labels_never_overlap():
    fig = new_figure(6, 4)
    ax = fig.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    labels = [Label(5, 5 + 0.01 * i, f"label {i}", "black") for i in range(8)]
    placed = place_labels(ax, labels)
    assert len(placed) >= 4
    renderer = fig.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in placed]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b)


def test_labels_are_placed_on_the_layout_the_figure_is_drawn_with():
    # Only the layout is settled before placing (no draw): autoscaled log axes and a legend outside
    # the axes must still put the labels where a full draw finds them, inside the axes, apart.
    fig = new_figure(6, 4)
    ax = fig.subplots()
    xs = [2.0**i for i in range(1, 12)]
    ax.plot(xs, [x**1.5 for x in xs], label="a line with a long name for the legend")
    ax.set_xscale("log")
    ax.set_yscale("log")
    fig.legend(loc="outside right center")
    placed = place_labels(ax, [Label(x, x**1.5, f"T={int(x)}", "black") for x in xs])
    assert len(placed) >= 4
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes_box = ax.get_window_extent(renderer)
    boxes = [text.get_window_extent(renderer) for text in placed]
    for box in boxes:
        assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1
        assert axes_box.y0 <= box.y0 and box.y1 <= axes_box.y1
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b)


def test_quick_labels_keep_their_layout_and_write_the_pixels_a_full_layout_would(synthetic):
    # Quick (a site's run page): the labels are placed on the layout without minor ticks, and that
    # layout is kept for the draw instead of solved again; the PNG is the one a layout solved at the
    # draw writes.
    plot = next(p for p in plots(synthetic, ["measured"]) if p.name == "measured_roofline_fwbw")
    [(_, quick)] = render([plot], synthetic, quick=True)
    assert not isinstance(quick.get_layout_engine(), ConstrainedLayoutEngine)
    ax = quick.axes[0]
    assert isinstance(ax.xaxis.get_minor_locator(), NullLocator)
    assert isinstance(ax.yaxis.get_minor_locator(), NullLocator)
    with matplotlib.rc_context({"axes.titley": 1.0}):
        [(_, full)] = render([plot], synthetic)
    assert isinstance(full.get_layout_engine(), ConstrainedLayoutEngine)  # `plot` and `roofline` as before
    drop_minor_ticks(full)
    assert png_bytes(quick, REPORT_DPI, squeeze=False) == png_bytes(full, REPORT_DPI, squeeze=False)


def test_model_figures_name_h100_and_h200_beside_their_curves():
    context = FigureContext(roofs=tuple(Roof(a) for a in H100_H200))
    drawn = dict((plot.name, fig) for plot, fig in render(plots(context, ["model"]), context))
    ax = drawn["fig22_roofline"].axes[0]
    assert {"H100 SXM", "H200"} <= {text.get_text() for text in ax.texts}
    roofs = {line.get_label(): line for line in ax.get_lines() if line.get_label().endswith("roofline")}
    assert roofs["H100 SXM roofline"].get_linestyle() != roofs["H200 roofline"].get_linestyle()


def test_a_measured_roof_is_drawn_beside_the_datasheet_one():
    measured = Roof(Accelerator("measured-hbm", 700e12, 3.0e12), MEASURED, HBM)
    context = FigureContext(roofs=(Roof(ACCELERATORS["h100"]), measured))
    assert context.accelerators == [ACCELERATORS["h100"]]  # model bounds stay on the data sheet
    fig = dict((p.name, f) for p, f in render(plots(context, ["model"]), context))["fig22_roofline"]
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert "H100 SXM roofline" in lines
    roof = lines["measured: 700 TFLOP/s, HBM 3.00 TB/s roofline"]
    assert roof.get_color() == "black" and max(roof.get_ydata()) == pytest.approx(700)


def _log_figure() -> bytes:
    fig = new_figure(6, 4)
    fig.subplots().loglog([1, 10, 100, 1000], [1e-3, 1, 1e2, 1e5])
    return png_bytes(fig)


def test_figures_drawn_after_a_fork_share_no_parsed_math_text_with_the_parent():
    # The figures share one parser of their log axes' labels; its parses hold fonts, which a forked
    # process (the site's pool) must not use: it drew wrong glyphs or failed ("too many hints").
    here = _log_figure()
    for _ in range(10):
        with ProcessPoolExecutor(2, mp_context=get_context("fork")) as pool:
            assert [future.result() for future in [pool.submit(_log_figure) for _ in range(4)]] == [here] * 4
