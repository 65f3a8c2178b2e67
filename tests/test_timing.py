"""The stop rule on synthetic timings, the median's confidence interval and the timing loop on CPU."""

import math
import random
import time

import pytest

from tfla_bench.measure import timing
from tfla_bench.measure.timing import StopRule


def simulate(rule: StopRule, draw, per_call_s: float) -> tuple[int, str]:
    """Feed `rule` synthetic times in the batches it asks for; elapsed time grows per call."""
    times: list[float] = []
    while True:
        elapsed = len(times) * per_call_s
        stop = rule.reason(times, elapsed)
        if stop is not None:
            return len(times), stop
        batch = rule.next_batch(len(times), elapsed)
        assert batch >= 1
        times += [draw() for _ in range(batch)]


def noise(spread: float, seed: int = 0):
    rng = random.Random(seed)
    return lambda: 1.0 + spread * rng.random()


def test_median_ci_matches_the_binomial_table():
    assert timing.median_ci([1.0] * 5) == (-math.inf, math.inf)
    values = [float(i) for i in range(1, 101)]
    # n = 100: the 95% interval of the median spans ranks 40 and 61 (order-statistic tables).
    assert timing.median_ci(values) == (40.0, 61.0)
    assert timing.median_ci([float(i) for i in range(1, 7)]) == (1.0, 6.0)
    assert timing.ci_rel([2.0] * 10) == 0.0


def test_a_noisy_series_stops_later_than_a_quiet_one():
    rule = StopRule(rel_ci=0.01, budget_s=100.0, max_reps=5000)
    quiet_reps, quiet_stop = simulate(rule, noise(0.005), per_call_s=1e-3)
    noisy_reps, noisy_stop = simulate(rule, noise(0.2), per_call_s=1e-3)
    assert quiet_stop == noisy_stop == "ci"
    assert noisy_reps > 4 * quiet_reps


def test_the_budget_stops_a_series_that_never_settles():
    rule = StopRule(rel_ci=0.001, budget_s=1.0, max_reps=10_000)
    reps, stop = simulate(rule, noise(1.0), per_call_s=0.01)
    assert stop == "budget"
    # Batches are at most a tenth of the budget, so it stops soon after the budget is spent.
    assert 100 <= reps <= 115


def test_a_quiet_short_kernel_is_timed_for_the_minimum_time():
    quiet = noise(0.001)
    assert simulate(StopRule(rel_ci=0.01, budget_s=1.0), quiet, per_call_s=1e-3) == (6, "ci")
    reps, stop = simulate(StopRule(rel_ci=0.01, budget_s=1.0, min_time_s=0.2), quiet, per_call_s=1e-3)
    # batches grow by a quarter, so the rule stops within a quarter past 200 calls of 1 ms
    assert stop == "ci" and 200 <= reps <= 250
    # a call longer than the minimum time stops at the interval as before
    assert simulate(StopRule(rel_ci=0.01, budget_s=10.0, min_time_s=0.2), quiet, per_call_s=0.5) == (6, "ci")


def test_the_minimum_holds_for_long_calls_and_the_maximum_caps():
    rule = StopRule(rel_ci=0.01, budget_s=1.0, min_reps=5)
    assert simulate(rule, noise(0.5), per_call_s=0.4) == (5, "budget")
    capped = StopRule(rel_ci=1e-6, budget_s=1e9, min_reps=5, max_reps=50)
    assert simulate(capped, noise(1.0), per_call_s=1e-3) == (50, "max")


def test_fixed_reps_are_honoured_whatever_the_noise_or_budget():
    rule = StopRule(reps=30, budget_s=1e-9)
    assert simulate(rule, noise(5.0), per_call_s=10.0) == (30, "fixed")


def test_time_calls_on_cpu_adaptive_and_fixed():
    calls = []

    def fn():
        calls.append(1)

    fixed = timing.time_calls(fn, rule=StopRule(reps=7), device="cpu")
    assert (fixed.reps, fixed.stop, len(calls), fixed.host_gap_share) == (7, "fixed", 7, None)
    adaptive = timing.time_calls(fn, rule=StopRule(budget_s=0.05, min_reps=5), device="cpu")
    assert adaptive.stop in ("ci", "budget", "max") and adaptive.reps >= 5
    assert adaptive.reps == len(calls) - 7
    assert adaptive.ci_rel <= 0.01 if adaptive.stop == "ci" else adaptive.ci_rel >= 0


