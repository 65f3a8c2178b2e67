"""Fault injection: real sweeps of a tiny CPU spec (`sdpa_math`, `mlstm_torch`) are killed, interrupted,
denied their disk and given workers that crash, and every finished row must survive.

Each sweep runs through the CLI in a subprocess, as a user starts one. Every fault test records how
many faults it injected, how many the run survived (stopped as it should, then completed with every
case exactly once and every earlier row unchanged) and how many finished rows were lost. The last test
renders those counts as the README's Reliability table and checks that the README shows exactly that
table; `TFLA_BENCH_WRITE_RELIABILITY=1` writes it there instead.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_run import ADHOC_RUN

from tfla_bench.adapters import registry
from tfla_bench.cli.main import main
from tfla_bench.measure import row as row_schema
from tfla_bench.measure import settings as measure_settings
from tfla_bench.run import phases, rundir, specs

# Real sweeps killed, interrupted and resumed: minutes on 2 CPU cores. The README's table needs every
# fault of one run, so the module runs whole, in `make test-slow`.
pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
README = TESTS.parent / "README.md"
WRITE_ENV = "TFLA_BENCH_WRITE_RELIABILITY"
TABLE_BEGIN = "<!-- reliability table: written by tests/test_faults.py -->"
TABLE_END = "<!-- end of reliability table -->"
FIG5 = "tfla_fig5_consttoken_rerun_nh16"

# 18 cases: sdpa_math and mlstm_torch (both gates), fw and fwbw, three sequence lengths.
SPEC = """
name = "tiny"
kernels = ["sdpa_math", "mlstm_torch"]
modes = ["fw", "fwbw"]
dtype = "float32"
warmup = 1
min_time_s = 0.3
budget_s = 0.3
timeout_s = 120
[shape]
tokens = 128
seq_len = [32, 64, 128]
num_heads = 2
head_dim_qk = 16
head_dim_v = 16
chunk_size = 16
[override.mlstm_torch]
params = { gate = ["exp", "sig"] }
"""
CASES = 18
KEY_COLUMNS = (*row_schema.CASE_COLUMNS, "param_gate")
# Where the sweeps are stopped: once while starting up (the spec is written, no row yet), then after
# the given number of rows, each reached by a run that wrote at least one row of its own. A sweep
# notices a signal within about 0.2 s, so each case times calls for 0.3 s (`min_time_s`): the signal
# lands before the next row, and the last point still leaves five cases.
STOP_POINTS = (None, 1, 3, 4, 6, 7, 9, 10, 12, 13)
WAIT_S = 300.0


@dataclass(frozen=True)
class Outcome:
    """One row of the Reliability table."""

    fault: str
    injected: int
    survived: int
    rows_lost: int


OUTCOMES: dict[str, Outcome] = {}
FAULTS = 16  # the rows of the table: the tests below that call `record`


def record(fault: str, injected: int, survived: int, rows_lost: int) -> None:
    OUTCOMES[fault] = Outcome(fault, injected, survived, rows_lost)


# --- running the CLI ---------------------------------------------------------------------------------


def _env(plugins: str | None = None) -> dict[str, str]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    env.pop(registry.PLUGINS_ENV, None)
    if plugins:
        env[registry.PLUGINS_ENV] = plugins
    return env


def start(args: list[str], cwd: Path, log: Path, plugins: str | None = None) -> subprocess.Popen:
    """`tfla-bench ARGS` in a subprocess; its output goes to `log` (a pipe nobody reads could fill up)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tfla_bench.cli.main", *args],
            cwd=cwd,
            env=_env(plugins),
            stdout=out,
            stderr=subprocess.STDOUT,
            # A shell's background job ignores SIGINT and its children inherit that; the sweep must
            # meet Ctrl-C as a terminal sends it.
            preexec_fn=_interruptible,
        )


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(args: list[str], cwd: Path, log: Path, plugins: str | None = None) -> int:
    proc = start(args, cwd, log, plugins)
    return proc.wait(WAIT_S)


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], log: Path) -> None:
    """Poll until `ready()`; the sweep must still be running then."""
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended (exit {proc.returncode}) early:\n{log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the fault point was not reached in {WAIT_S:g} s:\n{log.read_text()}")
        time.sleep(0.02)


# --- reading results ---------------------------------------------------------------------------------


def rows(run_dir: Path) -> list[dict[str, str]]:
    """The complete rows of `results.csv` (a torn last line is not a row)."""
    path = run_dir / "results.csv"
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    complete = text[: text.rfind("\n") + 1]
    return list(csv.DictReader(io.StringIO(complete)))


def key(row: dict[str, str]) -> tuple[str, ...]:
    return tuple(row.get(column, "") for column in KEY_COLUMNS)


def row_count(run_dir: Path) -> int:
    return len(rows(run_dir))


def spec_written(run_dir: Path) -> bool:
    try:
        json.loads((run_dir / "spec.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def lost(before: list[dict[str, str]], after: list[dict[str, str]]) -> int:
    """Finished rows of `before` missing from `after` or changed there."""
    now = {key(row): row for row in after}
    return sum(1 for row in before if now.get(key(row)) != row)


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "tiny.toml"
    path.write_text(SPEC)
    return path


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory, spec_file) -> Path:
    """The spec run once without faults: the case set every faulted run must end with."""
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    log = run_dir.parent / "sweep.log"
    assert finish(["sweep", str(spec_file), "--out", str(run_dir)], run_dir.parent, log) == 0, log.read_text()
    found = rows(run_dir)
    assert len(found) == CASES and {row["status"] for row in found} == {"ok"}
    return run_dir


# --- stopping a sweep and resuming it ------------------------------------------------------------------


def _stop_and_resume(tmp_path: Path, spec_file: Path, clean_run: Path, sig: int, exit_code: int) -> tuple:
    """Stop one run directory's sweep with `sig` at every `STOP_POINTS`, resuming it each time, then
    finish it; returns (faults injected, survived, rows lost)."""
    run_dir = tmp_path / "run"
    log = tmp_path / "sweep.log"
    codes, snapshots = [], []
    for index, point in enumerate(STOP_POINTS):
        resume = ["sweep", "--resume", str(run_dir)]
        args = resume if index else ["sweep", str(spec_file), "--out", str(run_dir)]
        before = row_count(run_dir)
        proc = start(args, tmp_path, log)
        if point is None:
            wait_until(proc, lambda: spec_written(run_dir), log)
        else:
            wait_until(proc, lambda p=point, b=before: (n := row_count(run_dir)) >= p and n > b, log)
        proc.send_signal(sig)
        codes.append(proc.wait(WAIT_S))
        snapshots.append(rows(run_dir))
    assert finish(["sweep", "--resume", str(run_dir)], tmp_path, log) == 0, log.read_text()
    final = rows(run_dir)
    keys = [key(row) for row in final]
    assert len(keys) == len(set(keys)) == CASES, log.read_text()
    assert set(keys) == {key(row) for row in rows(clean_run)}
    assert {row["status"] for row in final} == {"ok"}
    losses = [lost(snapshot, final) for snapshot in snapshots]
    survived = sum(code == exit_code and not loss for code, loss in zip(codes, losses, strict=True))
    assert codes == [exit_code] * len(STOP_POINTS), log.read_text()
    # Every stopped attempt that measured a row left its time in timings.json, kept under `earlier`.
    earlier = phases.read(run_dir)["earlier"]
    assert sum("measuring" in part["phases_s"] for part in earlier) >= sum(p is not None for p in STOP_POINTS)
    return len(STOP_POINTS), survived, sum(losses)


def test_kill_9_at_10_points_then_resume(tmp_path, spec_file, clean_run):
    counts = _stop_and_resume(tmp_path, spec_file, clean_run, signal.SIGKILL, -signal.SIGKILL)
    record("`kill -9` of the sweep, at 10 points of the run, each followed by `--resume`", *counts)
    assert counts[1:] == (counts[0], 0)


def test_ctrl_c_at_10_points_then_resume(tmp_path, spec_file, clean_run):
    counts = _stop_and_resume(tmp_path, spec_file, clean_run, signal.SIGINT, 130)
    record("Ctrl-C (SIGINT) of the sweep, at 10 points of the run, each followed by `--resume`", *counts)
    assert counts[1:] == (counts[0], 0)


# An adapter module that registers no adapter. In the sweep that loads it, the moment spec.json is
# written, it sends the process SIGINT and takes it in one of the places that the imports after
# spec.json pass through and that a KeyboardInterrupt does not leave as itself (`where`): code
# compiled from a string (the methods dataclasses and namedtuples build); a C extension's
# initialisation, which pybind11 ends in an ImportError raised from it (triton's, here in code from
# a string too); a weakref callback (importlib frees its module locks in one), where Python only
# reports an exception.
CTRL_C_HOOK = """
import os
import signal
import time
import weakref

from tfla_bench.run import rundir

_write_spec = rundir.write_spec


def ctrl_c(*_):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)


class Freed:
    pass


def write_spec(run_dir, spec):
    _write_spec(run_dir, spec)
    if {where!r} == "weakref callback":
        freed = Freed()
        ref = weakref.ref(freed, ctrl_c)
        del freed
        return
    try:
        exec("ctrl_c()", globals())
    except KeyboardInterrupt as exc:
        if {where!r} == "extension":
            raise ImportError("initialization failed") from exc
        raise


rundir.write_spec = write_spec
"""


@pytest.mark.parametrize("where", ["code from a string", "extension", "weakref callback"])
def test_ctrl_c_right_after_spec_json_is_exit_130_and_one_line(tmp_path, spec_file, where):
    """Ctrl-C the moment spec.json is written, landing where the sweep's imports go on: the sweep
    stops there with exit code 130 and one `interrupted` line (not an end by SIGINT after the
    interrupt was handled, an ImportError's traceback or a sweep that goes on), and `--resume` then
    measures every case."""
    (tmp_path / "ctrl_c_hook.py").write_text(CTRL_C_HOOK.format(where=where))
    run_dir, log = tmp_path / "run", tmp_path / "sweep.log"
    two_cases = ["--kernel", "sdpa_math", "--seq-len", "32"]
    args = ["sweep", str(spec_file), *two_cases, "--out", str(run_dir)]
    code = finish(args, tmp_path, log, plugins="ctrl_c_hook")  # `python -m` imports from tmp_path
    said = log.read_text()
    lines = [line for line in said.splitlines() if line.startswith("interrupted")]
    assert code == 130 and len(lines) == 1 and "Traceback" not in said, said
    assert spec_written(run_dir) and row_count(run_dir) == 0
    assert finish(["sweep", "--resume", str(run_dir)], tmp_path, log) == 0, log.read_text()
    assert [row["status"] for row in rows(run_dir)] == ["ok", "ok"]


# --- workers that crash, hang, run out of memory or write garbage -------------------------------------

WORKER_FAULTS = {
    "test_segfault": ("crashed", "SIGSEGV"),
    "test_sleep": ("timeout", "no result after"),
    "test_garbage": ("ok", ""),
}


def test_workers_that_segfault_hang_or_write_garbage(tmp_path):
    spec = tmp_path / "faulty.toml"
    spec.write_text(
        SPEC.replace('kernels = ["sdpa_math", "mlstm_torch"]', f"kernels = {[*WORKER_FAULTS, 'sdpa_math']}")
        .replace('modes = ["fw", "fwbw"]', 'modes = ["fw"]')
        .replace("seq_len = [32, 64, 128]", "seq_len = 32")
        .replace("timeout_s = 120", "timeout_s = 15")
    )
    run_dir, log = tmp_path / "run", tmp_path / "sweep.log"
    code = finish(["sweep", str(spec), "--out", str(run_dir)], tmp_path, log, plugins="fault_adapters")
    by_kernel = {row["kernel"]: row for row in rows(run_dir)}
    survived = 0
    for kernel, (status, message) in WORKER_FAULTS.items():
        row = by_kernel.get(kernel, {})
        survived += row.get("status") == status and message in row.get("error", "")
    survived -= by_kernel.get("sdpa_math", {}).get("status") != "ok"
    record("a worker that segfaults, hangs, or writes garbage to its output", len(WORKER_FAULTS), survived, 0)
    assert code == 0, log.read_text()
    assert {kernel: row["status"] for kernel, row in by_kernel.items()} == {
        **{kernel: status for kernel, (status, _) in WORKER_FAULTS.items()},
        "sdpa_math": "ok",
    }, log.read_text()
    assert survived == len(WORKER_FAULTS)


# --- a read-only directory ---------------------------------------------------------------------------

# Runs the CLI in-process for each argv of argv[1] and prints [exit code, stderr] per argv as JSON.
# Root writes into a read-only folder as if it were not, so as root it first gives up the
# capabilities that allow it (for itself and whatever it starts), before any thread exists.
_WITHOUT_DAC_OVERRIDE = """
import contextlib, ctypes, io, json, os, sys
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    dac = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    for cap in dac:
        assert libc.prctl(24, cap, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())  # PR_CAPBSET_DROP
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) x 2 words
    assert libc.capget(header, data) == 0
    for cap in dac:
        data[0] &= ~(1 << cap)
        data[1] &= ~(1 << cap)
    assert libc.capset(header, data) == 0, os.strerror(ctypes.get_errno())
from tfla_bench.cli.main import main
answers = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        answers.append([main(argv), err.getvalue()])
print(json.dumps(answers))
"""


def test_read_only_directory(tmp_path, spec_file, clean_run):
    run_dir = tmp_path / "run"
    shutil.copytree(clean_run, run_dir)
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    adhoc = list(ADHOC_RUN)
    commands = [
        ["compare", str(run_dir), "--published", FIG5, "--json", str(read_only / "c.json")],
        ["compare", str(run_dir), "--published", FIG5, "--csv", str(read_only / "c.csv")],
        ["report", str(run_dir), "--published", "none"],
        ["plot", str(run_dir), "--published", "none"],
        ["roofline", "--gpu", "h100", "--out", str(read_only / "figures")],
        ["sweep", str(spec_file), "--out", str(read_only / "run")],
        ["sweep", "--resume", str(run_dir)],
        [*adhoc, "--out", str(read_only / "adhoc")],
        ["profile", str(run_dir)],
        ["diff", str(run_dir), str(run_dir), "--json", str(read_only / "diff.json")],
    ]
    before = tree_digest(run_dir)
    for folder in (run_dir, read_only):
        folder.chmod(0o555)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _WITHOUT_DAC_OVERRIDE, json.dumps(commands)],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
    finally:
        for folder in (run_dir, read_only):
            folder.chmod(0o755)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    survived = sum(
        code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "cannot write" in err
        for code, err in answers
    )
    record(
        "a read-only directory, for each of 10 outputs",
        len(commands),
        survived,
        lost(rows(clean_run), rows(run_dir)),
    )
    assert survived == len(commands), answers
    assert tree_digest(run_dir) == before and list(read_only.iterdir()) == []


# --- generated specs and flags -----------------------------------------------------------------------

KERNELS = ["sdpa_math", "mlstm_torch", "sdpa_cudnn", "tfla_sig", "mamba2"]
# Kernels that a machine without CUDA decides without a worker: a sweep of only these runs fast.
GPU_ONLY = ["sdpa_cudnn", "tfla_sig", "mamba2"]
_sizes = st.sampled_from([16, 32, 64])
_shapes = st.tuples(
    st.one_of(_sizes, st.lists(_sizes, min_size=1, max_size=2, unique=True)),
    st.sampled_from([8, 16]),
    st.sampled_from([8, 16]),
    st.sampled_from([("tokens", 128), ("batch", 2)]),
    st.sampled_from([("num_heads", 2), ("embedding_dim", 16)]),
).map(lambda t: {"seq_len": t[0], "head_dim_qk": t[1], "head_dim_v": t[2], **dict(t[3:])})
_valid_specs = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["fuzz", "fuzz.2", "f-3"]),
        "kernels": st.lists(st.sampled_from(KERNELS), min_size=1, max_size=3, unique=True),
        "modes": st.lists(st.sampled_from(["fw", "fwbw"]), min_size=1, max_size=2, unique=True),
        "dtype": st.sampled_from(["float32", "bfloat16"]),
        "shape": _shapes,
    },
    optional={
        "warmup": st.integers(0, 3),
        "reps": st.integers(1, 3),
        "timeout_s": st.sampled_from([5, 60.5]),
        "expand": st.just("grid"),
        "grad": st.sampled_from(["fixed", "sum"]),
        "l2_flush": st.booleans(),
    },
)
# Up to two keys (of the spec or of its [shape]) replaced by a value of any kind, often a wrong one.
_wrong = st.one_of(
    st.sampled_from(["8", 2.5, True, -1, 0, [], "", 10**12, ["fw", 3], "no_such_kernel", "../up", "x" * 300]),
    st.integers(-8, 300),
    st.text(max_size=6),
)
_keys = [*("name", "kernels", "modes", "dtype", "warmup", "reps", "timeout_s", "expand", "grad", "l2_flush")]
_keys += [
    "params",
    "bogus",
    *(f"shape.{k}" for k in ("seq_len", "tokens", "num_heads", "head_dim_qk", "chunk_size", "x")),
]
_mutations = st.lists(st.tuples(st.sampled_from(_keys), _wrong), max_size=2)


