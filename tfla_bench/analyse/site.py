"""Every run in one static site (`tfla-bench site RUNS... --out DIR`): HTML, one CSS and one JS file,
and the figures as PNG (and the history's as SVG) files; no server, opened from disk or served by any
static server.

- `index.html`: the runs, one row each (spec, GPU, date, commit, cases ok of all, the headline),
  sortable by a click on a column head and filtered by spec, GPU and kernel;
- `runs/<run>.html`: each run's report (`tfla_bench.analyse.report`); a run that mixes GPUs gets one
  page per GPU, as `report --gpu` does;
- `figures/`: the run pages' figures, one file per figure drawn from the same inputs
  (`report.SharedFigures`): the pages whose figure is the same link one file, drawn once;
- `specs/<spec>.html`: the runs of one spec side by side, one column per GPU and commit (the latest
  run of each, for the `SERIES_PER_GPU` latest commits of each GPU) and the paper's published numbers
  as one more column; the cross-GPU check (`tfla_bench.analyse.crossgpu`) of the latest run of each
  pair of GPUs;
- `history/<spec>.html`: each case that two or more runs share over time
  (`tfla_bench.analyse.history`), the changes beyond both runs' noise first, then one figure per
  kernel and mode with a selector over its cases (one SVG per case, `tfla_bench.plots.history`).

Runs are read through `tfla_bench.run.rundir`, so a run written by an older version reads as
`--resume` reads it. A run that cannot be read (no results.csv, a newer schema, env.json not JSON)
is left out with a warning, and the index names it; the site goes on. The run pages and the history
figures, the slow part, are drawn by `jobs` processes side by side.
"""

from __future__ import annotations

import hashlib
import html
import importlib.util
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import pandas as pd

from tfla_bench.analyse import report
from tfla_bench.analyse.compare import compare_run, load_run, resolve_published_name
from tfla_bench.analyse.crossgpu import compare_gpus, summarize
from tfla_bench.analyse.headline import fastest_per_length, most_often_fastest, what_ran
from tfla_bench.analyse.history import RunRows, case_text, commit_of, flagged, history
from tfla_bench.errors import UserError
from tfla_bench.plots.base import device_name
from tfla_bench.plots.crossgpu import speedup_figure
from tfla_bench.plots.history import history_svg
from tfla_bench.plots.paper import paper_ratio_figure
from tfla_bench.run import phases, rundir

MARKER = ".tfla-bench-site"  # names a folder this command built, which a rebuild may replace
SUBFOLDERS = ("runs", "specs", "history")
# The run pages' figures, each file named by what it is drawn from (`report.SharedFigures`): a rebuild
# keeps the folder, draws only the files it lacks, and deletes the files no page links.
FIGURES = "figures"
SERIES_PER_GPU = 6
FLAGGED_SHOWN = 200  # a history lists this many changes, the largest first; its figures show every one
PAPER = "paper (H100)"

SITE_CSS = (
    report.STYLE
    + """
.filters label { margin-right: 1em; } .filters select { margin-left: .3em; }
tr.flag-slower td { background: #fde0dd; } tr.flag-faster td { background: #e5f5e0; }
.case-select { margin: .5em 0; max-width: 100%; }
table.runs td, table.runs th { text-align: left; } table.runs td:not(:last-child) { white-space: nowrap; }
"""
)
# The filters: a row stays when each chosen value is among its `data-` values ("|a|b|").
_FILTER_SCRIPT = """
function applyFilters() {
  var chosen = Array.from(document.querySelectorAll("select.filter"));
  var rows = document.querySelectorAll("#runs tbody tr"), shown = 0;
  rows.forEach(function (row) {
    var keep = chosen.every(function (s) {
      return !s.value || row.dataset[s.dataset.key].indexOf("|" + s.value + "|") >= 0; });
    row.hidden = !keep; if (keep) shown++;
  });
  document.getElementById("shown").textContent = shown;
}
document.querySelectorAll("select.filter").forEach(function (s) {
  s.addEventListener("change", applyFilters); });
document.querySelectorAll("select.case-select").forEach(function (s) {
  s.addEventListener("change", function () { document.getElementById(s.dataset.img).src = s.value; });
});
"""
SITE_JS = report.SORT_SCRIPT + _FILTER_SCRIPT