def test_warm_up_by_time_and_by_count():
    count, queue_s = timing.warm_up(lambda: None, "cpu", calls=3, seconds=10.0)
    assert count == 3 and queue_s >= 0
    count, _ = timing.warm_up(lambda: None, "cpu", calls=None, seconds=0.0)
    assert count == 1
    count, _ = timing.warm_up(lambda: None, "cpu", calls=None, seconds=0.02)
    assert count > 1


def test_the_autotuning_budget_shortens_library_autotuners_and_restores_triton():
    import triton
    import triton.language as tl
    from triton.runtime.autotuner import Autotuner

    configs = [triton.Config({"BLOCK": 16})]

    @triton.jit
    def body(out_ptr, BLOCK: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, BLOCK), BLOCK)

    library = triton.autotune(configs=configs, key=[])(body)
    own = triton.autotune(configs=configs, key=[], do_bench=lambda fn, quantiles: [1.0])(body)
    original = Autotuner.__dict__["do_bench"]
    with timing.autotuning_budget(40.0):
        bench = library.do_bench
        assert bench.func is triton.testing.do_bench and bench.keywords == {"warmup": 10.0, "rep": 40.0}
        assert own.do_bench([], quantiles=None) == [1.0]  # a library's own benchmark is kept
    assert Autotuner.__dict__["do_bench"] is original
    with timing.autotuning_budget(None):
        assert Autotuner.__dict__["do_bench"] is original


def test_first_config_only_runs_one_config_that_survives_pruning_and_caches_nothing():
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.autotuner import Autotuner

    ran = []
    configs = [
        triton.Config({"BLOCK": block}, pre_hook=lambda nargs, block=block: ran.append(block))
        for block in (8, 16, 32)
    ]

    @triton.jit
    def body(out_ptr, BLOCK: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, BLOCK), BLOCK)

    def drop_the_first(configs, named_args, **kwargs):
        return configs[1:]

    def bench_once(fn, quantiles):
        fn()
        return [1.0, 1.0, 1.0]

    kernel = triton.autotune(
        configs=configs, key=[], prune_configs_by={"early_config_prune": drop_the_first}, do_bench=bench_once
    )(body)
    out = torch.zeros(32, dtype=torch.int32)
    original = Autotuner.run
    with timing.first_config_only():
        kernel[(1,)](out)
    assert ran == [16] and out[:16].tolist() == [16] * 16 and out[16:].tolist() == [0] * 16
    assert Autotuner.run is original and kernel.cache == {} and len(kernel.configs) == 3
    ran.clear()
    kernel[(1,)](out)  # outside the block the autotuner times both configs left after pruning
    assert sorted(set(ran)) == [16, 32] and len(kernel.cache) == 1