def mutated(spec: dict, mutations: list) -> dict:
    spec = {**spec, "shape": dict(spec["shape"])}
    for where, value in mutations:
        table, _, name = where.rpartition(".")
        (spec["shape"] if table else spec)[name] = value
    return spec


_flags = st.lists(
    st.sampled_from(
        [
            ["--warmup", "0"],
            ["--warmup", "-2"],
            ["--reps", "x"],
            ["--reps", "2"],
            ["--timeout", "0"],
            ["--grad", "sideways"],
            ["--grad", "sum"],
            ["--clock", "wall"],
            ["--clock", "events"],
            ["--kernel", "sdpa_math"],
            ["--kernel", "nope"],
            ["--gpus", "0"],
            ["--precompile", "-1"],
            ["--l2-flush"],
            ["--no-cuda-graph"],
            ["--bogus"],
            ["--resume", "nowhere"],
            ["--out", "FILE"],
            ["--out", "FILE/below"],
        ]
    ),
    max_size=3,
)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return repr(value)


def spec_text(spec: dict) -> str:
    """A spec dict as TOML: top-level values, then the [shape] table."""
    lines = [f"{k} = {_toml(v)}" for k, v in spec.items() if k != "shape"]
    lines += ["[shape]", *(f"{k} = {_toml(v)}" for k, v in spec["shape"].items())]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "FILE").write_text("not a folder\n")
    return folder


