"""One self-contained HTML page per run (`tfla-bench report RUN_DIR`) that leads with the answer.

The page opens with a headline (`tfla_bench.analyse.headline`): what was run and on which GPU, the
fastest kernel per sequence length, our kernels against the official ones and against the paper's
published numbers, and what needs the reader's attention, each item saying what to check or run.
The figures of `tfla_bench.plots.catalog` follow, each numbered with its caption and embedded as
base64 PNG. Then the tables: a status summary, the rows that did not run grouped by their reason
(one row per reason, with its count and the rows it affected), the comparison with the published
data set (a summary per kernel and mode, then every row per mode, plain and roofline-normalized
where the run's GPU is known, plus both sides' unmatched rows), the roofline fraction per kernel,
the measured roofs and the model-vs-measured bytes where the run has them
(`tfla_bench.measure.roofs`, `tfla_bench.run.profiling`), the correctness gate when the sweep ran
with `--check` (check.json), every result row, the sweep's wall time per phase and adapter
(timings.json), the jobs of a sweep through a job scheduler (jobs.json, with links to the logs of
the jobs that failed) and the published-kernel mapping. The environment (env.json, nested keys
flattened to one row each, a repeated list entry shown once with its count) comes last, folded.

Every table is an HTML table in a box that scrolls sideways, long ones sort by a click on a
column head (a few lines of inline script), and the page fits a phone's width: one file to
open, nothing beside it.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from tfla_bench.analyse.compare import (
    Comparison,
    Run,
    compare_run,
    comparison_summary,
    comparison_tables,
    load_run,
    published_only_summary,
    resolve_published_name,
)
from tfla_bench.analyse.headline import (
    above_roof,
    fastest_per_length,
    findings,
    most_often_fastest,
    ours_against_official,
    ours_first,
    own_kernels,
    what_ran,
)
from tfla_bench.analyse.published import PUBLISHED_GPU_NOTE, PUBLISHED_MEMORY_NOTE, mapping_table
from tfla_bench.errors import UserError
from tfla_bench.measure.roofs import from_env, versus_datasheet
from tfla_bench.measure.row import CASE_COLUMNS
from tfla_bench.model.hardware import ACCELERATORS, Accelerator
from tfla_bench.plots.base import (
    FigureContext,
    Plot,
    device_name,
    draw,
    drop_minor_ticks,
    is_cpu_run,
    png_bytes,
    render,
)
from tfla_bench.plots.catalog import plots, run_context
from tfla_bench.plots.measured import own_accelerator, roofline_fractions
from tfla_bench.run import jobs, phases, rundir
from tfla_bench.run.profiling import MODEL_OFF, bytes_by_kernel, profile_failures, roof_check

DEFAULT_ACCELERATORS = ("h100", "h200")
# The facts of each node of a sweep through jobs that the environment section lists.
NODE_FACTS = ("shard", "job_id", "host", "gpu_name", "gpu_count", "driver", "cuda", "torch", "triton")
# The columns that name a row in the failure and run-only tables (a case without its dtype).
ROW_SHAPE = [c for c in CASE_COLUMNS if c != "dtype"]
RESULT_COLUMNS = (
    *CASE_COLUMNS,
    "status",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "first_call_s",
    "peak_memory_gb",
    "tflops",
    "gbps",
    "energy_mj",
    "tokens_per_joule",
)
# Result columns shown only where some row has a value: a run without NVML's energy counter has none.
WHEN_PRESENT = ("energy_mj", "tokens_per_joule")

REPORT_DPI = 100
DIGEST_CHARS = 20  # of a shared figure's digest in its file name (`SharedFigures`)
SORTABLE_ROWS = 10  # tables longer than this sort by a click on a column head
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; padding: 0 1em;
  color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; margin: .5em 0 1.5em; }
table.data { border-collapse: collapse; font-size: .85em; }
table.data th, table.data td { border: 1px solid #ddd; padding: .2em .5em; text-align: right; }
table.data th { background: #f3f3f3; position: sticky; top: 0; }
table.sortable th { cursor: pointer; } table.sortable th:after { content: " \\2195"; color: #aaa; }
table.data td:first-child, table.data th:first-child { text-align: left; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #444; max-width: 60em; } .note { color: #555; font-size: .9em; }
nav a { margin-right: 1em; display: inline-block; }
p.lead { font-size: 1.1em; } ul.findings li { margin-bottom: .5em; max-width: 75em; }
details > summary { cursor: pointer; color: #444; } code { background: #f3f3f3; padding: 0 .2em; }
@media (max-width: 600px) { body { margin: .5em auto; padding: 0 .5em; } h1 { font-size: 1.3em; }
  table.data { font-size: .75em; } }
"""
# Sorts a table by the clicked column: numbers numerically, text alphabetically, empty cells last.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var dir = th.dataset.dir === "asc" ? -1 : 1; th.dataset.dir = dir === 1 ? "asc" : "desc";
      var key = function (r) { var t = r.cells[col].textContent.trim(), n = parseFloat(t);
        return t === "" ? null : (isNaN(n) || !/^[-+.\\d]/.test(t) ? t : n); };
      rows.sort(function (a, b) { var x = key(a), y = key(b);
        if (x === null) return 1; if (y === null) return -1;
        if (typeof x === typeof y) return (x < y ? -1 : x > y ? 1 : 0) * dir;
        return (typeof x === "number" ? -1 : 1) * dir; });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def _float(value: float) -> str:
    return f"{value:.4g}"


