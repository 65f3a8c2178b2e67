"""The run directory: rows written whole and read back with reasons, atomic files, the lock, the
schema version, and what `sweep`, `--resume`, `--retry`, `--force`, `compare`, `plot` and `report`
do with a damaged, locked or full run directory."""

import dataclasses
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synthetic_run import fig5_rows, write_run

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case, parse_bool
from tfla_bench.cli.main import main
from tfla_bench.errors import UserError
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.row import ResultRow
from tfla_bench.measure.worker import failure_of
from tfla_bench.run import rundir, runner, specs

pytestmark = pytest.mark.usefixtures("plugin_adapters")

SPEC = """
name = "rundir"
kernels = ["sdpa_math", "test_raise"]
modes = ["fw"]
dtype = "float32"
warmup = 1
reps = 2
timeout_s = 60
[shape]
batch = 1
seq_len = [16, 32]
num_heads = 2
head_dim_qk = 8
head_dim_v = 8
"""
CASES = 4


def row(seq_len: int = 16, status: str = "ok", **values) -> ResultRow:
    case = Case("sdpa_math", "fw", "float32", 1, seq_len, 2, 8, 8, None, {"causal": True})
    if status == "ok":
        values.setdefault("median_ms", 1.0)  # an ok row has its time
    return ResultRow(case=case, family="attention", status=status, **values)


def write_rows(path: Path, rows: list[ResultRow]) -> None:
    writer = rundir.RowWriter(path, row_schema.columns_for([r.case for r in rows]))
    for one in rows:
        writer.write(one)
    writer.close()


# ---------------------------------------------------------------------------------------------
# Rows


def test_rows_round_trip_with_one_line_each(tmp_path):
    path = tmp_path / rundir.RESULTS
    rows = [row(16, median_ms=1.5, reps=30, error='a, "quoted"\nerror'), row(32, "crashed", error="x")]
    write_rows(path, rows)
    read = rundir.read_results(path)
    assert read.rows == rows and not read.skipped and not read.torn
    assert read.header == row_schema.columns_for([r.case for r in rows])
    assert read.rows[0].case.params == {"causal": True}


def test_adding_a_column_is_a_field_and_old_files_read_its_default(tmp_path):
    assert (
        row_schema.METRIC_COLUMNS[:3] == ("family", "status", "median_ms")
        and "reps" in row_schema.METRIC_COLUMNS
    )
    path = tmp_path / rundir.RESULTS
    write_rows(path, [row(16, median_ms=2.0, reps=5)])
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, name in enumerate(header) if name not in ("reps", "note")]
    path.write_text("\n".join(",".join(line.split(",")[i] for i in keep) for line in lines) + "\n")
    (read,) = rundir.read_results(path).rows
    assert read.median_ms == 2.0 and read.reps is None and read.note == ""


def test_fault_hook_tears_the_nth_row_and_resume_drops_only_that(tmp_path, monkeypatch):
    path = tmp_path / rundir.RESULTS
    monkeypatch.setenv(rundir.FAULT_ROW_ENV, "3")
    writer = rundir.RowWriter(path, row_schema.columns_for([row().case]))
    writer.write(row(16))
    writer.write(row(32))
    with pytest.raises(OSError) as failed:
        writer.write(row(64))
    writer.close()
    assert failed.value.errno == errno.ENOSPC and writer.written == 2
    assert not path.read_bytes().endswith(b"\n")
    read = rundir.read_results(path)
    assert read.torn and [s.line for s in read.skipped] == [4] and "torn last line" in read.skipped[0].reason
    assert [r.case.seq_len for r in read.for_resume()] == [16, 32]
    assert "1 unreadable row(s) skipped (line 4: torn last line" in read.warning()


def test_a_last_line_that_parses_but_lacks_its_newline_is_torn(tmp_path):
    path = tmp_path / rundir.RESULTS
    write_rows(path, [row(16, reps=30), row(32, reps=30)])
    path.write_bytes(path.read_bytes()[:-3])  # "...,30\r\n" cut to "...,3"
    read = rundir.read_results(path)
    assert read.torn and [r.case.seq_len for r in read.for_resume()] == [16]