FUZZ_EXAMPLES = 1000
_fuzz_exits: list[int] = []


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(valid=_valid_specs, mutations=_mutations, flags=_flags, broken=st.booleans(), runs=st.booleans())
def test_generated_specs_and_flags_end_in_exit_0_or_one_line(fuzz_dir, valid, mutations, flags, broken, runs):
    spec = mutated(valid, mutations)
    text = spec_text(spec)
    if broken and mutations:
        text = text.replace("=", "", 1)  # no longer TOML
    work = Path(tempfile.mkdtemp(dir=fuzz_dir))
    (work / "spec.toml").write_text(text)
    argv = ["sweep", str(work / "spec.toml")]
    for flag in flags:
        argv += [str(fuzz_dir / part) if part.startswith("FILE") else part for part in flag]
    # Only specs of GPU-only kernels run for real here (decided without a worker on a CPU machine).
    kernels = spec["kernels"] if isinstance(spec["kernels"], list) else []
    if not (runs and kernels and set(kernels) <= set(GPU_ONLY)) or "--kernel" in argv:
        argv.append("--dry-run")
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.chdir(cwd)
        shutil.rmtree(work)
    _fuzz_exits.append(code)
    message = err.getvalue()
    if code == 2:
        assert message.startswith("error: ") and message.count("\n") == 1, (argv, text, message)
    else:
        assert code == 0 and "Traceback" not in message, (argv, text, message)