def frame_html(df: pd.DataFrame, table_id: str) -> str:
    """A DataFrame as an HTML table with id `table_id` (values escaped, empty cells for NaN) in a
    box that scrolls sideways; sortable when longer than `SORTABLE_ROWS`."""
    if df.empty:
        return f'<p class="note" id="{table_id}">(no rows)</p>'
    classes = ["data", *(["sortable"] if len(df) > SORTABLE_ROWS else [])]
    # Nullable integers (a chunk size that does not apply) print <NA> where na_rep does not reach.
    shown = df.assign(
        **{c: df[c].astype(object).where(df[c].notna(), None) for c in df.columns if df[c].dtype == "Int64"}
    )
    table = shown.to_html(
        index=False, na_rep="", float_format=_float, classes=classes, border=0, table_id=table_id
    )
    # pandas indents every cell on its own line: a third of a long table's bytes.
    table = re.sub(r">\s+<", "><", table)
    # Numbers align right to compare digits; names and reasons read better from the left.
    text = [i for i, c in enumerate(df.columns, 1) if i > 1 and not pd.api.types.is_numeric_dtype(df[c])]
    rules = " ".join(
        f"#{table_id} td:nth-child({i}), #{table_id} th:nth-child({i}) {{ text-align: left; }}" for i in text
    )
    style = f"<style>{rules}</style>" if rules else ""
    return f'{style}<div class="scroll">{table}</div>'


def figure_src(name: str, fig: Figure, figure_dir: Path | None, links_from: Path, quick: bool = False) -> str:
    """Where a page finds a figure: a PNG file `<figure_dir>/<name>.png` (written here) linked relative
    to `links_from`, the page's folder; without `figure_dir` the PNG itself, inline, so the page is
    one file to open. `quick` (a site of many runs) draws it in about half the time: no minor ticks
    on a log axis that its major ticks label (`drop_minor_ticks`), and a PNG a tenth larger."""
    if quick:
        drop_minor_ticks(fig)
    data = png_bytes(fig, REPORT_DPI, squeeze=not quick)
    if figure_dir is None:
        return "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    figure_dir.mkdir(parents=True, exist_ok=True)
    path = figure_dir / f"{name}.png"
    rundir.write_atomic(path, data)
    return Path(os.path.relpath(path, links_from)).as_posix()