@dataclass(frozen=True)
class SiteRun:
    """One run (one GPU's view of it) on the site: where it is read from, its page, what the index
    shows, and its rows for the history."""

    run_dir: Path
    gpu_pick: str | None
    rows: RunRows
    ok: int
    kernels: tuple[str, ...]

    @property
    def page(self) -> str:
        return f"runs/{self.rows.name}.html"


@dataclass
class Site:
    """What `build_site` wrote: the index, the runs shown, the ones left out and why, the flags."""

    index: Path
    runs: list[SiteRun]
    left_out: dict[str, str]
    specs: list[str]
    gpus: list[str]
    flagged: int


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


def read_runs(run_dirs: list[Path], warn: Callable[[str], None]) -> tuple[list[SiteRun], dict[str, str]]:
    """Each run directory's rows and facts, one `SiteRun` per GPU it measured on; a run that cannot be
    read is warned about and returned with the reason among those left out."""
    runs: list[SiteRun] = []
    left_out: dict[str, str] = {}
    names: set[str] = set()
    for run_dir in run_dirs:
        try:
            read = rundir.read_results(run_dir / rundir.RESULTS)
            env = rundir.read_env(run_dir)
            phases.read(run_dir)  # its report's section on where the time went
            if not read.rows:
                raise UserError(f"{run_dir / rundir.RESULTS} has no readable result rows")
            rows = read.one_per_case()
            gpus = list(rundir.gpu_counts(rows, env)) or [None]
            views = [(gpu if len(gpus) > 1 else None, *rundir.on_one_gpu(rows, env, gpu, where=run_dir))
                     for gpu in gpus]  # fmt: skip
        except UserError as exc:
            warn(f"warning: left out {run_dir}: {exc}")
            left_out[str(run_dir)] = str(exc)
            continue
        if read.skipped:
            warn(f"warning: {read.warning()}")
        for pick, view_rows, view_env in views:
            name = _slug(rundir.for_gpu(run_dir.name, pick))
            while name in names:
                name += "-2"
            names.add(name)
            gpu = str(view_env.get("gpu_name") or "CPU")
            spec = str(view_env.get("spec") or run_dir.name)
            date = str(view_env.get("started_at") or "?")
            history_rows = RunRows(name, spec, gpu, date, commit_of(view_env), view_rows)
            ok = sum(row.status == "ok" for row in view_rows)
            kernels = tuple(sorted({row.case.kernel for row in view_rows}))
            runs.append(SiteRun(run_dir, pick, history_rows, ok, kernels))
    return runs, left_out


def _run_page(
    run_dir: Path, gpu: str | None, page: Path, key: str, shared: tuple[Path, str]
) -> tuple[str, list[str], str | None]:
    """Write a run's report as a site page, its figures in the site's folder of them (`shared`: the
    folder and the code's digest, `report.SharedFigures`), and `key` (what it was drawn from) with the
    figure files it links; return its headline line, those files, and the reason when the report could
    not be made."""
    figures = report.SharedFigures(*shared)
    try:
        run = load_run(run_dir, gpu)
        name = resolve_published_name(run, None)
        text = report.build_report(run, name, links_from=page.parent, figures=figures)
    except UserError as exc:
        return "", [], str(exc)
    rundir.write_atomic(page, text)
    fastest = fastest_per_length(run.results)
    headline = most_often_fastest(fastest) if not fastest.empty else what_ran(run, device_name(run))
    files = sorted(figures.used)
    _write_key(page.with_suffix(""), key, {"headline": headline, "figures": files})
    return headline, files, None


def _natural(text: str) -> str:
    """A sort key that orders `T512` before `T4096`: every number padded to 12 digits."""
    return re.sub(r"\d+", lambda number: number.group().zfill(12), text)


