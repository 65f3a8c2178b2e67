"""Sweeps through a real Slurm: one node on this machine (`slurm_daemons`), once without accounting
(`sacct` fails; states from `squeue` and the jobs' own records) and once with slurmdbd over MariaDB,
both with short timeouts and 2 s state polls; then once as a cluster runs, with accounting, Slurm's
own `KillWait`, `MinJobAge` and requeue hold and the sweep's own 30 s polls, where a job out of time
is requeued and slurmctld is stopped and started again while Slurm holds it.

The jobs measure on the CPU. A job is cancelled with `scancel`, or given a one-minute time limit so
that Slurm's requeue signal comes soon after it starts; afterwards every case has exactly one row,
none `crashed`, and `--resume` runs only the cases without a finished row. `make test-slurm` runs
these; without root or the packages they skip, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugin_support import registered_test_adapters
from slurm_daemons import LocalSlurm, SlurmUnavailable
from test_cluster import SPEC

from tfla_bench.adapters import registry
from tfla_bench.cli.main import main
from tfla_bench.measure.row import ResultRow
from tfla_bench.run import cluster, jobs, rundir, specs
from tfla_bench.run.console import make_console

pytestmark = pytest.mark.slurm

TESTS = Path(__file__).resolve().parent
SMOKE = TESTS.parent / "experiments" / "smoke.toml"
# The smoke's two PyTorch adapters (12 cases): our Triton kernel there needs the interpreter on a CPU.
SMOKE_KERNELS = ["--kernel", "sdpa_math,mlstm_torch"]
REQUIRED_ENV = "TFLA_BENCH_SLURM_REQUIRED"
WAIT_S = 240.0
CPU = ["--gpus-per-node", "0"]
# The sweep's own interval between state polls (the fixture shortens it for the sweeps in this process).
SWEEP_POLL_S = cluster.STATE_POLL_S


def slow_spec(lengths: int) -> str:
    """`lengths` sequence lengths of test_slow (about half a second a case), fw and fwbw."""
    seq_lens = ", ".join(str(8 * (n + 1)) for n in range(lengths))
    return f"""
