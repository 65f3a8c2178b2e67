"""`sweep --precompile`: sharded autotuning, the smaller cases, the parallel workers and env.json (CPU)."""

import dataclasses
import json
import threading

import pytest
import torch

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.measure import worker
from tfla_bench.measure.roofs import MeasuredRoofs
from tfla_bench.measure.row import ResultRow
from tfla_bench.run import precompile, runner, specs

pytestmark = pytest.mark.usefixtures("plugin_adapters")


@pytest.fixture(autouse=True)
def own_triton_cache(tmp_path, monkeypatch):
    """Each test its own Triton cache directory, so no test finds the runs another one remembered."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))


def tiny_spec(name, kernels, modes, batch):
    """A spec of the test adapters at two short lengths, float32, two timed calls each."""
    raw = {
        "name": name,
        "kernels": kernels,
        "modes": modes,
        "dtype": "float32",
        "warmup": 1,
        "reps": 2,
        "timeout_s": 120,
        "published": "nothing",
        "shape": {"batch": batch, "seq_len": [16, 32], "num_heads": 2, "head_dim_qk": 8, "head_dim_v": 8},
    }
    return specs.parse_spec(raw, "test")


def case(kernel, batch, seq_len, mode="fw", chunk_size=None):
    return Case(kernel, mode, "float32", batch, seq_len, 2, 8, 8, chunk_size)


def test_sharded_autotuning_tries_only_its_configs_and_restores_triton(plugin_adapters):
    from triton.runtime.autotuner import Autotuner

    kernel = plugin_adapters.fill_block_kernel()
    originals = {name: Autotuner.__dict__[name] for name in ("run", "prune_configs", "do_bench")}
    out = torch.zeros(256, dtype=torch.int32)

    def launch():
        kernel[lambda meta: (256 // meta["BLOCK"],)](out, 256)
        return sorted(config.kwargs["BLOCK"] for config in kernel.configs_timings), out.unique().tolist()

    with precompile.sharded_autotuning(1, 3):
        assert launch() == ([32], [32])
    with precompile.sharded_autotuning(0, 3):
        assert launch() == ([16, 128], [16])
        assert launch() == ([16, 128], [16])  # tuned again: the choice from dummy timings is dropped
    kernel.configs_timings = {}
    out.zero_()
    kernel.best_config = None
    with precompile.sharded_autotuning(5, 6):  # more shards than configs: none here, nothing launched
        assert launch() == ([], [0])
        assert kernel.best_config is kernel.configs[0]  # still named, for callers that read it
    assert {name: Autotuner.__dict__[name] for name in originals} == originals


def test_only_shard_0_launches_a_kernel_outside_an_autotuner(plugin_adapters):
    """A plain kernel (and a one-config autotuner) compiles once, in shard 0, not in every shard."""
    import triton

    tuned = plugin_adapters.fill_block_kernel()
    plain = tuned.fn
    single = triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])(plain)
    out = torch.zeros(256, dtype=torch.int32)

    def fills(kernel, **block):
        out.zero_()
        kernel[lambda meta: (256 // meta["BLOCK"],)](out, 256, **block)
        return out.unique().tolist()

    for shard, launched in ((0, [64]), (2, [0])):
        with precompile.sharded_autotuning(shard, 3):
            assert fills(plain, BLOCK=64) == launched
            single.best_config = None
            assert fills(single) == launched
            assert single.best_config is single.configs[0]
            assert fills(tuned) == [(16, 32, 64)[shard]]  # its own config, shard 2 included
    assert fills(plain, BLOCK=32) == [32]  # restored: launched outside any shard


def test_warm_cases_and_the_plan(plugin_adapters):
    # Fig. 5-like: 65,536 tokens at every length
    cases = [case("test_autotuned", 65536 // t, t) for t in (512, 1024, 8192, 16384, 65536)]
    cases += [case("test_counting", 4, 16384), case("test_counting", 2, 8192)]
    cases += [case("test_chunked", 2, 16384, chunk_size=16384)]  # 8192 tokens would be rejected
    jobs = precompile.plan_jobs(cases, 3, "sum")
    shapes = [(job.case.kernel, job.case.batch, job.case.seq_len, job.shard, job.shards) for job in jobs]
    # batches above 16 that are multiples of 16 become 16; smaller ones, and 1, stay as they are
    tuned = [(16, 512), (16, 1024), (8, 8192), (4, 8192), (1, 8192)]
    assert shapes == [
        *(("test_autotuned", b, t, shard, 3) for b, t in tuned for shard in range(3)),
        ("test_counting", 4, 8192, 0, 1),
        ("test_counting", 2, 8192, 0, 1),
        ("test_chunked", 2, 16384, 0, 1),
    ]
    assert all(job.grad == "sum" for job in jobs)
    assert jobs[0].adapter_module == "plugin_adapters"


def test_the_smaller_case_keeps_tritons_specialization(plugin_adapters):
    adapter = registry.get("test_counting")
    assert precompile.warm_case(adapter, case("test_counting", 48, 16384)).batch == 16
    assert precompile.warm_case(adapter, case("test_counting", 40, 16384)).batch == 15  # 40 % 16 != 0
    assert precompile.warm_case(adapter, case("test_counting", 1, 16384)).batch == 1
    assert precompile.warm_case(adapter, case("test_counting", 2, 16400)).seq_len == 8192
    assert precompile.warm_case(adapter, case("test_counting", 2, 16392)).seq_len == 8191


def test_an_adapter_whose_kernels_take_the_batch_as_a_constexpr_keeps_it(plugin_adapters, monkeypatch):
    adapter = registry.get("test_counting")
    monkeypatch.setattr(adapter, "precompile", "sequence")
    shapes = [(48, 16384), (2, 3072), (2, 10008), (128, 512)]
    warm = [precompile.warm_case(adapter, case("test_counting", b, t)) for b, t in shapes]
    # a multiple of 128 runs 128 steps; another length shrinks as for every adapter
    assert [(w.batch, w.seq_len) for w in warm] == [(48, 128), (2, 128), (2, 8191), (128, 128)]
    assert registry.get("gla").precompile == registry.get("simple_gla").precompile == "sequence"


def test_adapters_that_compile_per_shape_or_not_at_all(plugin_adapters, monkeypatch):
    cases = [case("test_counting", 64, 16384), case("test_chunked", 4, 64, chunk_size=16)]
    monkeypatch.setattr(registry.get("test_counting"), "precompile", "own")
    monkeypatch.setattr(registry.get("test_chunked"), "precompile", "none")
    jobs = precompile.plan_jobs(cases, 3, "sum")
    assert [(job.case.kernel, job.case.batch, job.case.seq_len) for job in jobs] == [
        ("test_counting", 64, 16384)
    ]


def test_workers_run_every_job_and_survive_a_crash(plugin_adapters, tmp_path, monkeypatch):
    log = tmp_path / "blocks.log"
    monkeypatch.setenv("TFLA_TEST_BLOCK_LOG", str(log))
    cases = [case("test_autotuned", 1, 16), case("test_abort", 1, 16), case("test_raise", 1, 16)]
    seen = []
    summary = precompile.precompile(
        cases, 2, ["cpu"], tmp_path, timeout_s=120, on_start=seen.append, on_result=seen.append
    )
    assert seen[0] == 4  # two shards of the autotuned case, then the other two cases
    statuses = sorted((r.job.case.kernel, r.job.shard, r.status) for r in seen[1:])
    assert statuses == [
        ("test_abort", 0, "crashed"),
        ("test_autotuned", 0, "ok"),
        ("test_autotuned", 1, "ok"),
        ("test_raise", 0, "error"),
    ]
    crashed = next(r for r in seen[1:] if r.status == "crashed")
    assert "SIGABRT" in crashed.error and "about to abort" in crashed.error
    # each shard ran the first config of its own slice: BLOCK 16 (configs 0, 2) and 32 (1, 3)
    assert sorted(log.read_text().split()) == ["16", "32"]
    assert (summary.processes, summary.cases, summary.runs, summary.failed) == (2, 3, 4, 2)
    assert sorted(p.name for p in tmp_path.glob("precompile-*.log")) == [
        "precompile-0.log",
        "precompile-1.log",
    ]


def test_a_kernel_that_keeps_crashing_is_not_run_again(plugin_adapters, tmp_path):
    cases = [case("test_abort", 1, t) for t in (16, 32, 64)] + [case("test_counting", 1, 16)]
    seen = []
    summary = precompile.precompile(cases, 1, ["cpu"], tmp_path, timeout_s=120, on_result=seen.append)
    aborts = [r for r in seen if r.job.case.kernel == "test_abort"]
    assert [r.status for r in aborts] == ["crashed"] * 3
    assert [r.error.startswith("not run: the previous 2 cases") for r in aborts] == [False, False, True]
    assert (summary.runs, summary.failed) == (4, 3)
    # The sweep is told which of its cases to leave alone, with the kernel's own error.
    assert sorted(summary.crashed) == sorted(c.key for c in cases[:3])
    assert all("SIGABRT" in error and not error.startswith("not run") for error in summary.crashed.values())
    # A later precompile into the same cache makes none of those runs and tells the sweep the same.
    again = precompile.precompile(cases, 1, ["cpu"], tmp_path, timeout_s=120)
    assert (again.runs, again.skipped, again.crashed) == (0, 4, summary.crashed)


def test_one_crash_among_runs_that_pass_is_left_to_the_sweep(plugin_adapters, tmp_path, monkeypatch):
    # test_abort aborts only at seq_len 32 here: one crash, the kernel's other runs pass.
    monkeypatch.setenv("TFLA_TEST_ABORT_SEQ_LEN", "32")
    cases = [case("test_abort", 1, t) for t in (16, 32, 64)]
    summary = precompile.precompile(cases, 1, ["cpu"], tmp_path, timeout_s=120)
    assert summary.failed == 1 and summary.crashed == {}


def test_each_process_may_take_its_share_of_the_gpu_memory():
    assert precompile.memory_share(14, ["cuda:0"]) == pytest.approx(precompile.MEMORY_SHARE / 14)
    assert precompile.memory_share(28, ["cuda:0", "cuda:1"]) == pytest.approx(precompile.MEMORY_SHARE / 14)
    assert precompile.memory_share(3, ["cuda:0", "cuda:1"]) == pytest.approx(precompile.MEMORY_SHARE / 2)
    assert precompile.memory_share(1, ["cuda:0"]) == precompile.MEMORY_SHARE
    assert precompile.memory_share(4, ["cpu"]) == 1.0


def test_a_shard_whose_configs_do_not_fit_the_gpu_is_done_not_failed(plugin_adapters):
    adapter = plugin_adapters.OutOfResources()
    job = precompile.PrecompileJob(case("test_out_of_resources", 1, 16), "plugin_adapters", 1, 4, "sum")
    assert precompile.run_job(adapter, job, "cpu").status == "ok"
    alone = precompile.PrecompileJob(case("test_out_of_resources", 1, 16), "plugin_adapters", 0, 1, "sum")
    result = precompile.run_job(adapter, alone, "cpu")  # not sharded: the sweep must hear of it
    assert result.status == "error" and "shared memory" in result.error


def test_runs_out_of_memory_run_again_with_a_larger_share_beside_the_others(
    plugin_adapters, tmp_path, monkeypatch
):
    monkeypatch.setenv("TFLA_TEST_OOM_MARK", str(tmp_path / "oom-once.mark"))
    cases = [case("test_oom_once", 1, 16), case("test_oom", 1, 16), case("test_counting", 1, 16)]
    seen, retries, runs = [], [], []
    summary = precompile.precompile(
        cases,
        4,
        ["cpu"],
        tmp_path,
        timeout_s=120,
        on_start=runs.append,
        on_result=seen.append,
        on_retry=lambda job, processes: retries.append((job.case.kernel, processes)),
    )
    # 3 processes (3 runs): two run out of memory and run again as if one process ran; test_oom
    # never fits
    assert sorted(retries) == [("test_oom", 1), ("test_oom_once", 1)]
    outcomes = sorted((r.job.case.kernel, r.status, r.retried) for r in seen)
    assert outcomes == [
        ("test_counting", "ok", False),
        ("test_oom", "oom", False),
        ("test_oom", "oom", True),
        ("test_oom_once", "ok", False),
        ("test_oom_once", "oom", True),
    ]
    assert runs == [3, 1, 1]
    assert (summary.processes, summary.runs, summary.retried, summary.failed) == (3, 3, 2, 1)


def _queue(jobs, processes, devices=("cuda:0",)):
    retries = []
    todo = precompile._Queue(jobs, processes, list(devices), lambda job, w: retries.append(w))
    return todo, retries


def test_the_queue_starts_a_run_only_where_the_shares_leave_room_and_lets_spare_processes_go():
    jobs = [
        precompile.PrecompileJob(case("test_counting", 1, t), "m", 0, 1, "sum") for t in (16, 32, 48, 64, 80)
    ]
    todo, retries = _queue(jobs, 4)
    first = [todo.take("cuda:0") for _ in range(4)]
    assert [w for _, w in first] == [4] * 4
    assert first[0][0].memory_share == pytest.approx(precompile.MEMORY_SHARE / 4)
    # the first runs out of memory: it goes to the end, as one of 2 processes (two quarters)
    assert todo.finish("cuda:0", *first[0], out_of_memory=True)
    assert retries == [2]
    assert [(j.case.seq_len, w) for j, w in todo.waiting] == [(80, 4), (16, 2)]
    assert todo.waiting[1][0].memory_share == pytest.approx(precompile.MEMORY_SHARE / 2)
    assert not todo.finish("cuda:0", *first[1], out_of_memory=False)
    fifth = todo.take("cuda:0")
    assert fifth[0].case.seq_len == 80
    # three quarters held: the run of two quarters does not fit, and of the 4 processes 2 leave
    assert todo.take("cuda:0") is None and todo.take("cuda:0") is None
    assert todo.up["cuda:0"] == 2
    taken = []
    thread = threading.Thread(target=lambda: taken.append(todo.take("cuda:0")))
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()  # 2 processes up, as many as the run needs: it waits
    assert not todo.finish("cuda:0", *first[2], out_of_memory=False)
    thread.join(5)
    assert taken[0][0].case.seq_len == 16 and taken[0][1] == 2
    # as one process it does not come back
    assert not todo.finish("cuda:0", taken[0][0], 1, out_of_memory=True)


def test_beside_the_measuring_a_run_that_goes_back_waits_before_the_kernels_measured_later():
    jobs = [
        precompile.PrecompileJob(case(kernel, 1, 16), "m", 0, 1, "sum")
        for kernel in ("test_counting", "test_counting", "test_raise", "test_autotuned")
    ]
    order = ["test_counting", "test_raise"]
    todo = precompile._Queue(jobs, 4, ["cuda:0"], lambda job, width: None, 0.5, order)
    first, second = todo.take("cuda:0"), todo.take("cuda:0")
    assert first[0].memory_share == pytest.approx(0.5 / 4)
    assert todo.finish("cuda:0", *first, out_of_memory=True)
    # before test_raise (measured after test_counting) and the kernel the order does not name
    assert [(j.case.kernel, w) for j, w in todo.waiting] == [
        ("test_counting", 2),
        ("test_raise", 4),
        ("test_autotuned", 4),
    ]
    assert todo.finish("cuda:0", *second, out_of_memory=True)
    assert [j.case.kernel for j, _ in todo.waiting][:2] == ["test_counting", "test_counting"]


def test_the_queue_ends_once_no_run_is_left_or_under_way():
    jobs = [precompile.PrecompileJob(case("test_counting", 1, 16), "m", 0, 1, "sum")]
    todo, _ = _queue(jobs, 2, devices=("cuda:0", "cuda:1"))
    job, width = todo.take("cuda:1")
    ended = []
    thread = threading.Thread(target=lambda: ended.append(todo.take("cuda:0")))
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()  # the run under way may come back
    todo.finish("cuda:1", job, width, out_of_memory=False)
    thread.join(5)
    assert ended == [None]
    assert todo.take("cuda:1") is None


def test_sweep_precompiles_first_and_records_it(plugin_adapters, tmp_path, monkeypatch):
    monkeypatch.setenv("TFLA_TEST_BLOCK_LOG", str(tmp_path / "blocks.log"))
    spec = tiny_spec("precompile-test", ["test_counting", "test_unavailable"], ["fw", "fwbw"], batch=4)
    run_dir = tmp_path / "run"
    report = runner.run_sweep(spec, specs.expand(spec), run_dir, devices=["cpu"], precompile_processes=2)
    assert sorted(row.status for row in report.rows) == ["ok"] * 4 + ["unavailable"] * 4
    env = json.loads((run_dir / "env.json").read_text())
    # only the cases that run: test_counting, batch 4 -> 2, at two lengths and two modes
    assert {k: env["precompile"][k] for k in ("processes", "cases", "runs", "failed", "retried")} == {
        "processes": 2,
        "cases": 4,
        "runs": 4,
        "failed": 0,
        "retried": 0,
    }
    assert env["precompile"]["seconds"] > 0


def test_a_later_precompile_into_the_same_cache_skips_the_runs_made(plugin_adapters, tmp_path, monkeypatch):
    log = tmp_path / "blocks.log"
    monkeypatch.setenv("TFLA_TEST_BLOCK_LOG", str(log))
    cases = [case("test_autotuned", 1, 16), case("test_counting", 1, 16), case("test_raise", 1, 16)]

    def run(**kwargs):
        return precompile.precompile(cases, 2, ["cpu"], tmp_path, timeout_s=120, **kwargs)

    first = run()
    assert (first.runs, first.skipped, first.failed) == (4, 0, 1)
    done = json.loads((tmp_path / "triton-cache" / precompile.DONE_FILE).read_text())
    # the two shards, test_counting and test_raise, whose error would repeat
    assert [len(entry["done"]) for entry in done.values()] == [4]
    seen = []
    second = run(on_start=seen.append)
    assert (second.runs, second.skipped, second.cases) == (0, 4, 3) and seen == [0]
    assert sorted(log.read_text().split()) == ["16", "32"]  # the shards ran once
    # Another torch, Triton, package, kernel source, config or GPU: another fingerprint, every run again.
    monkeypatch.setattr(precompile, "fingerprint", lambda devices: "another")
    assert (run().runs, run().skipped) == (4, 4)
    (tmp_path / "triton-cache" / precompile.DONE_FILE).write_text("not json")
    assert run().skipped == 0


def test_the_fingerprint_follows_the_devices_and_the_tuned_configs(monkeypatch):
    from tfla_bench.kernels import config as kernel_config

    before = precompile.fingerprint(["cpu"])
    assert precompile.fingerprint(["cpu"]) == before and precompile.fingerprint(["cpu", "cpu"]) != before
    monkeypatch.setitem(kernel_config.TUNED_CONFIGS, ("test GPU", "test key"), "a config")
    assert precompile.fingerprint(["cpu"]) != before


@pytest.mark.gpu
def test_precompile_an_autotuned_library_kernel_on_the_gpu(tmp_path):
    """fla's GLA (autotuned) through the real workers: every shard runs without a failure."""
    from tfla_bench.adapters import registry

    gla = registry.get("gla")
    if gla.available() is not None:
        pytest.skip(gla.available())
    cases = [Case("gla", mode, "bfloat16", 2, 256, 2, 64, 128) for mode in ("fw", "fwbw")]
    results = []
    summary = precompile.precompile(cases, 4, ["cuda:0"], tmp_path, on_result=results.append)
    assert (summary.cases, summary.runs) == (2, 8)
    assert [r.status for r in results] == ["ok"] * 8, [r.error for r in results if r.status != "ok"]