@dataclass
class SharedFigures:
    """A folder of figure files named by what they are drawn from, for the pages of a site: a figure's
    file is `<name>-<digest>.png`, the digest of its `Drawing` after `salt` (the code's digest), so
    every page whose figure is drawn from the same inputs links the one file, drawn by the first page
    that needs it (or a build before, into the same folder). Drawn quick (`figure_src`).

    Attributes:
        folder: where the files are.
        salt: the digest of the code that draws them.
        used: the files linked so far.
    """

    folder: Path
    salt: str
    used: set[str] = field(default_factory=set)

    def src(self, plot: Plot, context: FigureContext, links_from: Path) -> str | None:
        """Where a page in `links_from` finds the plot's figure of `context` (drawn now when the folder
        lacks it), or None when the figure has nothing to show."""
        drawing = plot.drawing(context)
        stem = f"{plot.name}-{drawing.digest(self.salt)[:DIGEST_CHARS]}"
        path = self.folder / f"{stem}.png"
        if not path.is_file():
            fig = draw(drawing, quick=True)
            if fig is None:
                return None
            figure_src(stem, fig, self.folder, links_from, quick=True)
        self.used.add(path.name)
        return Path(os.path.relpath(path, links_from)).as_posix()


def figure_html(number: int, name: str, caption: str, src: str) -> str:
    """A figure (its `figure_src`), numbered, with its caption and file name."""
    name = html.escape(name)
    return (
        f'<figure id="fig-{name}"><img alt="Figure {number}: {name}" loading="lazy" '
        f'src="{html.escape(src)}"><figcaption><b>Figure {number}.</b> {html.escape(caption)} '
        f'<span class="note">({name}.png)</span></figcaption></figure>'
    )


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts as one `a.b.c` key per leaf; lists as text (`list_text`); None as empty."""
    if isinstance(value, dict):
        flat: dict[str, str] = {}
        for key, inner in value.items():
            flat.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat if flat or not prefix else {prefix: ""}
    if isinstance(value, list | tuple):
        return {prefix: list_text(value)}
    return {prefix: "" if value is None else str(value)}


LISTED = 3  # a list inside a list entry shows this many items, then its count


def _entry_text(value: Any) -> str:
    if not isinstance(value, dict):
        return json.dumps(value) if isinstance(value, list) else str(value)
    parts = []
    for key, inner in value.items():
        if isinstance(inner, list | tuple) and len(inner) > LISTED:
            shown = ", ".join(str(v) for v in inner[:LISTED])
            parts.append(f"{key}: ×{len(inner)} ({shown}, …)")
        else:
            parts.append(f"{key}: {_entry_text(inner) if isinstance(inner, dict) else inner}")
    return "; ".join(parts)


def list_text(values: list[Any] | tuple[Any, ...]) -> str:
    """A list as comma-separated text, an entry that repeats once with its count (`… ×16`); a list
    inside an entry (the cases of one precompile crash) as its count and first items."""
    counts: dict[str, int] = {}
    for value in values:
        text = _entry_text(value)
        counts[text] = counts.get(text, 0) + 1
    return ", ".join(text if n == 1 else f"{text} ×{n}" for text, n in counts.items())


def _env_tables(env: dict[str, Any]) -> str:
    scalars = {k: v for k, v in env.items() if not isinstance(v, dict) and k not in ("nodes", "device_infos")}
    flat = flatten(scalars)
    parts = [frame_html(pd.DataFrame({"key": list(flat), "value": list(flat.values())}), "env")]
    if env.get("nodes"):
        # A sweep through jobs keeps each node's whole record; one line per node says what differs.
        nodes = pd.DataFrame([{key: node.get(key) for key in NODE_FACTS} for node in env["nodes"]])
        parts.append("<h3>nodes</h3>" + frame_html(nodes, "env-nodes"))
    if env.get("device_infos"):
        # One row per worker's device: a sweep over several GPUs names each of them.
        devices = pd.DataFrame([flatten(info) for info in env["device_infos"]])
        parts.append("<h3>devices</h3>" + frame_html(devices, "env-devices"))
    for key, value in env.items():
        if isinstance(value, dict):
            flat = flatten(value)
            table = pd.DataFrame({"name": list(flat), "value": list(flat.values())})
            parts.append(f"<h3>{html.escape(key)}</h3>" + frame_html(table, f"env-{key}"))
    return "\n".join(parts)


def gate_table(run_dir: Path) -> tuple[str, pd.DataFrame] | None:
    """The device and table of the run's correctness gate (`check.json` of `sweep --check`), or None."""
    path = Path(run_dir) / rundir.CHECK
    if not path.exists():
        return None
    try:
        gate = rundir.read_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not readable JSON: {exc}") from None
    results = gate.get("results") if isinstance(gate, dict) else None
    if not (isinstance(results, list) and all(isinstance(result, dict) for result in results)):
        raise UserError(f'{path}: expected {{"device": ..., "results": [objects]}}, as sweep --check writes')
    columns = ["name", "status", "max_rel_error", "tolerance", "passed", "reason"]
    table = pd.DataFrame(results, columns=columns).rename(columns={"name": "kernel"})
    return str(gate.get("device", "?")), table