def _history_figures(points: pd.DataFrame, title: str, folder: Path, key: str) -> list[tuple[str, str]]:
    """One SVG per case of `points` (one kernel and mode) in `folder`, with `key`; returns (case, file
    name) pairs."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    cases = sorted(points["case"].unique(), key=_natural)
    for number, case in enumerate(cases):
        name = f"case-{number}.svg"
        rundir.write_atomic(folder / name, history_svg(points[points["case"] == case], f"{title}: {case}"))
        written.append((str(case), name))
    _write_key(folder, key, {"files": written})
    return written


# ----------------------------------------------------------------------------------------------
# Reuse: a run page or a history figure drawn by the same code from the same inputs in the site built
# before is moved into the new one instead of drawn again.

# The files of a run directory that its report reads.
REPORT_INPUTS = (
    rundir.RESULTS,
    rundir.ENV,
    rundir.SPEC,
    rundir.SELECTION,
    rundir.CHECK,
    rundir.TIMINGS,
    rundir.JOBS,
    rundir.PROFILE,
)
KEY_FILE = "key.json"
PREVIOUS = ".previous"
# The code and data a page is drawn with: the suite, the adapters and the paper's numbers.
SOURCES = ("tfla_bench", "tfla_bench.kernels", "tfla_bench.baselines", "tfla_bench.published_data")


def code_digest() -> str:
    """A digest of the source and data files of `SOURCES`, which every key includes."""
    digest = hashlib.sha256()
    for package in SOURCES:
        spec = importlib.util.find_spec(package)
        for folder in map(Path, (spec.submodule_search_locations or []) if spec else []):
            for path in sorted(folder.rglob("*")):
                if path.suffix in (".py", ".csv", ".json") and path.is_file():
                    digest.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def run_key(code: str, run: SiteRun, out: Path) -> str:
    """What a run's page is drawn from: the code, the run's input files, the GPU picked, and where
    the run lies from the page (its links to job logs)."""
    digest = hashlib.sha256(code.encode())
    where = os.path.relpath(run.run_dir.resolve(), (out / "runs").resolve())
    digest.update(f"{run.gpu_pick}|{where}".encode())
    for name in REPORT_INPUTS:
        path = run.run_dir / name
        digest.update(name.encode() + (path.read_bytes() if path.is_file() else b"(none)"))
    return digest.hexdigest()


def _write_key(folder: Path, key: str, facts: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rundir.write_json(folder / KEY_FILE, {"key": key, **facts})


def _reuse(
    old: Path, new: Path, key: str, extra: tuple[Path, Path] | None = None, figures: Path | None = None
) -> dict | None:
    """Move the folder `old` (and the file `extra[0]` to `extra[1]`) of the site built before into
    place when its key is `key` (and the files its facts name under `figures` are there); return its
    recorded facts, or None (then nothing moved)."""
    try:
        facts = json.loads((old / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if facts.get("key") != key or (extra is not None and not extra[0].is_file()):
        return None
    if figures is not None and not all((figures / name).is_file() for name in facts.get("figures", [])):
        return None
    new.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(old, new)
    if extra is not None:
        shutil.move(extra[0], extra[1])
    return facts


def _restore(out: Path, previous: Path) -> None:
    """After a build that stopped part way, put back each page of the site built before that
    `_prepare` set aside and no reuse took, unless a page of the same name was drawn meanwhile: the
    old index then finds every page it links."""
    if not previous.is_dir():
        return
    for path in sorted(previous.rglob("*")):
        target = out / path.relative_to(previous)
        if path.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, target)
    shutil.rmtree(previous, ignore_errors=True)


def check_out(out: Path) -> None:
    """A `UserError` unless `out` is missing, empty, or a site this command built before."""
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise UserError(f"--out {out}: holds files not written by `tfla-bench site`; give an empty folder")


def _prepare(out: Path) -> Path | None:
    """An empty folder, or one this command built before: its pages go to `PREVIOUS` (returned), from
    where `_reuse` takes what has not changed."""
    previous = None
    check_out(out)
    if out.is_dir() and any(out.iterdir()):
        previous = out / PREVIOUS
        shutil.rmtree(previous, ignore_errors=True)
        previous.mkdir()
        for name in SUBFOLDERS:
            if (out / name).exists():
                shutil.move(out / name, previous / name)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("built by tfla-bench site; a rebuild replaces this folder's pages\n")
    for name in SUBFOLDERS:
        (out / name).mkdir()
    (out / FIGURES).mkdir(exist_ok=True)
    rundir.write_atomic(out / "style.css", SITE_CSS)
    rundir.write_atomic(out / "site.js", SITE_JS)
    return previous


def build_site(
    paths: list[Path],
    out: Path,
    warn: Callable[[str], None],
    progress: Callable[[str, int, int], None] = lambda what, done, total: None,
    jobs: int | None = None,
) -> Site:
    """Build the site of the runs in `paths` (run directories or folders of them) into `out`.

    Args:
        paths: run directories, or folders holding them.
        out: the site's folder: empty, missing, or a site built before (its pages are replaced).
        warn: receives one line per run left out or row skipped.
        progress: called with (what, done, total) as the run pages and history figures are drawn.
        jobs: processes drawing side by side; default one per CPU.

    Raises:
        UserError: a path that does not exist, no run directory, no run that can be read, or an
            `out` holding other files.
    """
    runs, left_out = read_runs(rundir.find_runs(paths), warn)
    if not runs:
        raise UserError(f"none of the {len(left_out)} run(s) could be read; see the warnings above")
    previous = _prepare(out) or out / PREVIOUS
    try:
        points = history([run.rows for run in runs])
        groups = list(points.groupby(["spec", "kernel", "mode"], sort=True))
        jobs = max(1, min(jobs or os.cpu_count() or 1, len(runs)))
        code = code_digest()
        headlines: dict[str, str] = {}
        linked: set[str] = set()  # the files of `FIGURES` that some run page links
        figures: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
        total, done = len(runs) + len(groups), 0
        shared = (out / FIGURES, code)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("fork")) as pool:
            pages = {}
            # The largest runs first, so that no long page is left to draw alone at the end.
            for run in sorted(runs, key=lambda r: len(r.rows.rows), reverse=True):
                key, folder = run_key(code, run, out), (out / run.page).with_suffix("")
                old = previous / "runs" / run.rows.name
                kept = _reuse(old, folder, key, (old.with_suffix(".html"), out / run.page), out / FIGURES)
                if kept is not None:
                    headlines[run.rows.name] = kept["headline"]
                    linked.update(kept["figures"])
                    done += 1
                else:
                    page = pool.submit(_run_page, run.run_dir, run.gpu_pick, out / run.page, key, shared)
                    pages[page] = run
            drawn = {}
            for (spec, kernel, mode), group in groups:
                key = hashlib.sha256((code + group.to_csv()).encode()).hexdigest()
                folder = Path("history", _slug(spec), f"{kernel}-{mode}")
                kept = _reuse(previous / folder, out / folder, key)
                if kept is not None:
                    figures[(spec, kernel, mode)] = [tuple(pair) for pair in kept["files"]]
                    done += 1
                else:
                    drawn[pool.submit(_history_figures, group, f"{kernel} {mode}", out / folder, key)] = (
                        spec,
                        kernel,
                        mode,
                    )
            progress("reused", done, total)
            # The spec pages' comparisons and figures are drawn here while the pool draws the rest.
            specs = sorted({run.rows.spec for run in runs})
            of_spec = {spec: [run for run in runs if run.rows.spec == spec] for spec in specs}
            compared = {spec: _spec_sections(spec, of_spec[spec], out, warn) for spec in specs}
            for future, run in pages.items():
                headline, files, reason = future.result()
                if reason is not None:
                    warn(f"warning: no page for {run.run_dir}: {reason}")
                    headline = f"(no report: {reason})"
                headlines[run.rows.name] = headline
                linked.update(files)
                done += 1
                progress("run pages", done, total)
            for future, group_key in drawn.items():
                figures[group_key] = future.result()
                done += 1
                progress("history figures", done, total)
        for spec in specs:
            page = _spec_page(spec, of_spec[spec], headlines, compared[spec])
            rundir.write_atomic(out / "specs" / f"{_slug(spec)}.html", page)
            spec_points = points[points["spec"] == spec]
            spec_figures = {(k, m): f for (s, k, m), f in figures.items() if s == spec}
            rundir.write_atomic(
                out / "history" / f"{_slug(spec)}.html",
                _history_page(spec, spec_points, spec_figures, len(of_spec[spec])),
            )
        index = out / "index.html"
        moved = len(flagged(points))
        rundir.write_atomic(index, _index_page(runs, headlines, left_out, specs, moved))
    except BaseException:  # an error or Ctrl-C part way: the site built before stays whole
        _restore(out, previous)
        raise
    shutil.rmtree(previous, ignore_errors=True)
    for path in (out / FIGURES).iterdir():
        if path.name not in linked:
            path.unlink()
    gpus = sorted({run.rows.gpu for run in runs})
    return Site(index, runs, left_out, specs, gpus, moved)


# ----------------------------------------------------------------------------------------------
# Pages


def _page(title: str, body: str, depth: int = 1) -> str:
    up = "../" * depth
    nav = f'<nav><a href="{up}index.html">All runs</a></nav>' if depth else ""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{html.escape(title)}</title><link rel="stylesheet" href="{up}style.css"></head><body>\n'
        f'{nav}<h1>{html.escape(title)}</h1>\n{body}\n<script src="{up}site.js"></script>\n</body></html>\n'
    )


def _cell(value: object) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _table(table_id: str, headings: Iterable[str], rows: str) -> str:
    """A sortable table of ready rows (`<tr>...</tr>`) in a box that scrolls sideways."""
    head = "".join(f"<th>{html.escape(name)}</th>" for name in headings)
    return (
        f'<div class="scroll"><table class="data sortable runs" id="{table_id}">'
        f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _run_cells(run: SiteRun, headlines: dict[str, str], up: str) -> str:
    """A run's date (linked to its page), commit, cases ok of all and headline, as table cells."""
    facts = run.rows
    return (
        f"<td>{_link(up + run.page, facts.date[:16].replace('T', ' '))}</td>{_cell(facts.commit)}"
        f"{_cell(f'{run.ok} / {len(facts.rows)}')}{_cell(headlines.get(facts.name, ''))}"
    )


