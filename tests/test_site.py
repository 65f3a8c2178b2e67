"""The static site of many runs: its pages, its history flags, its size, and the mistakes a user can make."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ElementTree
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
from synthetic_run import PLANTED, PLANTED_FACTOR, site_rows, site_runs, write_run

from tfla_bench.analyse import report
from tfla_bench.analyse import site as site_module
from tfla_bench.analyse.compare import compare_run, load_run
from tfla_bench.analyse.history import RunRows, flagged, history
from tfla_bench.analyse.site import SiteRun, build_site
from tfla_bench.cli.main import main
from tfla_bench.measure.row import ResultRow
from tfla_bench.model.hardware import ACCELERATORS
from tfla_bench.plots.base import Drawing, draw
from tfla_bench.plots.catalog import run_context
from tfla_bench.plots.history import MARKS, history_svg
from tfla_bench.plots.runs import energy_uj_per_token, run_plots, series_panels, with_published
from tfla_bench.run import rundir

# The site's budget, 50 MB for 100 runs of 300 rows, per run (its page and figures).
BYTES_PER_RUN = 50e6 / 100


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    # `write_run` records no `results_schema`: these read as runs of schema version 1, as --resume reads them.
    runs = site_runs(root / "runs")
    # A run that cannot be read: its env.json is not JSON.
    broken = shutil.copytree(runs[0], root / "runs" / "fig5_consttoken-broken")
    (broken / rundir.ENV).write_text("{not json")
    warnings: list[str] = []
    built = build_site([root / "runs"], root / "out", warnings.append, jobs=2)
    return root, built, warnings


def test_index_lists_every_readable_run_and_names_the_one_left_out(site):
    root, built, warnings = site
    index = built.index.read_text()
    assert len(built.runs) == 4
    assert index.count("<tr data-spec=") == 4
    assert "fig5_consttoken-broken" in index and "not readable JSON" in index
    assert any("left out" in line and "fig5_consttoken-broken" in line for line in warnings)
    assert 'data-gpu="|NVIDIA H200|"' in index
    assert "aaaaaaa" in index and "ccccccc" in index


def _linked(out: Path, run: SiteRun) -> dict[str, str]:
    """The figure files a run page links, by figure name (`memory_vs_seq_len`)."""
    page = (out / run.page).read_text()
    files = re.findall(r'src="\.\./figures/([^"]+\.png)"', page)
    return {re.sub(r"-[0-9a-f]{20}\.png$", "", name): name for name in files}


def test_run_pages_link_figure_files_instead_of_inlining_them(site):
    root, built, _ = site
    out = root / "out"
    linked = set()
    for run in built.runs:
        page = (out / run.page).read_text()
        assert "data:image/png;base64" not in page
        files = _linked(out, run)
        assert {"runtime_vs_seq_len", "memory_vs_seq_len", "measured_roofline_fw"} <= set(files), run.page
        assert all((out / "figures" / name).is_file() for name in files.values())
        linked |= set(files.values())
    # The folder holds the files some page links, and nothing else.
    assert {path.name for path in (out / "figures").iterdir()} == linked


def test_runs_whose_figure_inputs_are_equal_share_one_file_and_others_get_their_own(site):
    root, built, _ = site
    out = root / "out"
    runs = {run.rows.name: run for run in built.runs}
    a, b, c, h200 = (_linked(out, runs[f"fig5_consttoken-{name}"]) for name in ("a", "b", "c", "h200"))
    # a and b measured the same rows (at two commits); c has a case 1.5 times slower, the same memory;
    # the H200 run names another GPU in every figure's title.
    assert a["runtime_vs_seq_len"] == b["runtime_vs_seq_len"] != c["runtime_vs_seq_len"]
    assert a["memory_vs_seq_len"] == b["memory_vs_seq_len"] == c["memory_vs_seq_len"]
    assert not set(h200.values()) & (set(a.values()) | set(c.values()))
    # A figure drawn from the whole run is each run's own, though a and b draw the same pixels.
    assert a["measured_roofline_fw"] != b["measured_roofline_fw"]
    # The shared file is the figure each run's own context draws.
    for name in ("b", "c"):
        run = load_run(runs[f"fig5_consttoken-{name}"].run_dir)
        context = run_context(
            run, compare_run(run, run.published), [ACCELERATORS["h100"], ACCELERATORS["h200"]]
        )
        (plot,) = [plot for plot in run_plots(context) if plot.name == "memory_vs_seq_len"]
        src = report.figure_src("own", draw(plot.drawing(context), quick=True), root, root, quick=True)
        assert (root / src).read_bytes() == (out / "figures" / a["memory_vs_seq_len"]).read_bytes()


def test_a_figure_drawn_from_the_columns_it_reads_is_the_figure_of_every_column():
    # A committed Fig. 5 run: six kernel families in rows of panels, throttled points, energy, a param.
    run = load_run(Path(__file__).parent.parent / "results" / "runs" / "fig5_consttoken-20261202-h200")
    comparison = compare_run(run, run.published)
    context = run_context(run, comparison, [ACCELERATORS["h100"], ACCELERATORS["h200"]])
    every = with_published(run, comparison)
    every["energy_uj_per_token"] = energy_uj_per_token(every)
    checked = set()
    for plot in run_plots(context):
        drawing = plot.drawing(context)
        if plot.inputs is None or not drawing.args:  # drawn from the whole run, or nothing to show
            continue
        checked.add(plot.name)
        (rows,) = drawing.args
        assert len(rows.columns) < len(every.columns) / 2, plot.name
        pictures = [
            report.figure_src(name, draw(Drawing(drawing.function, (frame,)), quick=True), None, Path())
            for name, frame in (("read", rows), ("every", every))
        ]
        assert pictures[0] == pictures[1], plot.name
    assert checked == {"runtime_vs_seq_len", "energy_vs_seq_len", "memory_vs_seq_len"}


def test_a_drawing_digest_follows_the_values_it_is_given_not_the_objects():
    frame = pd.DataFrame({"kernel": ["tfla", "tfla"], "status": ["ok", "ok"], "chunk_size": [64, 128]})
    frame["chunk_size"] = frame["chunk_size"].astype("Int64")
    # Equal values from other objects: fresh strings, a dtype whose cached item size was asked for.
    again = pd.DataFrame({c: list(frame[c]) for c in frame.columns}).astype({"chunk_size": "Int64"})
    again["status"] = ["".join("ok") for _ in range(2)]
    assert again["chunk_size"].dtype.itemsize == 8
    digest = Drawing(series_panels, (frame,)).digest("code")
    assert Drawing(series_panels, (again,)).digest("code") == digest
    assert Drawing(series_panels, (frame.astype({"chunk_size": "float"}),)).digest("code") != digest
    assert Drawing(series_panels, (frame.assign(status=["ok", "oom"]),)).digest("code") != digest
    assert Drawing(partial(series_panels, x="seq_len"), (frame,)).digest("code") != digest
    assert Drawing(series_panels, (frame,)).digest("other code") != digest


def test_history_flags_the_planted_regression_and_nothing_else(site):
    root, _, _ = site
    page = (root / "out" / "history" / "fig5_consttoken.html").read_text()
    assert "1 change(s) beyond the noise of both runs: 1 slower, 0 faster" in page
    assert page.count('<tr class="flag-slower">') == 1
    assert "fig5_consttoken-c.html" in page and f"{PLANTED_FACTOR:.3f}" in page


def test_spec_page_sets_runs_side_by_side_with_the_paper_and_across_gpus(site):
    root, _, _ = site
    page = (root / "out" / "specs" / "fig5_consttoken.html").read_text()
    for gpu, commit in (
        ("NVIDIA H100 80GB HBM3", "aaaaaaa"),
        ("NVIDIA H100 80GB HBM3", "ccccccc"),
        ("NVIDIA H200", "ccccccc"),
    ):
        assert f"{gpu} · {commit}" in page
    assert "paper (H100)" in page
    assert "NVIDIA H200 against NVIDIA H100 80GB HBM3" in page
    figures = root / "out" / "specs" / "fig5_consttoken"
    assert any(figures.glob("compare-gpus-*.png"))
    assert (
        figures / "against-the-paper.png"
    ).is_file() and 'src="fig5_consttoken/against-the-paper.png"' in page


def _rows(seed: int, slower: dict[str, float] | None = None) -> list[ResultRow]:
    cells = site_rows(seed, slower, lengths=(8192,))
    text = [{k: "" if v is None or v != v else str(v) for k, v in row.items()} for row in cells]
    return [ResultRow.from_csv(cells) for cells in text]


def test_history_of_two_identical_runs_flags_nothing_and_a_slowdown_is_flagged_by_diffs_rule():
    same = [RunRows(name, "s", "gpu", f"2026-11-0{day}", name, _rows(0)) for day, name in enumerate("ab", 1)]
    assert flagged(history(same)).empty
    slowed = RunRows("c", "s", "gpu", "2026-11-03", "c", _rows(0, {PLANTED: 1.004}))
    # 0.4% slower is within the two rows' noise (0.5% each): not flagged; 1.5% is.
    assert flagged(history([*same, slowed])).empty
    slowed = RunRows("c", "s", "gpu", "2026-11-03", "c", _rows(0, {PLANTED: 1.015}))
    moved = flagged(history([*same, slowed]))
    assert list(moved["verdict"]) == ["slower"] and moved["key"].iloc[0].startswith(PLANTED)


def test_a_history_figure_labels_its_runs_and_marks_only_its_own_changes():
    runs = [RunRows(n, "s", "gpu", f"2026-11-0{d}", n, _rows(d)) for d, n in enumerate("abcd", 1)]
    slowed = RunRows("e", "s", "gpu", "2026-11-06", "e", _rows(0, {PLANTED: 3.0}))
    points = history([*runs, slowed])
    planted = points[points["key"].str.startswith(PLANTED)]
    other = points[~points["key"].str.startswith(PLANTED)]
    quiet = other[other["key"] == other["key"].iloc[0]]
    assert (planted["verdict"] == "slower").sum() == 1 and not quiet["verdict"].isin(list(MARKS)).any()
    svg = history_svg(planted, "tfla_sig fwbw: planted")
    ElementTree.fromstring(svg)  # well-formed: a browser shows it
    assert history_svg(planted, "tfla_sig fwbw: planted") == svg  # the same bytes every time
    assert all(f"2026-11-0{d}" in svg for d in (1, 2, 3, 4, 6)) and "tfla_sig fwbw: planted" in svg
    slower_mark = f'fill="{MARKS["slower"][1]}"'
    assert svg.count(slower_mark) == 2  # the changed point and its legend entry
    unchanged = history_svg(quiet, "quiet")
    assert slower_mark not in unchanged and "beyond the noise" not in unchanged


def test_a_site_weighs_less_than_its_share_of_50_mb_per_run(site):
    root, built, _ = site
    pages = sum(path.stat().st_size for path in (root / "out" / "runs").rglob("*") if path.is_file())
    assert pages / len(built.runs) < BYTES_PER_RUN * 0.6  # these runs have 90 rows, a tenth of the budget's


def test_a_rebuild_replaces_the_site_and_a_foreign_folder_is_refused(site, tmp_path, capsys):
    root, _, _ = site
    run = root / "runs" / "fig5_consttoken-a"
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine")
    assert main(["site", str(run), "--out", str(foreign)]) == 2
    assert "holds files not written by `tfla-bench site`" in capsys.readouterr().err
    assert (foreign / "todo.txt").read_text() == "mine"


def test_an_out_through_a_new_folder_and_back_is_the_folder_it_names(site, tmp_path, capsys):
    root, _, _ = site
    run = root / "runs" / "fig5_consttoken-a"
    (tmp_path / "todo.txt").write_text("mine")
    # `new/..` is tmp_path itself, which holds a file of the user's: refused, and no `new` is left.
    assert main(["site", str(run), "--out", str(tmp_path / "new" / "..")]) == 2
    assert "holds files not written by `tfla-bench site`" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["todo.txt"]
    assert main(["site", str(run), "--out", str(tmp_path / "a" / "b" / ".." / ".." / "site")]) == 0
    assert (tmp_path / "site" / "index.html").is_file() and not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda tmp: [str(tmp / "missing")], "no such run directory or folder"),
        (lambda tmp: [str(tmp)], "no run directory"),
    ],
)
def test_a_user_mistake_is_one_line_and_exit_2(tmp_path, capsys, make_args, message):
    assert main(["site", *make_args(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_no_readable_run_is_exit_2(tmp_path, capsys):
    run = write_run(tmp_path / "runs" / "r", site_rows(lengths=(8192,)))
    (run / rundir.ENV).write_text(json.dumps({"results_schema": rundir.SCHEMA_VERSION + 1}))
    assert main(["site", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 2
    assert "none of the 1 run(s) could be read" in capsys.readouterr().err


def test_a_rebuild_draws_again_only_what_changed(site):
    # After every other test of the `site` fixture: it rebuilds the site they read.
    root, built, _ = site
    out = root / "out"
    before = {path: path.stat().st_ino for path in out.rglob("*") if path.suffix in (".png", ".svg")}
    runs = {run.rows.name: run for run in built.runs}
    old = _linked(out, runs["fig5_consttoken-h200"])
    changed = root / "runs" / "fig5_consttoken-h200"
    env = json.loads((changed / rundir.ENV).read_text())
    (changed / rundir.ENV).write_text(json.dumps({**env, "host": "another node"}))
    steps = []
    build_site([root / "runs"], out, lambda line: None, lambda what, done, total: steps.append((what, done)))
    after = {path: path.stat().st_ino for path in out.rglob("*") if path.suffix in (".png", ".svg")}
    redrawn = {path.relative_to(out) for path in after if before.get(path) != after[path]}
    # The spec pages' cross-GPU figure is drawn each time; a history figure only anew; of the changed
    # run's figures, those drawn from its environment (all of the run), not those of its rows alone.
    new = _linked(out, runs["fig5_consttoken-h200"])
    assert {path for path in redrawn if path.parts[0] != "specs"} == {
        Path("figures", new[name]) for name in new if new[name] != old[name]
    }
    assert {name for name in new if new[name] != old[name]} >= {"measured_roofline_fw", "roofline_fraction"}
    assert new["runtime_vs_seq_len"] == old["runtime_vs_seq_len"]
    # Its figures of before that no page links any more are gone.
    assert {path.name for path in (out / "figures").iterdir()} == {
        name for run in built.runs for name in _linked(out, run).values()
    }
    assert steps[0] == (
        "reused",
        len(built.runs) - 1 + len(list((out / "history" / "fig5_consttoken").iterdir())),
    )
    assert "another node" in (out / "runs" / "fig5_consttoken-h200.html").read_text()
    assert not (out / ".previous").exists()


def test_a_rebuild_draws_a_reused_pages_missing_figure_again(tmp_path):
    runs = site_runs(tmp_path / "runs", lengths=(2048, 8192))[:1]
    out = tmp_path / "out"
    built = build_site(runs, out, lambda line: None, jobs=1)
    memory = out / "figures" / _linked(out, built.runs[0])["memory_vs_seq_len"]
    picture = memory.read_bytes()
    memory.unlink()
    steps = []
    build_site(runs, out, lambda line: None, lambda what, done, total: steps.append((what, done)), jobs=1)
    assert steps[0] == ("reused", 0) and memory.read_bytes() == picture


def test_a_run_that_mixes_gpus_gets_a_page_per_gpu(tmp_path):
    rows = site_rows(lengths=(8192,))
    for index, row in enumerate(rows):
        row["gpu_name"] = "NVIDIA H200" if index % 2 else "NVIDIA H100 80GB HBM3"
    write_run(tmp_path / "runs" / "fig5_consttoken-mixed", rows)
    built = build_site([tmp_path / "runs"], tmp_path / "out", lambda line: None, jobs=1)
    pages = sorted(run.page for run in built.runs)
    assert pages == [
        "runs/fig5_consttoken-mixed-nvidia-h100-80gb-hbm3.html",
        "runs/fig5_consttoken-mixed-nvidia-h200.html",
    ]
    assert sorted(run.rows.gpu for run in built.runs) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert all((tmp_path / "out" / page).is_file() for page in pages)
    assert sum(len(run.rows.rows) for run in built.runs) == len(rows)


def test_a_rebuild_stopped_part_way_leaves_the_site_built_before_whole(tmp_path, monkeypatch):
    runs = site_runs(tmp_path / "runs", lengths=(2048, 8192))[:2]
    out = tmp_path / "out"
    build_site(runs, out, lambda line: None, jobs=1)
    index = (out / "index.html").read_text()

    def targets() -> set[Path]:
        pages = [out / "index.html", *out.glob("*/*.html")]
        found = set()
        for page in pages:
            for link in re.findall(r'(?:href|src)="([^"#]+)"', page.read_text()):
                if "://" not in link:
                    found.add((page.parent / link).resolve())
        return found

    assert all(path.exists() for path in targets())
    # The second run changed (a page to draw), then the build stops as it writes the spec pages.
    env = json.loads((runs[1] / rundir.ENV).read_text())
    (runs[1] / rundir.ENV).write_text(json.dumps({**env, "host": "another node"}))

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(site_module, "_spec_page", stop)
    with pytest.raises(KeyboardInterrupt):
        build_site(runs, out, lambda line: None, jobs=1)
    assert (out / "index.html").read_text() == index
    missing = [path for path in targets() if not path.exists()]
    assert not missing and not (out / site_module.PREVIOUS).exists()