def jobs_section(record: jobs.JobsRecord, run_dir: Path, links_from: Path) -> str:
    """The jobs of a sweep through a job scheduler, one row each, with links to the logs of those that
    failed (relative to `links_from`, the page's folder)."""

    def link(path: str) -> str:
        target = os.path.relpath((run_dir / path).resolve(), links_from.resolve())
        return f'<a href="{html.escape(target)}">{html.escape(Path(path).name)}</a>'

    every = record.jobs()
    failed = sum(job.failed for _, job in every)
    body = []
    for one, job in every:
        cells = (one.shard(job), job.job_id, job.state, job.host, str(job.cases), job.error)
        logs = f"{link(job.stdout)} {link(job.stderr)}" if job.failed else ""
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + f"<td>{logs}</td></tr>")
    head = "".join(
        f"<th>{name}</th>" for name in ("shard", "job id", "state", "node", "cases", "error", "logs")
    )
    return (
        f"<p>{len(every)} {html.escape(record.executor)} job(s) in {len(record.rounds)} submission(s); "
        f"{failed} failed (their logs are linked).</p>"
        f'<div class="scroll"><table class="data" id="jobs"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _gate_section(device: str, table: pd.DataFrame) -> str:
    intro = f"<p>Forward output of each kernel against a PyTorch reference, on {html.escape(device)}.</p>"
    return intro + frame_html(table, "gate")


def status_summary(results: pd.DataFrame) -> pd.DataFrame:
    """Rows per kernel and mode, counted by status."""
    counts = results.groupby(["kernel", "mode", "status"]).size().unstack("status", fill_value=0)
    # The unstacked level's name would become an empty header column of its own in the HTML table.
    counts.columns.name = None
    return counts.reset_index()


def results_table(results: pd.DataFrame) -> pd.DataFrame:
    """The result rows with the report's columns (peak memory in GB, params kept; the energy columns
    where some row has energy)."""
    table = results.assign(peak_memory_gb=results["peak_memory_bytes"] / 1e9)
    for column in (c for c in WHEN_PRESENT if c in table.columns):
        table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    params = [c for c in table.columns if c.startswith("param_")]
    columns = [
        c for c in RESULT_COLUMNS if c in table.columns and (c not in WHEN_PRESENT or table[c].notna().any())
    ]
    return table[[*columns[:9], *params, *columns[9:]]]


def failures_table(results: pd.DataFrame) -> pd.DataFrame:
    """Rows whose status is not ok, one row per status and reason: how many rows it cost and which.

    Columns: `status`, `reason`, `rows` (their count), `kernels` (each kernel and mode with its
    count) and `seq_len` (the sequence lengths affected). Memory addresses in a reason are masked,
    so one crash met at several addresses is one group.
    """
    failed = results[results["status"] != "ok"].copy()
    columns = ["status", "reason", "rows", "kernels", "seq_len"]
    if failed.empty:
        return pd.DataFrame(columns=columns)
    failed["reason"] = (
        failed["error"].fillna("").astype(str).str.replace(r"0x[0-9a-fA-F]+", "0x…", regex=True)
    )
    groups = []
    for (status, reason), group in failed.groupby(["status", "reason"], sort=True):
        counts = group.groupby(["kernel", "mode"], sort=True).size()
        kernels = ", ".join(f"{kernel} {mode} ×{n}" for (kernel, mode), n in counts.items())
        seq_lens = ", ".join(str(int(t)) for t in sorted(group["seq_len"].dropna().unique()))
        groups.append((status, reason, len(group), kernels, seq_lens))
    table = pd.DataFrame(groups, columns=columns)
    return table.sort_values(["rows", "status"], ascending=[False, True], kind="stable").reset_index(
        drop=True
    )


def fraction_summary(fractions: pd.DataFrame) -> pd.DataFrame:
    """Median, min and max fraction of the roofline bound per kernel and mode."""
    if fractions.empty:
        return pd.DataFrame(columns=["kernel", "mode", "gpu", "cases", "median", "min", "max"])
    grouped = fractions.groupby(["kernel", "mode", "gpu"])["fraction"]
    return grouped.agg(cases="size", median="median", min="min", max="max").reset_index()


def roofs_table(run: Run) -> pd.DataFrame | None:
    """The run's measured roofs beside the data sheet, or None when it recorded none."""
    roofs = from_env(run.env)
    if roofs is None:
        return None
    rows = [
        {
            "roof": name,
            "measured": measured,
            "data sheet": datasheet,
            "unit": unit,
            "measured / data sheet": measured / datasheet if datasheet else None,
        }
        for name, measured, datasheet, unit in versus_datasheet(roofs)
    ]
    return pd.DataFrame(rows)


def _roofs_section(run: Run, check: pd.DataFrame) -> str:
    table = roofs_table(run)
    if table is None:
        error = (run.env.get("roofs") or {}).get(
            "error", "the sweep ran with --no-roofs or before roofs existed"
        )
        return (
            f'<p class="note">No measured roofs: {html.escape(str(error))}. '
            "<code>tfla-bench roofs</code> on the run's GPU measures them.</p>"
        )
    roofs = from_env(run.env)
    assert roofs is not None
    parts = [
        f"<p>Measured on {html.escape(roofs.gpu_name)} (driver {html.escape(roofs.driver)}) at "
        f"{html.escape(roofs.measured_at)} by <code>tfla-bench roofs</code>.</p>",
        frame_html(table, "measured-roofs"),
    ]
    finding = above_roof(run, check)
    if finding is None:
        parts.append("<p>No point lies above the measured roof.</p>")
    else:
        parts.append(
            f"<p><b>{html.escape(finding.what)}</b> {_code(finding.todo)} (Intensity from ncu's bytes "
            "where profiled, else the model's.)</p>"
        )
        above = check[check["above_roof"]]
        columns = [*ROW_SHAPE, "median_ms", "achieved_flops_per_s", "roof_flops_per_s", "intensity_basis"]
        parts.append(frame_html(above[columns], "above-roof"))
    return "\n".join(parts)


def _code(text: str) -> str:
    """Text with `backticks` as <code>, the rest escaped."""
    pieces = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))