def _span(dates: Iterable[str]) -> str:
    days = sorted({date[:10] for date in dates})
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def _index_page(
    runs: list[SiteRun], headlines: dict[str, str], left_out: dict[str, str], specs: list[str], moved: int
) -> str:
    gpus = sorted({run.rows.gpu for run in runs})
    kernels = sorted({kernel for run in runs for kernel in run.kernels})
    flags = (
        f"{moved} change(s) beyond the noise of both runs in the history of the specs below."
        if moved
        else "No case changed beyond the noise of both runs between runs of one GPU."
    )
    lead = (
        f'<p class="lead">{len(runs)} run(s) of {len(specs)} spec(s) on {len(gpus)} GPU(s), '
        f"{html.escape(_span(run.rows.date for run in runs))}. {flags}</p>"
    )
    spec_links = " · ".join(
        f"{_link(f'specs/{_slug(s)}.html', s)} ({_link(f'history/{_slug(s)}.html', 'history')})"
        for s in specs
    )
    filters = "".join(
        f'<label>{label}<select class="filter" data-key="{key}"><option value="">all</option>'
        + "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)
        + "</select></label>"
        for label, key, values in (
            ("spec", "spec", specs),
            ("GPU", "gpu", gpus),
            ("kernel", "kernel", kernels),
        )
    )
    body = []
    for run in sorted(runs, key=lambda r: r.rows.date, reverse=True):
        facts = run.rows
        data = (
            f'data-spec="|{html.escape(facts.spec)}|" data-gpu="|{html.escape(facts.gpu)}|" '
            f'data-kernel="|{html.escape("|".join(run.kernels))}|"'
        )
        body.append(
            f"<tr {data}><td>{_link(f'specs/{_slug(facts.spec)}.html', facts.spec)}</td>{_cell(facts.gpu)}"
            f"{_run_cells(run, headlines, '')}</tr>"
        )
    table = _table("runs", ("spec", "GPU", "date", "commit", "cases ok", "headline"), "".join(body))
    missing = ""
    if left_out:
        items = "".join(
            f"<li><code>{html.escape(p)}</code>: {html.escape(r)}</li>" for p, r in left_out.items()
        )
        missing = f"<h2>Left out</h2><p>These could not be read:</p><ul>{items}</ul>"
    body_html = (
        f'{lead}<p>Specs: {spec_links}</p><p class="filters">{filters} '
        f'<span class="note"><span id="shown">{len(runs)}</span> of {len(runs)} shown; a click on a column '
        f"head sorts; the date opens the run's report.</span></p>{table}{missing}"
    )
    return _page("tfla-bench: every run", body_html, depth=0)


