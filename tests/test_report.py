"""The one-page HTML report: every table and every figure of a run, self-contained."""

from __future__ import annotations

import base64
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from synthetic_run import fig5_rows, write_run

from tfla_bench.analyse.compare import compare_run, comparison_tables, load_run
from tfla_bench.analyse.report import build_report, failures_table, list_text, write_report
from tfla_bench.cli.main import main
from tfla_bench.model.hardware import ACCELERATORS
from tfla_bench.plots.base import render
from tfla_bench.plots.catalog import plots, run_context
from tfla_bench.run import rundir

FIG5 = "tfla_fig5_consttoken_rerun_nh16"
TABLE_IDS = (
    "env",
    "env-packages",
    "env-measurement",
    "status-summary",
    "results",
    "failures",
    "compare-fw",
    "compare-fwbw",
    "compare-normalized-fw",
    "compare-normalized-fwbw",
    "run-only",
    "published-only",
    "roofline-fraction",
    "mapping",
)


def fw_rows():
    # Forward rows only: every kind of table and figure, at half the rendering cost.
    return [r for r in fig5_rows(seq_lens=(4096, 8192)) if r["mode"] == "fw"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run_dir = write_run(tmp_path_factory.mktemp("runs") / "fig5_consttoken-20250101-000000", fw_rows())
    path = write_report(run_dir)
    return run_dir, path, path.read_text()


def test_report_is_written_beside_the_run_by_default(report):
    run_dir, path, _ = report
    assert path == run_dir / "report.html"


def test_report_holds_every_table(report):
    _, _, page = report
    tables = {"compare-fwbw", "compare-normalized-fwbw"}  # the fw-only run has no fwbw tables
    for table_id in set(TABLE_IDS) - tables:
        assert f'id="{table_id}"' in page, table_id
    for section in (
        "environment",
        "status",
        "results",
        "failures",
        "comparison",
        "roofline",
        "mapping",
        "figures",
    ):
        assert f'<section id="{section}">' in page
    # The failures table names each failed row's reason; the env table its GPU and packages.
    assert "LLVM ERROR: SLPVectorizer assertion" in page
    assert "flash_attn_interface is not installed" in page
    assert "NVIDIA H100 80GB HBM3" in page and "mlstm-kernels" in page
    assert "params differ: published causal=False, run causal=True" in page
    assert "fused_chunk_gla" in page


def test_report_comparison_table_has_the_ratio_values(report):
    run_dir, _, page = report
    table = comparison_tables(compare_run(load_run(run_dir), FIG5))["fw"]
    section = page[page.index('id="compare-fw"') :]
    section = section[: section.index("</table>")]
    for ratio in table["ms ratio"].dropna():
        assert f"{ratio:.4g}" in section


def test_report_embeds_every_figure_as_png(report):
    run_dir, _, page = report
    run = load_run(run_dir)
    context = run_context(run, compare_run(run, FIG5), [ACCELERATORS["h100"], ACCELERATORS["h200"]])
    drawn = render(plots(context, ["run", "measured"]), context)
    expected = {plot.name for plot, _ in drawn}
    names = set(re.findall(r'<span class="note">\(([^)<]+)\.png\)</span></figcaption>', page))
    assert names == expected
    for plot, _ in drawn:
        assert html.escape(plot.caption) in page
    sources = re.findall(r'src="([^"]+)"', page)
    assert len(sources) == len(expected)
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<link" not in page and "<script src" not in page


def small_rows():
    return [r for r in fw_rows() if r["kernel"] in ("tfla_exp", "sdpa_cudnn")]


def test_report_on_a_gpu_the_model_does_not_know(tmp_path):
    run_dir = write_run(tmp_path / "run", small_rows(), gpu_name="NVIDIA RTX 4090")
    page = build_report(load_run(run_dir), FIG5, [ACCELERATORS["h100"]])
    assert "H100 SXM (assumed: NVIDIA RTX 4090 is not in the model)" in page
    assert 'id="compare-fw"' in page and 'id="compare-normalized-fw"' not in page
    assert "No roofline normalization" in page


def test_cli_report_with_out_and_published_none(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", small_rows())
    out = tmp_path / "pages" / "page.html"
    assert main(["report", str(run_dir), "--published", "none", "--out", str(out)]) == 0
    assert out.is_file() and not (run_dir / "report.html").exists()
    assert f"wrote {out}" in capsys.readouterr().out.replace("\n", "")
    assert '<section id="comparison">' not in out.read_text()


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("spec.json", "", "spec.json is not readable JSON: Expecting value"),
        ("spec.json", '{"name": "tr', "spec.json is not readable JSON"),
        ("spec.json", "[]", "spec.json is not a spec record"),
        ("selection.json", "", "selection.json is not readable JSON"),
        ("selection.json", '{"kernels": 3}', "selection.json: expected"),
    ],
)
def test_report_on_a_run_whose_own_records_are_broken_warns_once(tmp_path, capsys, name, text, expected):
    run_dir = write_run(tmp_path / "run", small_rows())
    (run_dir / name).write_text(text)
    assert main(["report", str(run_dir), "--published", "none", "--out", str(tmp_path / "r.html")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and expected in warnings[0], warnings
    assert warnings[0].endswith("the rows are read as they are, but --resume cannot continue this run")


def test_report_shows_the_gate_of_a_checked_sweep(tmp_path):
    from tfla_bench.run import correctness

    run_dir = write_run(tmp_path / "fig5_consttoken-20250101-000000", fw_rows()[:4])
    assert 'id="gate"' not in build_report(load_run(run_dir), None, [ACCELERATORS["h100"]])
    gate = [
        correctness.GateResult("tfla_sig", "ok", 3.1e-3, 2e-2, True, None),
        correctness.GateResult("mlstm_kernels_exp", "crashed", None, None, False, "killed by SIGABRT"),
    ]
    correctness.write_gate(run_dir / rundir.CHECK, gate, "NVIDIA H100 80GB HBM3")
    page = build_report(load_run(run_dir), None, [ACCELERATORS["h100"]])
    assert '<section id="gate">' in page and 'id="gate"' in page
    assert "killed by SIGABRT" in page and "on NVIDIA H100 80GB HBM3" in page


def test_report_shows_where_the_time_went(tmp_path):
    from tfla_bench.run import phases

    run_dir = write_run(tmp_path / "fig5_consttoken-20250101-000000", fw_rows()[:4])
    assert 'id="timings"' not in build_report(load_run(run_dir), None, [ACCELERATORS["h100"]])
    clock = phases.PhaseClock()
    with clock.phase("measuring"):
        clock.add_case("sdpa_flash", 12.5)
    clock.write(run_dir)
    page = build_report(load_run(run_dir), None, [ACCELERATORS["h100"]])
    assert '<section id="timings">' in page and "adapter sdpa_flash" in page and "phase measuring" in page


class _Page(HTMLParser):
    """The tables (id, classes, header, rows of cell texts) and figure captions of a report page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, dict] = {}
        self.captions: list[str] = []
        self.meta: list[dict] = []
        self._table: dict | None = None
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._caption: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "meta":
            self.meta.append(attrs)
        elif tag == "table":
            self._table = {"classes": (attrs.get("class") or "").split(), "header": [], "rows": []}
            self.tables[attrs.get("id", "")] = self._table
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "figcaption":
            self._caption = []

    def handle_data(self, data):
        for sink in (self._cell, self._caption):
            if sink is not None:
                sink.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            key = "header" if not self._table["header"] else "rows"
            if key == "header":
                self._table["header"] = self._row
            else:
                self._table["rows"].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "figcaption":
            self.captions.append(" ".join("".join(self._caption).split()))
            self._caption = None


def parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    return parser


def test_report_tables_and_captions_parse_as_html(report):
    _, _, page = report
    parsed = parse(page)
    assert {"name": "viewport", "content": "width=device-width, initial-scale=1"} in parsed.meta
    assert set(TABLE_IDS) - {"compare-fwbw", "compare-normalized-fwbw"} <= set(parsed.tables)
    results = parsed.tables["results"]
    assert results["header"][:3] == ["kernel", "mode", "dtype"] and len(results["rows"]) > 10
    assert "sortable" in results["classes"] and "sortable" not in parsed.tables["failures"]["classes"]
    for table in parsed.tables.values():
        for row in table["rows"]:
            assert not any(cell.startswith("{") for cell in row), row  # no dict dumped into a cell
    devices = parsed.tables["env-devices"]
    assert devices["header"][:3] == ["device", "name", "uuid"] and "nvml.max_sm_mhz" in devices["header"]
    assert [row[0] for row in devices["rows"]] == ["cuda:0", "cuda:1"]
    env = {row[0]: row[1] for row in parsed.tables["env-measurement"]["rows"]}
    assert env["warmup"] == "10" and env["l2_flush"] == "True"
    assert len(parsed.captions) >= 5
    for caption in parsed.captions:
        assert caption.startswith("Figure ") and len(caption.split()) > 8, caption
    assert any("paper Fig. 5" in caption for caption in parsed.captions)
    assert 'class="scroll"' in page and "<script>" in page


def test_failures_are_grouped_by_reason(tmp_path):
    rows = fw_rows()
    crashed = [r for r in rows if r["status"] == "crashed"]
    assert len(crashed) == 2  # one LLVM crash per sequence length
    page = build_report(load_run(write_run(tmp_path / "run", rows)), None, [ACCELERATORS["h100"]])
    failures = parse(page).tables["failures"]
    assert failures["header"] == ["status", "reason", "rows", "kernels", "seq_len"]
    llvm = [row for row in failures["rows"] if "LLVM ERROR" in row[1]]
    assert len(llvm) == 1 and llvm[0][2] == "2"
    assert llvm[0][3] == "mlstm_kernels_exp fw ×2" and llvm[0][4] == "4096, 8192"
    assert page.count("LLVM ERROR: SLPVectorizer assertion") == 1


def test_failures_at_different_addresses_are_one_group():
    results = pd.DataFrame(
        [
            {"kernel": "k", "mode": "fw", "seq_len": 1024, "status": "crashed", "error": "abort at 0x7f12"},
            {"kernel": "k", "mode": "fwbw", "seq_len": 2048, "status": "crashed", "error": "abort at 0x7f99"},
            {"kernel": "k", "mode": "fw", "seq_len": 4096, "status": "ok", "error": ""},
        ]
    )
    table = failures_table(results)
    assert len(table) == 1 and table["rows"].iloc[0] == 2 and table["kernels"].iloc[0] == "k fw ×1, k fwbw ×1"


def test_report_of_a_cpu_run_names_cpu_and_leaves_out_roofs_and_throttling(tmp_path):
    run_dir = write_run(tmp_path / "run", small_rows(), gpu_name=None)
    page = build_report(load_run(run_dir), None)
    assert "on CPU" in page and "A run on a CPU" in page
    gpu_only = ("roofline_fraction.png", "measured_roofline_", 'id="roofs"', 'id="roofline"', "--no-roofs")
    for text in (*gpu_only, "grey ring", "no throttling"):
        assert text not in page, text


def test_a_cpu_smoke_report_says_which_times_are_no_speed_claim():
    # A real smoke sweep on a 2-core CPU, our tfla_sig in Triton's interpreter.
    run = load_run(Path(__file__).parent / "data" / "smoke-cpu-a")
    page = build_report(run, None)
    headline = page.split('id="headline"')[1].split("</section>")[0]
    assert "2 row(s) carry no speed claim" in headline and "tfla_sig fw ×2" in headline
    fastest = parse(page).tables["fastest"]
    assert not any("tfla_sig" in cell for row in fastest["rows"] for cell in row)
    shares = parse(page).tables["timings"]
    column = shares["header"].index("share")
    assert all(row[column].endswith("%") for row in shares["rows"] if row[column])


def section_order(page):
    return re.findall(r'<section id="([^"]+)">', page)


def test_the_page_leads_with_the_headline_and_ends_with_the_folded_environment(report):
    _, _, page = report
    order = section_order(page)
    assert order[:3] == ["headline", "figures", "status"] and order[-1] == "environment"
    environment = page[page.index('<section id="environment">') :]
    assert environment.index("<details><summary>") < environment.index('id="env"')
    assert "NVIDIA H100 80GB HBM3" in environment.split("</summary>")[0]
    # The figures come before the first table of the tables part.
    assert page.index("<figure") < page.index('id="status-summary"')


def test_the_headline_names_the_gpu_and_the_fastest_kernel_per_length(report):
    run_dir, _, page = report
    headline = page[page.index('<section id="headline">') : page.index('<section id="figures">')]
    assert "<b>NVIDIA H100 80GB HBM3</b>" in headline
    results = load_run(run_dir).results
    ok = results[results["status"] == "ok"]
    table = parse(headline).tables["fastest"]
    assert table["header"][:2] == ["T", "B"] and "fw: fastest" in table["header"]
    column = table["header"].index("fw: fastest")
    for cells in table["rows"]:
        at = ok[(ok["seq_len"] == int(cells[0])) & (ok["mode"] == "fw")]
        assert cells[column] == at.loc[at["median_ms"].idxmin(), "kernel"]
    assert "Fastest most often: fw: " in headline


def test_the_headline_sets_our_kernels_against_the_official_ones_and_the_paper(tmp_path):
    rows = fw_rows()
    # The official sigmoid kernel at twice our time at chunk 128; ours also ran other chunk sizes.
    peers = [
        {**r, "kernel": "mlstm_kernels_sig", "median_ms": 2 * r["median_ms"]}
        for r in rows
        if r["kernel"] == "tfla_sig" and r["chunk_size"] == 128
    ]
    run = load_run(write_run(tmp_path / "run", rows + peers))
    headline = parse(build_report(run, FIG5, [ACCELERATORS["h100"]]))
    pairs = {(row[0], row[1]): row for row in headline.tables["ours-vs-official"]["rows"]}
    ok = run.results[run.results["status"] == "ok"]
    best = ok.groupby(["kernel", "seq_len"])["median_ms"].min()
    expected = (best["tfla_sig"] / best["mlstm_kernels_sig"]).median()
    assert float(pairs[("tfla_sig", "mlstm_kernels_sig")][4]) == pytest.approx(expected, rel=1e-3)
    assert pairs[("tfla_exp", "mlstm_kernels_exp")][3] == "0"
    assert "mlstm_kernels_exp: crashed ×2" in pairs[("tfla_exp", "mlstm_kernels_exp")][-1]
    paper = headline.tables["ours-vs-paper"]["rows"]
    kernels = [row[0] for row in paper]
    # Each of our kernels is followed by its official peer; kernels without a peer are not listed.
    assert kernels.index("tfla_sig") + 1 == kernels.index("mlstm_kernels_sig")
    assert "sdpa_cudnn" not in kernels
    sig = next(row for row in paper if row[0] == "tfla_sig")
    assert float(sig[4]) == pytest.approx(0.9)  # the synthetic run is 0.9x the published time


def test_every_finding_says_what_to_do(tmp_path):
    rows = fw_rows()
    for r in rows:
        r["throttled"] = r["kernel"] == "sdpa_flash" and r["status"] == "ok"
    run = load_run(write_run(tmp_path / "run", rows))
    page = build_report(run, None, [ACCELERATORS["h100"]])
    headline = page[page.index('<section id="headline">') : page.index('<section id="figures">')]
    items = re.findall(r"<li><b>(.*?)</b>(.*?)</li>", headline, flags=re.S)
    whats = [what for what, _ in items]
    assert any("rows did not run (crashed ×2, unavailable ×2" in what for what in whats)
    assert any("measured while the GPU throttled" in what for what in whats)
    for _, todo in items:
        assert "<code>tfla-bench " in todo or "<code>nvidia-smi" in todo, todo
    assert f"--resume {run.run_dir} --retry crashed" in headline


def test_status_summary_has_a_column_per_status_and_no_empty_one(report):
    _, _, page = report
    summary = parse(page).tables["status-summary"]
    assert summary["header"][:2] == ["kernel", "mode"] and "" not in summary["header"]
    assert all(len(row) == len(summary["header"]) for row in summary["rows"])
    assert {"ok", "crashed", "unavailable"} <= set(summary["header"])


def test_repeated_list_entries_are_shown_once_with_their_count():
    trace = "worker died (SIGABRT): SLPVectorizer assertion"
    assert list_text([trace] * 16 + ["other"]) == f"{trace} ×16, other"
    cases = [f"mlstm_kernels_exp|fw|T{t}" for t in range(16)]
    text = list_text([{"error": trace, "cases": cases}])
    assert text.count(trace) == 1 and "cases: ×16 (mlstm_kernels_exp|fw|T0" in text
    assert "T15" not in text


def test_the_environment_shows_a_repeated_crash_once(tmp_path):
    run_dir = write_run(tmp_path / "run", small_rows())
    env = json.loads((run_dir / "env.json").read_text())
    trace = "worker died (SIGABRT): SLPVectorizer.cpp assertion"
    env["precompile"] = {"crashed": [{"error": trace, "cases": [f"case{i}"]} for i in range(1)] * 16}
    (run_dir / "env.json").write_text(json.dumps(env))
    page = build_report(load_run(run_dir), None, [ACCELERATORS["h100"]])
    assert page.count("SLPVectorizer.cpp assertion") == 1 and "×16" in page