def _bytes_section(run: Run) -> str:
    summary = bytes_by_kernel(roof_check(run.results, from_env(run.env)))
    parts = [
        "<p>Model bytes / DRAM bytes measured by Nsight Compute over one profiled call per case "
        "(median, min and max over the kernel's profiled cases).</p>",
        frame_html(summary, "bytes-model-vs-measured"),
    ]
    off = summary[summary["model_off"]]
    if not off.empty:
        names = ", ".join(f"{k} {m}" for k, m in zip(off["kernel"], off["mode"], strict=True))
        parts.append(
            f"<p><b>The model is off by more than {MODEL_OFF:.0%}</b> for: {html.escape(names)}. Check "
            "each adapter's <code>bytes()</code> against what its kernel reads and writes.</p>"
        )
    failures = profile_failures(run.results)
    if not failures.empty:
        parts.append("<h3>Cases not profiled</h3>" + frame_html(failures, "profile-failures"))
    return "\n".join(parts)


def _comparison_section(run: Run, plain: Comparison, normalized: Comparison | None) -> str:
    name = plain.published_name
    parts = [
        f"<p>Run on <b>{html.escape(run.gpu_name)}</b>; published data set <b>{html.escape(name)}</b> "
        f"measured on {html.escape(PUBLISHED_GPU_NOTE)}. Ratios are run / published (&lt; 1: the run is "
        f"faster or leaner); {html.escape(PUBLISHED_MEMORY_NOTE)}.</p>"
    ]
    parts.append(
        "<h3>Summary per kernel and mode</h3>" + frame_html(comparison_summary(plain), "compare-summary")
    )
    for mode, table in comparison_tables(plain).items():
        parts.append(f"<h3>{mode}: run vs published</h3>" + frame_html(table, f"compare-{mode}"))
    if normalized is not None:
        parts.append(
            "<p>Normalized: each side's runtime divided by its own GPU's roofline bound "
            "max(FLOPs/peak, bytes/bandwidth); a normalized ratio of 1 means the same fraction of the "
            "limit.</p>"
        )
        for mode, table in comparison_tables(normalized).items():
            parts.append(
                f"<h3>{mode}: roofline-normalized</h3>" + frame_html(table, f"compare-normalized-{mode}")
            )
    else:
        parts.append(
            f'<p class="note">No roofline normalization: {html.escape(run.gpu_name)} is not in the model.</p>'
        )
    run_only = plain.measured_only[[*ROW_SHAPE, "status", "reason"]]
    parts.append("<h3>Run rows without a published counterpart</h3>" + frame_html(run_only, "run-only"))
    parts.append(
        "<h3>Published rows without a run row</h3>"
        + frame_html(published_only_summary(plain), "published-only")
    )
    return "\n".join(parts)