name = "slow"
kernels = ["test_slow"]
modes = ["fw", "fwbw"]
dtype = "float32"
warmup = 1
reps = 3
timeout_s = 120
[shape]
batch = 1
seq_len = [{seq_lens}]
num_heads = 2
head_dim_qk = 8
head_dim_v = 8
"""


@pytest.fixture(scope="module", autouse=True)
def with_test_adapters():
    with registered_test_adapters():
        yield


@pytest.fixture(scope="module", params=["no-accounting", "accounting"])
def slurm(request):
    """The daemons, with the jobs' environment: this cluster's config, the test adapters, and state
    polls every 2 s instead of 30. `defaults` (asked for by a test) is a cluster as Slurm configures
    one, with accounting."""
    daemons = LocalSlurm(accounting=request.param != "no-accounting", defaults=request.param == "defaults")
    try:
        daemons.start()
    except SlurmUnavailable as exc:
        daemons.stop()
        if os.environ.get(REQUIRED_ENV):
            pytest.fail(f"the Slurm daemons did not start: {exc}")
        pytest.skip(f"no Slurm daemons here: {exc}")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SLURM_CONF", str(daemons.conf))
            patch.setenv(registry.PLUGINS_ENV, "plugin_adapters")
            patch.setenv(
                "PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
            )
            patch.setattr(cluster, "STATE_POLL_S", 2.0)
            patch.setattr(cluster, "_accounting", True)
            yield daemons
    finally:
        daemons.stop()


@pytest.fixture(scope="module")
def local_smoke(tmp_path_factory):
    """The rows of smoke.toml swept in this process."""
    run = tmp_path_factory.mktemp("local") / "run"
    assert main(["sweep", str(SMOKE), *SMOKE_KERNELS, "--out", str(run)]) == 0
    return rows_of(run)


def spec_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return str(path)


def rows_of(run_dir: Path) -> list[ResultRow]:
    return rundir.read_results(run_dir / rundir.RESULTS).rows


def keys(rows: list[ResultRow]) -> list[str]:
    return sorted(row.case.key for row in rows)


def wait_for(ready, what: str, slurm: LocalSlurm) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {WAIT_S:g} s; slurmctld log:\n{slurm.log('slurmctld')}")
        time.sleep(0.5)


def all_ended(run_dir: Path) -> bool:
    record, _, _ = cluster.status(run_dir, make_console())
    return all(job.ended for _, job in record.jobs())


def every_case(spec: str) -> list[str]:
    return sorted(case.key for case in specs.expand(specs.load_spec(Path(spec))))


def shard_rows(run_dir: Path) -> list[ResultRow]:
    shards = run_dir / rundir.SHARDS
    return [row for path in sorted(shards.iterdir()) for row in rows_of(path)] if shards.is_dir() else []


def queue_state(slurm: LocalSlurm, job_id: str) -> str:
    """`STATE|REASON` of a job in squeue (`PENDING|BeginTime`: held after its requeue)."""
    queued = subprocess.run(
        ["squeue", "--noheader", "--format=%T|%r", f"--jobs={job_id}"],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return queued.stdout.strip()


def scancel(slurm: LocalSlurm, job_id: str) -> None:
    subprocess.run(["scancel", job_id], env=slurm.env, check=True, timeout=30)


# ----------------------------------------------------------------------------------------------


def test_a_sweep_on_two_nodes_gives_the_rows_of_a_local_sweep(slurm, local_smoke, tmp_path, capfd):
    run = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                str(SMOKE),
                *SMOKE_KERNELS,
                "--out",
                str(run),
                "--executor",
                "slurm",
                "--nodes",
                "2",
                *CPU,
            ]
        )
        == 0
    )
    printed = capfd.readouterr()
    assert "submitted 12 case(s) in 2 slurm job(s)" in printed.out
    assert "Bypassing sacct error" not in printed.out + printed.err

    rows = rows_of(run)
    assert keys(rows) == keys(local_smoke)
    assert {row.case.key: row.status for row in rows} == {row.case.key: row.status for row in local_smoke}
    assert {row.status for row in rows} == {"ok"}
    (submitted,) = jobs.read(run).rounds
    assert submitted.closed and [job.state for job in submitted.jobs] == ["COMPLETED", "COMPLETED"]
    assert [job.host for job in submitted.jobs] == ["localhost", "localhost"] or all(
        job.host for job in submitted.jobs
    )
    assert [node["job_id"] for node in rundir.read_env(run)["nodes"]] == [
        job.job_id for job in submitted.jobs
    ]


def test_no_wait_then_status(slurm, tmp_path, capsys):
    spec = spec_file(tmp_path, SPEC)
    run = tmp_path / "run"
    assert main(["sweep", spec, "--out", str(run), "--executor", "slurm", "--no-wait", *CPU]) == 0
    assert f"`tfla-bench status {run}`" in capsys.readouterr().out
    wait_for(lambda: all_ended(run), "the end of the job", slurm)
    assert main(["status", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "12 row(s) merged into" in printed and "COMPLETED" in printed
    assert "run again" not in printed  # every case has its row
    assert keys(rows_of(run)) == every_case(spec)
    assert jobs.read(run).rounds[0].closed


def test_a_gres_refusal_names_the_flag_that_avoids_it(slurm, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["sweep", spec_file(tmp_path, SPEC), "--out", str(run), "--executor", "slurm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gres" in err.lower() and "--gpus-per-node 0" in err


def test_scancel_of_one_task_then_resume_runs_every_case_once(slurm, tmp_path, capsys):
    spec = spec_file(tmp_path, slow_spec(8))
    run = tmp_path / "run"
    assert (
        main(["sweep", spec, "--out", str(run), "--executor", "slurm", "--nodes", "2", "--no-wait", *CPU])
        == 0
    )
    cancelled, other = jobs.read(run).rounds[0].jobs
    wait_for(lambda: rows_of(run / "shards/1-0"), "a first row of task 0", slurm)
    scancel(slurm, cancelled.job_id)
    wait_for(lambda: all_ended(run), "the end of both tasks", slurm)

    cancelled, other = jobs.read(run).rounds[0].jobs
    assert (cancelled.state, other.state) == ("CANCELLED", "COMPLETED")
    before = rows_of(run)
    assert "crashed" not in {row.status for row in before}
    assert keys(before) == sorted({row.case.key for row in shard_rows(run)})  # nothing left in a shard
    finished = {row.case.key for row in before if row.finished}
    assert len(finished) < 16
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    assert f"{16 - len(finished)} case(s) without a row (or with an interrupted one) run again" in (
        capsys.readouterr().out
    )

    assert main(["sweep", "--resume", str(run)]) == 0
    record = jobs.read(run)
    assert [job.state for job in record.rounds[1].jobs] == ["COMPLETED", "COMPLETED"]
    assert sum(job.cases for job in record.rounds[1].jobs) == 16 - len(finished)
    after = rows_of(run)
    assert keys(after) == every_case(spec)  # each case exactly once
    assert {row.status for row in after} == {"ok"}


def test_a_cancel_while_rows_are_written_strands_no_row(slurm, tmp_path, capsys):
    spec = spec_file(tmp_path, slow_spec(8))
    run = tmp_path / "run"
    assert (
        main(["sweep", spec, "--out", str(run), "--executor", "slurm", "--nodes", "2", "--no-wait", *CPU])
        == 0
    )
    array = jobs.read(run).rounds[0].jobs[0].job_id.split("_")[0]
    wait_for(lambda: len(shard_rows(run)) >= 3, "three rows", slurm)
    scancel(slurm, array)
    # Merged again and again while the tasks stop.
    wait_for(lambda: all_ended(run), "the end of both tasks", slurm)
    time.sleep(2)  # a row written after the round closed would show in the shards now

    assert main(["status", str(run)]) == 0
    merged = {row.case.key: row for row in rows_of(run)}
    assert all(merged.get(row.case.key) == row for row in shard_rows(run))
    assert "crashed" not in {row.status for row in merged.values()}
    assert {job.state for job in jobs.read(run).rounds[0].jobs} <= {"CANCELLED", "COMPLETED"}

    assert main(["sweep", "--resume", str(run)]) == 0
    record = jobs.read(run)
    again = [
        row.case.key for job in record.rounds[1].jobs for row in rows_of(run / record.rounds[1].shard(job))
    ]
    assert not set(again) & {key for key, row in merged.items() if row.finished}  # nothing measured twice
    assert keys(rows_of(run)) == every_case(spec)


@pytest.mark.parametrize("slurm", ["defaults"], indirect=True)
def test_a_requeue_hold_and_a_stopped_controller_are_said_and_keep_every_row(slurm, tmp_path, capsys):
    """A job out of time is requeued and held; slurmctld stops for longer than a poll during the
    hold and starts again. The sweep (a process of its own, polling as it does on a cluster) says
    both, waits, and ends with the job's rows; `--resume` runs the rest."""
    spec = spec_file(tmp_path, slow_spec(30))
    run, log = tmp_path / "run", tmp_path / "sweep.log"
    argv = ["sweep", spec, "--out", str(run), "--executor", "slurm", "--time", "1", *CPU]
    with log.open("wb") as out:
        sweep = subprocess.Popen(
            [sys.executable, "-m", "tfla_bench.cli.main", *argv], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: (run / rundir.JOBS).is_file(), "the submission", slurm)
        (job,) = jobs.read(run).rounds[0].jobs
        held = lambda: queue_state(slurm, job.job_id) == "PENDING|BeginTime"  # noqa: E731
        wait_for(lambda: held() or sweep.poll() is not None, "the requeue hold", slurm)
        assert sweep.poll() is None, f"the job ended without a requeue:\n{log.read_text()}"
        slurm.stop_controller()
        outage = time.monotonic()
        time.sleep(SWEEP_POLL_S + 10)
        slurm.start_controller()
        outage = time.monotonic() - outage
        code = sweep.wait(WAIT_S)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert f"job {job.job_id}: held by Slurm until " in text and "(BeginTime)" in text, text
    failed = text.count("warning: squeue failed: ")
    assert 1 <= failed <= outage / SWEEP_POLL_S + 1, text
    (job,) = jobs.read(run).rounds[0].jobs
    rows = rows_of(run)
    assert "crashed" not in {row.status for row in rows} and len(keys(rows)) == len(set(keys(rows)))
    if job.state == "COMPLETED":
        assert code == 0 and len(rows) == 60, text
    else:
        assert (code, job.state) == (1, "INTERRUPTED"), text
        assert "submit the rest with tfla-bench sweep --resume" in text

    assert main(["sweep", "--resume", str(run), "--time", "60"]) == 0
    left = 60 - len([row for row in rows if row.finished])
    assert sum(job.cases for one in jobs.read(run).rounds[1:] for job in one.jobs) == left
    assert keys(rows_of(run)) == every_case(spec)
    assert {row.status for row in rows_of(run)} == {"ok"}