def test_fuzz_reached_both_outcomes():
    """The generated inputs were neither all accepted nor all refused, and every one was recorded."""
    if len(_fuzz_exits) < FUZZ_EXAMPLES:
        pytest.skip("the generated-input test did not run before this one")
    record(
        f"{FUZZ_EXAMPLES:,} generated specs and flag sets (exit 0, or exit 2 with one line)",
        len(_fuzz_exits),
        sum(code in (0, 2) for code in _fuzz_exits),
        0,
    )
    assert {0, 2} <= set(_fuzz_exits)


# --- hostile numbers: NaN, inf, huge, negative and non-numeric values ---------------------------------

# Every numeric key of a spec: the measurement settings, the shape, and an override's warmup and reps.
NUMERIC_SPEC_KEYS = [
    *(key for key, rule in measure_settings.RULES.items() if rule.kind in ("int", "number")),
    *(f"shape.{key}" for key in specs.SHAPE_KEYS),
    "override.mlstm.warmup",
    "override.mlstm.reps",
]

MODEL = [
    "model",
    "flops",
    "--seq-len",
    "8192",
    "--head-dim-qk",
    "64",
    "--head-dim-v",
    "64",
    "--chunk-size",
    "64",
]
# Every numeric flag: (the command line it is added to, the flag, whether a huge value is refused). A
# custom accelerator's peak and bandwidth may be huge (up to 1e18 FLOP/s and 1e16 bytes/s).
NUMERIC_FLAGS = [
    *(
        (["sweep", "SPEC", "--dry-run"], flag, True)
        for flag in ("--warmup", "--reps", "--rel-ci", "--budget")
    ),
    *((["sweep", "SPEC", "--dry-run"], flag, True) for flag in ("--timeout", "--autotune-ms")),
    *(
        ([*ADHOC_RUN, "--dry-run"], flag, True)
        for flag in ("--warmup", "--reps", "--timeout", "--precompile")
    ),
    *(
        ([*ADHOC_RUN, "--dry-run"], flag, True)
        for flag in ("--seq-len", "--tokens", "--heads", "--head-dim-qk", "--head-dim-v", "--chunk-size")
    ),
    (["check", "-k", "sdpa_math"], "--timeout", True),
    (["diff", "A", "B"], "--threshold", True),
    *((MODEL, flag, True) for flag in ("--seq-len", "--head-dim-qk", "--chunk-size", "--batch", "--heads")),
    *((MODEL, flag, True) for flag in ("--causal-factor", "--qkv-bytes", "--gate-bytes", "--state-bytes")),
    *(
        ([*MODEL, "--gpu", "custom", "--peak-flops", "1e15", "--bandwidth", "1e12"], f, False)
        for f in ("--peak-flops", "--bandwidth")
    ),
]
# A hostile value as (its TOML literal, its text on a command line, its kind).
_nan_inf = st.sampled_from([("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"), ("+inf", "+inf")])
_huge = st.one_of(st.integers(10**10, 10**30).map(str), st.floats(1e10, 1e300).map(repr))
_negative = st.one_of(st.integers(-(10**9), -1).map(str), st.floats(-1e9, -1e-9).map(repr))
_words = st.text("abcdefghjklmopqrsuvwxyz", min_size=1, max_size=8)
_hostile = st.one_of(
    _nan_inf.map(lambda pair: (*pair, "non-finite")),
    _huge.map(lambda text: (text, text, "huge")),
    _negative.map(lambda text: (text, text, "negative")),
    _words.map(lambda word: (json.dumps(word), word, "non-numeric")),
    st.sampled_from(["true", '[1, "x"]', "{ a = 1 }"]).map(lambda text: (text, "1,,x", "non-numeric")),
)


def _spec_with(key: str, literal: str) -> str:
    """The tiny spec with `key` (top level, `shape.x` or `override.mlstm.x`) set to `literal`."""
    table, _, name = key.rpartition(".")
    lines = SPEC.strip().splitlines()
    shape_at, override_at = lines.index("[shape]"), lines.index("[override.mlstm_torch]")
    top, shape, rest = lines[:shape_at], lines[shape_at + 1 : override_at], lines[override_at:]
    entry = f"{name} = {literal}"
    if not table:
        top = [entry, *(line for line in top if not line.startswith(f"{name} ="))]
    elif table == "shape":
        shape = [entry, *(line for line in shape if not line.startswith(f"{name} ="))]
    else:
        rest += ["[override.mlstm]", entry]
    return "\n".join([*top, "[shape]", *shape, *rest]) + "\n"