def _accelerators(run: Run) -> list[Accelerator]:
    if is_cpu_run(run):
        return []
    accelerators = [ACCELERATORS[name] for name in DEFAULT_ACCELERATORS]
    own = run.gpu.accelerator
    if own is not None and own not in accelerators:
        accelerators.append(own)
    return accelerators


def build_report(
    run: Run,
    published: str | None,
    accelerators: list[Accelerator] | None = None,
    links_from: Path | None = None,
    figures: SharedFigures | None = None,
) -> str:
    """The report page of a run as an HTML string: headline, figures, tables, environment (folded).

    Args:
        run: from `load_run`.
        published: the published data set to compare with, or None for none.
        accelerators: roofs for the measured roofline figures; default H100, H200 and the run's GPU.
        links_from: the folder of the page, which links to job logs and figure files are relative
            to; default the run directory.
        figures: link the figures as files of this folder (a site's), drawn where it lacks them;
            default inline in the page.
    """
    accelerators = _accelerators(run) if accelerators is None else accelerators
    links_from = links_from or run.run_dir
    # One join with the published rows: the plain comparison is the normalized one less its columns.
    normalized = compare_run(run, published, "roofline") if published and run.gpu.accelerator else None
    comparison = normalized.plain() if normalized else compare_run(run, published) if published else None
    context = run_context(run, comparison, accelerators)
    check = roof_check(run.results, from_env(run.env))
    drawn = _figures_html(plots(context, ["run", "measured"]), context, links_from, figures)
    sections: list[Section] = [
        ("headline", "Headline", lambda: headline_html(run, comparison, check)),
        ("figures", "Figures", lambda: drawn or '<p class="note">(no figure: the run sweeps no axis)</p>'),
        *_table_sections(run, (comparison, normalized), context, check, links_from),
        ("environment", "Environment", lambda: _environment_section(run)),
    ]
    return _page(run, sections)


