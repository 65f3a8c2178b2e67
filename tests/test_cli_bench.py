"""`tfla-bench list`, `run` and `sweep`: output, run directories, and exit code 2 on bad input."""

import json
import re
import time

import pytest

from tfla_bench.adapters import registry
from tfla_bench.cli import bench
from tfla_bench.cli.main import main
from tfla_bench.run import rundir

pytestmark = pytest.mark.usefixtures("plugin_adapters")

SPEC = """
name = "cli"
kernels = ["sdpa_math", "test_unavailable"]
modes = ["fw", "fwbw"]
dtype = "float32"
warmup = 1
reps = 2
timeout_s = 60
[shape]
tokens = 64
seq_len = [16, 32]
num_heads = 2
head_dim_qk = 8
head_dim_v = 16
"""


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "cli.toml"
    path.write_text(SPEC)
    return path


def test_list_json(capsys, plugins):
    assert main(["list", "--json"]) == 0
    entries = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert entries["sdpa_math"]["available"] is True and entries["sdpa_math"]["cpu_capable"] is True
    assert entries["sdpa_math"]["family"] == "attention" and entries["sdpa_math"]["layout"] == "BHTD"
    assert entries["test_unavailable"]["reason"] == "needs the package frobnicate"
    assert set(entries["test_chunked"]) >= {"modes", "dtypes", "constraints", "uses_chunk_size", "origin"}
    assert entries["sdpa_math"]["origin"] == "built-in tfla_bench.baselines.sdpa_math"
    assert entries["test_unavailable"]["origin"].endswith("plugin_adapters")


@pytest.fixture
def asked_names(monkeypatch):
    """The names of the adapters `registry.availability` asks (not found in the cache), per call."""
    calls = []
    ask = registry.ask_available

    def counting(chosen, processes=None):
        calls.append({adapter.name for adapter in chosen})
        return ask(chosen, processes)

    monkeypatch.setattr(registry, "ask_available", counting)
    return calls