def _series_name(run: SiteRun) -> str:
    return f"{run.rows.gpu} · {run.rows.commit}"


def _side_by_side(spec: str, runs: list[SiteRun], paper: pd.DataFrame, out: Path) -> str:
    """One table per mode: a row per case, a column per GPU and commit (its latest run) and the paper;
    before them, the figure of each column against the paper (`paper_ratio_figure`)."""
    latest: dict[str, SiteRun] = {}
    for run in sorted(runs, key=lambda r: r.rows.date):
        latest[_series_name(run)] = run
    chosen: list[SiteRun] = []
    for gpu in sorted({run.rows.gpu for run in latest.values()}):
        of_gpu = sorted((r for r in latest.values() if r.rows.gpu == gpu), key=lambda r: r.rows.date)
        chosen += of_gpu[-SERIES_PER_GPU:]
    records = []
    for run in chosen:
        for row in run.rows.rows:
            if row.status == "ok" and row.median_ms:
                records.append(
                    {"kernel": row.case.kernel, "mode": row.case.mode, "case": case_text(row),
                     "series": _series_name(run), "median_ms": row.median_ms}
                )  # fmt: skip
    if not records:
        return '<p class="note">(no row ran)</p>'
    frame = pd.DataFrame(records + paper.to_dict("records"))
    table = frame.pivot_table(index=["mode", "kernel", "case"], columns="series", values="median_ms")
    order = [_series_name(run) for run in chosen] + ([PAPER] if PAPER in table.columns else [])
    table = table[order].reset_index().rename_axis(columns=None)
    table = table.sort_values("case", key=lambda cases: cases.map(_natural), kind="stable")
    table = table.sort_values(["mode", "kernel"], kind="stable")
    parts = []
    title = f"{spec}: each GPU and commit against the paper's numbers"
    figure = paper_ratio_figure(table, [_series_name(run) for run in chosen], PAPER, title)
    if figure is not None:
        src = report.figure_src(
            "against-the-paper", figure, out / "specs" / _slug(spec), out / "specs", quick=True
        )
        caption = (
            "Per kernel, runtime / the paper's runtime (geometric mean over the cases both have) of the "
            "latest run of each GPU and commit; the line at 1 is the paper."
        )
        parts.append(report.figure_html(1, "against-the-paper", caption, src))
    for mode, part in table.groupby("mode", sort=True):
        parts.append(f"<h3>{html.escape(str(mode))}: median runtime [ms]</h3>")
        parts.append(report.frame_html(part.drop(columns="mode"), f"side-by-side-{mode}"))
    return "\n".join(parts)


