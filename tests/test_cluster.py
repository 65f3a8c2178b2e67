"""Sweeps through a job scheduler (`sweep --executor local|slurm`, `tfla_bench.run.cluster`).

Local jobs (submitit's `LocalExecutor`, real processes on this machine) measure a tiny CPU spec and
must give the cases of the in-process sweep; a killed job leaves its missing cases, and only those,
to `--resume`; a preempted job is requeued and keeps its rows. The merge of shard files is checked
under concurrent writers. Slurm is stood in for by small `srun`, `sbatch` and `sacct` scripts on
PATH, so the sbatch script submitit writes for the flags is checked without a cluster. Analysis of a
run whose rows come from two GPUs is refused unless `--gpu` picks one.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from plugin_support import registered_test_adapters
from rich.console import Console
from synthetic_run import H100_NAME, headdim_rows, write_run

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.analyse.compare import load_run
from tfla_bench.cli.main import main
from tfla_bench.errors import RunFailed
from tfla_bench.measure import row as row_schema
from tfla_bench.measure.row import ResultRow
from tfla_bench.run import cluster, jobs, rundir, specs
from tfla_bench.run.console import make_console
from tfla_bench.run.jobs import JobRecord, JobsRecord, Round
from tfla_bench.run.shard import ShardJob

TESTS = Path(__file__).resolve().parent
WAIT_S = 120.0
# 12 cases: sdpa_math and mlstm_torch (both gates), fw and fwbw, two sequence lengths.
SPEC = """
name = "tiny"
kernels = ["sdpa_math", "mlstm_torch"]
modes = ["fw", "fwbw"]
dtype = "float32"
warmup = 1
reps = 3
timeout_s = 120
[shape]
tokens = 64
seq_len = [16, 32]
num_heads = 2
head_dim_qk = 8
head_dim_v = 8
chunk_size = 8
[override.mlstm_torch]
params = { gate = ["exp", "sig"] }
"""
# 12 cases, the first 6 taking about half a second each, so a job can be stopped halfway.
SLOW_SPEC = """
name = "slow"
kernels = ["test_slow", "sdpa_math"]
modes = ["fw", "fwbw"]
dtype = "float32"
warmup = 1
reps = 3
timeout_s = 120
[shape]
tokens = 64
seq_len = [8, 16, 32]
num_heads = 2
head_dim_qk = 8
head_dim_v = 8
"""
A100_NAME = "NVIDIA A100-SXM4-80GB"


@pytest.fixture(scope="module", autouse=True)
def with_test_adapters():
    with registered_test_adapters():
        yield


@pytest.fixture
def job_env(monkeypatch):
    """Local jobs inherit this process's environment: they find the test adapters as a user's
    unpackaged module."""
    monkeypatch.setenv(registry.PLUGINS_ENV, "plugin_adapters")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    )


def spec_file(tmp_path: Path, text: str = SPEC) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return str(path)


def rows_of(run_dir: Path) -> list[ResultRow]:
    return rundir.read_results(run_dir / rundir.RESULTS).rows


def keys(rows: list[ResultRow]) -> list[str]:
    return sorted(row.case.key for row in rows)


def wait_for(ready, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {WAIT_S:g} s")
        time.sleep(0.05)


def all_ended(run_dir: Path) -> bool:
    record, _, _ = cluster.status(run_dir, make_console())
    return all(job.ended for _, job in record.jobs())


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def task_of(job_id: str) -> int:
    """The process a local job runs its work in: the child of its controller (the job id)."""
    wait_for(lambda: children(int(job_id)), f"the task of local job {job_id}")
    return children(int(job_id))[0]


# ----------------------------------------------------------------------------------------------
# Local jobs


def test_local_jobs_give_the_cases_of_the_in_process_sweep(tmp_path, capsys):
    spec = spec_file(tmp_path)
    here, there = tmp_path / "in-process", tmp_path / "in-jobs"
    assert main(["sweep", spec, "--out", str(here)]) == 0
    assert main(["sweep", spec, "--out", str(there), "--executor", "local", "--nodes", "2"]) == 0
    printed = capsys.readouterr().out
    assert "submitted 12 case(s) in 2 local job(s)" in printed and "COMPLETED" in printed

    measured, sharded = rows_of(here), rows_of(there)
    assert len(measured) == len(sharded) == 12 and keys(measured) == keys(sharded)
    assert {row.case.key: row.status for row in measured} == {row.case.key: row.status for row in sharded}
    for row in [*measured, *sharded]:
        assert row.host == socket.gethostname() and row.gpu_name == ""  # a CPU measured them

    record = jobs.read(there)
    assert record is not None and record.executor == "local" and len(record.rounds) == 1
    (submitted,) = record.rounds
    assert submitted.closed and [job.state for job in submitted.jobs] == ["COMPLETED", "COMPLETED"]
    assert sum(job.cases for job in submitted.jobs) == 12
    for job in submitted.jobs:
        assert (there / job.stderr).is_file() and len(rows_of(there / submitted.shard(job))) == job.cases
    env = rundir.read_env(there)
    assert env["executor"] == "local" and [node["shard"] for node in env["nodes"]] == [
        "shards/1-0",
        "shards/1-1",
    ]

    assert main(["status", str(there)]) == 0
    printed = capsys.readouterr().out
    assert "12 row(s) merged into" in printed and printed.count("COMPLETED") == 2


@pytest.mark.slow  # jobs killed or requeued and waited for: about a minute
def test_a_killed_job_then_resume_submits_only_its_missing_cases(tmp_path, job_env):
    spec = spec_file(tmp_path, SLOW_SPEC)
    run = tmp_path / "run"
    assert main(["sweep", spec, "--out", str(run), "--executor", "local", "--nodes", "2", "--no-wait"]) == 0
    killed = jobs.read(run).rounds[0].jobs[0]
    wait_for(lambda: rows_of(run / "shards/1-0"), "a first row of job 0")
    tree, index = [int(killed.job_id)], 0
    while index < len(tree):
        tree += children(tree[index])
        index += 1
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all_ended(run), "the end of both jobs")

    record = jobs.read(run)
    assert [job.state for job in record.rounds[0].jobs] == ["INTERRUPTED", "COMPLETED"]
    before = {row.case.key: row for row in rows_of(run)}
    every = [case.key for case in specs.expand(specs.load_spec(Path(spec)))]
    missing = sorted(set(every) - set(before))
    assert missing and set(missing) <= set(every[0::2])  # job 0's cases only: the shards are round-robin

    assert main(["sweep", "--resume", str(run)]) == 0  # the run's own executor: local
    record = jobs.read(run)
    again = record.rounds[1]
    assert again.closed and sum(job.cases for job in again.jobs) == len(missing)
    assert keys([row for job in again.jobs for row in rows_of(run / again.shard(job))]) == missing
    after = rows_of(run)
    assert keys(after) == sorted(every)
    assert all(row == before[row.case.key] for row in after if row.case.key in before)


@pytest.mark.slow  # jobs killed or requeued and waited for: about a minute
def test_a_preempted_job_is_requeued_and_keeps_its_rows(tmp_path, job_env):
    spec = spec_file(tmp_path, SLOW_SPEC)
    run = tmp_path / "run"
    assert main(["sweep", spec, "--out", str(run), "--executor", "local", "--no-wait"]) == 0
    (job,) = jobs.read(run).rounds[0].jobs
    shard = run / "shards/1-0"
    wait_for(lambda: rows_of(shard), "a first row")
    os.kill(task_of(job.job_id), signal.SIGUSR2)  # what Slurm sends before preempting the job
    first = rows_of(shard)
    wait_for(lambda: all_ended(run), "the end of the job")

    (job,) = jobs.read(run).rounds[0].jobs
    assert job.state == "COMPLETED"
    log = (run / job.stdout).read_text() + (run / job.stderr).read_text()
    assert "Requeued job" in log and "finished row(s) kept" in log
    rows = rows_of(run)
    assert len(rows) == 12 and len(set(keys(rows))) == 12
    kept = {row.case.key: row for row in rows}
    assert all(kept[row.case.key] == row for row in first)


def test_a_job_is_requeued_once(tmp_path):
    spec = specs.load_spec(Path(spec_file(tmp_path)))
    case = specs.expand(spec)[0]
    job = ShardJob(tmp_path, 1, 0, spec, (case,), precompile=4)
    requeued = job.checkpoint()
    assert requeued.function == ShardJob(tmp_path, 1, 0, spec, (case,), precompile=4, requeued=1)
    assert requeued.function.directory == tmp_path / "shards" / "1-0"
    assert requeued.function.checkpoint() is None


# ----------------------------------------------------------------------------------------------
# Merging


def _write_shard(path: Path, rows: list[ResultRow], columns: list[str], halfway: Any = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = rundir.RowWriter(path, columns)
    for number, row in enumerate(rows):
        if halfway is not None and number == len(rows) // 2:
            halfway.wait(timeout=120)  # the merges run while every shard is half written
        writer.write(row)
        time.sleep(0.005)
    writer.close()


def test_loading_a_shard_job_imports_no_torch():
    # submitit unpickles the job before it installs its signal handlers: a requeue signal in that
    # window ends the job, so the window is kept short.
    probe = "import pickle, sys, tfla_bench.run.shard; print(sorted({'torch', 'pandas'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_shard_files_merge_without_duplicates_under_concurrent_writers(tmp_path):
    shards = [
        [
            Case("sdpa_math", "fw", "float32", 1, 8 * (25 * shard + i + 1), 2, 8, 8, None, {})
            for i in range(25)
        ]
        for shard in range(4)
    ]
    every = [case for shard in shards for case in shard]
    columns = row_schema.columns_for(every)
    # A case a requeued job runs again: its interrupted row is in results.csv, the shard writes its new one.
    retried = ResultRow(case=shards[0][0], family="attention", status="interrupted", error="old")
    rundir.rewrite_results(tmp_path / rundir.RESULTS, [retried], columns)
    record = JobsRecord("local", {}, [Round(1, "now", [JobRecord(i, str(i), 25) for i in range(4)])])
    context = multiprocessing.get_context("fork")
    halfway = context.Event()
    writers = [
        context.Process(
            target=_write_shard,
            args=(
                tmp_path / rundir.shard_dir(1, index) / rundir.RESULTS,
                [ResultRow(case=case, family="attention", status="ok", median_ms=1.0) for case in shard],
                columns,
                halfway,
            ),
        )
        for index, shard in enumerate(shards)
    ]
    for writer in writers:
        writer.start()
    merges = 0
    while any(writer.is_alive() for writer in writers) or merges < 3:
        merged = cluster.merge(tmp_path, record)
        read = rundir.read_results(tmp_path / rundir.RESULTS)
        assert not read.skipped and len(keys(read.rows)) == len(set(keys(read.rows)))
        assert keys(read.rows) == keys(merged.rows)
        merges += 1
        if merges == 3:
            halfway.set()
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    merged = cluster.merge(tmp_path, record)
    assert keys(merged.rows) == sorted(case.key for case in every) and merges >= 3
    assert {row.status for row in merged.rows} == {"ok"}
    assert merged.shard_rows == {rundir.shard_dir(1, index): 25 for index in range(4)}


def test_env_lists_the_nodes_in_job_order_whichever_finished_first(tmp_path):
    record = JobsRecord("local", {}, [Round(1, "now", [JobRecord(i, str(i), 1) for i in range(3)])])
    for index in (2, 0, 1):  # the jobs write their env.json in this order, a merge after each
        (tmp_path / rundir.shard_dir(1, index)).mkdir(parents=True)
        rundir.write_json(tmp_path / rundir.shard_dir(1, index) / rundir.ENV, {"gpu_name": f"node {index}"})
        cluster.merge(tmp_path, record)
    env = rundir.read_env(tmp_path)
    assert [node["shard"] for node in env["nodes"]] == [rundir.shard_dir(1, index) for index in range(3)]
    assert [node["job_id"] for node in env["nodes"]] == ["0", "1", "2"]
    assert env["gpu_name"] == "node 2"  # the first node to report heads the record


# ----------------------------------------------------------------------------------------------
# Slurm, stood in for


def stand_in(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """A folder on PATH with an `srun` (how submitit tells a Slurm cluster) and an `sbatch` that
    accepts every submission as job 4242; returns the folder."""
    folder = tmp_path / "slurm-bin"
    folder.mkdir()
    stand_in(folder, "srun", "exit 0")
    stand_in(folder, "sbatch", 'echo "Submitted batch job 4242"')
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def test_the_sbatch_script_for_the_flags(tmp_path, capsys, slurm):
    run = tmp_path / "run"
    flags = ["--executor", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "1:30:00"]
    flags += ["--partition", "gpu", "--account", "proj", "--constraint", "h100", "--precompile", "3"]
    flags += ["--slurm-arg", "qos=high", "--slurm-arg", "exclusive", "--no-wait"]
    assert main(["sweep", spec_file(tmp_path), "--out", str(run), *flags]) == 0
    assert "job id(s) 4242_0, 4242_1" in capsys.readouterr().out

    folder = (run / rundir.submitit_dir(1)).resolve()
    script = (folder / "4242_submission.sh").read_text()
    options = {line for line in script.splitlines() if line.startswith("#SBATCH")}
    assert options >= {
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --constraint=h100",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --time=90",
        "#SBATCH --qos=high",
        "#SBATCH --exclusive",
        "#SBATCH --array=0-1%2",
        "#SBATCH --job-name=tfla-bench-tiny",
        f"#SBATCH --signal=USR2@{cluster.SIGNAL_DELAY_S}",
        f"#SBATCH --output={folder}/%A_%a_0_log.out",
        f"#SBATCH --error={folder}/%A_%a_0_log.err",
    }
    assert script.rstrip().splitlines()[-1].endswith(f"-m submitit.core._submit {folder}")

    record = jobs.read(run)
    assert [(job.job_id, job.cases, job.state) for job in record.rounds[0].jobs] == [
        ("4242_0", 6, "SUBMITTED"),
        ("4242_1", 6, "SUBMITTED"),
    ]
    assert record.options["slurm_args"] == {"qos": "high", "exclusive": True}
    from submitit.core.utils import DelayedSubmission

    shards = [DelayedSubmission.load(folder / f"4242_{index}_submitted.pkl").function for index in (0, 1)]
    assert all(shard.precompile == 3 and shard.run_dir == run.resolve() for shard in shards)
    assert len({case.key for shard in shards for case in shard.cases}) == 12

    stand_in(slurm, "sacct", "printf 'JobID|State|NodeList\\n4242_0|RUNNING|n1\\n4242_1|PENDING|None\\n'")
    assert main(["status", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "RUNNING" in printed and "PENDING" in printed and "2 job(s) not ended yet" in printed
    assert main(["sweep", "--resume", str(run)]) == 2
    assert "2 job(s) of" in capsys.readouterr().err


def test_a_refused_submission_shows_sbatchs_message(tmp_path, capsys, slurm):
    stand_in(slurm, "sbatch", 'echo "sbatch: error: invalid partition specified: nope" >&2\nexit 1')
    args = ["sweep", spec_file(tmp_path), "--out", str(tmp_path / "run"), "--executor", "slurm"]
    assert main([*args, "--partition", "nope"]) == 2
    err = capsys.readouterr().err
    assert (
        err == "error: the slurm submission was refused: sbatch: error: invalid partition specified: nope\n"
    )
    assert jobs.read(tmp_path / "run") is None


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--partition", "gpu"], "--partition needs --executor slurm or local"),
        (["--no-wait"], "--no-wait needs --executor slurm or local"),
        (["--executor", "pbs"], "--executor: expected one of none, slurm, local, got 'pbs'"),
        (["--executor", "local", "--account", "proj"], "--account needs --executor slurm"),
        (["--executor", "local", "--nodes", "0"], "--nodes: expected a number of jobs >= 1, got 0"),
        (["--executor", "local", "--gpus-per-node", "64"], "need 64 GPU(s); this machine has"),
        (["--executor", "local", "--check"], "--check is not available with --executor local"),
        (["--executor", "local", "--gpus", "1"], "--gpus is not available with --executor local"),
        (["--executor", "slurm", "--time", "1:xx"], "--time: expected minutes or D-HH:MM:SS, got '1:xx'"),
        (["--executor", "slurm", "--time", "0"], "--time: expected a positive time"),
        (["--executor", "slurm", "--partition", "a b"], "--partition: expected one word"),
        (["--executor", "slurm", "--slurm-arg", "time=10"], "--slurm-arg time: give it as --time"),
        (["--executor", "slurm", "--slurm-arg", "output=x"], "--slurm-arg output: set by tfla-bench"),
        (["--executor", "slurm", "--slurm-arg", "=3"], "--slurm-arg: expected KEY=VALUE"),
        (["--executor", "slurm", "--slurm-arg", "qos="], "--slurm-arg: expected KEY=VALUE"),
        (["--executor", "slurm", "--slurm-arg", "noequals"], "--slurm-arg noequals: expected KEY=VALUE"),
        (["--executor", "slurm", "--slurm-arg", "qos", "--dry-run"], "--slurm-arg qos: expected KEY=VALUE"),
        (
            ["--executor", "slurm", "--slurm-arg", "mem=1\n#SBATCH --x=y", "--dry-run"],
            "holds a control character",
        ),
    ],
)
def test_bad_cluster_flags_are_one_line_and_exit_2(tmp_path, capsys, slurm, flags, expected):
    out = tmp_path / "run"
    assert main(["sweep", spec_file(tmp_path), "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and err.count("\n") == 1
    assert not out.exists()


def test_without_slurm_or_submitit_the_executor_is_one_line(tmp_path, capsys, monkeypatch):
    args = ["sweep", spec_file(tmp_path), "--out", str(tmp_path / "run")]
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    assert main([*args, "--executor", "slurm"]) == 2
    assert "no srun on PATH" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` fails
    assert main([*args, "--executor", "local"]) == 2
    assert (
        capsys.readouterr().err == "error: --executor local needs submitit: pip install tfla-bench[cluster]\n"
    )


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("90", 90),
        ("30:00", 30),
        ("0:30", 1),
        ("1:30:00", 90),
        ("2-00", 2880),
        ("1-2:03", 1563),
        ("1-0:0:1", 1441),
    ],
)
def test_slurm_time_formats(text, minutes):
    assert cluster.parse_time(text) == minutes


# ----------------------------------------------------------------------------------------------
# Rows of several GPUs


@pytest.fixture
def mixed_run(tmp_path):
    """A run whose tfla_sig rows were measured on an H100 and its tfla_exp rows on an A100."""
    rows = headdim_rows()
    for row in rows:
        row["gpu_name"] = H100_NAME if row["kernel"] == "tfla_sig" else A100_NAME
    run = write_run(tmp_path / "mixed", rows, published="none")
    env = json.loads((run / rundir.ENV).read_text())
    env["nodes"] = [
        {"shard": "shards/1-0", "gpu_name": H100_NAME, "driver": "580.00"},
        {"shard": "shards/1-1", "gpu_name": A100_NAME, "driver": "550.00", "sm_count": 108},
    ]
    (run / rundir.ENV).write_text(json.dumps(env))
    return run


@pytest.mark.parametrize("command", [["compare"], ["plot"], ["report"], ["diff", "RUN"]])
def test_a_run_of_two_gpus_is_refused_without_gpu(capsys, mixed_run, command):
    argv = [command[0], str(mixed_run), *[str(mixed_run) for _ in command[1:]]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds rows of 2 GPUs" in err and "--gpu NAME" in err
    assert H100_NAME in err and A100_NAME in err


def test_gpu_picks_one_gpus_rows_and_its_node(capsys, mixed_run):
    run = load_run(mixed_run, A100_NAME)
    assert set(run.results["kernel"]) == {"tfla_exp"} and set(run.results["gpu_name"]) == {A100_NAME}
    assert (run.gpu_name, run.env["driver"], run.env["sm_count"]) == (A100_NAME, "550.00", 108)
    assert main(["report", str(mixed_run), "--gpu", H100_NAME, "--published", "none"]) == 0
    page = (mixed_run / "report-nvidia-h100-80gb-hbm3.html").read_text()
    assert "<td>tfla_sig</td>" in page and "<td>tfla_exp</td>" not in page  # table cells, not the mapping
    assert main(["diff", str(mixed_run), str(mixed_run), "--gpu", A100_NAME]) == 0
    assert main(["compare", str(mixed_run), "--gpu", "NVIDIA B200"]) == 2
    assert "--gpu NVIDIA B200: no row of" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Slurm job states, without daemons


@pytest.mark.parametrize(
    ("seen", "result", "marker", "previous", "expected"),
    [
        # With accounting, sacct's word; a result read as soon as the job wrote it.
        (("RUNNING", "RUNNING"), None, None, "PENDING", ("RUNNING", "")),
        (("RUNNING", "RUNNING"), ("COMPLETED", ""), None, "RUNNING", ("COMPLETED", "")),
        (
            ("RUNNING", "RUNNING"),
            ("FAILED", "timed-out too many times"),
            "INTERRUPTED",
            "RUNNING",
            ("INTERRUPTED", "timed-out too many times"),
        ),
        (("CANCELLED by 0", ""), ("COMPLETED", ""), None, "RUNNING", ("CANCELLED", "")),
        (
            ("TIMEOUT", ""),
            ("FAILED", "timed-out too many times"),
            "INTERRUPTED",
            "RUNNING",
            ("TIMEOUT", "timed-out too many times"),
        ),
        (("COMPLETED", ""), ("FAILED", "boom"), None, "RUNNING", ("FAILED", "boom")),
        (("FAILED", ""), None, None, "RUNNING", ("FAILED", "")),
        (
            ("FAILED", ""),
            ("FAILED", "timed-out too many times"),
            "INTERRUPTED",
            "RUNNING",
            ("INTERRUPTED", "timed-out too many times"),
        ),
        # Without accounting: squeue while it lists the job, even an ended one.
        ((None, "PENDING"), None, None, "SUBMITTED", ("PENDING", "")),
        ((None, "REQUEUED"), None, None, "RUNNING", ("REQUEUED", "")),
        ((None, "CANCELLED"), None, "CANCELLED", "RUNNING", ("CANCELLED", "")),
        ((None, "COMPLETING"), None, "CANCELLED", "RUNNING", ("COMPLETING", "")),
        # Gone from the queue: it ended, as its marker or result says, or ENDED.
        ((None, ""), None, "CANCELLED", "RUNNING", ("CANCELLED", "")),
        ((None, ""), ("COMPLETED", ""), None, "RUNNING", ("COMPLETED", "")),
        ((None, ""), None, None, "UNKNOWN", ("ENDED", "left Slurm's queue")),
        # Accounting that has no record yet, and squeue gone: the same.
        ((None, ""), None, None, "SUBMITTED", ("ENDED", "left Slurm's queue")),
        # Slurm could not be asked: what the job left, else the state before.
        ((None, None), None, None, "RUNNING", ("RUNNING", "")),
        ((None, None), ("COMPLETED", ""), None, "RUNNING", ("COMPLETED", "")),
        (None, None, None, "SUBMITTED", ("SUBMITTED", "")),
    ],
)
def test_slurm_job_states(seen, result, marker, previous, expected):
    state, error = cluster.job_state(
        cluster.SlurmSeen(*seen) if seen is not None else None, result, marker, previous
    )
    assert state == expected[0] and error.startswith(expected[1])
    if state not in jobs.ACTIVE_STATES:
        assert JobRecord(0, "1", 1, state=state).ended


def test_no_state_stays_active_once_a_job_left_the_queue():
    for previous in jobs.ACTIVE_STATES:
        state, _ = cluster.job_state(cluster.SlurmSeen(None, ""), None, None, previous)
        assert JobRecord(0, "1", 1, state=state).ended


def test_poll_without_accounting_asks_sacct_once(tmp_path, monkeypatch, slurm):
    calls = tmp_path / "calls"
    stand_in(
        slurm, "sacct", f'echo sacct >> {calls}\necho "Slurm accounting storage is disabled" >&2\nexit 1'
    )
    stand_in(slurm, "squeue", f"echo squeue >> {calls}\nprintf '7_0|RUNNING\\n'")
    monkeypatch.setattr(cluster, "_accounting", True)
    poll = cluster.poll_slurm(["7_0", "7_1"])
    assert poll.seen == {"7_0": cluster.SlurmSeen(None, "RUNNING"), "7_1": cluster.SlurmSeen(None, "")}
    assert poll.failed == poll.held == {}
    assert cluster.poll_slurm(["7_0"]).seen == {"7_0": cluster.SlurmSeen(None, "RUNNING")}
    assert calls.read_text().split() == ["sacct", "squeue", "squeue"]


def test_a_failed_sacct_is_said_and_asked_again(tmp_path, monkeypatch, slurm):
    calls = tmp_path / "calls"
    refused = 'echo "sacct: error: slurmdbd: Connection refused" >&2\nexit 1'
    stand_in(slurm, "sacct", f"echo sacct >> {calls}\n{refused}")
    stand_in(slurm, "squeue", "printf '7_0|RUNNING|None|2026-12-02T10:00:00\\n'")
    monkeypatch.setattr(cluster, "_accounting", True)
    poll = cluster.poll_slurm(["7_0"])
    assert poll.failed == {"sacct": "sacct: error: slurmdbd: Connection refused"}
    assert poll.seen == {"7_0": cluster.SlurmSeen(None, "RUNNING")}
    stand_in(slurm, "sacct", f"echo sacct >> {calls}\nprintf 'JobID|State\\n7_0|COMPLETED\\n'")
    poll = cluster.poll_slurm(["7_0"])
    assert poll.failed == {} and poll.seen == {"7_0": cluster.SlurmSeen("COMPLETED", "RUNNING")}
    assert calls.read_text().split() == ["sacct", "sacct"]


def test_a_held_job_is_said_once_per_hold(slurm, monkeypatch):
    stand_in(slurm, "sacct", 'echo "Slurm accounting storage is disabled" >&2\nexit 1')
    lines = (
        "7_0|PENDING|BeginTime|2026-12-02T10:02:00\\n7_1|PENDING|JobHeldUser|N/A\\n7_2|PENDING|Resources|N/A"
    )
    stand_in(slurm, "squeue", f"printf '{lines}\\n'")
    monkeypatch.setattr(cluster, "_accounting", True)
    poll = cluster.poll_slurm(["7_0", "7_1", "7_2"])
    assert set(poll.held) == {"7_0", "7_1"}
    assert poll.held["7_0"].startswith("held by Slurm until 2026-12-02T10:02:00 (BeginTime): a requeued job")
    assert "(JobHeldUser): it starts once released" in poll.held["7_1"]
    console = Console(file=io.StringIO(), width=200)
    holds: dict[str, str] = {}
    for _ in range(3):
        cluster.say_poll(poll, console, holds)
    assert console.file.getvalue().count("held by Slurm") == 2


def test_a_sweep_says_each_failed_squeue_and_stops_after_the_wait_it_is_given(tmp_path, monkeypatch, slurm):
    stand_in(slurm, "sacct", 'echo "Slurm accounting storage is disabled" >&2\nexit 1')
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    stand_in(slurm, "squeue", f'echo "{down}" >&2\nexit 1')
    monkeypatch.setattr(cluster, "_accounting", True)
    monkeypatch.setattr(cluster, "STATE_POLL_S", 0.2)
    monkeypatch.setattr(cluster, "POLL_S", 0.05)
    monkeypatch.setenv(cluster.SLURM_WAIT_ENV, "1")
    case = Case("sdpa_math", "fw", "float32", 1, 8, 2, 8, 8, None, {})
    rundir.rewrite_results(tmp_path / rundir.RESULTS, [], row_schema.columns_for([case]))
    record = JobsRecord("slurm", {}, [Round(1, "now", [JobRecord(0, "7", 1, state="PENDING")])])
    handle = SimpleNamespace(paths=SimpleNamespace(result_pickle=tmp_path / "none.pkl"))
    console = Console(file=io.StringIO(), width=300)
    began = time.monotonic()
    with pytest.raises(
        RunFailed, match=r"Slurm's queue has not answered for \d+ s \(squeue: slurm_load_jobs"
    ):
        cluster.follow(tmp_path, record, record.rounds[0], [handle], console)
    polls = (time.monotonic() - began) / cluster.STATE_POLL_S
    said = console.file.getvalue().count(f"warning: squeue failed: {down}")
    assert 1 < said <= polls + 1
    assert record.rounds[0].jobs[0].state == "PENDING"


@pytest.mark.parametrize("value", ["x", "0", "-5", "nan", "inf"])
def test_a_bad_slurm_wait_is_one_line(tmp_path, capsys, monkeypatch, slurm, value):
    monkeypatch.setenv(cluster.SLURM_WAIT_ENV, value)
    argv = ["sweep", spec_file(tmp_path), "--executor", "slurm", "--dry-run"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: {cluster.SLURM_WAIT_ENV}={value!r}: expected a number of seconds above 0\n"
    )


def test_squeue_forgetting_the_one_job_asked_is_its_end(slurm, monkeypatch):
    stand_in(slurm, "sacct", 'echo "Slurm accounting storage is disabled" >&2\nexit 1')
    stand_in(slurm, "squeue", 'echo "slurm_load_jobs error: Invalid job id specified" >&2\nexit 1')
    monkeypatch.setattr(cluster, "_accounting", True)
    assert cluster.poll_slurm(["9"]).seen == {"9": cluster.SlurmSeen(None, "")}
    stand_in(slurm, "squeue", 'echo "slurm_load_jobs error: Unable to contact slurm controller" >&2\nexit 1')
    poll = cluster.poll_slurm(["9"])
    assert poll.seen == {"9": cluster.SlurmSeen(None, None)}
    assert poll.failed == {"squeue": "slurm_load_jobs error: Unable to contact slurm controller"}


def test_rows_a_shard_writes_after_its_round_closed_are_merged_once(tmp_path):
    cases = [Case("sdpa_math", "fw", "float32", 1, 8 * (i + 1), 2, 8, 8, None, {}) for i in range(4)]
    columns = row_schema.columns_for(cases)
    shard = tmp_path / rundir.shard_dir(1, 0) / rundir.RESULTS
    shard.parent.mkdir(parents=True)
    writer = rundir.RowWriter(shard, columns)
    ok = [ResultRow(case=case, family="attention", status="ok", median_ms=1.0) for case in cases]
    writer.write(ok[0])
    rundir.rewrite_results(tmp_path / rundir.RESULTS, [], columns)
    record = JobsRecord("slurm", {}, [Round(1, "now", [JobRecord(0, "5_0", 4, state="CANCELLED")])])
    cluster.close(tmp_path, record, record.rounds[0])
    assert keys(rows_of(tmp_path)) == [cases[0].key] and record.rounds[0].jobs[0].merged_rows == 1

    # A later resume in this process replaced case 0's row; the cancelled job then wrote case 1.
    replaced = ResultRow(case=cases[0], family="attention", status="ok", median_ms=2.0)
    rundir.rewrite_results(tmp_path / rundir.RESULTS, [replaced], columns)
    writer.write(ok[1])
    merged = cluster.merge(tmp_path, record)
    assert merged.late and record.rounds[0].jobs[0].merged_rows == 2
    assert {row.case.key: row.median_ms for row in rows_of(tmp_path)} == {
        cases[0].key: 2.0,
        cases[1].key: 1.0,
    }
    assert not cluster.merge(tmp_path, record).late
    writer.close()


def test_a_merge_changes_no_finished_row_of_results_csv(tmp_path):
    """A finished row of results.csv stays as the file holds it (a NaN cell, its spelling of a
    number) when an open round's shard holds another row of its case; an interrupted one is replaced."""
    cases = [Case("sdpa_math", "fw", "float32", 1, 8 * (i + 1), 2, 8, 8, None, {}) for i in range(2)]
    columns = row_schema.columns_for(cases)
    shard = [ResultRow(case=case, family="attention", status="ok", median_ms=1.0) for case in cases]
    _write_shard(tmp_path / rundir.shard_dir(1, 0) / rundir.RESULTS, shard, columns)
    held = [
        ResultRow(case=cases[0], family="attention", status="ok", median_ms=1.5, p20_ms=float("nan")),
        ResultRow(case=cases[1], family="attention", status="interrupted"),
    ]
    rundir.rewrite_results(tmp_path / rundir.RESULTS, held, columns)
    path = tmp_path / rundir.RESULTS
    p20 = columns.index("p20_ms")
    lines = path.read_bytes().decode().splitlines(keepends=True)
    cells = next(csv.reader([lines[1]]))
    cells[p20] = "NaN"
    lines[1] = ",".join(f'"{cell}"' if "," in cell else cell for cell in cells) + "\r\n"
    path.write_bytes("".join(lines).encode())
    record = JobsRecord("slurm", {}, [Round(1, "now", [JobRecord(0, "5_0", 2, state="RUNNING")])])
    cluster.merge(tmp_path, record)
    after = path.read_bytes().decode().splitlines(keepends=True)
    assert after[1] == lines[1]
    assert [row.status for row in rows_of(tmp_path)] == ["ok", "ok"]
    assert rows_of(tmp_path)[1].median_ms == 1.0


