"""The committed runs (`results/runs/`): each one cited by the docs and listed in their index, and
each committed output what today's code writes, so that following the README changes no file."""

import re
from pathlib import Path

import pytest

from tfla_bench.analyse.compare import compare_run, comparison_frame, load_run, resolve_published_name

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "results" / "runs"
INDEX = RUNS / "README.md"
# The tfla_vs_peer_chunks runs name no published data set (their spec has no paper figure); their
# compare.csv sets them beside the paper's Fig. 5 rerun (the index says so).
FALLBACK_PUBLISHED = "tfla_fig5_consttoken_rerun_nh16"
HEADLINE = "fig5_consttoken-20261126-154300"


def committed_runs() -> list[str]:
    return sorted(path.name for path in RUNS.iterdir() if (path / "results.csv").is_file())


def citing_text() -> str:
    """What the docs say: the README, docs/, the notebooks, the code's comments (measurements they
    stand on) and the tests (which read some runs)."""
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "notebooks").glob("*.ipynb")]
    paths += [*(ROOT / "tfla_bench").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]
    paths += [path for path in (ROOT / "tests").glob("*.py") if path.name != Path(__file__).name]
    return "\n".join(path.read_text() for path in paths)


def cited(run: str, text: str) -> bool:
    """By its name, or as the docs name a series of one spec: by its suffix after a cited sibling
    (`fig5_consttoken-20261126-024017` and `-024742`)."""
    if run in text:
        return True
    return f"`-{run.rsplit('-', 1)[-1]}`" in text and run.partition("-")[0] in text


def test_every_committed_run_is_cited_by_the_docs_and_listed_in_the_index():
    text, index = citing_text(), INDEX.read_text()
    runs = committed_runs()
    assert HEADLINE in runs
    assert [run for run in runs if not cited(run, text)] == []
    assert [run for run in runs if not cited(run, index)] == []


def test_a_run_no_doc_cites_is_found():
    text = "see `fig5_consttoken-20261126-024017` and `-024742`"
    assert cited("fig5_consttoken-20261126-024017", text)
    assert cited("fig5_consttoken-20261126-024742", text)
    assert not cited("fig5_consttoken-20261126-030120", text)


def runs_with(name: str) -> list[pytest.param]:
    found = sorted(path.parent.name for path in RUNS.glob(f"*/{name}"))
    # One run in `make test`, every run in `make test-slow`.
    return [pytest.param(run, marks=() if run == HEADLINE else pytest.mark.slow) for run in found]


@pytest.mark.parametrize("run_name", runs_with("compare.csv"))
def test_a_committed_compare_csv_is_what_compare_writes_today(run_name):
    run = load_run(RUNS / run_name)
    published = resolve_published_name(run, None) or FALLBACK_PUBLISHED
    written = comparison_frame(compare_run(run, published)).to_csv(index=False)
    assert (RUNS / run_name / "compare.csv").read_text() == written, (
        f"tfla-bench compare {RUNS.relative_to(ROOT)}/{run_name} would change its compare.csv"
    )


@pytest.mark.slow
@pytest.mark.parametrize("run_name", sorted({path.parts[-3] for path in RUNS.glob("*/figures/*.png")}))
def test_committed_figures_are_what_plot_draws_today(run_name, tmp_path):
    import matplotlib.image
    import numpy as np

    from tfla_bench.plots.catalog import plot_run

    drawn = {path.name: path for path in plot_run(RUNS / run_name, tmp_path)}
    committed = {path.name: path for path in (RUNS / run_name / "figures").glob("*.png")}
    assert sorted(drawn) == sorted(committed)
    for name, path in committed.items():
        old, new = matplotlib.image.imread(path), matplotlib.image.imread(drawn[name])
        # Pixels, not bytes: another FreeType may draw a glyph a shade apart.
        assert old.shape == new.shape and np.abs(old - new).mean() < 0.01, name


def test_the_readme_names_runs_by_a_path_that_exists():
    readme = (ROOT / "README.md").read_text()
    for path in re.findall(r"results/runs/[\w.-]+", readme):
        assert (ROOT / path).exists(), path


def test_the_readme_headline_carries_the_caveats_of_its_run():
    import pandas as pd

    rows = pd.read_csv(RUNS / HEADLINE / "results.csv")
    readme = " ".join((ROOT / "README.md").read_text().split())
    ok = rows[rows["status"] == "ok"]
    throttled = ok[ok["throttled"].astype(str).str.lower() == "true"]
    fa3 = rows[rows["kernel"] == "fa3"]
    fa3_throttled = int((fa3["throttled"].astype(str).str.lower() == "true").sum())
    assert f"{fa3_throttled} of `fa3`'s {len(fa3)} rows" in readme
    assert f"{len(throttled)} of the run's {len(ok)} ok rows" in readme
    assert sorted(throttled["kernel"].unique()) == ["fa3", "fa4", "sdpa_cudnn", "sdpa_flash"]
    exp = rows[rows["kernel"] == "mlstm_kernels_exp"]
    assert set(exp["status"]) == {"crashed"} and f"crashed on all {len(exp)} of its rows" in readme
    headline_fa3 = fa3[(fa3["mode"] == "fwbw") & (fa3["seq_len"] == 8192)]
    assert headline_fa3["throttled"].astype(str).str.lower().item() == "true"
    assert f"| {headline_fa3['median_ms'].item():.2f}\\* |" in readme
