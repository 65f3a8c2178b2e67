"""The static site of many runs: its pages, its history flags, its size, and the mistakes a user can make."""

from __future__ import annotations

import json
import shutil

import pytest
from synthetic_run import PLANTED, PLANTED_FACTOR, site_rows, site_runs, write_run

from tfla_bench.analyse.history import RunRows, flagged, history
from tfla_bench.analyse.site import build_site
from tfla_bench.cli.main import main
from tfla_bench.measure.row import ResultRow
from tfla_bench.plots.history import HistoryFigure
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


def test_run_pages_link_figure_files_instead_of_inlining_them(site):
    root, built, _ = site
    for run in built.runs:
        page = (root / "out" / run.page).read_text()
        assert "data:image/png;base64" not in page
        figures = sorted((root / "out" / run.page).with_suffix("").glob("*.png"))
        assert figures, run.page
        for figure in figures:
            assert f'src="{run.rows.name}/{figure.name}"' in page


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


def test_a_history_figure_drawn_after_another_case_is_the_one_drawn_anew(tmp_path):
    # Cases of different run counts and runtimes: nothing of the case drawn before may stay on the axes.
    runs = [RunRows(n, "s", "gpu", f"2026-11-0{d}", n, _rows(d)) for d, n in enumerate("abcd", 1)]
    slowed = RunRows("e", "s", "gpu", "2026-11-06", "e", _rows(0, {PLANTED: 3.0}))
    points = history([*runs, slowed])
    planted = points[points["key"].str.startswith(PLANTED)]
    other = points[~points["key"].str.startswith(PLANTED)]
    short = other[other["key"] == other["key"].iloc[0]].head(2)
    assert (planted["verdict"] == "slower").any() and len(short) == 2 and planted["key"].nunique() == 1
    ratio = planted["median_ms"].max() / short["median_ms"].max()
    assert not 0.5 < ratio < 2  # their y axes differ
    reused = HistoryFigure()
    for number, (case, title) in enumerate(((planted, "planted"), (short, "short"), (planted, "planted"))):
        again, anew = tmp_path / f"reused-{number}.png", tmp_path / f"new-{number}.png"
        reused.save(case, title, again)
        HistoryFigure().save(case, title, anew)
        assert again.read_bytes() == anew.read_bytes()


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
    before = {path: path.stat().st_ino for path in out.rglob("*.png")}
    changed = root / "runs" / "fig5_consttoken-h200"
    env = json.loads((changed / rundir.ENV).read_text())
    (changed / rundir.ENV).write_text(json.dumps({**env, "host": "another node"}))
    steps = []
    build_site([root / "runs"], out, lambda line: None, lambda what, done, total: steps.append((what, done)))
    after = {path: path.stat().st_ino for path in out.rglob("*.png")}
    redrawn = {path.relative_to(out).parts[:2] for path in after if before.get(path) != after[path]}
    # The spec pages' cross-GPU figure is drawn each time; a run's page and a history figure only anew.
    assert redrawn - {("specs", "fig5_consttoken")} == {("runs", "fig5_consttoken-h200")}
    assert steps[0] == (
        "reused",
        len(built.runs) - 1 + len(list((out / "history" / "fig5_consttoken").iterdir())),
    )
    assert "another node" in (out / "runs" / "fig5_consttoken-h200.html").read_text()
    assert not (out / ".previous").exists()


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