def test_both_flushes_run_and_touch_their_whole_buffer(monkeypatch):
    import torch

    class Properties:
        L2_cache_size = 50 * 1024 * 1024

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    dirty, clean = timing.L2Flush("cpu"), timing.L2Flush("cpu", clean=True)
    assert dirty.size_bytes == clean.size_bytes == timing.MIN_FLUSH_BYTES  # > 2 x 50 MiB
    clean.buffer.fill_(1)
    clean()  # reads every word: the sum of 4-byte words of 0x01010101
    assert int(clean._sum) == (clean.size_bytes // 4) * 0x01010101
    dirty.buffer.fill_(1)
    dirty()
    assert int(dirty.buffer.abs().sum()) == 0


def test_standalone_timing_resets_before_every_call_on_cpu():
    calls, resets = [], []
    stats = timing.time_standalone(
        lambda: calls.append(1), "cpu", rule=StopRule(reps=7), warmup_calls=2, reset=lambda: resets.append(1)
    )
    assert (stats.reps, stats.stop, len(calls), len(resets)) == (7, "fixed", 9, 9)
    assert stats.host_gap_share is None  # no flush, spin or events on CPU


def test_an_idle_gap_as_long_as_the_call_before_it_comes_before_each_later_call(monkeypatch):
    gaps = []
    monkeypatch.setattr(timing.time, "sleep", gaps.append)

    def call():  # about 2 ms of host work, timed by the host clock on CPU
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass

    stats = timing.time_calls(call, rule=StopRule(reps=4), device="cpu", idle_gap=1.5)
    assert stats.reps == len(gaps) + 1 == 4
    assert all(1.5 * 0.002 <= gap < 1.5 * 0.02 for gap in gaps)
    assert timing.time_calls(call, rule=StopRule(reps=4), device="cpu").reps == len(gaps) + 1 == 4


def test_the_kernels_clock_splits_the_record_at_the_markers():
    marker = "void at::cuda::(anonymous namespace)::spin_kernel<long>(long)"
    record = [
        ("fill (flush)", 0, 100),
        (marker, 100, 300),  # the spin before call 1: the call starts when it ends
        ("kernel a", 305, 325),
        ("kernel b", 330, 350),
        (marker, 352, 353),
        ("fill (flush)", 400, 500),
        (marker, 500, 700),
        ("Memcpy DtoD", 702, 712),
        ("kernel c", 712 + timing.HOST_WAIT_NS + 1, 9000),  # the GPU waited for the host before it
        (marker, 9001, 9002),
    ]
    shuffled = record[::-1]  # the record is sorted by start time first
    assert timing.split_calls(shuffled, 2) == [(50, False), (8300, True)]
    with pytest.raises(RuntimeError, match="found 4 marker kernels for 3 calls"):
        timing.split_calls(record, 3)
    with pytest.raises(RuntimeError, match="ran no kernel"):
        timing.split_calls([(marker, 0, 1), (marker, 2, 3)], 1)


def test_the_kernels_clock_needs_cuda_and_a_known_name():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        timing.time_calls(lambda: None, rule=StopRule(reps=1), device="cpu", clock="kernels")
    with pytest.raises(ValueError, match="clock must be one of"):
        timing.time_calls(lambda: None, rule=StopRule(reps=1), device="cpu", clock="wall")


def test_a_series_that_may_stop_early_times_one_call_then_batches_of_at_most_the_check_interval():
    batches = []
    calls = []

    def call():  # about 10 ms of host work
        calls.append(1)
        end = time.perf_counter() + 0.01
        while time.perf_counter() < end:
            pass

    def stop_early():
        batches.append(len(calls) - sum(batches))
        return False

    stats = timing.time_calls(call, rule=StopRule(reps=12), device="cpu", stop_early=stop_early)
    assert stats.reps == 12 and stats.stop == "fixed"
    assert batches[0] == 1 and max(batches) <= int(timing.EARLY_CHECK_S / 0.01)
    assert sum(batches) == 12


def test_a_series_ends_at_the_batch_where_stop_early_says_so():
    answers = iter([False, False, True])
    calls = []

    def call():  # about 5 ms of host work: batches of one call, then of about ten
        calls.append(1)
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass

    stats = timing.time_calls(call, rule=StopRule(reps=50), device="cpu", stop_early=lambda: next(answers))
    assert stats.stop == timing.STOPPED_EARLY and stats.reps == len(calls) < 50


def test_only_a_series_out_of_budget_with_a_wide_interval_is_unsettled():
    def stats(stop: str, ci_rel: float) -> timing.TimingStats:
        return timing.TimingStats(16.1, 9.1, 21.0, 8.9, 52, ci_rel=ci_rel, stop=stop)

    assert timing.unsettled(stats("budget", 0.24))
    # Within the limit, stopped by the interval or the count, or too few calls for an interval.
    for stop, ci_rel in (("budget", timing.UNSETTLED_CI), ("ci", 0.24), ("max", 0.24), ("budget", math.inf)):
        assert not timing.unsettled(stats(stop, ci_rel))
    note = timing.unsettled_note(stats("budget", 0.24), stats("budget", 0.12))
    assert note == (
        "timed again: its first 52 calls ran out of their time budget with the median's 95% interval"
        " at +-24%; unsettled again (+-12%)"
    )
    assert timing.unsettled_note(stats("budget", 0.24), stats("ci", 0.01)).endswith("at +-24%")