def test_compile_only_compiles_each_kernel_without_launching_it(monkeypatch):
    from triton.runtime.jit import JITFunction

    calls = []

    def recorder(self, *args, grid, warmup, **kwargs):
        calls.append((args, grid, warmup, kwargs))
        return "compiled"

    monkeypatch.setattr(JITFunction, "run", recorder)
    with precompile.compile_only():
        assert JITFunction.run(object(), 1, 2, grid=(4,), warmup=False, BLOCK=16) == "compiled"
    assert calls == [((1, 2), (4,), True, {"BLOCK": 16})]
    assert JITFunction.__dict__["run"] is recorder  # restored
    JITFunction.run(object(), grid=(4,), warmup=False)
    assert calls[-1][2] is False


def test_the_plan_follows_the_order_the_sweep_measures_in(plugin_adapters):
    cases = [case("test_counting", 1, 16), case("test_autotuned", 1, 16), case("test_raise", 1, 16)]
    kernels = [job.case.kernel for job in precompile.plan_jobs(cases, 2, "sum")]
    assert kernels == ["test_autotuned", "test_autotuned", "test_counting", "test_raise"]
    ordered = precompile.plan_jobs(cases, 2, "sum", order=["test_raise", "test_counting", "test_autotuned"])
    assert [job.case.kernel for job in ordered] == [
        "test_raise",
        "test_counting",
        "test_autotuned",
        "test_autotuned",
    ]
    assert [job.shard for job in ordered] == [0, 0, 0, 1]