Section = tuple[str, str, Callable[[], str]]


def _figures_html(
    shown: list[Plot], context: FigureContext, links_from: Path, figures: SharedFigures | None
) -> str:
    """The figures of `shown` that have something to show, numbered: inline, or files of `figures`."""
    if figures is None:
        drawn = [(plot, figure_src(plot.name, fig, None, links_from)) for plot, fig in render(shown, context)]
    else:
        drawn = [(plot, figures.src(plot, context, links_from)) for plot in shown]
    linked = [(plot, src) for plot, src in drawn if src is not None]
    return "\n".join(figure_html(i, plot.name, plot.caption, src) for i, (plot, src) in enumerate(linked, 1))


def headline_html(run: Run, comparison: Comparison | None, check: pd.DataFrame) -> str:
    """The opening section: what ran where, who wins, ours against the official kernels and the
    paper, and what needs attention with what to do."""
    ours = own_kernels()
    gpu = f"<b>{html.escape(device_name(run))}</b>"
    parts = [f'<p class="lead">{html.escape(what_ran(run, "GPU")).replace("GPU", gpu, 1)}</p>']
    if is_cpu_run(run):
        parts.append(
            '<p class="note">A run on a CPU: its times are this CPU\'s, and no GPU roof, clock or '
            "throttling applies, so this page leaves those out.</p>"
        )
    fastest = fastest_per_length(run.results)
    parts.append("<h3>Fastest kernel per sequence length</h3>")
    if not fastest.empty:
        parts.append(f"<p>{html.escape(most_often_fastest(fastest))}</p>")
    parts.append(
        "<p>Median runtime of the fastest kernel of each mode at its fastest chunk size; <i>next</i> is "
        "the runner-up and how many times as long it takes.</p>" + frame_html(fastest, "fastest")
    )
    pairs = ours_against_official(run.results)
    if not pairs.empty:
        parts.append("<h3>Our kernels against the official ones</h3>")
        parts.append(
            "<p>Our runtime / the official kernel's, median over the shapes both ran (&lt; 1: ours is "
            "faster).</p>" + frame_html(pairs, "ours-vs-official")
        )
    if comparison is not None:
        summary = ours_first(comparison_summary(comparison), ours)
        parts.append(f"<h3>Against the paper ({html.escape(comparison.published_name)})</h3>")
        parts.append(
            f"<p>Run / published median runtime, the paper measured on {html.escape(PUBLISHED_GPU_NOTE)} "
            '(&lt; 1: faster here). Every kernel: <a href="#comparison">Comparison</a>.</p>'
            + frame_html(summary, "ours-vs-paper")
        )
    found = findings(run, check)
    parts.append("<h3>Needs attention</h3>")
    if found:
        items = "".join(f"<li><b>{html.escape(f.what)}</b> {_code(f.todo)}</li>" for f in found)
        parts.append(f'<ul class="findings">{items}</ul>')
    elif is_cpu_run(run):
        parts.append("<p>Nothing: every row ran.</p>")
    else:
        parts.append("<p>Nothing: every row ran, none above the roof, no throttling.</p>")
    return "\n".join(parts)