def _paper_series(runs: list[SiteRun], warn: Callable[[str], None]) -> pd.DataFrame:
    """The paper's median runtime per case of the spec's latest run that names a published data set."""
    for run in sorted(runs, key=lambda r: r.rows.date, reverse=True):
        try:
            loaded = load_run(run.run_dir, run.gpu_pick)
            name = resolve_published_name(loaded, None)
            if name is None:
                continue
            matched = compare_run(loaded, name).matched
        except UserError as exc:
            warn(f"warning: no paper series from {run.run_dir}: {exc}")
            continue
        # `load_run` keeps the rows `read_runs` kept, in the same order: `row_id` is an index into both.
        cases = [case_text(run.rows.rows[i]) for i in matched["row_id"]]
        return pd.DataFrame(
            {"kernel": matched["kernel"].to_list(), "mode": matched["mode"].to_list(), "case": cases,
             "series": PAPER, "median_ms": matched["published_ms"].to_list()}
        ).dropna(subset=["median_ms"])  # fmt: skip
    return pd.DataFrame(columns=["kernel", "mode", "case", "series", "median_ms"])


def _cross_gpu(spec: str, runs: list[SiteRun], out: Path, warn: Callable[[str], None]) -> str:
    latest: dict[str, SiteRun] = {}
    for run in sorted(runs, key=lambda r: r.rows.date):
        latest[run.rows.gpu] = run
    gpus = sorted(latest)
    if len(gpus) < 2:
        return f'<p class="note">Only {html.escape(gpus[0])} ran this spec: no second GPU to compare.</p>'
    parts = []
    for i, gpu_a in enumerate(gpus):
        for gpu_b in gpus[i + 1 :]:
            a, b = latest[gpu_a], latest[gpu_b]
            heading = f"<h3>{html.escape(gpu_b)} against {html.escape(gpu_a)}</h3>"
            try:
                found = compare_gpus(a.run_dir, b.run_dir, gpu_a=a.gpu_pick, gpu_b=b.gpu_pick)
            except UserError as exc:
                parts.append(f'{heading}<p class="note">No comparison: {html.escape(str(exc))}</p>')
                continue
            lines = "".join(f"<li>{html.escape(w)}</li>" for w in found.warnings)
            parts.append(
                f"{heading}<p>The latest runs: A {_link(f'../{a.page}', a.rows.name)} "
                f"({html.escape(found.a.describe())}), B {_link(f'../{b.page}', b.rows.name)} "
                f"({html.escape(found.b.describe())}). Speed-up = runtime A / runtime B (above 1: B "
                "faster) beside the roofline model's prediction.</p>"
                + report.frame_html(summarize(found.rows), f"cross-gpu-{i}")
                + (f"<ul>{lines}</ul>" if lines else "")
            )
            figure = speedup_figure(found)
            if figure is not None:
                name = f"compare-gpus-{_slug(gpu_a)}-{_slug(gpu_b)}"
                src = report.figure_src(name, figure, out / "specs" / _slug(spec), out / "specs", quick=True)
                parts.append(
                    report.figure_html(2, name, "Measured against predicted speed-up per case.", src)
                )
    return "\n".join(parts)