def test_each_kernel_is_told_once_as_soon_as_its_runs_are_done(plugin_adapters, tmp_path):
    cases = [case("test_abort", 1, t) for t in (16, 32, 64)] + [case("test_counting", 1, 16)]
    told = []
    summary = precompile.precompile(
        cases,
        1,
        ["cpu"],
        tmp_path,
        timeout_s=120,
        on_kernel_done=lambda kernel, crashed: told.append((kernel, crashed)),
    )
    assert told == [("test_abort", summary.crashed), ("test_counting", {})]
    assert sorted(summary.crashed) == sorted(c.key for c in cases[:3])
    # With every run made by an earlier sweep, each kernel is told at once, with that sweep's verdict.
    again = []
    precompile.precompile(cases, 1, ["cpu"], tmp_path, on_kernel_done=lambda *told: again.append(told))
    assert again == told


def test_sweep_measures_beside_its_precompile(plugin_adapters, tmp_path, monkeypatch):
    """On a GPU the precompile runs beside the measuring (forced here on the CPU): the adapters with
    nothing to compile measure first, each other adapter waits for its compiling, and a case that ran
    out of memory while the precompile held its share runs again after it."""
    monkeypatch.setattr(runner, "compile_beside", lambda cuda: True)
    monkeypatch.setattr(plugin_adapters.OomOnce, "precompile", "none")
    monkeypatch.setenv("TFLA_TEST_OOM_MARK", str(tmp_path / "oom-once.mark"))
    spec = tiny_spec("beside-test", ["test_slow_to_compile", "test_oom_once"], ["fw"], batch=2)
    run_dir = tmp_path / "run"
    report = runner.run_sweep(spec, specs.expand(spec), run_dir, devices=["cpu"], precompile_processes=2)
    assert [(row.case.kernel, row.status) for row in report.rows] == [
        ("test_slow_to_compile", "ok"),
        ("test_slow_to_compile", "ok"),
        ("test_oom_once", "ok"),
        ("test_oom_once", "ok"),
    ]
    # The precompile ran (5 s per run at its raised niceness), the measuring not (no sleep there).
    assert all(row.median_ms < 1000 for row in report.rows)
    # Measured while it compiled, the row says so; after it (the held case too), not.
    assert [runner.BESIDE_NOTE in row.note for row in report.rows] == [False, False, False, True]
    # ... and has no energy: the GPU's counter would count the precompile's work with its calls.
    assert runner.BESIDE_NO_ENERGY_NOTE in report.rows[3].note and report.rows[3].energy_mj is None
    env = json.loads((run_dir / "env.json").read_text())
    assert (env["precompile"]["runs"], env["precompile"]["failed"]) == (2, 0)
    phases = json.loads((run_dir / "timings.json").read_text())["phases_s"]
    assert phases["precompile"] >= 5 and phases["precompile_wait"] > 0
    # The OOM'd case ran once more: its first worker log holds the out-of-memory error.
    assert "out of memory" in (run_dir / "worker-0.log").read_text().lower()