def _one_line_naming(code: int, err: str, names: tuple[str, ...]) -> bool:
    return code == 2 and err.startswith("error: ") and err.count("\n") == 1 and any(n in err for n in names)


HOSTILE_EXAMPLES = 400
_hostile_outcomes: list[bool] = []


@settings(
    max_examples=HOSTILE_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
@given(
    target=st.one_of(st.sampled_from(NUMERIC_SPEC_KEYS), st.sampled_from(range(len(NUMERIC_FLAGS)))),
    value=_hostile,
)
def test_hostile_numbers_in_every_numeric_key_and_flag_are_one_line(fuzz_dir, target, value):
    literal, text, kind = value
    accepted = False  # a huge value a model float flag takes: it must give an answer (exit 0)
    spec = fuzz_dir / "hostile.toml"
    if isinstance(target, str):
        spec.write_text(_spec_with(target, literal))
        argv = ["sweep", str(spec), "--dry-run"]
        names = (f"'{target}'", f"'{target.replace('override.mlstm.', '')}'")
    else:
        command, flag, huge_refused = NUMERIC_FLAGS[target]
        accepted = kind == "huge" and not huge_refused
        spec.write_text(SPEC)
        argv = [str(spec) if part == "SPEC" else part for part in command] + [flag, text]
        names = (flag, flag.lstrip("-").replace("-", "_"))
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    ok = _one_line_naming(code, err.getvalue(), names) or (accepted and code == 0 and not err.getvalue())
    _hostile_outcomes.append(ok)
    assert ok, (argv, kind, code, err.getvalue(), spec.read_text())


def test_hostile_numbers_reached_every_key_and_flag():
    if len(_hostile_outcomes) < HOSTILE_EXAMPLES:
        pytest.skip("the hostile-number test did not run before this one")
    record(
        f"{HOSTILE_EXAMPLES} NaN, inf, huge, negative and non-numeric values in {len(NUMERIC_SPEC_KEYS)} "
        f"spec keys and {len(NUMERIC_FLAGS)} flags (exit 2, one line naming it; a model float may be huge)",
        len(_hostile_outcomes),
        sum(_hostile_outcomes),
        0,
    )
    assert all(_hostile_outcomes)


BINARY_SPECS = {
    "bytes that are not UTF-8": b"\x00\xff\xfe\x80name = 1",
    "a spec saved as UTF-16": SPEC.encode("utf-16"),
    "NUL bytes in a UTF-8 file": SPEC.replace("[shape]", "[shape]\x00").encode(),
}


def test_binary_spec_files_are_one_line(tmp_path, capsys):
    answers = []
    for name, data in BINARY_SPECS.items():
        path = tmp_path / f"{name.replace(' ', '_')}.toml"
        path.write_bytes(data)
        answers.append((main(["sweep", str(path), "--dry-run"]), capsys.readouterr().err))
    survived = sum(_one_line_naming(code, err, (str(tmp_path),)) for code, err in answers)
    record(
        "binary spec files: not UTF-8, UTF-16, NUL bytes (exit 2 with one line)", len(answers), survived, 0
    )
    assert survived == len(answers), answers


# --- diff of runs whose medians are zero, inf or NaN -----------------------------------------------------


def test_diff_of_zero_inf_and_nan_medians_and_bad_thresholds(tmp_path, clean_run, capsys):
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(clean_run, run_a)
    shutil.copytree(clean_run, run_b)
    lines = (run_a / "results.csv").read_text().splitlines()
    column = lines[0].split(",").index("median_ms")
    broken = {1: "inf", 2: "0", 3: "nan", 4: "-1"}
    for line, value in broken.items():
        cells = next(csv.reader([lines[line]]))
        cells[column] = value
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow(cells)
        lines[line] = out.getvalue()
    (run_a / "results.csv").write_text("\n".join(lines) + "\n")
    report = tmp_path / "d.json"
    argv = [
        "diff",
        str(run_a),
        str(run_b),
        "--threshold",
        "5",
        "--json",
        str(report),
        "--plot",
        str(tmp_path / "d.png"),
    ]
    code = main(argv)
    captured = capsys.readouterr()
    out = " ".join((captured.out + captured.err).split())
    reasons = sorted(row["reason"] for row in json.loads(report.read_text())["rows"] if row["reason"])
    # An ok row without a finite time above 0 is a bad line of A (`ResultRow.from_csv`): skipped with
    # one warning, its case then in B only.
    outcomes = [
        code == 0
        and "4 unreadable row(s) skipped (line 2: bad value (median_ms: not a finite number" in out
        and "4 case(s) in run B only" in out
        and not reasons
    ]
    for threshold in ("nan", "inf", "0", "-5", "1e30"):
        code = main(["diff", str(run_a), str(run_b), "--threshold", threshold])
        outcomes.append(_one_line_naming(code, capsys.readouterr().err, ("--threshold",)))
    shutil.copy(clean_run / "results.csv", run_a / "results.csv")  # no warning about A before the error
    env = json.loads((run_b / "env.json").read_text())
    (run_b / "env.json").write_text(json.dumps({**env, "results_schema": rundir.SCHEMA_VERSION + 1}))
    code = main(["diff", str(run_a), str(run_b)])
    outcomes.append(_one_line_naming(code, capsys.readouterr().err, ("upgrade tfla-bench",)))
    record(
        "`diff` of zero, inf, NaN and negative medians (one run), 5 bad thresholds, a newer schema",
        len(outcomes),
        sum(outcomes),
        0,
    )
    assert all(outcomes), (outcomes, reasons, out)


# --- hostile output paths ---------------------------------------------------------------------------------


def test_empty_too_long_and_looping_output_paths(tmp_path, clean_run, capsys):
    from test_cli_paths import WRITERS

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    wrong = {
        "empty": "",
        "a 300-byte name": str(tmp_path / ("x" * 300)),
        "a symlink loop": str(tmp_path / "loop" / "out"),
    }
    smoke = str(TESTS.parent / "experiments" / "smoke.toml")
    answers = []
    before = tree_digest(clean_run)
    for template, _kind in WRITERS.values():
        flag = template[template.index("OUT") - 1]
        for path in wrong.values():
            argv = [
                {"RUN": str(clean_run), "OUT": path, "experiments/smoke.toml": smoke}.get(a, a)
                for a in template
            ]
            code = main(argv)
            answers.append((argv, code, capsys.readouterr().err, flag))
    survived = sum(_one_line_naming(code, err, (f"error: {flag}",)) for _, code, err, flag in answers)
    record(
        f"an empty, a 300-byte and a looping output path, for each of {len(WRITERS)} outputs",
        len(answers),
        survived,
        lost(rows(clean_run), rows(clean_run)) if tree_digest(clean_run) == before else CASES,
    )
    assert survived == len(answers), [
        a for a in answers if not _one_line_naming(a[1], a[2], (f"error: {a[3]}",))
    ]


# --- resumes that would drop or change data ---------------------------------------------------------------


def test_resume_refuses_what_it_would_drop_or_change(tmp_path, clean_run, capsys):
    """Two different rows of one case, a read-only results.csv and an invalid recorded spec.json are
    each refused with one line saying what to do, and the run is left as it was."""
    outcomes = []
    for fault in ("duplicate", "read-only", "invalid spec.json"):
        run_dir = tmp_path / fault.replace(" ", "-")
        shutil.copytree(clean_run, run_dir)
        csv_path = run_dir / "results.csv"
        lines = csv_path.read_text().splitlines(keepends=True)
        if fault == "duplicate":
            cells = next(csv.reader([lines[1]]))
            cells[list(next(csv.reader([lines[0]]))).index("median_ms")] = "123.0"
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerow(cells)
            csv_path.write_text("".join(lines) + out.getvalue())
            expected = (
                f"lines 2 and {len(lines) + 1} are two different rows",
                "delete the one that is wrong",
            )
        elif fault == "read-only":
            csv_path.chmod(0o444)
            expected = ("is read-only (mode 444)", "chmod u+w")
        else:
            spec = json.loads((run_dir / "spec.json").read_text())
            (run_dir / "spec.json").write_text(json.dumps({**spec, "timeout_s": float("nan")}))
            expected = ("the run's own record is invalid", "timeout_s", "start a new run with --out")
        before = tree_digest(run_dir)
        mode = csv_path.stat().st_mode
        code = main(["sweep", "--resume", str(run_dir)])
        err = capsys.readouterr().err
        unchanged = tree_digest(run_dir) == before and csv_path.stat().st_mode == mode
        outcomes.append(
            (
                fault,
                _one_line_naming(code, err, expected[:1]) and all(e in err for e in expected),
                unchanged,
                err,
            )
        )
    record(
        "a resume over two different rows of one case, a read-only results.csv, an invalid spec.json",
        len(outcomes),
        sum(ok and unchanged for _, ok, unchanged, _ in outcomes),
        0,
    )
    assert all(ok and unchanged for _, ok, unchanged, _ in outcomes), outcomes


# --- a full disk -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on `folder`; the test is skipped, with the reason, where none can be."""
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Append to a file in `folder` until its file system is full; returns it (deleting it frees the
    space)."""
    filler = folder / "filler"
    with filler.open("ab", buffering=0) as out:
        for size in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)
    return filler


def keep_full(folder: Path, proc: subprocess.Popen) -> None:
    """Fill `folder` again and again while `proc` runs: whatever a failed write frees (the sweep
    removes a timings.json it cannot replace) is taken back at once."""
    while proc.poll() is None:
        fill(folder)
        time.sleep(0.01)


def test_a_full_disk_during_a_sweep_and_in_report_and_plot(tmp_path, spec_file, clean_run):
    with small_disk(tmp_path / "disk", "8m") as disk:
        run_dir, log = disk / "run", tmp_path / "sweep.log"
        proc = start(["sweep", str(spec_file), "--out", str(run_dir)], tmp_path, log)
        wait_until(proc, lambda: row_count(run_dir) >= 2, log)
        filler = fill(disk)
        keep_full(disk, proc)
        code = proc.wait(WAIT_S)
        text = log.read_text()
        before = rows(run_dir)
        timings = phases.read(run_dir)
        # No timings.json older than the rows: it was removed with a warning, or its record is current.
        fresh = (
            timings is None
            and "warning: cannot write" in text
            or (timings is not None and sum(a["cases"] for a in timings["adapters"].values()) >= len(before))
        )
        stopped = code == 1 and "error: writing to" in text and "continue with --resume" in text
        answers = [main_quiet(["report", str(run_dir), "--published", "none", "--out", str(disk / "r.html")])]
        answers.append(main_quiet(["plot", str(run_dir), "--published", "none", "--out", str(disk / "figs")]))
        refused = [c == 2 and "no space left" in err for c, err in answers]
        left = sorted(p.name for p in disk.iterdir())
        filler.unlink()
        assert finish(["sweep", "--resume", str(run_dir)], tmp_path, log) == 0, log.read_text()
        final = rows(run_dir)
        keys = [key(row) for row in final]
        survived = (stopped and fresh) + sum(refused)
        record(
            "a full disk (a small tmpfs) during a sweep, then `--resume`; `report` and `plot` on it",
            1 + len(answers),
            survived if left == ["filler", "run"] else 0,
            lost(before, final),
        )
        assert stopped and fresh, text
        assert all(refused) and left == ["filler", "run"], (answers, left)
        assert len(keys) == len(set(keys)) == CASES and not lost(before, final)


def main_quiet(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


# --- the environment the suite reads --------------------------------------------------------------------


def cli(args: list[str], cwd: Path, **variables: str) -> tuple[int, str]:
    """`tfla-bench ARGS` in a process of its own, with these environment variables set (those the
    suite reads when it is imported); its exit code and its output."""
    done = subprocess.run(
        [sys.executable, "-m", "tfla_bench.cli.main", *args],
        cwd=cwd,
        env={**_env(), **variables},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    return done.returncode, done.stderr + done.stdout


def _without_dac_override(commands: list[list[str]], cwd: Path, env: dict[str, str]) -> list[tuple[int, str]]:
    """Each command in one process that, even as root, cannot write where the permission bits say no."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DAC_OVERRIDE, json.dumps(commands)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr
    return [tuple(answer) for answer in json.loads(done.stdout)]


def test_the_environment_the_suite_reads(tmp_path, spec_file, clean_run):
    """A broken or misplaced tuned-config file, bad variables, and a read-only home: each a warning
    the run goes on after, or one line and exit 2."""
    from tfla_bench.analyse.published import PUBLISHED_DIR_ENV
    from tfla_bench.kernels.config import TUNED_FILE_ENV
    from tfla_bench.run.cluster import SLURM_WAIT_ENV

    broken = tmp_path / "tuned.json"
    broken.write_text('[{"target": "sm90"')
    two_cases = ["sweep", str(spec_file), "--kernel", "sdpa_math", "--seq-len", "32"]
    dry = ["sweep", str(spec_file), "--dry-run"]

    def left_out(run: Path, code: int) -> bool:
        configs = rundir.read_env(run)["measurement"]["kernel_configs"] if code == 0 else {}
        return len(configs.get("unreadable", [])) == 1 and row_count(run) == 2

    outcomes = []
    for name, where in (("broken", broken), ("folder", tmp_path)):
        run = tmp_path / f"run-{name}"
        code, text = cli([*two_cases, "--out", str(run)], tmp_path, **{TUNED_FILE_ENV: str(where)})
        outcomes.append(("Traceback" not in text and left_out(run, code), text))
    refused = [
        ({registry.PLUGINS_ENV: "no_such_module"}, dry, "no_such_module"),
        ({SLURM_WAIT_ENV: "soon"}, [*dry, "--executor", "slurm"], SLURM_WAIT_ENV),
        (
            {PUBLISHED_DIR_ENV: str(tmp_path / "none")},
            ["compare", str(clean_run), "--published", FIG5],
            "none",
        ),
    ]
    for variables, argv, named in refused:
        code, text = cli(argv, tmp_path, **variables)
        outcomes.append((_one_line_naming(code, text, (named,)), text))
    for variables in ({"COLUMNS": "wide"}, {"XDG_CACHE_HOME": str(tmp_path / "missing" / "cache")}):
        code, text = cli(dry, tmp_path, **variables)
        outcomes.append((code == 0 and "Traceback" not in text and "warning" not in text, text))
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in _env().items() if key not in ("XDG_CACHE_HOME", "MPLCONFIGDIR")}
    run = tmp_path / "run-home"
    commands = [
        [*two_cases, "--out", str(run)],
        ["report", str(run), "--published", "none", "--out", str(tmp_path / "r.html")],
        ["plot", str(run), "--published", "none", "--out", str(tmp_path / "figures")],
    ]
    home.chmod(0o555)
    try:
        answers = _without_dac_override(commands, tmp_path, {**env, "HOME": str(home)})
    finally:
        home.chmod(0o755)
    outcomes += [(code == 0 and "Traceback" not in err and row_count(run) == 2, err) for code, err in answers]
    record(
        "the environment: a broken or misplaced tuned-config file, 5 bad variables, a read-only home "
        "(3 commands)",
        len(outcomes),
        sum(ok for ok, _ in outcomes),
        0,
    )
    assert all(ok for ok, _ in outcomes), [text for ok, text in outcomes if not ok]
    assert list(home.iterdir()) == []