def test_garbage_before_the_last_line_cannot_be_repaired(tmp_path):
    path = tmp_path / rundir.RESULTS
    write_rows(path, [row(16), row(32)])
    lines = path.read_bytes().split(b"\r\n")
    path.write_bytes(b"\r\n".join([lines[0], b"\x00garbage\xff", *lines[1:]]))
    before = path.read_bytes()
    read = rundir.read_results(path)
    assert len(read.rows) == 2 and read.skipped[0].line == 2
    with pytest.raises(UserError, match="cannot be repaired: line 2"):
        read.for_resume()
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "header, message",
    [
        ("kernel,mode,status\n", "lacks dtype"),
        (
            "kernel,mode,dtype,batch,seq_len,num_heads,head_dim_qk,"
            "head_dim_v,chunk_size,family,status,median_ms,speed\n",
            r"unknown column\(s\) speed",
        ),
    ],
)
def test_a_wrong_header_is_one_user_error(tmp_path, header, message):
    path = tmp_path / rundir.RESULTS
    path.write_text(header)
    with pytest.raises(UserError, match=message):
        rundir.read_results(path)


def test_one_bool_parser():
    assert parse_bool(" TRUE ") is True and parse_bool("false") is False
    assert parse_bool("yes") is None
    assert [row_schema.parse_param(t) for t in ("True", "3", "2.5", "x")] == [True, 3, 2.5, "x"]


# ---------------------------------------------------------------------------------------------
# Atomic files, schema, GPU


def test_write_atomic_leaves_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / rundir.ENV
    rundir.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir, "_write_all", full)
    with pytest.raises(OSError):
        rundir.write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == [rundir.ENV]


def test_schema_version_newer_runs_are_refused_older_ones_read(tmp_path):
    (tmp_path / rundir.ENV).write_text(json.dumps({"gpu_name": "NVIDIA H100 80GB HBM3"}))
    assert rundir.read_env(tmp_path)["gpu_name"].startswith("NVIDIA")
    (tmp_path / rundir.ENV).write_text(json.dumps({"results_schema": rundir.SCHEMA_VERSION + 1}))
    with pytest.raises(UserError, match=f"schema version {rundir.SCHEMA_VERSION + 1}"):
        rundir.read_env(tmp_path)


def test_the_gpu_is_resolved_from_env_json():
    gpu = rundir.run_gpu({"gpu_name": "NVIDIA H100 80GB HBM3"})
    assert gpu.accelerator is not None and gpu.accelerator.name == "h100"
    assert not gpu.cpu
    assert rundir.run_gpu({}) == rundir.RunGpu("unknown GPU", None, cpu=True)


def test_spec_difference_names_the_first_differing_field():
    old = {"name": "a", "shape": {"seq_len": [16, 32]}, "reps": 2}
    assert rundir.spec_difference(old, old) is None
    new = {"name": "a", "shape": {"seq_len": [16, 64]}, "reps": 2}
    assert rundir.spec_difference(old, new) == "shape.seq_len: [16, 64] here, [16, 32] in the run"


def test_file_names():
    assert (rundir.worker_log(2), rundir.precompile_log(0)) == ("worker-2.log", "precompile-0.log")