def test_the_long_calls_of_every_adapter_are_measured_last_when_the_roofs_are_known(
    plugin_adapters, monkeypatch
):
    roofs = MeasuredRoofs("GPU", "1", 1e15, 8192, 4e12, 1e13, 1 << 20, "now", "torch").to_dict()

    def planned(kernel, seq_len, flops):
        return runner._Planned(case(kernel, 1, seq_len), registry.get(kernel), flops, 0.0)

    to_run = [
        planned("test_autotuned", 16, 1e9),
        planned("test_counting", 16, 1e9),
        planned("test_counting", 32, 25e12),  # 25 ms at 1 PFLOP/s: a long call
        planned("test_slow_to_compile", 16, 1e9),
        planned("test_autotuned", 32, 19e12),  # 19 ms: not
    ]
    monkeypatch.setattr(plugin_adapters.SlowToCompile, "precompile", "none")
    keys = [(p.case.kernel, p.case.seq_len) for p in runner.measuring_order(to_run, roofs)]
    assert keys == [
        ("test_slow_to_compile", 16),
        ("test_counting", 16),
        ("test_autotuned", 16),
        ("test_autotuned", 32),
        ("test_counting", 32),
    ]
    # Without measured roofs (or with their error) the groups are the adapters' alone.
    for unknown in (None, {"error": "measuring the roofs failed"}):
        assert [p.case.seq_len for p in runner.measuring_order(to_run, unknown)][-1] == 32
        assert runner.measuring_order(to_run, unknown)[3].case.kernel == "test_autotuned"