def _spec_sections(spec: str, runs: list[SiteRun], out: Path, warn: Callable[[str], None]) -> str:
    """The spec page's runs side by side and across GPUs, with their figures (no run page needed)."""
    side = _side_by_side(spec, runs, _paper_series(runs, warn), out)
    shown = f"the latest run of each GPU and commit, the {SERIES_PER_GPU} latest commits of each GPU"
    return (
        f"<h2>Side by side</h2><p>Median runtime per case: {shown}, and the paper's published numbers "
        f"({PAPER}) where the run's data set has the case.</p>{side}"
        f"<h2>Across GPUs</h2>{_cross_gpu(spec, runs, out, warn)}"
    )


def _spec_page(spec: str, runs: list[SiteRun], headlines: dict[str, str], sections: str) -> str:
    """The spec page: its runs (with the headlines of their pages), then its `_spec_sections`."""
    gpus = sorted({run.rows.gpu for run in runs})
    commits = {run.rows.commit for run in runs}
    lead = (
        f'<p class="lead">{len(runs)} run(s) of {html.escape(spec)} on {html.escape(", ".join(gpus))}, '
        f"{len(commits)} commit(s), {html.escape(_span(run.rows.date for run in runs))}. "
        f"{_link(f'../history/{_slug(spec)}.html', 'History of every case')}.</p>"
    )
    rows = "".join(
        f"<tr>{_cell(run.rows.gpu)}{_run_cells(run, headlines, '../')}</tr>"
        for run in sorted(runs, key=lambda r: (r.rows.gpu, r.rows.date))
    )
    table = _table("spec-runs", ("GPU", "date", "commit", "cases ok", "headline"), rows)
    return _page(f"{spec}: runs side by side", f"{lead}<h2>Runs</h2>{table}{sections}")


