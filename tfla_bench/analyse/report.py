"""One self-contained HTML page per run (`tfla-bench report RUN_DIR`), laid out like a paper's
results section.

The page holds the environment (env.json, nested keys flattened to one row each), the jobs of a
sweep through a job scheduler (jobs.json, with links to the logs of the jobs that failed), the
correctness gate when the sweep ran with `--check` (check.json), the sweep's wall time per phase and adapter
(timings.json), a status summary, every result row, the rows that did not run grouped by their
reason (one row per reason, naming the rows it affected), the comparison with the published data
set (per mode, plain and roofline-normalized where the run's GPU is known, plus both sides'
unmatched rows), the roofline fraction per kernel, the measured roofs and the model-vs-measured
bytes where the run has them (`tfla_bench.measure.roofs`, `tfla_bench.run.profiling`), the published-kernel
mapping, and the run and measured figures of `tfla_bench.plots.catalog`, each numbered with its
caption and embedded as base64 PNG: one file to open, nothing beside it.

Every table is an HTML table in a box that scrolls sideways, long ones sort by a click on a
column head (a few lines of inline script), and the page fits a phone's width.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from tfla_bench.analyse.compare import (
    Comparison,
    Run,
    compare_run,
    comparison_tables,
    load_run,
    published_only_summary,
    resolve_published_name,
)
from tfla_bench.analyse.published import PUBLISHED_GPU_NOTE, PUBLISHED_MEMORY_NOTE, mapping_table
from tfla_bench.measure.roofs import from_env, versus_datasheet
from tfla_bench.measure.row import CASE_COLUMNS
from tfla_bench.model.hardware import ACCELERATORS, Accelerator
from tfla_bench.plots.base import device_name, is_cpu_run, render
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
)

REPORT_DPI = 100
SORTABLE_ROWS = 10  # tables longer than this sort by a click on a column head
_STYLE = """
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
@media (max-width: 600px) { body { margin: .5em auto; padding: 0 .5em; } h1 { font-size: 1.3em; }
  table.data { font-size: .75em; } }
"""
# Sorts a table by the clicked column: numbers numerically, text alphabetically, empty cells last.
_SORT_SCRIPT = """
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
    table = df.to_html(
        index=False, na_rep="", float_format=_float, classes=classes, border=0, table_id=table_id
    )
    return f'<div class="scroll">{table}</div>'


def figure_html(number: int, name: str, caption: str, fig: Figure) -> str:
    """A figure as an embedded PNG, numbered, with its caption and file name."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=REPORT_DPI)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    name = html.escape(name)
    return (
        f'<figure id="fig-{name}"><img alt="Figure {number}: {name}" loading="lazy" '
        f'src="data:image/png;base64,{data}"><figcaption><b>Figure {number}.</b> {html.escape(caption)} '
        f'<span class="note">({name}.png)</span></figcaption></figure>'
    )


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts as one `a.b.c` key per leaf; lists as comma-separated text; None as empty."""
    if isinstance(value, dict):
        flat: dict[str, str] = {}
        for key, inner in value.items():
            flat.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat if flat or not prefix else {prefix: ""}
    if isinstance(value, list | tuple):
        text = ", ".join(json.dumps(v) if isinstance(v, dict | list) else str(v) for v in value)
        return {prefix: text}
    return {prefix: "" if value is None else str(value)}


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
    gate = json.loads(path.read_text())
    columns = ["name", "status", "max_rel_error", "tolerance", "passed", "reason"]
    table = pd.DataFrame(gate["results"], columns=columns).rename(columns={"name": "kernel"})
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
    return counts.reset_index()


def results_table(results: pd.DataFrame) -> pd.DataFrame:
    """The result rows with the report's columns (peak memory in GB, params kept)."""
    table = results.assign(peak_memory_gb=results["peak_memory_bytes"] / 1e9)
    params = [c for c in table.columns if c.startswith("param_")]
    columns = [c for c in RESULT_COLUMNS if c in table.columns]
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


def _roofs_section(run: Run) -> str:
    table = roofs_table(run)
    if table is None:
        error = (run.env.get("roofs") or {}).get(
            "error", "the sweep ran with --no-roofs or before roofs existed"
        )
        return f'<p class="note">No measured roofs: {html.escape(str(error))}.</p>'
    roofs = from_env(run.env)
    assert roofs is not None
    check = roof_check(run.results, roofs)
    parts = [
        f"<p>Measured on {html.escape(roofs.gpu_name)} (driver {html.escape(roofs.driver)}) at "
        f"{html.escape(roofs.measured_at)} by <code>tfla-bench roofs</code>.</p>",
        frame_html(table, "measured-roofs"),
    ]
    above = check[check["above_roof"]]
    if above.empty:
        parts.append("<p>No point lies above the measured roof.</p>")
    else:
        parts.append(
            f"<p><b>{len(above)} point(s) lie above the measured roof</b>: their FLOP count or timing is "
            "wrong (intensity from ncu's bytes where profiled, else the model's).</p>"
        )
        columns = [*ROW_SHAPE, "median_ms", "achieved_flops_per_s", "roof_flops_per_s", "intensity_basis"]
        parts.append(frame_html(above[columns], "above-roof"))
    return "\n".join(parts)


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
            f"<p><b>The model is off by more than {MODEL_OFF:.0%}</b> for: {html.escape(names)}.</p>"
        )
    failures = profile_failures(run.results)
    if not failures.empty:
        parts.append("<h3>Cases not profiled</h3>" + frame_html(failures, "profile-failures"))
    return "\n".join(parts)