def test_settle_merges_rows_of_closed_rounds(tmp_path):
    case = Case("sdpa_math", "fw", "float32", 1, 8, 2, 8, 8, None, {})
    columns = row_schema.columns_for([case])
    rundir.rewrite_results(tmp_path / rundir.RESULTS, [], columns)
    record = JobsRecord(
        "slurm", {}, [Round(1, "now", [JobRecord(0, "5", 1, state="CANCELLED")], closed=True)]
    )
    jobs.write(tmp_path, record)
    _write_shard(
        tmp_path / rundir.shard_dir(1, 0) / rundir.RESULTS,
        [ResultRow(case=case, family="attention", status="ok", median_ms=1.0)],
        columns,
    )
    cluster.settle(tmp_path)
    assert keys(rows_of(tmp_path)) == [case.key]
    assert jobs.read(tmp_path).rounds[0].jobs[0].merged_rows == 1


def test_an_interrupted_row_runs_again_on_resume():
    case = Case("sdpa_math", "fw", "float32", 1, 8, 2, 8, 8, None, {})
    assert not ResultRow(case=case, family="attention", status="interrupted").finished
    assert ResultRow(case=case, family="attention", status="crashed").finished


def test_a_time_within_the_signal_lead_is_warned_about_in_one_line(tmp_path, capsys, slurm):
    spec = spec_file(tmp_path)
    for minutes, out in ((2, "run"), (3, "later")):
        args = ["sweep", spec, "--out", str(tmp_path / out), "--executor", "slurm", "--time", str(minutes)]
        assert main([*args, "--no-wait"]) == 0
        warned = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
        assert warned == (
            [
                f"warning: --time 2 min is within the {cluster.SIGNAL_DELAY_S} s that Slurm's requeue signal "
                "comes before a job's end: each job is signalled soon after it starts"
            ]
            if minutes == 2
            else []
        )


