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


def test_every_committed_run_is_cited_by_the_docs_and_the_index_names_only_runs_that_are_here():
    text, index = citing_text(), INDEX.read_text()
    runs = committed_runs()
    assert HEADLINE in runs
    assert [run for run in runs if not cited(run, text)] == []
    # A run added with the doc that cites it passes; the index never names a run that is gone.
    named = set(re.findall(r"^\| `([\w.-]+-\d{8}-[\w-]+)`", index, re.MULTILINE))
    assert len(named) > 30 and sorted(named - set(runs)) == []


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


def readme_block(starting: str) -> list[str]:
    """The lines of the README's code block whose first line is `starting`."""
    text = (ROOT / "README.md").read_text()
    return text.split(f"```\n{starting}\n")[1].split("\n```")[0].splitlines()


def test_the_readme_compare_sample_is_what_compare_prints(tmp_path, capsys, monkeypatch):
    from tfla_bench.cli.main import main

    monkeypatch.delenv("COLUMNS", raising=False)
    sample = readme_block(f"$ tfla-bench compare results/runs/{HEADLINE}")
    monkeypatch.chdir(ROOT)
    assert main(["compare", f"results/runs/{HEADLINE}", "--csv", str(tmp_path / "c.csv")]) == 0
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    shown = [line for line in sample if line != "..."]
    assert len(shown) > 8 and [line for line in printed if line in shown] == shown  # in order


def test_the_readme_smoke_sample_has_the_shape_the_sweep_prints(capsys, monkeypatch):
    from tfla_bench.measure.row import ResultRow
    from tfla_bench.run import specs
    from tfla_bench.run.console import make_console, summary_table

    monkeypatch.delenv("COLUMNS", raising=False)
    sample = readme_block("$ export TRITON_INTERPRET=1 PATH=$PWD/.venv/bin:$PATH")
    cases = specs.expand(specs.load_spec(specs.find_spec(Path("smoke"))))
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"(Two of the {len(cases)} progress lines shown." in readme
    assert sum(line.lstrip().startswith("ok ") for line in sample) == 2
    table = [line for line in sample if line[:1] in "┏┃┡│└"]
    # The table the sweep prints for the sample's own numbers, row by row.
    rows = []
    for line in table:
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if len(cells) != 6 or line[0] != "│":
            continue
        kernel, mode, dtype, config, *times = cells
        for case in cases:
            label = f"H{case.num_heads} Dqk{case.head_dim_qk} Dv{case.head_dim_v}"
            label += f" L{case.chunk_size}" if case.chunk_size else ""
            label += "".join(f" {k}={v}" for k, v in sorted(case.params.items()))
            if (case.kernel, case.mode, case.dtype, label) == (kernel, mode, dtype, config):
                median = float(times[[128, 256].index(case.seq_len)])
                rows.append(ResultRow(case=case, family="", status="ok", median_ms=median))
    assert len(rows) == len(cases)
    make_console().print(summary_table(rows))
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert [line for line in printed if line[:1] in "┏┃┡│└"] == table
    done = next(line for line in sample if "case(s) run" in line)
    counts = rf"{len(cases)} case\(s\) run, 0 decided without running, 0 kept"
    assert re.fullmatch(rf"{counts}; [\d.]+ s; results in runs/smoke/results.csv", done)


def diff_pairs() -> list[pytest.param]:
    """Each committed `diff_vs_<A>.csv` of a run B, with run A: the run of B's spec named `<A>`."""
    pairs = []
    for path in sorted(RUNS.glob("*/diff_vs_*.csv")):
        spec = path.parent.name.rsplit("-", 2)[0]
        (run_a,) = sorted(RUNS.glob(f"{spec}-{path.stem.removeprefix('diff_vs_')}*"))[:1]
        pairs.append(pytest.param(run_a, path, id=path.parent.name))
    return pairs


@pytest.mark.parametrize(("run_a", "written"), diff_pairs())
def test_a_committed_diff_csv_is_what_diff_writes_today(run_a, written):
    from tfla_bench.analyse.diff import diff_runs

    rows = diff_runs(run_a, written.parent).rows
    assert written.read_text() == rows.to_csv(index=False), (
        f"tfla-bench diff {run_a.name} {written.parent.name} --csv would change {written.name}"
    )