def _table_sections(
    run: Run,
    comparisons: tuple[Comparison | None, Comparison | None],
    context: FigureContext,
    check: pd.DataFrame,
    links_from: Path,
) -> list[Section]:
    """The report's tables, the most read first; a table the run has no data for is left out.
    `comparisons`: the plain comparison with the published data set and the roofline-normalized one."""
    comparison, normalized = comparisons
    failures = failures_table(run.results)
    sections: list[Section] = [
        ("status", "Status summary", lambda: frame_html(status_summary(run.results), "status-summary")),
        (
            "failures",
            "Rows that did not run",
            lambda: (
                "<p>One row per status and reason, with the rows it affected.</p>"
                + frame_html(failures, "failures")
            ),
        ),
    ]
    if comparison is not None:
        heading = f"Comparison with {comparison.published_name}"
        sections.append(("comparison", heading, lambda: _comparison_section(run, comparison, normalized)))
    if not is_cpu_run(run):
        fractions = fraction_summary(roofline_fractions(run, context.accelerators))
        sections += [
            (
                "roofline",
                "Fraction of the roofline bound",
                lambda: (
                    _fraction_intro(run, context.accelerators) + frame_html(fractions, "roofline-fraction")
                ),
            ),
            ("roofs", "Measured roofs", lambda: _roofs_section(run, check)),
        ]
    if "profile_status" in run.results:
        sections.append(("bytes", "Model vs measured bytes", lambda: _bytes_section(run)))
    gate = gate_table(run.run_dir)
    if gate is not None:
        sections.append(("gate", "Correctness gate", lambda: _gate_section(*gate)))
    sections.append(("results", "Results", lambda: frame_html(results_table(run.results), "results")))
    timings = phases.read(run.run_dir)
    if timings is not None:
        table = pd.DataFrame(phases.rows(timings))
        table["share"] = table["share"].map(lambda share: "" if pd.isna(share) else f"{share:.1%}")
        sections.append(("timings", "Where the time went", lambda: frame_html(table, "timings")))
    record = jobs.read(run.run_dir)
    if record is not None:
        sections.append(("jobs", "Jobs", lambda: jobs_section(record, run.run_dir, links_from)))
    sections.append(
        ("mapping", "Published kernels and our adapters", lambda: frame_html(mapping_table(), "mapping"))
    )
    return sections


def _page(run: Run, sections: list[Section]) -> str:
    title = f"tfla-bench report: {run.spec}"
    nav = " ".join(f'<a href="#{sid}">{html.escape(heading)}</a>' for sid, heading, _ in sections)
    body = "\n".join(
        f'<section id="{sid}"><h2>{html.escape(heading)}</h2>\n{content()}\n</section>'
        for sid, heading, content in sections
    )
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f'<p class="note">{html.escape(str(run.run_dir))} on {html.escape(device_name(run))}, started '
        f"{html.escape(str(run.env.get('started_at', '?')))}</p>\n<nav>{nav}</nav>\n{body}\n"
        f"<script>{SORT_SCRIPT}</script>\n</body></html>\n"
    )


def _environment_section(run: Run) -> str:
    """The whole environment record, folded under one line that names the stack."""
    env = run.env
    stack = [
        device_name(run),
        *(f"{k} {env[k]}" for k in ("driver", "cuda", "torch", "triton") if env.get(k)),
    ]
    return (
        f"<details><summary>{html.escape(' · '.join(stack))}: GPU, clocks, packages, measurement "
        f"settings, precompile (click to open)</summary>\n{_env_tables(env)}\n</details>"
    )


def _fraction_intro(run: Run, accelerators: list[Accelerator]) -> str:
    if not accelerators:
        return f'<p class="note">{html.escape(device_name(run))} run: no GPU roof bounds it.</p>'
    own, detected = own_accelerator(run, accelerators)
    gpu = (
        own.display_name if detected else f"{own.display_name} (assumed: {run.gpu_name} is not in the model)"
    )
    return f"<p>Model lower-bound runtime / measured runtime on {html.escape(gpu)}.</p>"


def write_report(
    run_dir: Path, published: str | None = None, out: Path | None = None, gpu: str | None = None
) -> Path:
    """Write the run's report page.

    Args:
        run_dir: the run directory.
        published: the published data set; default the run's env.json `published` field;
            `"none"` for no comparison.
        out: the HTML file; default `<run_dir>/report.html` (`report-<gpu>.html` with `gpu`).
        gpu: report the rows of this GPU, for a run that mixes GPUs (`compare.load_run`).

    Returns:
        The written file.
    """
    run = load_run(run_dir, gpu)
    name = resolve_published_name(run, published)
    out = out or Path(run_dir) / rundir.for_gpu(rundir.REPORT, gpu)
    out.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_atomic(out, build_report(run, name, links_from=out.parent))
    return out
