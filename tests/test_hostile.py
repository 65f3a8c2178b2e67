"""Writes that fail part way (a full disk), rows of one case repeated, and the path checks, tested
in one process: what the fault suite (`test_faults.py`) drives through real sweeps, here at each step."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from synthetic_run import ADHOC_RUN, REPO, fig5_rows, write_run

from tfla_bench.cli import paths
from tfla_bench.cli.main import main
from tfla_bench.errors import RunFailed, UserError
from tfla_bench.run import jobs, phases, rundir, specs


@pytest.fixture
def run_dir(tmp_path):
    rows = [r for r in fig5_rows(seq_lens=(8192,)) if r["mode"] == "fw"]
    return write_run(tmp_path / "fig5-20250101-000000", rows)


def _with_spec(run_dir):
    """Give the synthetic run the spec.json a sweep writes (of the smoke spec)."""
    spec = specs.load_spec(Path("experiments/smoke.toml"))
    (run_dir / rundir.SPEC).write_text(json.dumps(spec.to_dict()))


def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_timings_file_that_cannot_be_written_is_removed_once_with_a_warning(tmp_path, monkeypatch, capsys):
    clock = phases.PhaseClock()
    clock.add_case("sdpa_math", 1.0)
    clock.write(tmp_path)
    assert phases.read(tmp_path)["adapters"]["sdpa_math"]["cases"] == 1
    clock.add_case("sdpa_math", 1.0)
    monkeypatch.setattr(rundir, "write_json", _no_space)
    clock.write(tmp_path)
    clock.write(tmp_path)
    assert phases.read(tmp_path) is None  # the record of one case, now out of date, is gone
    err = capsys.readouterr().err
    assert err.count("warning: cannot write") == 1 and "removed the older one" in err
    monkeypatch.undo()
    clock.write(tmp_path)
    assert phases.read(tmp_path)["adapters"]["sdpa_math"]["cases"] == 2


def test_plot_that_fills_the_disk_exits_1_and_leaves_no_empty_folder(run_dir, monkeypatch, capsys):
    monkeypatch.setattr(rundir, "save_atomic", _no_space)
    out = run_dir / "figures-new"
    assert main(["plot", str(run_dir), "--published", "none", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the figures in") and err.count("\n") == 1
    assert "removed the empty folder" in err and not out.exists()


def test_writes_names_the_files_it_did_write(tmp_path):
    folder = tmp_path / "figures"
    with pytest.raises(RunFailed, match=r"1 file\(s\) written before are kept: a.png"):
        with paths.writes("the figures", folder=folder):
            folder.mkdir()
            (folder / "a.png").write_bytes(b"png")
            _no_space()
    assert (folder / "a.png").exists()


def test_report_that_fills_the_disk_exits_1_and_leaves_no_file(run_dir, monkeypatch, capsys):
    monkeypatch.setattr(rundir, "write_atomic", _no_space)
    out = run_dir / "new" / "report.html"
    assert main(["report", str(run_dir), "--published", "none", "--out", str(out)]) == 1
    assert capsys.readouterr().err.startswith("error: cannot write the report")
    assert not out.parent.exists()


def test_a_file_system_without_room_is_refused_before_any_work(tmp_path, monkeypatch):
    full = os.statvfs_result((4096, 4096, 100, 0, 0, 100, 0, 0, 0, 255, 0))
    monkeypatch.setattr(paths.os, "statvfs", lambda _path: full)
    with pytest.raises(UserError, match=r"--out .*: no space left in .* \(0 bytes free; at least 1,048,576"):
        paths.output_dir(tmp_path / "run", "--out")


def test_identical_repeated_rows_are_kept_once_and_different_ones_refused(tmp_path, run_dir):
    csv_path = run_dir / rundir.RESULTS
    read = rundir.read_results(csv_path)
    lines = csv_path.read_text().splitlines(keepends=True)
    csv_path.write_text("".join([*lines, lines[1]]))
    assert len(rundir.read_results(csv_path).for_resume()) == len(read.rows)
    changed = lines[1].replace(",ok,", ",crashed,", 1)
    assert changed != lines[1]
    csv_path.write_text("".join([*lines, changed]))
    key = read.rows[0].case.key
    with pytest.raises(UserError, match=f"lines 2 and {len(lines) + 1} are two different rows of case {key}"):
        rundir.read_results(csv_path).for_resume()


def test_a_read_only_results_file_is_refused_for_a_resume(run_dir):
    csv_path = run_dir / rundir.RESULTS
    csv_path.chmod(0o444)
    with pytest.raises(UserError, match=r"read-only \(mode 444\).*the file is left as it is"):
        rundir.read_results(csv_path).for_resume()
    assert oct(csv_path.stat().st_mode & 0o777) == "0o444"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[]", "an attempt is list, not an object"),
        ("{}", "no finite `wall_s`"),
        ('{"wall_s": 1, "phases_s": []}', "`phases_s` is not an object of finite seconds"),
        ('{"wall_s": 1, "phases_s": {}, "adapters": {"x": {"seconds": NaN}}}', "adapter 'x' has no finite"),
        ('{"earlier": 5}', "`earlier` is not a list"),
        ('{"wall_s": 1, "phases_s": {}, "adapters": {}, "earlier": [{}]}', "no finite `wall_s`"),
    ],
)
def test_a_timings_file_that_is_no_timing_record_is_one_line_before_anything_is_written(
    run_dir, tmp_path, capsys, text, problem
):
    _with_spec(run_dir)
    (run_dir / rundir.TIMINGS).write_text(text)
    with pytest.raises(UserError, match=f"is not a sweep's timing record \\({problem}"):
        phases.read(run_dir)
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    for argv in (["sweep", "--resume", str(run_dir)], ["report", str(run_dir)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "timings.json is not a sweep's timing record" in err, argv
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before
    assert main(["site", str(run_dir), "--out", str(tmp_path / "site")]) == 2
    warned = "".join(capsys.readouterr().err.split())  # the console wraps the line at its width
    assert f"warning:leftout{run_dir}:{run_dir / rundir.TIMINGS}isnotasweep's" in warned


@pytest.mark.parametrize(
    "text", ["[]", "5", "null", '{"foo": 1}', '{"kernels": [], "seq_lens": null}', '{"kernels": null}']
)
def test_a_selection_that_is_no_selection_record_never_widens_a_resume(run_dir, capsys, text):
    _with_spec(run_dir)
    (run_dir / rundir.SELECTION).write_text(text)
    with pytest.raises(UserError, match="selection.json: expected"):
        rundir.read_selection(run_dir)
    assert main(["sweep", "--resume", str(run_dir), "--dry-run"]) == 2
    assert "selection.json: expected" in capsys.readouterr().err


def test_shape_integers_past_the_cap_are_refused_in_a_spec(tmp_path, capsys):
    spec = tmp_path / "big.toml"
    spec.write_text(
        'name = "big"\nkernels = ["sdpa_math"]\n[shape]\nbatch = 1\nseq_len = 4294967296\nnum_heads = 1\n'
        "head_dim_qk = 8\nhead_dim_v = 8\n"
    )
    assert main(["sweep", str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "key 'shape.seq_len': expected a positive integer (at most 2,147,483,648)" in err


def test_nan_never_reaches_spec_json(tmp_path, capsys):
    """A refused flag leaves no run directory behind, so no NaN is ever recorded."""
    out = tmp_path / "run"
    argv = list(ADHOC_RUN)
    for flag in ("--rel-ci", "--autotune-ms", "--budget", "--timeout"):
        assert main([*argv, flag, "nan", "--out", str(out)]) == 2
        assert f"error: {flag}: expected a finite number" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("reps", "inf", "reps: not a 64-bit integer: 'inf'"),
        ("peak_memory_bytes", "1e30", "peak_memory_bytes: not a 64-bit integer: '1e30'"),
        ("median_ms", "0", "median_ms of an ok row: not a finite time above 0: '0'"),
        ("median_ms", "-1", "median_ms: not a finite number of 0 or more: '-1'"),
        ("median_ms", "inf", "median_ms: not a finite number of 0 or more: 'inf'"),
        ("flops", "inf", "flops: not a finite number of 0 or more: 'inf'"),
        ("median_ms", "1e308", "median_ms: more than a day, no timed call's: '1e308'"),
        ("p80_ms", "9e7", "p80_ms: more than a day, no timed call's: '9e7'"),
        ("chunk_size", "99999999999999999999", "chunk_size: not a 64-bit integer: '99999999999999999999'"),
        ("chunk_size", "-5", "chunk_size: expected a size from 1, got '-5'"),
        ("seq_len", "-1", "seq_len: expected a size from 1, got '-1'"),
        ("mode", "xx", "mode: expected one of fw, fwbw, got 'xx'"),
        ("dtype", "int3", "dtype: expected one of bfloat16, float16, float32, got 'int3'"),
        ("kernel", "", "kernel: expected a name, got ''"),
    ],
)
def test_a_value_no_table_can_hold_is_a_bad_line_for_every_reader(run_dir, capsys, column, value, why):
    _with_spec(run_dir)
    path = run_dir / rundir.RESULTS
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\r\n").split(",")
    cells = lines[1].rstrip("\r\n").split(",")
    cells[header.index(column)] = value
    path.write_text("".join([lines[0], ",".join(cells) + "\r\n", *lines[2:]]))
    read = rundir.read_results(path)
    assert [(s.line, s.reason) for s in read.skipped] == [(2, f"bad value ({why})")]
    before = path.read_bytes()
    for command in (
        ["report", str(run_dir), "--out", str(run_dir.parent / "r.html")],
        ["plot", str(run_dir)],
    ):
        assert main(command) == 0  # the line skipped with a warning, not a traceback
        assert "1 unreadable row(s) skipped (line 2: bad value" in capsys.readouterr().err
    assert main(["sweep", "--resume", str(run_dir)]) == 2
    assert "cannot be repaired: line 2: bad value" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_a_spec_name_ending_in_a_newline_is_refused(tmp_path, capsys):
    spec = tmp_path / "n.toml"
    spec.write_text('name = "tiny\\n"\nkernels = ["sdpa_math"]\n[shape]\nseq_len = [16]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert "key 'name'" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["-k", ""], ["-k", ","], ["-k", "sdpa_math", "-k", ","], ["--seq-len", ""]])
def test_an_empty_filter_is_a_mistake_not_no_filter(capsys, args):
    assert main(["sweep", "experiments/smoke.toml", "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --") and err.count("\n") == 1


@pytest.mark.parametrize("raw", ["null", "5", '"x"', "[1]"])
def test_a_spec_json_that_is_no_object_is_one_line(run_dir, capsys, raw):
    (run_dir / rundir.SPEC).write_text(raw)
    assert main(["sweep", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"expected the run's spec as a JSON object, got {raw}" in err and err.count("\n") == 1
    assert main(["diff", str(run_dir), str(run_dir)]) == 0  # no settings to compare: no warning


def test_an_output_hard_linked_to_an_input_is_refused(run_dir, tmp_path, capsys):
    linked = tmp_path / "out.csv"
    os.link(run_dir / rundir.RESULTS, linked)
    before = linked.read_bytes()
    assert main(["diff", str(run_dir), str(run_dir), "--csv", str(linked)]) == 2
    assert "would replace an input of this command" in capsys.readouterr().err
    assert linked.read_bytes() == before


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("roofs", "x"),
        ("published", [1]),
        ("device_infos", 1.5),
        ("packages", "x"),
        ("resumed", [{"gpu_name": 5}]),
    ],
)
def test_an_env_json_key_of_the_wrong_type_is_one_line(run_dir, capsys, key, value):
    path = run_dir / rundir.ENV
    env = json.loads(path.read_text())
    path.write_text(json.dumps({**env, key: value}))
    for command in (
        ["report", str(run_dir), "--out", str(run_dir.parent / "r.html")],
        ["diff", str(run_dir), str(run_dir)],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path} is not an environment record: key ") and err.count("\n") == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda raw: raw["rounds"][0]["jobs"][0].update(stderr=None),
        lambda raw: raw["rounds"][0]["jobs"][0].update(job_id=5),
        lambda raw: raw["rounds"][0]["jobs"][0].update(state=[1]),
        lambda raw: raw["rounds"][0]["jobs"][0].update(merged_rows="x"),
        lambda raw: raw.update(options="x"),
    ],
)
def test_a_jobs_json_field_of_the_wrong_type_is_one_line(run_dir, capsys, change):
    job = jobs.JobRecord(0, "123", 4, state="COMPLETED", host="node1")
    raw = jobs.JobsRecord("local", {}, [jobs.Round(1, "2026-01-01T00:00:00", [job], closed=True)]).to_dict()
    _with_spec(run_dir)
    rundir.write_json(run_dir / rundir.JOBS, raw)
    assert main(["status", str(run_dir)]) == 0
    capsys.readouterr()
    change(raw)
    rundir.write_json(run_dir / rundir.JOBS, raw)
    assert main(["status", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir / rundir.JOBS} is not a jobs record (") and err.count("\n") == 1


def test_status_of_no_run_directory_says_so_in_one_line(tmp_path, capsys):
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    for path, what in (
        (tmp_path / "missing", "no such run directory"),
        (afile, "a file, not a run directory"),
    ):
        assert main(["status", str(path)]) == 2
        assert capsys.readouterr().err == f"error: {path}: {what}\n"


def _first_png(folder: Path) -> Path:
    return sorted(folder.glob("*.png"))[0]


@pytest.mark.parametrize(
    ("args", "output"),
    [
        (["compare", "{run}"], lambda run, out: run / "compare.csv"),
        (["plot", "{run}", "--published", "none"], lambda run, out: _first_png(run / "figures")),
        (["report", "{run}", "--published", "none"], lambda run, out: run / "report.html"),
        (["diff", "{run}", "{run}", "--csv", "{out}/diff.csv"], lambda run, out: out / "diff.csv"),
        (["compare-gpus", "{a}", "{b}", "--out", "{out}"], lambda run, out: out / "compare-gpus.csv"),
        (["compare-gpus", "{a}", "{b}", "--out", "{out}"], lambda run, out: out / "compare-gpus.png"),
        (["roofline", "--measured", "{b}", "--out", "{out}"], lambda run, out: out / "roofline_fraction.csv"),
        (["roofline", "--out", "{out}"], lambda run, out: out / "fig22_roofline.svg"),
    ],
)
def test_an_output_made_read_only_is_one_line_and_stays_as_it_was(run_dir, tmp_path, capsys, args, output):
    """A file made read-only (mode 444) is never replaced, by root either, whose access ignores the
    mode: the command refuses it in one line, exit 2, and leaves its bytes and mode."""
    chunks = REPO / "results" / "runs"
    names = {
        "run": run_dir,
        "out": tmp_path / "out",
        "a": chunks / "tfla_vs_peer_chunks-20261126-215953",
        "b": chunks / "tfla_vs_peer_chunks-20261204-h200",
    }
    argv = [arg.format(**names) for arg in args]
    assert main(argv) == 0, capsys.readouterr().err
    target = output(run_dir, names["out"])
    target.chmod(0o444)
    before = target.read_bytes()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{target}: is not writable (mode 444)" in err, err
    assert target.read_bytes() == before and target.stat().st_mode & 0o777 == 0o444


def test_the_atomic_writers_never_replace_a_read_only_file(tmp_path):
    path = tmp_path / "kept.json"
    path.write_text("{}\n")
    path.chmod(0o444)
    for write in (lambda: rundir.write_atomic(path, "[]\n"), lambda: rundir.save_atomic(path, Path.touch)):
        with pytest.raises(PermissionError, match="not writable"):
            write()
    assert path.read_text() == "{}\n" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]


def test_a_run_on_no_gpu_is_refused_by_roofline_measured(tmp_path, capsys):
    run = write_run(tmp_path / "cpu-run", fig5_rows(seq_lens=(8192,)), gpu_name="")
    out = tmp_path / "out"
    assert main(["roofline", "--measured", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names no GPU (gpu_name), so no roof bounds its rows" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "{run}"],
        ["plot", "{run}", "--published", "none", "--out", "{out}"],
        ["report", "{run}", "--published", "none", "--out", "{out}/report.html"],
        ["diff", "{run}", "{other}"],
        ["diff", "{other}", "{run}"],
        ["roofline", "--measured", "{run}", "--out", "{out}"],
    ],
)
def test_two_different_rows_of_one_case_are_one_line_for_every_reader(run_dir, tmp_path, capsys, args):
    """Which of two rows of one case holds is the user's call: no reader takes the last one silently."""
    other = write_run(tmp_path / "other", [r for r in fig5_rows(seq_lens=(8192,)) if r["mode"] == "fw"])
    csv_path = run_dir / rundir.RESULTS
    lines = csv_path.read_text().splitlines(keepends=True)
    changed = lines[1].replace(",ok,", ",crashed,", 1)
    assert changed != lines[1]
    csv_path.write_text("".join([*lines, changed]))
    before = {path: path.read_bytes() for path in run_dir.iterdir()}
    out = tmp_path / "out"
    argv = [arg.format(run=run_dir, other=other, out=out) for arg in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"lines 2 and {len(lines) + 1} are two different rows of case" in err, err
    assert {path: path.read_bytes() for path in run_dir.iterdir()} == before and not out.exists()


def test_a_gpu_run_resumed_on_a_host_without_cuda_is_one_line_and_left_as_it_was(tmp_path, capsys):
    """Here its cases could only be marked unavailable, and the rows the GPU decided without running
    (fla's Hopper refusal) would be decided again: the resume is refused before anything is written."""
    source = REPO / "results" / "runs" / "fig17_headdim-20261204-h200"
    run_dir = tmp_path / source.name
    run_dir.mkdir()
    for path in source.iterdir():
        if path.is_file():
            (run_dir / path.name).write_bytes(path.read_bytes())
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    for extra in ([], ["--dry-run"]):
        assert main(["sweep", "--resume", str(run_dir), *extra]) == 2
        err = capsys.readouterr().err
        assert (
            err.count("\n") == 1 and "it was measured on NVIDIA H200, and this host has no CUDA device" in err
        )
        assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ('{"kernels": null, "seq_lens": [1]}', "1 is not a sequence length of spec"),
        ('{"kernels": ["nosuch"], "seq_lens": null}', "kernel 'nosuch' is not in spec"),
    ],
)
def test_a_selection_outside_the_spec_is_named_as_the_file_not_as_a_flag(run_dir, capsys, text, what):
    _with_spec(run_dir)
    (run_dir / rundir.SELECTION).write_text(text)
    assert main(["sweep", "--resume", str(run_dir), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run_dir / rundir.SELECTION}: {what}" in err and "--seq-len:" not in err


def test_a_spec_naming_no_published_data_set_is_refused_by_a_dry_run(tmp_path, capsys):
    spec = Path("experiments/smoke.toml").read_text()
    path = tmp_path / "smoke.toml"
    path.write_text(f'published = "nosuch"\n{spec}')
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: key 'published': unknown published data set 'nosuch'" in err


def test_a_results_file_without_median_ms_is_a_header_error(run_dir, capsys):
    csv_path = run_dir / rundir.RESULTS
    lines = csv_path.read_text().splitlines()
    column = lines[0].split(",").index("median_ms")
    csv_path.write_text(
        "".join(",".join(c for i, c in enumerate(line.split(",")) if i != column) + "\n" for line in lines)
    )
    before = csv_path.read_bytes()
    assert main(["compare", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a results header of schema" in err and "lacks median_ms" in err
    assert csv_path.read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ["diff", "{run}", "{other}", "--json", "{out}/x.json", "--csv", "{out}/x.json"],
        ["diff", "{run}", "{other}", "--json", "{out}/x.png", "--plot", "{out}/./x.png"],
        ["compare", "{run}", "--json", "{out}/x", "--csv", "{out}/x"],
    ],
)
def test_two_outputs_of_one_command_naming_one_file_are_one_line(run_dir, tmp_path, capsys, args):
    other = write_run(tmp_path / "other", [r for r in fig5_rows(seq_lens=(8192,)) if r["mode"] == "fw"])
    out = tmp_path / "out"
    assert main([arg.format(run=run_dir, other=other, out=out) for arg in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": the same file as --json; give each output a file" in err, err
    assert not out.exists()


def _published_copy(tmp_path: Path) -> Path:
    """A copy of the published CSVs, for `TFLA_BENCH_PUBLISHED_DIR`."""
    folder = tmp_path / "published"
    folder.mkdir()
    for source in (REPO / "results" / "published").glob("*.csv"):
        (folder / source.name).write_bytes(source.read_bytes())
    return folder


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("runtime_ms", "abc", "empty or a finite number above 0"),
        ("runtime_ms", "-1", "empty or a finite number above 0"),
        ("runtime_ms", "inf", "empty or a finite number above 0"),
        ("peak_memory_bytes", "-5", "empty or a finite number from 0"),
        ("seq_len", "1024.5", "a whole number from 1"),
        ("seq_len", "", "a whole number from 1"),
        ("chunk_size", "0", "empty or a whole number from 1"),
    ],
)
def test_a_published_number_that_is_none_is_one_line_naming_its_line(
    run_dir, tmp_path, monkeypatch, capsys, column, value, expected
):
    folder = _published_copy(tmp_path)
    path = folder / "tfla_fig5_consttoken.csv"
    lines = path.read_text().split("\n")
    cells = lines[4].split(",")
    cells[lines[0].split(",").index(column)] = value
    lines[4] = ",".join(cells)
    path.write_text("\n".join(lines))
    monkeypatch.setenv("TFLA_BENCH_PUBLISHED_DIR", str(folder))
    assert main(["compare", str(run_dir), "--csv", str(tmp_path / "c.csv")]) == 2
    err = capsys.readouterr().err
    shown = "empty" if value == "" else repr(value)
    assert err.count("\n") == 1 and f"{path} line 5: {column} is {shown}; " in err and expected in err, err


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # a blank line and a line of spaces before the bad row: pandas skips both, the file counts them
        (lambda lines: lines[:2] + ["", "   "] + lines[2:4]
         + [lines[4].replace(",16,4096,16,", ",16,4096.5,16,", 1)] + lines[5:], "line 7: seq_len is "),
        (lambda lines: lines[:3] + [lines[3] + ",extra"] + lines[4:],
         "cannot be read: ParserError: Error tokenizing data. C error: Expected 18 fields in line 4, saw 19"),
        (lambda lines: [], "cannot be read: EmptyDataError: No columns to parse from file"),
        # a row of a case repeated with another runtime: compare would pick one without a word
        (lambda lines: lines[:2] + [lines[4].replace(",6.5615", ",99.0", 1)] + lines[2:],
         "lines 3 and 6: two rows of one case; keep one"),
        (lambda lines: lines[:4] + [lines[4].replace(",ok", ",bogus", 1)] + lines[5:],
         "line 5: status is 'bogus'; expected one of ok, failed, invalid_config, not_run"),
        (lambda lines: lines[:4] + [lines[4].replace(",bfloat16,", ",float64,", 1)] + lines[5:],
         "line 5: dtype is 'float64'; expected one of bfloat16, float16, float32"),
        (lambda lines: lines[:4] + [lines[4].replace(",fw,", ",bw,", 1)] + lines[5:],
         "line 5: mode is 'bw'; expected one of fw, fwbw"),
        (lambda lines: lines[:4] + ["," + lines[4].split(",", 1)[1]] + lines[5:],
         "line 5: figure is empty; expected a data set's name"),
    ],
    ids=["blank-lines", "extra-cell", "empty", "repeated-case", "status", "dtype", "mode", "figure"],
)  # fmt: skip
def test_a_published_csv_that_is_no_table_or_has_blank_lines_is_one_line_naming_the_line(
    run_dir, tmp_path, monkeypatch, capsys, edit, expected
):
    folder = _published_copy(tmp_path)
    path = folder / "tfla_fig5_consttoken.csv"
    lines = path.read_text().split("\n")
    assert ",16,4096,16," in lines[4] and ",6.5615" in lines[4] and lines[4].endswith(",ok")
    path.write_text("\n".join(edit(lines)))
    monkeypatch.setenv("TFLA_BENCH_PUBLISHED_DIR", str(folder))
    assert main(["compare", str(run_dir), "--csv", str(tmp_path / "c.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} " in err and expected in err, err


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("measured_at", 5, "measured_at is 5; expected a string"),
        ("matmul_flops_per_s", True, "expected a finite number in [1, 1e+18] FLOP/s"),
        ("hbm_bytes_per_s", 1e-300, "expected a finite number in [1, 1e+16] bytes/s"),
        ("l2_bytes_per_s", None, "l2_bytes_per_s is null"),
    ],
)
def test_a_saved_roofs_record_out_of_its_ranges_is_one_line_naming_the_file(
    tmp_path, monkeypatch, capsys, field, value, expected
):
    good = {
        "gpu_name": "NVIDIA H200", "driver": "580.00", "matmul_flops_per_s": 8e14, "matmul_size": 8192,
        "hbm_bytes_per_s": 4.2e12, "l2_bytes_per_s": 1e13, "l2_working_set_bytes": 25_000_000,
        "measured_at": "2026-12-01T00:00:00Z", "torch": "2.11.0",
    }  # fmt: skip
    path = tmp_path / "roofs.json"
    path.write_text(json.dumps({"a": good, "b": {**good, "driver": "581", field: value}}))
    monkeypatch.setenv("TFLA_BENCH_ROOFS_FILE", str(path))
    assert main(["model", "runtime", "--gpu", "measured"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: measured roofs 'b': {field}" in err and expected in err, err


@pytest.mark.parametrize(
    "args", [["report", "{run}", "--out", "{out}/r.html"], ["compare-gpus", "{run}", "{run}"]]
)
def test_roofs_in_env_json_out_of_their_ranges_are_one_line_naming_the_file(run_dir, tmp_path, capsys, args):
    env = json.loads((run_dir / rundir.ENV).read_text())
    env["roofs"] = {
        "gpu_name": env["gpu_name"], "driver": "580.00", "matmul_flops_per_s": 8e14, "matmul_size": 8192,
        "hbm_bytes_per_s": 1e-300, "l2_bytes_per_s": 1e13, "l2_working_set_bytes": 25_000_000,
        "measured_at": "2026-12-01T00:00:00Z", "torch": "2.11.0",
    }  # fmt: skip
    (run_dir / rundir.ENV).write_text(json.dumps(env))
    out = tmp_path / "out"
    assert main([arg.format(run=run_dir, out=out) for arg in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run_dir / rundir.ENV} is not an environment record" in err, err
    assert "key 'roofs': hbm_bytes_per_s is 1e-300; expected a finite number in [1, 1e+16]" in err, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "experiments/smoke.toml", "--resume", "{run}", "--out", "{out}", "--dry-run"],
         "give --out or --resume, not both"),
        (["roofline", "--measured-gpu", "NVIDIA H100", "--out", "{out}"], "--measured-gpu picks the rows of"),
        (["model", "flops", "--formulation", "parallel", "--chunk-size", "64"], "formulation has no"),
    ],
)  # fmt: skip
def test_a_flag_that_would_be_ignored_is_one_line(run_dir, tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert main([arg.format(run=run_dir, out=out) for arg in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("profile.csv", "garbage\n", "profile.csv: not a profile record (lacks kernel"),
        ("profile.csv", "", "profile.csv: not a profile record ("),
        ("check.json", '{"device": "cpu", "res', "check.json is not readable JSON"),
        ("check.json", "[]", 'check.json: expected {"device": ..., "results": [objects]}'),
        ("check.json", '{"results": 5}', 'check.json: expected {"device": ..., "results": [objects]}'),
    ],
)
def test_a_broken_profile_or_check_record_is_one_line(run_dir, tmp_path, capsys, name, text, message):
    (run_dir / name).write_text(text)
    assert main(["report", str(run_dir), "--published", "none", "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "r.html").exists()


def test_a_run_file_that_is_a_symlink_is_written_through(tmp_path):
    target = tmp_path / "elsewhere.csv"
    target.write_text("old\n")
    link = tmp_path / "results.csv"
    link.symlink_to(target)
    rundir.write_atomic(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


def test_a_folder_where_the_run_keeps_a_log_is_one_line(run_dir, capsys):
    _with_spec(run_dir)
    (run_dir / "worker-0.log").mkdir()
    assert main(["sweep", "--resume", str(run_dir), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "worker-0.log: a folder where the run keeps a file of its own" in err


def test_a_folder_in_place_of_the_lock_is_one_line_naming_it(run_dir, capsys):
    _with_spec(run_dir)
    (run_dir / "sweep.lock").mkdir()
    assert main(["sweep", "--resume", str(run_dir)]) == 2  # the lock is taken before the run is read
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep.lock: a folder where the run keeps a file of its own" in err


@pytest.mark.parametrize(("source", "message"), [
    ('raise RuntimeError("boom")\n', "failed while it was imported: RuntimeError: boom ("),
    ("def broken(:\n", "failed while it was imported: SyntaxError: "),
])  # fmt: skip
def test_a_plugin_that_fails_on_import_is_one_line(tmp_path, monkeypatch, capsys, source, message):
    (tmp_path / "failing_plugin.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TFLA_BENCH_PLUGINS", "failing_plugin")
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"module 'failing_plugin' (TFLA_BENCH_PLUGINS) {message}" in err, err


def test_check_refuses_a_timeout_it_could_not_keep(capsys):
    assert main(["check", "-k", "sdpa_math", "--no-isolate", "--timeout", "0.01"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--timeout stops the worker; --no-isolate runs the kernels" in err


def test_report_says_it_replaced_a_file(run_dir, tmp_path, capsys):
    out = tmp_path / "r.html"
    out.write_text("a file of the user's\n")
    assert main(["report", str(run_dir), "--published", "none", "--out", str(out)]) == 0
    assert f"wrote {out} (replaced the previous one)" in capsys.readouterr().out.replace("\n", "")


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "{run}", "--csv", "{pub}/tfla_fig5_consttoken.csv"],
        ["compare", "{run}", "--json", "{pub}/new.json"],
        ["report", "{run}", "--out", "{pub}/tfla_fig5_consttoken.csv"],
        ["diff", "{run}", "{run}", "--csv", "{pub}/tfla_fig5_consttoken.csv"],
        ["plot", "{run}", "--out", "{pub}/figures"],
    ],
    ids=["compare-csv", "compare-json", "report", "diff", "plot"],
)
def test_an_output_in_the_published_data_folder_is_one_line_and_writes_nothing(
    run_dir, tmp_path, monkeypatch, capsys, args
):
    folder = _published_copy(tmp_path)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    monkeypatch.setenv("TFLA_BENCH_PUBLISHED_DIR", str(folder))
    assert main([arg.format(run=run_dir, pub=folder) for arg in args]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and f"lies in {folder}, the paper's published data that compare reads" in err
    ), err
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


@pytest.mark.parametrize("log", ["worker-0.log", "precompile-3.log"])
def test_an_output_over_a_process_log_of_a_run_is_one_line(run_dir, tmp_path, capsys, log):
    (run_dir / log).write_text("the worker's own lines\n")
    assert main(["compare", str(run_dir), "--csv", str(run_dir / log)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"would write over {log} of the run" in err, err
    assert (run_dir / log).read_text() == "the worker's own lines\n"


@pytest.mark.parametrize("record", ["env.json", "spec.json"])
def test_a_new_sweep_into_a_folder_with_a_runs_records_is_one_line(tmp_path, capsys, record):
    out = tmp_path / "out"
    out.mkdir()
    (out / record).write_text('{"gpu_name": "NVIDIA H200"}\n')
    args = ["sweep", "smoke", "-k", "sdpa_math", "--seq-len", "128", "--out", str(out)]
    for extra in (["--dry-run"], []):
        assert main(args + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"already holds a run's {record}; continue it with --resume" in err, (
            err
        )
    assert sorted(path.name for path in out.iterdir()) == [record]


def test_a_report_named_as_another_kind_of_file_is_one_line(run_dir, capsys):
    figure = run_dir / "figures" / "runtime_vs_seq_len.png"
    figure.parent.mkdir()
    figure.write_bytes(b"\x89PNG")
    assert main(["report", str(run_dir), "--out", str(figure)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the report is one HTML page; give a file name ending in .html" in err
    assert figure.read_bytes() == b"\x89PNG"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--seq-len", "128,,256"],
            "--seq-len: expected an integer or a comma list of integers, got '128,,256'",
        ),
        (["--seq-len", "128", "--tokens", "512,"], "--tokens: expected an integer or a comma list of"),
        (
            ["--seq-len", "128", "--mode", "fw,"],
            "--mode: expected a name or a comma list of names, got 'fw,'",
        ),
        (["--seq-len", "128", "--dtype", ",float32"], "--dtype: expected a name or a comma list of names"),
        (["--seq-len", "128", "-k", "sdpa_math,,mlstm_torch"], "--kernel: expected a name or a comma list"),
    ],
    ids=["seq-len", "tokens", "mode", "dtype", "kernel"],
)
def test_an_empty_item_in_a_comma_list_is_one_line(tmp_path, capsys, extra, message):
    argv = [
        "run",
        "--dry-run",
        "-k",
        "sdpa_math",
        "--head-dim-qk",
        "32",
        *extra,
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_an_empty_retry_status_or_profile_mode_is_one_line(run_dir, capsys):
    _with_spec(run_dir)
    assert main(["sweep", "--resume", str(run_dir), "--retry", "crashed,,", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "--retry: expected a name or a comma list of names, got 'crashed,,'" in err
    )
    assert main(["profile", str(run_dir), "--mode", "", "--ncu-path", "/bin/true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--mode: expected a name or a comma list of names, got ''" in err, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["site", "", "--out", "{tmp}/site"], "RUNS: expected a path, got an empty one"),
        (["status", ""], "RUN_DIR: expected a path, got an empty one"),
        (["compare", ""], "RUN_DIR: expected a path, got an empty one"),
        (["plot", "{run}", "--published", " "], "--published: expected a name, got an empty one"),
        (["report", "{run}", "--published", ""], "--published: expected a name, got an empty one"),
    ],
    ids=["site", "status", "compare", "plot", "report"],
)
def test_an_empty_path_or_name_is_one_line(run_dir, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(run_dir.parent)  # an empty path would have read this folder as the current one
    assert main([arg.format(run=run_dir, tmp=tmp_path) for arg in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "site").exists() and not (run_dir / "report.html").exists()