# --- specs that expand to very many cases -----------------------------------------------------------------


def test_specs_of_very_many_cases(tmp_path, capsys):
    """A grid of about 10^8 cases is one line before any case is made; one of 32,000 is listed in
    part, with a count of all."""
    many = "[" + ", ".join(str(8 * (n + 1)) for n in range(64)) + "]"
    huge = SPEC.replace("seq_len = [32, 64, 128]", f"seq_len = {many}").replace("tokens = 128", "batch = 1")
    for key in ("num_heads = 2", "head_dim_qk = 16", "head_dim_v = 16"):
        huge = huge.replace(key, f"{key.split(' = ')[0]} = {many}")
    twenty = "[" + ", ".join(str(8 * (n + 1)) for n in range(20)) + "]"
    large = huge.replace(many, twenty).replace(f"head_dim_v = {twenty}", "head_dim_v = [8, 16]")
    large = large.replace('kernels = ["sdpa_math", "mlstm_torch"]', 'kernels = ["sdpa_math"]')
    outcomes = []
    for name, text in (("huge", huge), ("large", large)):
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        outcomes.append((main(["sweep", str(path), "--dry-run"]), capsys.readouterr()))
    adhoc = ["run", "-k", "sdpa_math", "--seq-len", many[1:-1], "--head-dim-qk", many[1:-1], "--batch"]
    outcomes.append((main([*adhoc, many[1:-1], "--heads", many[1:-1], "--dry-run"]), capsys.readouterr()))
    (huge_code, huge_out), (large_code, large_out), (adhoc_code, adhoc_out) = outcomes
    said = "; split it into several specs"
    survived = [
        _one_line_naming(huge_code, huge_out.err, ("expands to more than 100,000",)) and said in huge_out.err,
        large_code == 0 and "the first 1,000 of 32,000 cases" in " ".join(large_out.out.split()),
        _one_line_naming(adhoc_code, adhoc_out.err, ("expands to more than 100,000",)),
    ]
    record(
        "specs of very many cases: a grid of about 10^8 (file and flags, one line) and one of 32,000 "
        "(a dry run)",
        len(survived),
        sum(survived),
        0,
    )
    assert all(survived), outcomes