def test_a_gres_refusal_names_gpus_per_node_0(tmp_path, capsys, slurm):
    stand_in(
        slurm, "sbatch", 'echo "sbatch: error: Invalid generic resource (gres) specification" >&2\nexit 1'
    )
    args = ["sweep", spec_file(tmp_path), "--out", str(tmp_path / "run"), "--executor", "slurm"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith("on nodes without GPUs give --gpus-per-node 0")


def test_status_hints_at_resume_only_when_a_case_lacks_a_measured_row(tmp_path, capsys):
    spec = specs.load_spec(Path(spec_file(tmp_path)))
    cases = specs.expand(spec)
    rundir.write_json(tmp_path / rundir.SPEC, spec.to_dict())
    record = JobsRecord(
        "slurm", {}, [Round(1, "now", [JobRecord(0, "5", 12, state="CANCELLED")], closed=True)]
    )
    jobs.write(tmp_path, record)
    ok = [ResultRow(case=case, family="attention", status="ok", median_ms=1.0) for case in cases]
    for rows, hint in (
        (ok, None),
        (ok[1:], "1 case(s) without a row (or with an interrupted one) run again"),
        ([dataclasses.replace(ok[0], status="interrupted"), *ok[1:]], "1 case(s) without a row"),
    ):
        rundir.rewrite_results(tmp_path / rundir.RESULTS, rows, row_schema.columns_for(cases))
        assert main(["status", str(tmp_path)]) == 0
        printed = capsys.readouterr().out
        assert (hint in printed) if hint else "run again" not in printed