def test_list_says_when_it_answers_from_the_cache_and_fresh_asks_again(capsys, plugins, asked_names):
    assert main(["list"]) == 0
    first = capsys.readouterr().out
    assert "from the cache" not in first and "test_unavailable" in asked_names[0]
    assert main(["list"]) == 0
    second = capsys.readouterr().out
    assert re.fullmatch(
        r"availability from the cache, asked \d+ s ago \(--fresh asks again\)", second.splitlines()[1]
    )
    assert asked_names[1:] == [set()] and second.splitlines()[2:] == first.splitlines()[1:]
    assert main(["list", "--fresh"]) == 0
    assert "from the cache" not in capsys.readouterr().out and asked_names[2] == asked_names[0]
    assert main(["list", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) and "availability from the cache" in captured.err


@pytest.mark.parametrize(
    ("age_s", "said"),
    [(0.2, "0 s"), (59, "59 s"), (61, "1 min"), (3 * 3600 + 5, "3 h"), (86400, "1 day"), (5e5, "5 days")],
)
def test_list_says_the_caches_age_in_one_unit(age_s, said):
    reasons = {"a": None, "b": "needs frobnicate"}
    answers = registry.Availability(reasons, frozenset(reasons), time.time() - age_s)
    assert (
        bench._cached_line(answers) == f"availability from the cache, asked {said} ago (--fresh asks again)"
    )
    answers = registry.Availability(reasons, frozenset("a"), time.time() - age_s)
    assert bench._cached_line(answers).startswith("availability of 1 of 2 kernels from the cache, asked")
    assert bench._cached_line(registry.Availability(reasons, frozenset(), None)) == ""


def test_list_works_where_the_cache_cannot_be_written(capsys, monkeypatch, tmp_path, plugins, asked_names):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TFLA_BENCH_AVAILABILITY_FILE", str(tmp_path / "a-file" / "availability.json"))
    assert main(["list"]) == 0 and main(["list"]) == 0
    assert "from the cache" not in capsys.readouterr().out and asked_names[0] == asked_names[1]


@pytest.mark.parametrize("columns", [80, 100])
def test_list_reads_at_the_terminals_width(capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    hints = lines.index("how to install:") if "how to install:" in lines else len(lines)
    assert max(len(line) for line in lines[:hints]) <= columns
    # Each install hint is one line, however long, so that its command pastes whole.
    for adapter in registry.adapters():
        reason = adapter.available() or ""
        if "pip install" in reason:
            command = reason[reason.index("pip install") :].rstrip(")")
            assert any(line.startswith("  ") and adapter.name in line and command in line for line in lines)
    names = {adapter.name for adapter in registry.adapters()}
    by_name = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in names}
    assert set(by_name) == names
    for name, words in by_name.items():
        adapter = registry.get(name)
        assert words[1:3] == [adapter.family, "yes" if adapter.available() is None else "no"]
    # The reason, wrapped over lines at 80 columns, is there in full: the install command is the point.
    text = " ".join(" ".join(line.split()) for line in lines)
    assert "test_unavailable test no needs the package frobnicate" in text
    assert "BHTD" not in text and "float32" not in text  # the details wait for --long


def test_list_long_gives_every_fact_at_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list", "--long"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("sdpa_math "))
    end = next(i for i in range(first + 1, len(lines)) if not lines[i].startswith(" "))
    block = "\n".join(lines[first:end])
    for fact in ("layout       BHTD", "modes        fw, fwbw", "float32", "runs on CPU  yes"):
        assert fact in block
    assert "built-in tfla_bench.baselines.sdpa_math" in out


def test_sweep_end_to_end_then_refuse_then_resume(capsys, plugins, spec_file, tmp_path):
    out_dir = tmp_path / "run"
    assert main(["sweep", str(spec_file), "--out", str(out_dir), "--reps", "3"]) == 0
    printed = capsys.readouterr().out
    assert "median runtime (ms) by seq_len" in printed and "unavailable" in printed
    rows = rundir.read_results(out_dir / "results.csv").rows
    assert len(rows) == 8
    assert {r.status for r in rows if r.case.kernel == "sdpa_math"} == {"ok"}
    assert json.loads((out_dir / "env.json").read_text())["measurement"]["reps"] == 3

    assert main(["sweep", str(spec_file), "--out", str(out_dir)]) == 2
    assert "already holds results" in capsys.readouterr().err

    log_size = (out_dir / "worker-0.log").stat().st_size
    assert main(["sweep", "--resume", str(out_dir)]) == 0
    assert "0 case(s) run" in capsys.readouterr().out
    assert (out_dir / "worker-0.log").stat().st_size == log_size  # no worker was started
    assert len(rundir.read_results(out_dir / "results.csv").rows) == 8


def test_resume_keeps_the_kernels_and_lengths_the_run_set_out_with(capsys, plugins, spec_file, tmp_path):
    out_dir = tmp_path / "run"
    args = ["sweep", str(spec_file), "--out", str(out_dir), "-k", "sdpa_math", "--seq-len", "16"]
    assert main([*args, "--reps", "2"]) == 0
    selection = json.loads((out_dir / "selection.json").read_text())
    assert selection == {"kernels": ["sdpa_math"], "seq_lens": [16]}
    rows = rundir.read_results(out_dir / "results.csv").rows
    assert sorted((r.case.kernel, r.case.seq_len, r.case.mode) for r in rows) == [
        ("sdpa_math", 16, "fw"),
        ("sdpa_math", 16, "fwbw"),
    ]
    capsys.readouterr()
    # the resume finishes that selection, not the whole spec (test_unavailable, seq_len 32)
    assert main(["sweep", "--resume", str(out_dir)]) == 0
    assert "0 case(s) run" in capsys.readouterr().out
    assert len(rundir.read_results(out_dir / "results.csv").rows) == 2
    # given its own filter, the resume takes that one
    assert main(["sweep", "--resume", str(out_dir), "--seq-len", "32", "-k", "sdpa_math"]) == 0
    assert "2 case(s) run" in capsys.readouterr().out
    (out_dir / "selection.json").write_text('{"kernels": "sdpa_math"}')
    assert main(["sweep", "--resume", str(out_dir)]) == 2
    assert "selection.json: expected" in capsys.readouterr().err


def test_sweep_finds_a_shipped_spec_by_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing called smoke here: the name is looked up
    assert main(["sweep", "smoke", "--dry-run"]) == 0
    assert "mlstm_torch" in capsys.readouterr().out
    assert main(["sweep", "smok", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no spec file 'smok'") and "smoke" in err and err.count("\n") == 1


def test_our_kernels_run_on_the_cpu_in_the_interpreter_and_their_rows_say_no_speed_claim(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out_dir = tmp_path / "run"
    shape = ["--seq-len", "32", "--batch", "1", "--heads", "1", "--head-dim-qk", "16", "--chunk-size", "16"]
    flags = ["--mode", "fw", "--dtype", "float32", "--warmup", "1", "--reps", "2", "--out", str(out_dir)]
    assert main(["run", "--kernel", "tfla_sig,sdpa_math", *shape, *flags]) == 0
    printed = capsys.readouterr()
    note = "tfla_sig: timed in Triton's interpreter (TRITON_INTERPRET=1): no speed claim"
    assert note in printed.err  # before the progress
    assert note in " ".join(printed.out.split())  # under the summary table
    rows = {row.case.kernel: row for row in rundir.read_results(out_dir / rundir.RESULTS).rows}
    assert rows["tfla_sig"].status == "ok" and rows["tfla_sig"].device == "cpu"
    assert "no speed claim" in rows["tfla_sig"].note and "no speed claim" not in rows["sdpa_math"].note


def test_run_ad_hoc_dry_run(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # each case on one line; a log folds the table to 80 columns
    args = ["run", "-k", "sdpa_math,sdpa_flash", "--seq-len", "64,128", "--tokens", "256", "--heads", "4"]
    args += ["--head-dim-qk", "32", "--mode", "fwbw", "--param", "causal=false", "--dry-run"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "4 case(s)" in out
    assert "B4 T64 H4 Dqk32 Dv32" in out and "B2 T128 H4 Dqk32 Dv32" in out and "causal=False" in out


def test_run_names_a_misspelt_kernel_first_then_every_missing_flag_and_takes_the_papers_defaults(capsys):
    assert main(["run", "-k", "tfla_sgi"]) == 2
    err = capsys.readouterr().err
    assert "unknown kernel 'tfla_sgi' (closest: tfla_sig" in err and err.count("\n") == 1
    assert main(["run", "-k", "tfla_sig"]) == 2
    err = capsys.readouterr().err
    assert "--seq-len T" in err and "--head-dim-qk D" in err and err.count("\n") == 1
    assert main(["run", "-k", "sdpa_math", "--seq-len", "8192", "--head-dim-qk", "128", "--dry-run"]) == 0
    assert "B8 T8192 H32 Dqk128 Dv128" in capsys.readouterr().out  # 65,536 tokens, embedding 4096


def test_sweep_dry_run_writes_nothing(capsys, spec_file, tmp_path, plugins, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # each case on one line; a log folds the table to 80 columns
    assert main(["sweep", str(spec_file), "--dry-run", "--kernel", "test_unavailable"]) == 0
    out = capsys.readouterr().out
    assert "4 case(s)" in out and "needs the package frobnicate" in out
    assert not (tmp_path / "results").exists()


SHAPE = ["--seq-len", "64", "--batch", "1", "--heads", "1", "--head-dim-qk", "8"]
BAD_RUNS = [
    (["run", "-k", "nope", *SHAPE], "known kernels"),
    (["run", "-k", "sdpa_math", *SHAPE, "--tokens", "64"], "one of --tokens and --batch, not both"),
    (["run", "--seq-len", "64"], "run needs --kernel NAME (see tfla-bench list), --head-dim-qk D"),
    (["run", "-k", "sdpa_math", *SHAPE, "--seq-len", "6x"], "--seq-len"),
    (["run", "-k", "sdpa_math", *SHAPE, "--mode", "bw"], "key 'modes'"),
    (["run", "-k", "sdpa_math", *SHAPE, "--param", "causal"], "--param: expected key=value"),
    (["run", "-k", "sdpa_math", *SHAPE, "--grad", "mean"], "--grad: expected one of fixed, sum"),
    (["run", "-k", "sdpa_math", *SHAPE, "--clock", "wall"], "--clock: expected one of events, kernels"),
    (["run", "-k", "sdpa_math", *SHAPE, "--power-cap", "wait"], "--power-cap: expected one of gaps, again"),
    (
        ["run", "-k", "sdpa_math", *SHAPE, "--precompile", "-1"],
        "--precompile: expected an integer in [0, 1024] processes",
    ),
    (["sweep", "missing.toml"], "cannot read spec missing.toml"),
    (["sweep"], "needs a SPEC"),
    (["sweep", "--bogus-flag"], "No such option"),
]


@pytest.mark.parametrize(("argv", "expected"), BAD_RUNS)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and err.count("\n") == 1


GPUS_EXPECTED = "--gpus: expected a count >= 1 or a comma list of distinct GPU indices"


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--gpus", "abc"], f"{GPUS_EXPECTED}, got 'abc'"),
        (["--gpus", "-1"], f"{GPUS_EXPECTED}, got '-1'"),
        (["--gpus", "0,0"], "--gpus: expected a count >= 1"),
        (["--gpus", "1" + "0" * 15], "--gpus: expected a count >= 1"),
        (["--out", "runs/a\nb"], "--out 'runs/a\\nb': holds a control character ('\\n'); give a plain name"),
        (["--out", "a\tb"], "holds a control character ('\\t')"),
    ],
)
def test_a_dry_run_refuses_what_the_run_refuses(capsys, tmp_path, monkeypatch, flags, expected, dry_run):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-k", "sdpa_math", *SHAPE, *flags, *dry_run]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_refuses_the_run_directory_the_run_refuses(capsys, tmp_path, spec_file, plugins):
    run_dir = tmp_path / "run"
    assert main(["sweep", str(spec_file), "--kernel", "test_unavailable", "--out", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["sweep", str(spec_file), "--out", str(run_dir), "--dry-run"]) == 2
    assert "already holds results; continue it with --resume" in capsys.readouterr().err
    spec_file.write_text(SPEC.replace("reps = 2", "reps = 3"))
    assert main(["sweep", str(spec_file), "--resume", str(run_dir), "--dry-run"]) == 2
    assert "the spec differs from the run's own at reps: 3 here, 2 in the run" in capsys.readouterr().err
    assert main(["sweep", str(spec_file), "--resume", str(run_dir), "--dry-run", "--force"]) == 0


@pytest.mark.parametrize(
    ("replace", "expected"),
    [
        (("num_heads = 2", "num_heads = 2\nnum_head = 2"), "unknown key 'num_head' in [shape]"),
        (("reps = 2", 'reps = "two"'), "key 'reps': expected an integer in [1, 1000000], got 'two'"),
        (('"test_unavailable"', '"test_unavailabel"'), "unknown kernel 'test_unavailabel' (closest: "),
    ],
)
def test_bad_spec_exit_2(capsys, spec_file, replace, expected):
    spec_file.write_text(SPEC.replace(*replace))
    assert main(["sweep", str(spec_file), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert expected in err and str(spec_file) in err and err.count("\n") == 1


def test_sweep_seq_len_filter(capsys, spec_file, plugins):
    assert main(["sweep", str(spec_file), "--dry-run", "--seq-len", "32"]) == 0
    out = capsys.readouterr().out
    assert "4 case(s)" in out and "T32" in out and "T16" not in out
    assert main(["sweep", str(spec_file), "--dry-run", "--seq-len", "48"]) == 2
    assert "--seq-len: 48 is not a sequence length of spec 'cli' (16, 32)" in capsys.readouterr().err


def test_unknown_kernel_filter_exit_2(capsys, spec_file):
    assert main(["sweep", str(spec_file), "--kernel", "sdpa_mat", "--dry-run"]) == 2
    assert "unknown kernel 'sdpa_mat' (closest: sdpa_math" in capsys.readouterr().err


def test_sweep_check_marks_failing_kernel_without_running_it(
    capsys, monkeypatch, plugins, spec_file, tmp_path
):
    from tfla_bench.run import correctness

    seen = []

    def fake_gate(names, device, **_):
        seen.append((names, device))
        return [correctness.GateResult("sdpa_math", "ok", 0.5, 1e-2, False, None)]

    monkeypatch.setattr(correctness, "run_gate", fake_gate)
    out_dir = tmp_path / "checked"
    assert main(["sweep", str(spec_file), "--out", str(out_dir), "--check", "--kernel", "sdpa_math"]) == 0
    assert seen == [(["sdpa_math"], "cpu")]
    rows = rundir.read_results(out_dir / "results.csv").rows
    assert rows and all(row.status == "failed_check" for row in rows)
    assert "0.5 > tolerance" in rows[0].error
    gate = json.loads((out_dir / "check.json").read_text())
    assert gate["device"] == "cpu"
    assert gate["results"] == [
        {
            "name": "sdpa_math",
            "status": "ok",
            "max_rel_error": 0.5,
            "tolerance": 1e-2,
            "passed": False,
            "reason": None,
            "seconds": None,
        }
    ]


def test_sweep_times_adaptively_when_the_spec_fixes_no_reps(capsys, plugins, spec_file, tmp_path):
    spec_file.write_text(SPEC.replace("warmup = 1\nreps = 2\n", ""))
    out_dir = tmp_path / "run"
    args = ["sweep", str(spec_file), "--out", str(out_dir), "--kernel", "sdpa_math"]
    assert main([*args, "--budget", "0.05", "--rel-ci", "0.02", "--autotune-ms", "50"]) == 0
    measurement = json.loads((out_dir / "env.json").read_text())["measurement"]
    assert (measurement["budget_s"], measurement["rel_ci"], measurement["reps"]) == (0.05, 0.02, None)
    assert measurement["autotune_ms"] == 50
    for row in rundir.read_results(out_dir / "results.csv").rows:
        assert row.status == "ok" and row.stop in ("ci", "budget", "max") and row.reps >= 5
        assert row.warmup >= 1
    record = json.loads((out_dir / "timings.json").read_text())
    assert record["adapters"]["sdpa_math"]["cases"] == 4 and record["wall_s"] > 0
    captured = capsys.readouterr()
    assert "time per phase: plan" in captured.out and "measuring" in captured.out
    assert "outside the phases" in captured.out
    assert " reps, " in captured.err  # each row's line says how many calls it took and why it stopped


@pytest.mark.parametrize(
    ("flag", "allowed"),
    [
        ("--rel-ci", "a finite number in (0, 1]"),
        ("--budget", "a finite number in (0, 86400] seconds"),
        ("--autotune-ms", "a finite number in (0, 60000] ms"),
        ("--timeout", "a finite number in (0, 604800] seconds"),
        ("--energy-s", "a finite number in (0, 600] seconds"),
    ],
)
@pytest.mark.parametrize("value", ["0", "nan", "inf", "-1", "1e30"])
def test_measurement_flags_must_be_finite_and_in_range(capsys, spec_file, tmp_path, flag, allowed, value):
    assert main(["sweep", str(spec_file), "--out", str(tmp_path / "run"), flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {flag}: expected {allowed}, got {float(value)!r}"
    assert not (tmp_path / "run").exists()