def _comparison_section(run: Run, plain: Comparison) -> str:
    name = plain.published_name
    parts = [
        f"<p>Run on <b>{html.escape(run.gpu_name)}</b>; published data set <b>{html.escape(name)}</b> "
        f"measured on {html.escape(PUBLISHED_GPU_NOTE)}. Ratios are run / published (&lt; 1: the run is "
        f"faster or leaner); {html.escape(PUBLISHED_MEMORY_NOTE)}.</p>"
    ]
    for mode, table in comparison_tables(plain).items():
        parts.append(f"<h3>{mode}: run vs published</h3>" + frame_html(table, f"compare-{mode}"))
    if run.gpu.accelerator is not None:
        normalized = compare_run(run, name, normalize="roofline")
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
) -> str:
    """The report page of a run as an HTML string.

    Args:
        run: from `load_run`.
        published: the published data set to compare with, or None for none.
        accelerators: roofs for the measured roofline figures; default H100, H200 and the run's GPU.
        links_from: the folder of the page, which links to job logs are relative to; default the
            run directory.
    """
    accelerators = _accelerators(run) if accelerators is None else accelerators
    comparison: Comparison | None = compare_run(run, published) if published else None
    context = run_context(run, comparison, accelerators)
    fractions = roofline_fractions(run, context.accelerators)
    sections: list[tuple[str, str, Callable[[], str]]] = [
        ("environment", "Environment", lambda: _env_tables(run.env)),
    ]
    record = jobs.read(run.run_dir)
    if record is not None:
        where = links_from or run.run_dir
        sections.append(("jobs", "Jobs", lambda: jobs_section(record, run.run_dir, where)))
    gate = gate_table(run.run_dir)
    if gate is not None:
        sections.append(("gate", "Correctness gate", lambda: _gate_section(*gate)))
    timings = phases.read(run.run_dir)
    if timings is not None:
        table = pd.DataFrame(phases.rows(timings))
        sections.append(("timings", "Where the time went", lambda: frame_html(table, "timings")))
    sections += [
        ("status", "Status summary", lambda: frame_html(status_summary(run.results), "status-summary")),
        ("results", "Results", lambda: frame_html(results_table(run.results), "results")),
        (
            "failures",
            "Rows that did not run",
            lambda: (
                "<p>One row per status and reason, with the rows it affected.</p>"
                + frame_html(failures_table(run.results), "failures")
            ),
        ),
    ]
    if comparison is not None:
        sections.append(
            ("comparison", f"Comparison with {published}", lambda: _comparison_section(run, comparison))
        )
    sections += [
        (
            "roofline",
            "Fraction of the roofline bound",
            lambda: (
                _fraction_intro(run, context.accelerators)
                + frame_html(fraction_summary(fractions), "roofline-fraction")
            ),
        ),
        ("roofs", "Measured roofs", lambda: _roofs_section(run)),
    ]
    if "profile_status" in run.results:
        sections.append(("bytes", "Model vs measured bytes", lambda: _bytes_section(run)))
    sections += [
        ("mapping", "Published kernels and our adapters", lambda: frame_html(mapping_table(), "mapping")),
    ]
    drawn = render(plots(context, ["run", "measured"]), context)
    sections.append(
        (
            "figures",
            "Figures",
            lambda: "\n".join(
                figure_html(i, plot.name, plot.caption, fig) for i, (plot, fig) in enumerate(drawn, 1)
            ),
        )
    )

    title = f"tfla-bench report: {run.spec}"
    nav = " ".join(f'<a href="#{sid}">{html.escape(heading)}</a>' for sid, heading, _ in sections)
    body = "\n".join(
        f'<section id="{sid}"><h2>{html.escape(heading)}</h2>\n{content()}\n</section>'
        for sid, heading, content in sections
    )
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f'<p class="note">{html.escape(str(run.run_dir))} on {html.escape(device_name(run))}, started '
        f"{html.escape(str(run.env.get('started_at', '?')))}</p>\n<nav>{nav}</nav>\n{body}\n"
        f"<script>{_SORT_SCRIPT}</script>\n</body></html>\n"
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