def _history_page(
    spec: str, points: pd.DataFrame, figures: dict[tuple[str, str], list[tuple[str, str]]], runs: int
) -> str:
    moved = flagged(points)
    cases = points[["kernel", "mode", "case"]].drop_duplicates()
    if points.empty:
        lead = f"No case of {spec} was measured ok by two or more runs: no history."
    elif moved.empty:
        lead = (
            f"No change beyond the noise of both runs: {len(cases)} case(s) over {runs} run(s), each point "
            "set against the one before it on its GPU by the rule tfla-bench diff gates on."
        )
    else:
        slower = int((moved["verdict"] == "slower").sum())
        lead = (
            f"{len(moved)} change(s) beyond the noise of both runs: {slower} slower, {len(moved) - slower} "
            f"faster, over {len(cases)} case(s) and {runs} run(s), by the rule tfla-bench diff gates on."
        )
    parts = [f'<p class="lead" id="history-lead">{html.escape(lead)}</p>']
    if not moved.empty:
        rows = "".join(
            f'<tr class="flag-{r.verdict}">{_cell(r.kernel)}{_cell(r.mode)}{_cell(r.case)}{_cell(r.gpu)}'
            f"<td>{_link(f'../runs/{r.run}.html', r.run)}</td>{_cell(r.commit)}{_cell(f'{r.ratio:.3f}')}"
            f"{_cell(f'{r.noise:.3f}')}{_cell(r.verdict)}</tr>"
            for r in moved.head(FLAGGED_SHOWN).itertuples()
        )
        more = (
            f" The {FLAGGED_SHOWN} largest of {len(moved)} are listed." if len(moved) > FLAGGED_SHOWN else ""
        )
        parts.append(
            "<h2>Changes beyond the noise</h2><p>Each against the run before it on its GPU: ratio = this "
            f"run's median / the one before; noise = the sum of both rows' relative uncertainty.{more}</p>"
            + _table(
                "flagged",
                ("kernel", "mode", "case", "GPU", "run", "commit", "ratio", "noise", "verdict"),
                rows,
            )
        )
    flagged_cases = set(zip(moved["kernel"], moved["mode"], moved["case"], strict=True))
    for number, ((kernel, mode), files) in enumerate(sorted(figures.items())):
        options = []
        first = next((f for c, f in files if (kernel, mode, c) in flagged_cases), files[0][1])
        for case, file in files:
            mark = " (changed)" if (kernel, mode, case) in flagged_cases else ""
            selected = " selected" if file == first else ""
            src = f"{_slug(spec)}/{kernel}-{mode}/{file}"
            options.append(
                f'<option value="{html.escape(src)}"{selected}>{html.escape(case + mark)}</option>'
            )
        img = f"history-img-{number}"
        parts.append(
            f"<h2>{html.escape(kernel)} {html.escape(mode)}</h2>"
            f'<select class="case-select" data-img="{img}" aria-label="case">{"".join(options)}</select>'
            f'<figure><img id="{img}" alt="{html.escape(kernel)} {html.escape(mode)} history" '
            f'src="{html.escape(f"{_slug(spec)}/{kernel}-{mode}/{first}")}"></figure>'
        )
    return _page(f"{spec}: history", "\n".join(parts))