def test_the_workers_keep_fa4s_compiled_kernels_in_tritons_cache_unless_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv(worker.CUTE_CACHE_ENV, raising=False)
    monkeypatch.delenv(worker.CUTE_CACHE_DIR_ENV, raising=False)
    folder = str(tmp_path / "triton" / worker.CUTE_CACHE_FOLDER)
    assert worker.cute_cache_settings() == {worker.CUTE_CACHE_ENV: "1", worker.CUTE_CACHE_DIR_ENV: folder}
    assert worker.cute_cache_dir() == folder
    monkeypatch.setenv(worker.CUTE_CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert worker.cute_cache_dir() == str(tmp_path / "mine")
    monkeypatch.setenv(worker.CUTE_CACHE_ENV, "0")
    assert worker.cute_cache_settings()[worker.CUTE_CACHE_ENV] == "0" and worker.cute_cache_dir() is None


def _beside_the_precompile(kernel: str, tmp_path) -> tuple[object, str]:
    """Sweep `kernel` beside a precompile that takes seconds; its row and its worker's log."""
    raw = {
        "name": "beside-test",
        "kernels": ["test_slow_to_compile", kernel],
        "modes": ["fw"],
        "dtype": "float32",
        "warmup": 1,
        "budget_s": 0.06,
        "min_time_s": 0.0,
        "timeout_s": 120,
        "energy": False,
        "published": "nothing",
        "shape": {"batch": 1, "seq_len": [16], "num_heads": 2, "head_dim_qk": 8, "head_dim_v": 8},
    }
    spec = specs.parse_spec(raw, "test")
    report = runner.run_sweep(
        spec, specs.expand(spec), tmp_path / "run", devices=["cpu"], precompile_processes=2
    )
    (row,) = [row for row in report.rows if row.case.kernel == kernel]
    return row, (tmp_path / "run" / "worker-0.log").read_text()


def test_a_case_left_unsettled_beside_the_precompile_is_measured_again_after_it(
    plugin_adapters, tmp_path, monkeypatch
):
    monkeypatch.setattr(runner, "compile_beside", lambda cuda: True)
    unsettled, log = _beside_the_precompile("test_unsettled", tmp_path)
    # Measured first, beside the precompile, it was timed twice there, held, and measured after it.
    assert unsettled.status == "ok" and runner.BESIDE_NOTE not in unsettled.note
    assert "timed again: its first" in unsettled.note and "unsettled again" in unsettled.note
    assert log.count("--- case test_unsettled") == 2


def test_a_case_wavering_beside_the_precompile_is_measured_again_after_it(
    plugin_adapters, tmp_path, monkeypatch
):
    monkeypatch.setattr(runner, "compile_beside", lambda cuda: True)
    wavering, log = _beside_the_precompile("test_wavering", tmp_path)
    # Out of its budget at about +-6% beside the precompile: not timed again at once by the worker
    # (+-10%), but held and measured after the precompile, where it wavers as much.
    assert wavering.status == "ok" and wavering.stop == "budget"
    assert runner.BESIDE_UNSETTLED_CI < wavering.ci_rel <= 0.1, wavering.ci_rel
    assert runner.BESIDE_NOTE not in wavering.note and "timed again" not in wavering.note
    assert log.count("--- case test_wavering") == 2


def test_only_an_ok_series_out_of_budget_wider_than_the_beside_bound_is_held():
    case = Case("k", "fw", "float32", 1, 16, 2, 8, 8, None, {})
    row = ResultRow(case, "test", "ok", stop="budget", ci_rel=0.05)
    assert runner.unsettled_beside(row)
    for changes in (
        {"ci_rel": 0.02},
        {"ci_rel": float("inf")},
        {"ci_rel": None},
        {"stop": "ci"},
        {"status": "error"},
    ):
        assert not runner.unsettled_beside(dataclasses.replace(row, **changes)), changes