# --- other encodings and line endings ---------------------------------------------------------------------


def test_other_encodings_and_line_endings(tmp_path, spec_file, clean_run, capsys):
    """A spec and a run's files with a byte-order mark, CRLF or LF line endings are read as they are;
    a spec with CR line endings is one line. A resume keeps every line of an edited results.csv."""
    text = SPEC.strip() + "\n"
    specs_written = {
        "a byte-order mark": codecs.BOM_UTF8 + text.encode(),
        "CRLF": text.replace("\n", "\r\n").encode(),
        "CR": text.replace("\n", "\r").encode(),
    }
    outcomes = []
    for name, data in specs_written.items():
        path = tmp_path / f"{name.replace(' ', '-')}.toml"
        path.write_bytes(data)
        code = main(["sweep", str(path), "--dry-run"])
        err = capsys.readouterr().err
        outcomes.append(_one_line_naming(code, err, (str(path),)) if name == "CR" else code == 0 and not err)
    run_dir = tmp_path / "run"
    shutil.copytree(clean_run, run_dir)
    header, *lines = (run_dir / "results.csv").read_bytes().decode().splitlines()
    kept = [line + "\n" for line in lines[:-2]]  # the last two cases run again
    (run_dir / "results.csv").write_bytes(codecs.BOM_UTF8 + (header + "\n" + "".join(kept)).encode())
    spec_json = (run_dir / "spec.json").read_text().replace("\n", "\r\n")
    (run_dir / "spec.json").write_bytes(codecs.BOM_UTF8 + spec_json.encode())
    code = main(["report", str(run_dir), "--published", "none", "--out", str(tmp_path / "r.html")])
    outcomes.append(code == 0 and not capsys.readouterr().err)
    code = finish(["sweep", "--resume", str(run_dir)], tmp_path, tmp_path / "resume.log")
    after = (run_dir / "results.csv").read_bytes().decode()
    outcomes.append(code == 0 and all(line in after for line in kept) and row_count(run_dir) == CASES)
    record(
        "a spec with a byte-order mark, CRLF or CR line endings; a run's files with a byte-order mark and "
        "LF or CRLF (`report`, `--resume`)",
        len(outcomes),
        sum(outcomes),
        lost(rows(clean_run)[:-2], rows(run_dir)),
    )
    assert all(outcomes), (outcomes, (tmp_path / "resume.log").read_text())