# ---------------------------------------------------------------------------------------------
# Lock


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_lock_refuses_a_second_writer_naming_the_owner(tmp_path):
    with rundir.RunLock(tmp_path, warn=print):
        owner = json.loads((tmp_path / rundir.LOCK).read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        with pytest.raises(UserError, match=f"written by {os.getpid()}@{socket.gethostname()}"):
            rundir.RunLock(tmp_path, warn=print).acquire()
    assert not (tmp_path / rundir.LOCK).exists()


def test_lock_held_in_another_process_is_refused(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from tfla_bench.run import rundir
            lock = rundir.RunLock(Path({str(tmp_path)!r}), warn=print)
            lock.acquire()
            print("held", flush=True)
            time.sleep(60)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"written by {holder.pid}@"):
            rundir.RunLock(tmp_path, warn=print).acquire()
    finally:
        holder.kill()
        holder.wait()
    warnings = []
    with rundir.RunLock(tmp_path, warn=warnings.append):
        assert json.loads((tmp_path / rundir.LOCK).read_bytes())["pid"] == os.getpid()  # no NULs before it
    assert len(warnings) == 1 and f"from {holder.pid}@" in warnings[0] and "no longer running" in warnings[0]


@pytest.mark.parametrize("whose", ["live", "other-host"])
def test_a_lock_file_of_a_live_or_foreign_owner_is_refused(tmp_path, whose):
    pid, host = (os.getppid(), socket.gethostname()) if whose == "live" else (_dead_pid(), "elsewhere")
    (tmp_path / rundir.LOCK).write_text(json.dumps({"pid": pid, "host": host, "started_at": "t"}))
    with pytest.raises(UserError, match=f"{pid}@{host}"):
        rundir.RunLock(tmp_path, warn=print).acquire()


@pytest.mark.parametrize("pid", ["Infinity", "99999999999999999999", "0", "-1", '"12"', "true", "1.5"])
def test_a_hand_edited_lock_record_names_no_owner_and_is_taken(tmp_path, pid):
    # json.loads reads Infinity and 20-digit numbers; a pid of 0 or -1 would signal a process group
    (tmp_path / rundir.LOCK).write_text(f'{{"pid": {pid}, "host": "{socket.gethostname()}"}}')
    warnings = []
    with rundir.RunLock(tmp_path, warn=warnings.append):
        # the record replaces the old one from the file's start
        assert json.loads((tmp_path / rundir.LOCK).read_bytes())["pid"] == os.getpid()
    assert warnings == []


def test_a_lock_in_an_unwritable_directory_is_a_user_error(tmp_path, monkeypatch):
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith(rundir.LOCK):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(UserError, match="cannot write to .*Permission denied"):
        rundir.RunLock(tmp_path, warn=print).acquire()


def test_default_run_dirs_never_collide(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "RUNS_DIR", tmp_path / "runs")
    monkeypatch.setattr(runner, "default_run_dir", lambda name: tmp_path / "runs" / f"{name}-20260101-000000")
    first, _ = runner.resolve_run_dir("s", None, None)
    second, _ = runner.resolve_run_dir("s", None, None)
    assert first.name == "s-20260101-000000" and second.name == "s-20260101-000000-2"
    assert first.is_dir() and second.is_dir()


def test_cpu_out_of_memory_is_oom():
    assert failure_of(MemoryError()).status == "oom"
    message = "[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory: you tried"
    assert failure_of(RuntimeError(message)).status == "oom"
    assert failure_of(ValueError("bad shape")).status == "error"


def test_a_file_size_limit_is_an_oserror_not_a_signal(tmp_path):
    script = textwrap.dedent(f"""
        import resource
        from pathlib import Path
        from tfla_bench.run import rundir
        from tfla_bench.measure import row as row_schema
        from tfla_bench.measure.row import ResultRow
        from tfla_bench.adapters.workloads import Case
        resource.setrlimit(resource.RLIMIT_FSIZE, (2039, 2039))  # within a row, not at its end
        case = Case("sdpa_math", "fw", "float32", 1, 16, 2, 8, 8, None, {{}})
        writer = rundir.RowWriter(Path({str(tmp_path / rundir.RESULTS)!r}), row_schema.columns_for([case]))
        try:
            for _ in range(100):
                row = ResultRow(case=case, family="attention", status="ok", median_ms=1.0, error="x" * 50)
                writer.write(row)
        except OSError as exc:
            print(exc.errno, writer.written)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    code, written = done.stdout.split()
    assert done.returncode == 0 and int(code) in (errno.EFBIG, errno.ENOSPC) and int(written) > 0
    read = rundir.read_results(tmp_path / rundir.RESULTS)
    assert len(read.rows) == int(written) and read.torn


# ---------------------------------------------------------------------------------------------
# sweep, --resume, --retry, --force through the CLI


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "rundir.toml"
    path.write_text(SPEC)
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished sweep of SPEC (sdpa_math ok, test_raise error), copied by each test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(registry.PLUGINS_ENV, "plugin_adapters")
        spec_path = tmp_path_factory.mktemp("spec") / "rundir.toml"
        spec_path.write_text(SPEC)
        run_dir = tmp_path_factory.mktemp("finished") / "run"
        assert main(["sweep", str(spec_path), "--out", str(run_dir)]) == 0
    return run_dir


@pytest.fixture
def run_copy(finished, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    return run_dir


def statuses(run_dir: Path) -> dict[str, str]:
    rows = rundir.read_results(run_dir / rundir.RESULTS).rows
    assert len(rows) == len({r.case.key for r in rows})  # never a duplicate row
    return {f"{r.case.kernel}/{r.case.seq_len}": r.status for r in rows}


def one_error_line(capsys, *, after_progress: bool = False) -> str:
    """The one `error:` line on stderr (after the sweep's progress lines, if it started)."""
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == lines[-1] and not any("Traceback" in line for line in lines)
    assert after_progress or len(lines) == 1
    return errors[0]


def test_finished_sweep_records_schema_and_leaves_no_lock(finished):
    assert statuses(finished) == {
        "sdpa_math/16": "ok",
        "sdpa_math/32": "ok",
        "test_raise/16": "error",
        "test_raise/32": "error",
    }
    assert json.loads((finished / rundir.ENV).read_text())["results_schema"] == rundir.SCHEMA_VERSION
    assert not (finished / rundir.LOCK).exists()


def test_sweep_into_a_locked_directory_exits_2_naming_the_owner(plugins, spec_file, tmp_path, capsys):
    out = tmp_path / "locked"
    out.mkdir()
    with rundir.RunLock(out, warn=print):
        assert main(["sweep", str(spec_file), "--out", str(out)]) == 2
    assert f"{os.getpid()}@{socket.gethostname()}" in one_error_line(capsys)
    assert not (out / rundir.RESULTS).exists()


def test_resume_refuses_another_spec_and_force_records_it(plugins, run_copy, tmp_path, capsys):
    other = tmp_path / "other.toml"
    other.write_text(SPEC.replace("reps = 2", "reps = 3"))
    before = (run_copy / rundir.RESULTS).read_bytes()
    assert main(["sweep", str(other), "--resume", str(run_copy)]) == 2
    assert "reps: 3 here, 2 in the run" in one_error_line(capsys)
    assert (run_copy / rundir.RESULTS).read_bytes() == before

    assert main(["sweep", str(other), "--resume", str(run_copy), "--force"]) == 0
    env = json.loads((run_copy / rundir.ENV).read_text())
    assert env["resumed"][-1]["forced_spec_difference"] == "reps: 3 here, 2 in the run"
    assert len(statuses(run_copy)) == CASES


def test_resume_repairs_a_torn_last_line_and_runs_that_case_again(plugins, run_copy, capsys):
    path = run_copy / rundir.RESULTS
    rows = rundir.read_results(path).rows
    torn = rows[-1]
    path.write_bytes(path.read_bytes()[:-10])
    assert main(["sweep", "--resume", str(run_copy)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "torn last line" in err
    assert statuses(run_copy)[f"{torn.case.kernel}/{torn.case.seq_len}"] == torn.status
    assert len(statuses(run_copy)) == CASES


def test_resume_of_an_unrepairable_file_exits_2_and_leaves_it(plugins, run_copy, capsys):
    path = run_copy / rundir.RESULTS
    lines = path.read_bytes().split(b"\r\n")
    path.write_bytes(b"\r\n".join([lines[0], lines[1], b"garbage", *lines[2:]]))
    before = path.read_bytes()
    assert main(["sweep", "--resume", str(run_copy)]) == 2
    assert "cannot be repaired: line 3" in one_error_line(capsys)
    assert path.read_bytes() == before and not (run_copy / rundir.LOCK).exists()


def test_retry_replaces_the_rows_of_the_named_statuses(plugins, run_copy, capsys):
    log = run_copy / rundir.worker_log(0)
    size = log.stat().st_size
    assert main(["sweep", "--resume", str(run_copy), "--retry", "crashed,error"]) == 0
    assert "2 case(s) run" in capsys.readouterr().out
    assert log.stat().st_size > size
    assert statuses(run_copy) == {
        "sdpa_math/16": "ok",
        "sdpa_math/32": "ok",
        "test_raise/16": "error",
        "test_raise/32": "error",
    }


def test_retry_beside_measures_again_the_rows_measured_beside_the_precompile(plugins, run_copy, capsys):
    path = run_copy / rundir.RESULTS
    read = rundir.read_results(path)
    rows = [
        dataclasses.replace(row, note=runner.BESIDE_NO_ENERGY_NOTE) if row.case.seq_len == 16 else row
        for row in read.rows
    ]
    rundir.rewrite_results(path, rows, read.header)
    lines = path.read_bytes().split(b"\r\n")
    assert main(["sweep", "--resume", str(run_copy), "--retry", "beside"]) == 0
    assert "1 case(s) run" in capsys.readouterr().out  # sdpa_math/16: test_raise/16 is no ok row
    after = rundir.read_results(path).rows
    assert not any(runner.BESIDE_NOTE in row.note for row in after if row.case.kernel == "sdpa_math")
    changed = set(path.read_bytes().split(b"\r\n")) ^ set(lines)  # that row's line, before and after
    assert len(changed) == 2 and all(line.startswith(b"sdpa_math,") for line in changed)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--retry", "crashed,bogus"],
            "--retry: expected a comma list of crashed, timeout, error, oom, beside",
        ),
        (["--retry", ","], "--retry: expected"),
    ],
)
def test_bad_retry_names_exit_2(plugins, run_copy, capsys, args, message):
    assert main(["sweep", "--resume", str(run_copy), *args]) == 2
    assert message in one_error_line(capsys)


@pytest.mark.parametrize("flag", [["--retry", "error"], ["--force"]])
def test_retry_and_force_need_resume(plugins, spec_file, tmp_path, capsys, flag):
    assert main(["sweep", str(spec_file), "--out", str(tmp_path / "x"), *flag]) == 2
    assert "needs --resume" in one_error_line(capsys)


def test_a_full_disk_after_the_start_exits_1_keeping_every_finished_row(
    plugins, spec_file, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "full"
    monkeypatch.setenv(rundir.FAULT_ROW_ENV, "3")
    assert main(["sweep", str(spec_file), "--out", str(out)]) == 1
    err = one_error_line(capsys, after_progress=True)
    assert "No space left on device" in err and "2 row(s) written before are kept" in err
    read = rundir.read_results(out / rundir.RESULTS)
    assert len(read.rows) == 2 and read.torn and not (out / rundir.LOCK).exists()

    monkeypatch.delenv(rundir.FAULT_ROW_ENV)
    assert main(["sweep", "--resume", str(out)]) == 0
    assert len(statuses(out)) == CASES


def test_an_unwritable_directory_before_the_start_exits_2(plugins, spec_file, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["sweep", str(spec_file), "--out", str(blocker / "run")]) == 2
    one_error_line(capsys)
    assert main(["sweep", str(spec_file), "--out", str(blocker)]) == 2
    assert "is a file; give a folder" in one_error_line(capsys)


@pytest.mark.parametrize("command", ["compare", "plot", "report"])
def test_analysis_commands_warn_about_unreadable_rows(tmp_path, capsys, command):
    run_dir = write_run(tmp_path / "run", fig5_rows(seq_lens=(8192,)))
    with (run_dir / rundir.RESULTS).open("a") as handle:
        handle.write("not,a,row\ntfla_sig,fw,bfl")
    assert main([command, str(run_dir)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "2 unreadable row(s) skipped" in warnings[0]
    assert "line " in warnings[0] and "torn last line" in warnings[0]


def test_check_run_dir_refuses_a_newer_schema(run_copy):
    env = json.loads((run_copy / rundir.ENV).read_text())
    env["results_schema"] = rundir.SCHEMA_VERSION + 1
    (run_copy / rundir.ENV).write_text(json.dumps(env))
    spec = runner.load_run_spec(run_copy)
    with pytest.raises(UserError, match="upgrade tfla-bench"):
        runner.check_run_dir(run_copy, spec, resume=True)
    assert specs.expand(spec)