# --- outputs aimed at a run's own files --------------------------------------------------------------------


def test_outputs_aimed_at_a_runs_own_files(tmp_path, clean_run, capsys):
    from test_cli_paths import WRITERS

    run_dir = tmp_path / "run"
    shutil.copytree(clean_run, run_dir)
    (run_dir / rundir.SHARDS).mkdir()
    smoke = str(TESTS.parent / "experiments" / "smoke.toml")
    own = [run_dir / rundir.SPEC, run_dir / rundir.SELECTION, run_dir / rundir.TIMINGS]
    before = tree_digest(run_dir)
    answers = []
    for template, kind in WRITERS.values():
        flag = template[template.index("OUT") - 1]
        for path in own if kind == "file" else [run_dir / rundir.SHARDS / "out"]:
            argv = [
                {"RUN": str(run_dir), "OUT": str(path), "experiments/smoke.toml": smoke}.get(a, a)
                for a in template
            ]
            answers.append((main(argv), capsys.readouterr().err, flag))
    survived = sum(
        _one_line_naming(code, err, (f"error: {flag}",)) and "its own" in err for code, err, flag in answers
    )
    record(
        f"outputs aimed at a run's own records and folders, for each of {len(WRITERS)} outputs",
        len(answers),
        survived,
        lost(rows(clean_run), rows(run_dir)),
    )
    assert survived == len(answers), answers
    assert tree_digest(run_dir) == before


# --- a spec edited between a run and its resume -----------------------------------------------------------


def test_a_spec_edited_between_a_run_and_its_resume(tmp_path, spec_file, clean_run, capsys):
    """The spec file given to `--resume` edited, or the run's spec.json edited by hand: refused in one
    line, the run left as it was; with `--force`, the new cases run and no earlier row changes."""
    run_dir = tmp_path / "run"
    shutil.copytree(clean_run, run_dir)
    before = tree_digest(run_dir)
    edited_toml = tmp_path / "edited.toml"
    edited_toml.write_text(SPEC.replace("warmup = 1", "warmup = 2"))
    outcomes = []
    code = main(["sweep", str(edited_toml), "--resume", str(run_dir)])
    outcomes.append(_one_line_naming(code, capsys.readouterr().err, ("the spec differs from the run's own",)))
    recorded = json.loads((run_dir / "spec.json").read_text())
    (run_dir / "spec.json").write_text(
        json.dumps({**recorded, "shape": {**recorded["shape"], "seq_len": [16, 32, 64, 128]}})
    )
    code = main(["sweep", "--resume", str(run_dir)])
    outcomes.append(_one_line_naming(code, capsys.readouterr().err, ("spec.json was edited after the run",)))
    unchanged = {**before, "spec.json": tree_digest(run_dir)["spec.json"]} == tree_digest(run_dir)
    code = finish(["sweep", "--resume", str(run_dir), "--force"], tmp_path, tmp_path / "forced.log")
    after = rows(run_dir)
    outcomes.append(code == 0 and len(after) == CASES + 6)
    record(
        "a spec edited between a run and its resume: the spec file, spec.json (refused), spec.json with "
        "`--force`",
        len(outcomes),
        sum(outcomes) if unchanged else 0,
        lost(rows(clean_run), after),
    )
    assert all(outcomes) and unchanged, (outcomes, (tmp_path / "forced.log").read_text())
    assert (
        "spec.json edited at shape.seq_len"
        in rundir.read_env(run_dir)["resumed"][-1]["forced_spec_difference"]
    )


# --- the README's Reliability table ------------------------------------------------------------------


def render_table(outcomes: list[Outcome]) -> str:
    lines = ["| fault injected | injected | survived | rows lost |", "|---|---:|---:|---:|"]
    lines += [f"| {o.fault} | {o.injected:,} | {o.survived:,} | {o.rows_lost} |" for o in outcomes]
    return "\n".join(lines)


def test_readme_reliability_table_is_this_suites():
    if len(OUTCOMES) < FAULTS:
        pytest.skip(f"{len(OUTCOMES)} of the {FAULTS} faults ran: the table needs every one")
    text = README.read_text()
    head, begin, rest = text.partition(TABLE_BEGIN)
    _, end, tail = rest.partition(TABLE_END)
    assert begin and end, f"README.md lacks the lines {TABLE_BEGIN!r} and {TABLE_END!r}"
    expected = f"{head}{TABLE_BEGIN}\n{render_table(list(OUTCOMES.values()))}\n{TABLE_END}{tail}"
    if os.environ.get(WRITE_ENV) == "1":
        README.write_text(expected)
    assert README.read_text() == expected, f"the README's table is not this run's; rerun with {WRITE_ENV}=1"
