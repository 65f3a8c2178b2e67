"""Tuning our kernels' configs: candidate grids, the search on CPU (interpreter), the tuned-config file."""

import dataclasses
import json

import pytest
import torch

from tfla_bench.adapters.workloads import Case
from tfla_bench.cli import tune as tune_cli
from tfla_bench.cli.main import main
from tfla_bench.kernels import config as kconfig
from tfla_bench.measure import timing, tuning


def shape(chunk_size=128, kernel="tfla", gate="sig"):
    return tuning.Shape(kernel, gate, 8, 16, 8192, 128, 256, chunk_size)


@pytest.mark.parametrize("chunk_size", [64, 128, 256])
def test_candidates_are_valid_distinct_and_start_from_the_base(chunk_size):
    tuned = shape(chunk_size)
    base = kconfig.default_config("tfla", 128, 256, chunk_size, torch.bfloat16, "sig")
    for group, fields in tuning.GROUPS.items():
        found = tuning.candidates(tuned, base, group)
        assert found[0] == base and len(found) == len(set(found)) > 1
        for candidate in found:
            kconfig.check_config("tfla", candidate, 128, 256, chunk_size)
            others = [f for f in kconfig.KernelConfig.__dataclass_fields__ if f not in fields]
            assert all(getattr(candidate, f) == getattr(base, f) for f in others), group
    assert all(c.seq_q <= 64 for c in tuning.candidates(shape(64), base, "fwd")[1:])


@pytest.mark.parametrize("tma", [False, True])
def test_the_forward_grid_tries_the_value_block_and_tma_loads_where_the_gpu_has_them(tma):
    base = dataclasses.replace(kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "exp"), seq_q=64)
    found = tuning.candidates(shape(128, gate="exp"), base, "fwd", tma)
    assert {c.v for c in found} == {128, 256}
    assert {c.tma for c in found} == ({False, True} if tma else {False})
    assert found[0] == base and tuning.idle_warps(base)  # 8 warps over 64 rows: the base may idle warps
    assert not any(tuning.idle_warps(c) for c in found[1:])  # no other candidate does
    assert {(c.seq_q, c.num_warps) for c in found[1:]} == {(64, 4), (128, 4), (128, 8)}
    # the value block never exceeds a small head dim; the backward's grid tries its own TMA loads
    # wherever its query tile is no taller than its key tile, the state grid none
    small = tuning.Shape("tfla", "sig", 4, 128, 8192, 32, 32, 256)
    small_base = kconfig.default_config("tfla", 32, 32, 256, torch.bfloat16, "sig")
    assert {c.v for c in tuning.candidates(small, small_base, "fwd", tma)} == {32}
    backward = tuning.candidates(shape(), base, "bwd", tma)
    assert not any(c.tma for c in backward)
    assert {c.bwd_tma for c in backward[1:]} == ({False, True} if tma else {False})
    assert all(c.bwd_seq_q <= c.bwd_seq_kv for c in backward if c.bwd_tma)
    assert not any(c.tma or c.bwd_tma for c in tuning.candidates(shape(), base, "state", tma))


def test_tune_searches_the_forward_grid_with_tma_loads_only_on_a_gpu_that_has_them(monkeypatch):
    small = tuning.Shape("tfla", "sig", 1, 1, 64, 16, 16, 32, torch.float32)
    seen = []

    def grid(s, group, tma=False):
        seen.append((group, tma))
        return {}

    monkeypatch.setattr(tuning, "grid", grid)
    monkeypatch.setattr(tuning, "STEP_ROUNDS", 0)
    _timed_by_config(monkeypatch, lambda c: 1.0)
    for available in (False, True):
        monkeypatch.setattr(tuning, "tma_available", lambda device, available=available: available)
        seen.clear()
        tuning.tune(small, device="cpu", compiler=tuning.Compiler(0), groups=("fwd",), stages=())
        assert seen == [("fwd", available)]


def test_dk_and_dv_in_one_kernel_are_tried_at_small_head_dims_only():
    for dqk, dv, tried in [(64, 64, True), (128, 128, True), (128, 256, False), (48, 64, False)]:
        small = tuning.Shape("tfla", "sig", 4, 64, 8192, dqk, dv, 256)
        base = kconfig.default_config("tfla", dqk, dv, 256, torch.bfloat16, "sig")
        fused = [c for c in tuning.candidates(small, base, "bwd") if c.bwd_fused_kv]
        assert bool(fused) == tried, (dqk, dv)


def test_limit_chunk_candidates_keep_whole_chunk_tiles():
    base = kconfig.default_config("limit_chunk", 128, 256, 64, torch.bfloat16)
    for group in tuning.GROUPS:
        for candidate in tuning.candidates(shape(64, "limit_chunk", "exp"), base, group):
            assert candidate.seq_q == candidate.bwd_seq_kv == 64


def _timed_by_config(monkeypatch, full_ms, screen_ms=None):
    """Time each call by its config: `full_ms(config)` in full, `screen_ms(config)` when screened."""
    real = tuning.make_call

    def tagged(s, inputs, config, mode):
        call = real(s, inputs, config, mode)
        call.config = config
        return call

    def fake_time(call, device, rule):
        screened = rule is tuning.SCREEN_RULE
        timed.append((call.config, screened))
        return (screen_ms or full_ms)(call.config) if screened else full_ms(call.config)

    timed = []
    monkeypatch.setattr(tuning, "make_call", tagged)
    monkeypatch.setattr(tuning, "time_call", fake_time)
    return timed


def test_the_search_screens_every_candidate_times_the_close_ones_and_keeps_the_fastest_on_cpu(monkeypatch):
    small = tuning.Shape("tfla", "exp", 1, 1, 64, 16, 32, 16, torch.float32)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)  # the interpreter is slow
    monkeypatch.setattr(tuning, "STEP_ROUNDS", 0)
    grids = {"fwd": {"num_warps": (2, 4, 8)}, "bwd": {"bwd_num_warps": (2, 4)}, "state": {}}
    monkeypatch.setattr(tuning, "grid", lambda s, group, tma=False: grids[group])
    fw = {2: 1.05, 4: 3.0, 8: 1.0}  # fwd: warps 8 fastest, 2 within the margin, the base (4) far off
    timed = _timed_by_config(
        monkeypatch,
        lambda c: fw[c.num_warps] if c.bwd_num_warps == 4 else 5.0,
        lambda c: fw[c.num_warps] * (1.02 if c.num_warps == 2 else 1.0) if c.bwd_num_warps == 4 else 5.0,
    )
    seen = []
    search = tuning.tune(
        small, device="cpu", compiler=tuning.Compiler(0), groups=("fwd", "bwd", "state"), on_trial=seen.append
    )
    trials = search.trials
    assert seen == trials and [t.group for t in trials] == ["fwd"] * 3 + ["bwd"] * 2 + ["state"]
    assert all(t.error == "" and t.rel_err <= 1e-5 for t in trials)  # float32: tiles change rounding only
    assert all(t.screen_ms is not None for t in trials)
    by_warps = {t.config.num_warps: t for t in trials[:3]}
    assert by_warps[4].median_ms is None and by_warps[2].median_ms == 1.05 and by_warps[8].median_ms == 1.0
    assert search.best.num_warps == 8 and search.best.bwd_num_warps == 4  # fastest of each group, else base
    assert sum(not screened for _, screened in timed) == 2 + 1 + 1  # the finalists of each group only
    assert set(search.seconds) == {"compile", "time"}
    table = tuning.markdown(small, search, trials[0].config, "CPU")
    assert "6 candidates" in table
    assert "| fwd | fw | grid | num_warps=8 | 1.000 | 1.000 |" in table
    assert "| fwd | fw | grid | default |  | 3.000 |" in table
    assert "| bwd | fwbw | grid | num_warps=8 bwd_num_warps=2 |  | 5.000 |" in table


def test_the_search_steps_past_its_grid_while_a_step_gains(monkeypatch):
    small = tuning.Shape("tfla", "sig", 1, 1, 32, 16, 16, 16, torch.float32)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)
    monkeypatch.setattr(tuning, "grid", lambda s, group, tma=False: {"num_warps": (4, 8)})
    monkeypatch.setattr(tuning, "STEPS", {"fwd": ("num_warps", "num_stages")})
    monkeypatch.setattr(tuning, "LADDERS", {"num_warps": (2, 4, 8, 16), "num_stages": (1, 2, 3)})
    base = kconfig.default_config("tfla", 16, 16, 16, torch.float32, "sig")
    # warps 8 wins the grid, 16 the first step, 16 with one stage more the second; then nothing gains.
    times = {(4, base.num_stages): 4.0, (8, base.num_stages): 3.0, (16, base.num_stages): 2.0}
    times[(16, base.num_stages + 1)] = 1.0
    _timed_by_config(monkeypatch, lambda c: times.get((c.num_warps, c.num_stages), 9.0))
    search = tuning.tune(small, device="cpu", compiler=tuning.Compiler(0), groups=("fwd",))
    assert (search.best.num_warps, search.best.num_stages) == (16, base.num_stages + 1)
    stepped = [(t.config.num_warps, t.config.num_stages) for t in search.trials if t.stage == "step"]
    assert (16, base.num_stages) in stepped and (16, base.num_stages + 1) in stepped
    assert len(stepped) == len(set(stepped)) and (8, base.num_stages) not in stepped  # none tried twice


def test_steps_move_one_field_one_rung_and_keep_the_dtype_of_the_states():
    wide = tuning.Shape("tfla", "exp", 4, 8, 8192, 256, 512, 128)
    base = kconfig.default_config("tfla", 256, 512, 128, torch.bfloat16, "exp")
    assert not kconfig.float32_states("tfla", "exp", 256, base)  # one d_qk block of 256
    for group in tuning.STEPS:
        found = tuning.steps(wide, base, group)
        assert found and len(found) == len(set(found)) and base not in found
        for candidate in found:
            kconfig.check_config("tfla", candidate, 256, 512, 128)
            (moved,) = [f for f in tuning.LADDERS if getattr(candidate, f) != getattr(base, f)]
            ladder = tuning.LADDERS[moved]
            gap = abs(ladder.index(getattr(candidate, moved)) - ladder.index(getattr(base, moved)))
            assert moved in tuning.STEPS[group] and gap == 1
            assert not kconfig.float32_states("tfla", "exp", 256, candidate)
    assert all(c.qk == 256 for c in tuning.steps(wide, base, "fwd"))  # a smaller block: float32 states
    assert any(c.bwd_seq_q == 2 * base.bwd_seq_q for c in tuning.steps(wide, base, "bwd"))
    assert any(c.state_num_stages != base.state_num_stages for c in tuning.steps(wide, base, "state"))


def test_a_candidate_off_the_default_result_is_rejected(monkeypatch):
    small = tuning.Shape("tfla", "sig", 1, 1, 32, 16, 16, 16, torch.float32)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)
    monkeypatch.setattr(tuning, "grid", lambda s, group, tma=False: {"bwd_num_warps": (2,)})
    monkeypatch.setattr(tuning, "STEP_ROUNDS", 0)
    real = tuning.outputs
    monkeypatch.setattr(
        tuning,
        "outputs",
        lambda s, inputs, config, mode: [
            x * (1.5 if config.bwd_num_warps == 2 else 1.0) for x in real(s, inputs, config, mode)
        ],
    )
    monkeypatch.setattr(tuning, "time_call", lambda call, device, rule: 1.0)
    search = tuning.tune(
        small, device="cpu", compiler=tuning.Compiler(0), groups=("bwd",), rule=timing.StopRule(reps=1)
    )
    rejected = search.trials[1]
    assert rejected.median_ms is None and rejected.screen_ms is None
    assert "from the default config's result" in rejected.error
    assert search.best == search.trials[0].config


# 16-bit states off by 1% everywhere (as the miscompile was), by 1e-4 in the gate gradients alone
# (whose chunk sums read the rounded states: kept), or not at all
@pytest.mark.parametrize(("off", "where", "agrees"), [(0.0, 0, True), (1e-4, 3, True), (1e-2, 0, False)])
def test_a_winner_with_float32_states_tries_16_bit_states_and_keeps_them_where_they_agree_and_gain(
    monkeypatch, off, where, agrees
):
    # mLSTMexp with two d_qk blocks wins the grid: float32 chunk states (`float32_states`)
    small = tuning.Shape("tfla", "exp", 1, 1, 64, 32, 16, 16, torch.float16)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)
    monkeypatch.setattr(tuning, "STEP_ROUNDS", 0)
    monkeypatch.setattr(tuning, "grid", lambda s, group, tma=False: {"qk": (16,)} if group == "fwd" else {})
    real = tuning.outputs

    def outputs(s, inputs, config, mode):  # fw: [h]; fwbw: [dq, dk, dv, di, df]
        got = real(s, inputs, config, mode)
        start = where if mode == "fwbw" else min(where, 1)
        return [x * (1 + off) if config.states16 and n >= start else x for n, x in enumerate(got)]

    monkeypatch.setattr(tuning, "outputs", outputs)
    _timed_by_config(monkeypatch, lambda c: 1.0 if c.states16 else 2.0 if c.qk == 16 else 3.0)
    search = tuning.tune(small, device="cpu", compiler=tuning.Compiler(0), groups=("fwd",))
    assert search.trials[1].config.qk == 16 and not search.trials[1].config.states16
    last = [t for t in search.trials if t.stage == "states16"]
    if agrees:
        assert [t.config.states16 for t in last] == [False, True] and last[1].rel_err <= tuning.STATES_MATCH
        assert [t.median_ms for t in last] == [2.0, 1.0]
        assert search.best == last[1].config and search.best.qk == 16
        assert not kconfig.float32_states("tfla", "exp", 32, search.best)
    else:
        (rejected,) = last
        assert rejected.median_ms is None and "from the float32 states' result" in rejected.error
        assert search.best.qk == 16 and not search.best.states16
    assert "| state | fwbw | states16 | qk=16 states16=True |" in tuning.markdown(
        small, search, search.trials[0].config, "CPU"
    )


def test_a_tuned_file_is_looked_up_by_architecture_and_shape(monkeypatch, tmp_path):
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", {})
    kconfig.config_for.cache_clear()
    base = kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "sig")
    tuned = kconfig.KernelConfig(**{**base.__dict__, "bwd_num_warps": 8})
    entry = kconfig.tuned_entry(shape(128).config_key("sm90"), tuned, fwbw_ms=1.0)
    assert entry["dtype"] == "bfloat16" and entry["fwbw_ms"] == 1.0 and entry["target"] == "sm90"
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps([entry]))
    assert kconfig.load_tuned(path) == 1
    for gpu in (("sm90", "NVIDIA H100 80GB HBM3"), ("sm90", "NVIDIA H200"), ("sm90", "NVIDIA GH200 480GB")):
        assert kconfig.config_for("tfla", 128, 256, 128, torch.bfloat16, "sig", gpu) == tuned
    assert kconfig.config_for("tfla", 128, 256, 128, torch.bfloat16, "sig", ("sm80", "NVIDIA A100")) == base
    assert kconfig.config_for("tfla", 128, 256, 128, torch.bfloat16, "exp", ("sm90", "H")) == (
        kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "exp")
    )
    kconfig.config_for.cache_clear()
    monkeypatch.setenv(kconfig.TUNED_FILE_ENV, str(path))
    assert kconfig.user_tuned_file() == path and kconfig.tuned_files() == [kconfig.TUNED_FILE, path]
    monkeypatch.delenv(kconfig.TUNED_FILE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kconfig.user_tuned_file() == tmp_path / "tfla-bench" / "tuned_configs.json"


def test_an_entry_for_one_gpu_wins_over_its_architecture(monkeypatch):
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", {})
    kconfig.config_for.cache_clear()
    base = kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "sig")
    for_arch = kconfig.KernelConfig(**{**base.__dict__, "bwd_num_warps": 8})
    for_h200 = kconfig.KernelConfig(**{**base.__dict__, "num_stages": 3})
    kconfig.register_tuned("sm90", "tfla", 128, 256, 128, torch.bfloat16, "sig", for_arch)
    kconfig.register_tuned("NVIDIA H200", "tfla", 128, 256, 128, torch.bfloat16, "sig", for_h200)
    lookup = ("tfla", 128, 256, 128, torch.bfloat16, "sig")
    assert kconfig.config_for(*lookup, ("sm90", "NVIDIA H200")) == for_h200
    assert kconfig.config_for(*lookup, ("sm90", "NVIDIA H100 80GB HBM3")) == for_arch
    kconfig.config_for.cache_clear()


def test_16_bit_states_checked_at_one_shape_are_not_carried_to_another(monkeypatch):
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", {})
    kconfig.config_for.cache_clear()
    base = kconfig.default_config("tfla", 512, 512, 128, torch.bfloat16, "exp")
    checked = dataclasses.replace(base, qk=128, states16=True)
    kconfig.register_tuned("sm90", "tfla", 512, 512, 128, torch.bfloat16, "exp", checked)
    gpu = ("sm90", "NVIDIA H200")
    assert kconfig.config_for("tfla", 512, 512, 128, torch.bfloat16, "exp", gpu) == checked
    carried = kconfig.config_for("tfla", 512, 512, 256, torch.bfloat16, "exp", gpu)
    assert carried.qk == 128 and not carried.states16
    assert kconfig.float32_states("tfla", "exp", 512, carried)
    kconfig.config_for.cache_clear()


def test_16_bit_states_checked_under_another_triton_version_are_not_used(monkeypatch, tmp_path):
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", {})
    checked = dataclasses.replace(
        kconfig.default_config("tfla", 512, 512, 128, torch.bfloat16, "exp"), qk=128
    )
    checked = dataclasses.replace(checked, states16=True)
    keys = [("sm90", "tfla", 512, 512, chunk, torch.bfloat16, "exp") for chunk in (128, 256)]
    path = tmp_path / "tuned.json"
    kconfig.save_entry(path, kconfig.tuned_entry(keys[0], checked, triton=kconfig._triton_version()))
    kconfig.save_entry(path, kconfig.tuned_entry(keys[1], checked, triton="2.0.0"))
    assert kconfig.load_tuned(path) == 2
    assert kconfig.TUNED_CONFIGS[keys[0]] == checked
    assert kconfig.TUNED_CONFIGS[keys[1]] == dataclasses.replace(checked, states16=False)
    kconfig.config_for.cache_clear()


@pytest.mark.parametrize(
    ("dqk", "dv", "chunk", "expected"),
    [
        (128, 256, 256, "L256"),  # the same shape
        (64, 128, 256, "L256"),  # smaller head dims: the same chunk's entry, blocks cut to the dims
        (512, 1024, 256, "L256"),  # larger head dims: the blocks loop more often
        (128, 256, 128, "L128"),
        (128, 256, 512, "L256"),  # no entry at L512: the nearest chunk, tiles unchanged
        (128, 256, 32, "L128"),  # tiles cut to the chunk
    ],
)
def test_a_shape_without_an_entry_gets_the_nearest_tuned_config_that_runs_it(
    monkeypatch, dqk, dv, chunk, expected
):
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", {})
    kconfig.config_for.cache_clear()
    tuned = {}
    for label, (chunk_size, warps) in {"L128": (128, 2), "L256": (256, 16)}.items():
        base = kconfig.default_config("tfla", 128, 256, chunk_size, torch.bfloat16, "sig")
        tuned[label] = kconfig.KernelConfig(**{**base.__dict__, "num_warps": warps})
        kconfig.register_tuned("sm90", "tfla", 128, 256, chunk_size, torch.bfloat16, "sig", tuned[label])
    got = kconfig.config_for("tfla", dqk, dv, chunk, torch.bfloat16, "sig", ("sm90", "NVIDIA H200"))
    kconfig.check_config("tfla", got, dqk, dv, chunk)
    assert got.num_warps == tuned[expected].num_warps
    assert got.seq_q <= chunk and got.qk <= tuned[expected].qk and dqk % got.qk == 0
    other_arch = kconfig.config_for("tfla", dqk, dv, chunk, torch.bfloat16, "sig", ("sm100", "B200"))
    assert other_arch == kconfig.default_config("tfla", dqk, dv, chunk, torch.bfloat16, "sig")
    kconfig.config_for.cache_clear()


def test_a_limit_chunk_entry_is_not_carried_to_a_chunk_that_does_not_fit_on_chip(monkeypatch):
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", {})
    kconfig.config_for.cache_clear()
    base = kconfig.default_config("limit_chunk", 128, 256, 64, torch.bfloat16)
    kconfig.register_tuned("sm90", "limit_chunk", 128, 256, 64, torch.bfloat16, "exp", base)
    assert kconfig.adapted("limit_chunk", base, 128, 256, 32, torch.bfloat16).seq_q == 32
    wide = kconfig.KernelConfig(**{**base.__dict__, "qk": 128, "v": 256, "bwd_qk": 128, "bwd_v": 256})
    assert kconfig.adapted("limit_chunk", wide, 128, 256, 128, torch.bfloat16) is None
    kconfig.config_for.cache_clear()


def test_a_broken_tuned_file_is_one_clear_error(tmp_path):
    path = tmp_path / "tuned.json"
    path.write_text('[{"target": "sm90"}]')
    with pytest.raises(ValueError, match="not a tuned-config file"):
        kconfig.load_tuned(path)
    base = kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "sig")
    too_big = kconfig.KernelConfig(**{**base.__dict__, "seq_q": 256})
    bad = kconfig.tuned_entry(("sm90", "tfla", 128, 256, 128, torch.bfloat16, "sig"), too_big)
    path.write_text(json.dumps([bad]))
    with pytest.raises(ValueError, match="seq_q"):
        kconfig.load_tuned(path)


def test_the_compile_shape_keeps_the_integer_specializations():
    def kind(n):
        return "one" if n == 1 else "x16" if n % 16 == 0 else "other"

    # B8 NH16 at L1024: 8 chunks, which a small shape of 16 chunks would have compiled differently.
    shapes = [(8, 16, 8192, 128), (8, 16, 8192, 1024), (1, 8, 65536, 2048), (3, 11, 8192 + 64, 128),
              (1, 1, 100 * 64, 64), (2, 12, 64, 64)]  # fmt: skip
    for batch, heads, seq_len, chunk in shapes:
        tuned = tuning.Shape("tfla", "sig", batch, heads, seq_len, 128, 256, chunk)
        small = tuned.small()
        assert small.batch == 1 and small.heads <= 17 and small.seq_len <= 17 * chunk
        assert kind(small.heads) == kind(batch * heads)
        assert kind(-(-small.seq_len // chunk)) == kind(-(-seq_len // chunk))
        assert small.seq_len % chunk == seq_len % chunk
        assert (small.head_dim_qk, small.head_dim_v, small.chunk_size) == (128, 256, chunk)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ("tfla:sig:8,16,8192,128,256", "expected KERNEL:GATE:B,NH,T,DQK,DV:L"),
        ("tfla:sig:8,16,8192,128,x:128", "expected KERNEL:GATE:B,NH,T,DQK,DV:L"),
        ("limit_chunk:sig:8,16,8192,128,256:64", "limit_chunk (gate exp)"),
        ("tfla:sig:0,16,8192,128,256:128", "integers in [1, 2147483648]"),
        ("tfla:sig:8,16,8192,128,256:0", "chunk_size must be a power of two in [16, 4096], got 0"),
        ("tfla:sig:8,16,8192,128,256:-64", "chunk_size must be a power of two in [16, 4096], got -64"),
        ("tfla:sig:8,16,64,128,256:128", "chunk_size 128 is larger than seq_len 64"),
        ("tfla:exp:8,16,8192,0,-5:128", "head_dim_qk must be a multiple of 16 in [16, 1024], got 0"),
        ("tfla:exp:8,16,8192,128,2048:128", "head_dim_v must be a multiple of 16 in [16, 1024], got 2048"),
        ("tfla:exp:8,16,1000,128,256:64", "seq_len must be a multiple of 16, got 1000"),
        ("limit_chunk:exp:8,16,8192,128,256:256", "the largest chunk_size that fits is 128"),
        ("tfla:sig:8,16,8192,128,256:128 --processes 2000", "--processes: expected an integer in [0, 1024]"),
    ],
)
def test_tune_refuses_a_bad_shape_in_one_line(capsys, shape, message):
    assert main(["tune", *shape.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_tune_tma_only_refuses_a_limit_chunk_shape_in_one_line(capsys):
    limit = "limit_chunk:exp:8,16,8192,128,256:64"
    assert main(["tune", "tfla:sig:8,16,8192,128,256:128", limit, "--tma-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --tma-only: TMA loads are an option of the tfla kernel, not of {limit}"


# TMA loads off by 1% in dk (a wrong tile), or as the pointer loads to the bit
@pytest.mark.parametrize("off", [0.0, 1e-2])
def test_the_winner_tries_tma_loads_and_keeps_the_fastest_that_gives_its_result(monkeypatch, off):
    small = tuning.Shape("tfla", "sig", 1, 1, 64, 16, 16, 32, torch.float32)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)
    monkeypatch.setattr(tuning, "STEP_ROUNDS", 0)
    monkeypatch.setattr(tuning, "grid", lambda s, group, tma=False: {})
    monkeypatch.setattr(tuning, "tma_available", lambda device: True)
    real = tuning.outputs

    def outputs(s, inputs, config, mode):  # fw: [h]; fwbw: [dq, dk, dv, di, df]
        got = real(s, inputs, config, mode)
        return [
            x * (1 + off) if config.bwd_tma and mode == "fwbw" and n == 1 else x for n, x in enumerate(got)
        ]

    monkeypatch.setattr(tuning, "outputs", outputs)
    times = {(False, False): 4.0, (False, True): 2.0, (True, False): 3.0, (True, True): 1.0}
    _timed_by_config(monkeypatch, lambda c: times[(c.tma, c.bwd_tma)])
    search = tuning.tune(small, device="cpu", compiler=tuning.Compiler(0), groups=("fwd",))
    stage = [t for t in search.trials if t.stage == "tma"]
    assert [(t.config.tma, t.config.bwd_tma) for t in stage] == list(times)  # the winner first
    assert stage[0].rel_err == 0.0 and stage[2].rel_err == 0.0  # the same tiles: the same result
    if off:
        assert [t.median_ms for t in stage] == [4.0, None, 3.0, None]
        assert all("from the result without them" in t.error for t in stage[1::2])
        assert (search.best.tma, search.best.bwd_tma) == (True, False)
    else:
        assert [t.median_ms for t in stage] == [4.0, 2.0, 3.0, 1.0]
        assert (search.best.tma, search.best.bwd_tma) == (True, True)
    assert "| bwd | fwbw | tma | tma=True |" in tuning.markdown(small, search, search.trials[0].config, "CPU")


def test_tune_tma_only_refuses_a_gpu_without_tma_in_one_line(capsys, monkeypatch):
    _fake_gpu_search(monkeypatch)
    monkeypatch.setattr(tuning, "tma_available", lambda device: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert main(["tune", "tfla:sig:8,16,8192,128,256:128", "--tma-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --tma-only: TMA loads need a GPU of sm90 or later, this one is sm80"


@pytest.mark.parametrize(
    ("options", "groups", "tma_only"),
    [([], (), False), (["--group", "fwd", "--group", "bwd", "--group", "fwd"], ("fwd", "bwd"), False),
     (["--tma-only"], (), True)],
)  # fmt: skip
def test_tune_group_hands_the_search_its_groups(tmp_path, monkeypatch, capsys, options, groups, tma_only):
    asked = _fake_gpu_search(monkeypatch)
    monkeypatch.setattr(tuning, "tma_available", lambda device: True)
    argv = ["tune", "tfla:exp:8,16,8192,128,256:128", "--out", str(tmp_path / "tuned.json"), *options]
    assert main(argv) == 0, capsys.readouterr().err
    assert asked == [{"groups": groups, "tma_only": tma_only}]
    assert tune_cli.SEARCH_GROUPS == tuple(tuning.GROUPS)  # the names --help gives without torch


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--group", "fw"], "--group: expected one of fwd, bwd, state, got 'fw'"),
     (["--group", "fwd", "--tma-only"], "--group and --tma-only: the TMA stage alone searches no group")],
)  # fmt: skip
def test_tune_refuses_a_bad_group_in_one_line(tmp_path, monkeypatch, capsys, options, message):
    asked = _fake_gpu_search(monkeypatch)
    out = tmp_path / "tuned.json"
    assert main(["tune", "tfla:exp:8,16,8192,128,256:128", "--out", str(out), *options]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {message}") and "\n" not in err
    assert asked == [] and not out.exists()


@pytest.mark.parametrize(
    ("tma_only", "groups", "want"),
    [(False, ("fwd",), {"groups": ("fwd",)}), (True, (), {"groups": (), "stages": ("tma",)})],
)
def test_a_search_of_some_groups_starts_from_the_config_the_gpu_takes_now(
    monkeypatch, tma_only, groups, want
):
    small = tuning.Shape("tfla", "exp", 1, 1, 64, 16, 16, 32, torch.float32)
    now = dataclasses.replace(small.default(), num_stages=3)
    monkeypatch.setattr(kconfig, "gpu_target", lambda device: ("sm90", "NVIDIA H200"))
    monkeypatch.setattr(kconfig, "config_for", lambda *key: now)
    monkeypatch.setattr(tuning, "reference_error", lambda shape, config, device: 1e-3)
    monkeypatch.setattr(tuning, "time_call", lambda call, device, rule: 1.0)
    asked = []

    def tune(shape, **kwargs):
        asked.append(kwargs)
        return tuning.Search(kwargs["start"], [])

    monkeypatch.setattr(tuning, "tune", tune)
    entry, _ = tuning.tune_entry(
        small, "sm90", "NVIDIA H200", None, device="cpu", tma_only=tma_only, groups=groups
    )
    (kwargs,) = asked
    assert kwargs["start"] == now and {k: kwargs[k] for k in want} == want
    assert entry["config"]["num_stages"] == 3


def test_tune_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["tune", "tfla:sig:8,16,8192,128,256:128"]) == 2
    assert "needs CUDA" in capsys.readouterr().err


def _fake_gpu_search(monkeypatch):
    """`tune` as on a GPU, with a search that finds the default config at once; the list of what each
    search was asked (its groups, whether TMA only)."""
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kconfig, "gpu_target", lambda device: ("sm90", "NVIDIA H200"))

    def found(shape, target, gpu, compiler, on_trial=None, device="cuda", tma_only=False, groups=()):
        asked.append({"groups": groups, "tma_only": tma_only})
        config = kconfig.default_config("tfla", shape.head_dim_qk, shape.head_dim_v, shape.chunk_size,
                                        shape.dtype, shape.gate)  # fmt: skip
        times = {"default_fwbw_ms": 2.0, "tuned_fwbw_ms": 1.0, "default_fw_ms": 1.0, "tuned_fw_ms": 0.5}
        times.update(candidates=7, search_s=12.0, compile_s=5.0)
        return kconfig.tuned_entry(shape.config_key(target), config, **times), "| trial |\n"

    monkeypatch.setattr(tuning, "tune_entry", found)
    return asked


def test_tune_tables_into_a_folder_not_made_yet_makes_it(tmp_path, monkeypatch, capsys):
    _fake_gpu_search(monkeypatch)
    tables = tmp_path / "not" / "yet"
    argv = ["tune", "tfla:sig:8,16,8192,128,256:128", "--out", str(tmp_path / "tuned.json")]
    assert main([*argv, "--tables", str(tables)]) == 0, capsys.readouterr().err
    assert [path.stem for path in tables.iterdir()] == ["tuning-tfla-sig-B8-NH16-T8192-Dqk128-Dv256-L128"]
    assert len(json.loads((tmp_path / "tuned.json").read_text())) == 1


def test_tune_tables_that_cannot_be_written_keep_the_search(tmp_path, monkeypatch, capsys):
    _fake_gpu_search(monkeypatch)
    tables = tmp_path / "tables"
    real_mkdir = type(tables).mkdir

    def full_disk(self, *args, **kwargs):
        if self == tables:
            raise OSError(28, "No space left on device")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(type(tables), "mkdir", full_disk)
    argv = ["tune", "tfla:sig:8,16,8192,128,256:128", "--out", str(tmp_path / "tuned.json")]
    assert main([*argv, "--tables", str(tables)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the table of trials") and err.count("\n") == 1
    assert "No space left on device" in err and "the tuned config is saved in" in err
    assert len(json.loads((tmp_path / "tuned.json").read_text())) == 1


def test_a_search_that_breaks_the_cuda_context_stops_tune_in_one_line_naming_the_shapes_left(
    tmp_path, monkeypatch, capsys
):
    _fake_gpu_search(monkeypatch)
    found = tuning.tune_entry

    def broken_at_the_second(shape, *args, **kwargs):
        if shape.chunk_size == 64:
            raise tuning.ContextLost("the CUDA context broke while tfla sig ... ran a candidate")
        return found(shape, *args, **kwargs)

    monkeypatch.setattr(tuning, "tune_entry", broken_at_the_second)
    shapes = [
        "tfla:sig:8,16,8192,128,256:128",
        "tfla:sig:8,16,8192,128,256:64",
        "tfla:exp:8,16,8192,128,256:64",
    ]
    assert main(["tune", *shapes, "--out", str(tmp_path / "tuned.json"), "--processes", "3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the CUDA context broke") and err.count("\n") == 1
    assert f"The 1 shape(s) before it are saved in {tmp_path / 'tuned.json'}" in err
    resume = f"tfla-bench tune {' '.join(shapes[1:])} --out {tmp_path / 'tuned.json'} --processes 3"
    assert err.rstrip().endswith(resume)
    assert len(json.loads((tmp_path / "tuned.json").read_text())) == 1


def test_a_candidate_that_breaks_a_worker_is_rejected_and_those_it_left_untried_run_again(monkeypatch):
    # a worker whose CUDA context a candidate broke hands the candidates after it back untried
    # (`UNTRIED`); the compiler starts its workers anew and runs them there
    runs = []

    def compile_one(job):
        _, config, _, _ = job
        runs.append(config.num_warps)
        if config.num_warps == 4:
            return tuning.LOST + "AcceleratorError: an illegal memory access was encountered"
        return tuning.UNTRIED if runs.count(config.num_warps) == 1 else ""

    stops = []
    compiler = tuning.Compiler(2)  # its workers stand in here: the jobs run in this process
    monkeypatch.setattr(compiler, "_map", lambda jobs: [compile_one(job) for job in jobs])
    monkeypatch.setattr(compiler, "_stop", lambda: stops.append(1))
    base = kconfig.default_config("tfla", 16, 16, 16, torch.float32, "sig")
    configs = [dataclasses.replace(base, num_warps=w) for w in (4, 2, 8)]
    errors = compiler.run(shape(16), configs, "cuda")
    assert errors[0].startswith(tuning.LOST) and errors[1:] == ["", ""]
    assert runs == [4, 2, 8, 2, 8] and len(stops) == 1  # one restart, the broken one not run again
    # compiling in this process: the broken context is this process's, and the search stops
    monkeypatch.setattr(tuning, "_compile_one", compile_one)
    with pytest.raises(tuning.ContextLost, match="compiled a candidate .*illegal memory access"):
        tuning.Compiler(0).run(shape(16), configs, "cuda")


def test_a_worker_with_a_broken_cuda_context_runs_nothing_and_says_which_candidate_broke_it(monkeypatch):
    small = tuning.Shape("tfla", "sig", 1, 1, 32, 16, 16, 16, torch.float32)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)
    config = small.default()
    monkeypatch.setattr(tuning, "cuda_alive", lambda device: False)
    assert tuning._compile_one((small, config, "cuda", False)) == tuning.UNTRIED
    illegal = "CUDA error: an illegal memory access was encountered\nSearch for ...\nCompile with ..."

    def broken(shape, device):
        raise RuntimeError(illegal)

    monkeypatch.setattr(tuning, "make_inputs", broken)
    alive = iter([True, False, False])  # alive before the candidate, broken after it: CUDA's first line
    monkeypatch.setattr(tuning, "cuda_alive", lambda device: next(alive))
    note = tuning._compile_one((small, config, "cuda", False))
    assert note == tuning.LOST + "RuntimeError: CUDA error: an illegal memory access was encountered"
    monkeypatch.setattr(tuning, "cuda_alive", lambda device: True)  # a compile error: its last line
    assert tuning._compile_one((small, config, "cuda", False)) == "RuntimeError: Compile with ..."


def test_a_candidate_off_the_default_result_at_the_compile_shape_is_rejected_in_its_worker(monkeypatch):
    small = tuning.Shape("tfla", "sig", 1, 1, 32, 16, 16, 16, torch.float32)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)
    config = dataclasses.replace(small.default(), num_warps=2)
    tuning._default_result.cache_clear()
    assert tuning._compile_one((small, config, "cpu", False)) == ""  # the same sums in another order
    real = tuning._run_both
    monkeypatch.setattr(tuning, "_run_both", lambda s, c, d: [x * 1.5 for x in real(s, c, d)])
    tuning._default_result.cache_clear()  # the default's result is now 1.5 times as large too
    assert tuning._compile_one((small, config, "cpu", False)) == ""
    tuning._default_result.cache_clear()  # no scaled result left for the tests after this one
    monkeypatch.setattr(tuning, "_default_result", lambda s, d: real(s, s.default(), d))
    note = tuning._compile_one((small, config, "cpu", False))
    assert note == "5.00e-01 from the default config's result at the compile shape"
    assert tuning._compile_one((small, config, "cpu", True)) == ""  # at the tuned shape: run, unchecked


def test_what_passed_at_the_compile_shape_runs_at_the_tuned_shape_as_many_at_a_time_as_memory_holds(
    monkeypatch,
):
    batches = []

    def fake_map(jobs):
        batches.append([(config.num_warps, full) for _, config, _, full in jobs])
        return [
            "RuntimeError: out of resources" if c.num_warps == 8 and not full else ""
            for _, c, _, full in jobs
        ]

    compiler = tuning.Compiler(4)
    monkeypatch.setattr(compiler, "_map", fake_map)
    base = kconfig.default_config("tfla", 16, 16, 16, torch.float32, "sig")
    configs = [dataclasses.replace(base, num_warps=w, num_stages=s) for w in (2, 4, 8) for s in (1, 2)]
    assert compiler.run(shape(16), configs, "cpu") == [
        "",
        "",
        "",
        "",
        *["RuntimeError: out of resources"] * 2,
    ]
    assert batches == [[(w, False) for w in (2, 2, 4, 4, 8, 8)]]  # no memory given: the compile shape only
    monkeypatch.setattr(tuning, "probes_at_once", lambda processes, need, device: 3)
    batches.clear()
    assert compiler.run(shape(16), configs, "cuda", need_bytes=1 << 30)[4].endswith("out of resources")
    assert batches[1:] == [[(2, True), (2, True), (4, True)], [(4, True)]]
    assert (
        tuning.Compiler(0).run(shape(16), [], "cuda", need_bytes=1 << 30) == []
    )  # in this process: no second run


def test_the_runs_at_the_tuned_shape_side_by_side_fit_the_free_memory(monkeypatch):
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (100 * gib, 141 * gib))
    assert tuning.probes_at_once(14, 9 * gib, "cuda") == 7  # 70 GiB over 9 + 1 GiB each
    assert tuning.probes_at_once(4, 1 * gib, "cuda") == 4
    assert tuning.probes_at_once(14, 500 * gib, "cuda") == 1
    assert tuning.probes_at_once(6, 500 * gib, "cpu") == 6


def test_a_candidate_that_breaks_the_searching_process_stops_the_search(monkeypatch):
    small = tuning.Shape("tfla", "sig", 1, 1, 32, 16, 16, 16, torch.float32)
    monkeypatch.setattr(tuning, "cuda_alive", lambda device: False)

    def broken(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nSearch for ...")

    monkeypatch.setattr(tuning, "outputs", broken)
    with pytest.raises(tuning.ContextLost, match="ran a candidate .*illegal memory access") as lost:
        tuning._screen(small, [], [], "fwd", small.default(), "fw", "", "cpu", "grid")
    assert "\n" not in str(lost.value)  # the tune command's one line


def test_a_sweep_whose_tuning_breaks_the_cuda_context_measures_the_shapes_left_untuned(tmp_path, monkeypatch):
    monkeypatch.setenv(kconfig.TUNED_FILE_ENV, str(tmp_path / "tuned.json"))
    monkeypatch.setattr(tuning.kconfig, "gpu_target", lambda device: ("sm100", "NVIDIA B200"))

    def broken(shape, *args, **kwargs):
        raise tuning.ContextLost("the CUDA context broke while tfla sig ... ran a candidate")

    monkeypatch.setattr(tuning, "tune_entry", broken)
    said = []
    assert tuning.tune_missing([case(dqk=64, dv=64), case(dqk=32, dv=32)], "cuda", 2, said.append) == []
    assert (
        said[-1]
        == "  the CUDA context broke while tfla sig ... ran a candidate; the 2 shape(s) left run untuned"
    )
    assert len(said) == 2 and not (tmp_path / "tuned.json").exists()


def test_a_new_entry_replaces_the_one_of_its_key_and_keeps_the_others(tmp_path):
    base = kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "sig")
    path = tmp_path / "deeper" / "tuned.json"
    old = kconfig.tuned_entry(shape(128).config_key("sm90"), base, tuned_fwbw_ms=2.0)
    other = kconfig.tuned_entry(shape(256).config_key("sm90"), base, tuned_fwbw_ms=3.0)
    kconfig.save_entry(path, old)
    kconfig.save_entry(path, other)
    kconfig.save_entry(path, {**old, "tuned_fwbw_ms": 1.0})
    entries = json.loads(path.read_text())
    assert [(e["chunk_size"], e["tuned_fwbw_ms"]) for e in entries] == [(256, 3.0), (128, 1.0)]


# ---- tuning before a sweep ---------------------------------------------------------------------------
def case(kernel="tfla_sig", dtype="bfloat16", seq_len=1024, dqk=128, dv=256, chunk=128, batch=2):
    return Case(kernel=kernel, mode="fwbw", dtype=dtype, batch=batch, seq_len=seq_len, num_heads=4,
                head_dim_qk=dqk, head_dim_v=dv, chunk_size=chunk)  # fmt: skip


def test_the_tuned_shape_of_a_case_is_that_of_our_kernels_in_half_precision():
    assert tuning.shape_of(case()) == tuning.Shape("tfla", "sig", 2, 4, 1024, 128, 256, 128, torch.bfloat16)
    assert tuning.shape_of(case("tfla_exp", "float16")).gate == "exp"
    assert tuning.shape_of(case("limit_chunk", chunk=64, dqk=64, dv=64)).kernel == "limit_chunk"
    assert tuning.shape_of(case(dtype="float32")) is None
    assert tuning.shape_of(case("mlstm_kernels_sig")) is None
    assert tuning.shape_of(case("no_such_kernel")) is None


def test_only_shapes_without_an_entry_for_the_gpu_are_tuned_each_once_at_its_largest_case():
    cases = [case(seq_len=1024), case(seq_len=4096), case(dqk=64, dv=64), case(dtype="float32")]
    # sig Dqk128 Dv256 L128 bf16 has a shipped entry for sm90: another sm90 GPU tunes only Dqk64 Dv64.
    on_sm90 = tuning.untuned(cases, ("sm90", "NVIDIA H200"))
    assert [(s.head_dim_qk, s.head_dim_v, s.seq_len) for s in on_sm90] == [(64, 64, 1024)]
    elsewhere = tuning.untuned(cases, ("sm100", "NVIDIA B200"))
    assert sorted((s.head_dim_qk, s.seq_len) for s in elsewhere) == [(64, 1024), (128, 4096)]
    assert tuning.untuned(cases, ("", "")) == elsewhere  # no GPU name: no entry applies
    constant_tokens = [case(dqk=64, dv=64, seq_len=t, batch=8192 // t) for t in (1024, 8192, 2048)]
    (picked,) = tuning.untuned(constant_tokens, ("sm90", "NVIDIA H200"))
    assert (picked.batch, picked.seq_len) == (1, 8192)  # equally many tokens: the longest sequence


def test_tune_missing_saves_one_entry_per_untuned_shape_in_the_user_file(tmp_path, monkeypatch):
    path = tmp_path / "user" / "tuned.json"
    monkeypatch.setenv(kconfig.TUNED_FILE_ENV, str(path))
    monkeypatch.setattr(tuning.kconfig, "gpu_target", lambda device: ("sm100", "NVIDIA B200"))
    searched = []

    def fake_search(shape, target, gpu, compiler, on_trial=None, device="cuda"):
        searched.append((shape.seq_len, target, gpu, device, compiler.processes))
        config = kconfig.default_config("tfla", shape.head_dim_qk, shape.head_dim_v, shape.chunk_size,
                                        shape.dtype, shape.gate)  # fmt: skip
        times = {"default_fwbw_ms": 2.0, "tuned_fwbw_ms": 1.6, "candidates": 9, "search_s": 31.0}
        return kconfig.tuned_entry(shape.config_key(target), config, **times), ""

    monkeypatch.setattr(tuning, "tune_entry", fake_search)
    said = []
    entries = tuning.tune_missing([case(seq_len=1024), case(seq_len=2048)], "cuda:1", 4, said.append)
    assert searched == [(2048, "sm100", "NVIDIA B200", "cuda:1", 4)]
    saved = json.loads(path.read_text())
    assert saved == entries and saved[0]["target"] == "sm100" and saved[0]["chunk_size"] == 128
    assert (
        said[0].startswith("tuning 1/1: tfla sig B2 NH4 T2048") and "(1.25x); 9 candidates in 31 s" in said[1]
    )


def test_a_cpu_sweep_with_tune_says_it_tunes_nothing(tmp_path, capsys):
    shape = ["--seq-len", "64", "--batch", "1", "--heads", "1", "--head-dim-qk", "16"]
    flags = ["--mode", "fw", "--dtype", "float32", "--warmup", "1", "--reps", "2", "--no-roofs"]
    assert main(["run", "--kernel", "sdpa_math", *shape, *flags, "--tune", "--out", str(tmp_path / "r")]) == 0
    assert "--tune times kernels on a GPU; this CPU run uses the configs as they are" in " ".join(
        capsys.readouterr().err.split()
    )


@pytest.mark.parametrize(("kernel", "gate"), [("tfla", "sig"), ("tfla", "exp"), ("limit_chunk", "exp")])
def test_the_reference_check_of_a_config_is_small_in_float32(monkeypatch, kernel, gate):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tuning, "CHECK_TOKENS", 32)
    small = tuning.Shape(kernel, gate, 1, 2, 32, 16, 16, 16, torch.float32)
    config = kconfig.default_config(kernel, 16, 16, 16, torch.float32, gate)
    assert tuning.reference_error(small, config, "cpu") < 1e-4


def test_a_winner_less_accurate_than_the_default_is_not_kept(monkeypatch):
    base = kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "sig")
    faster = dataclasses.replace(base, num_warps=8 if base.num_warps == 4 else 4)
    monkeypatch.setattr(tuning, "make_inputs", lambda shape, device: [])
    monkeypatch.setattr(tuning, "tune", lambda shape, **_: tuning.Search(faster, []))
    monkeypatch.setattr(tuning, "make_call", lambda shape, inputs, config, mode: None)
    monkeypatch.setattr(tuning, "time_call", lambda call, device, rule: 1.0)
    for tuned_err, kept in ((1.4e-2, faster), (1.6e-2, base)):
        errors = {base: 1e-2, faster: tuned_err}
        monkeypatch.setattr(tuning, "reference_error", lambda shape, config, device, e=errors: e[config])
        entry, _ = tuning.tune_entry(shape(128), "sm90", "GPU", tuning.Compiler(0), device="cpu")
        assert entry["config"] == dataclasses.asdict(kept)
        assert entry["default_reference_rel_err"] == 1e-2
        assert entry["tuned_reference_rel_err"] == errors[kept]


def test_between_equally_near_shapes_the_one_tuned_at_head_dims_no_smaller_wins(monkeypatch):
    # Head dims 256/256 lie one doubling from 128/256 and from 256/512: the 256/512 entry's blocks
    # cut to fit, the 128/256 entry's d_qk block (128) cannot grow to the head dim.
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", {})
    kconfig.config_for.cache_clear()
    tuned = {}
    for dqk, dv, warps in ((128, 256, 2), (256, 512, 16)):
        base = kconfig.default_config("tfla", dqk, dv, 128, torch.bfloat16, "exp")
        tuned[dqk] = kconfig.KernelConfig(**{**base.__dict__, "num_warps": warps, "qk": min(dqk, 256)})
        kconfig.register_tuned("sm90", "tfla", dqk, dv, 128, torch.bfloat16, "exp", tuned[dqk])
    got = kconfig.config_for("tfla", 256, 256, 128, torch.bfloat16, "exp", ("sm90", "NVIDIA H200"))
    assert got.num_warps == 16 and got.qk == 256
    assert not kconfig.float32_states("tfla", "exp", 256, got)
    # Nearer is still nearer: at 128/256 itself the entry tuned there wins.
    assert kconfig.config_for("tfla", 128, 256, 128, torch.bfloat16, "exp", ("sm90", "x")).num_warps == 2
    kconfig.config_for.cache_clear()


def test_a_sweep_tunes_by_default_and_not_with_no_tune(tmp_path, monkeypatch, capsys):
    from tfla_bench.run import runner

    asked = []

    def fake_sweep(spec, cases, run_dir, **kwargs):
        asked.append(kwargs["tune"])
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run_sweep", fake_sweep)
    shape = ["--seq-len", "64", "--batch", "1", "--heads", "1", "--head-dim-qk", "16", "--no-roofs"]
    for flag in ([], ["--no-tune"], ["--tune"]):
        with pytest.raises(SystemExit):
            main(["run", "--kernel", "sdpa_math", *shape, *flag, "--out", str(tmp_path / f"r{len(asked)}")])
    assert asked == [None, False, True]  # None: on a GPU, at each shape without a tuned config
    flags = ["--mode", "fw", "--dtype", "float32", "--warmup", "1", "--reps", "2"]
    monkeypatch.undo()
    assert main(["run", "--kernel", "sdpa_math", *shape, *flags, "--out", str(tmp_path / "cpu")]) == 0
    assert "--tune" not in capsys.readouterr().err  # by default a CPU run says nothing of tuning


@pytest.fixture
def first_use(monkeypatch, tmp_path):
    """A first-use tuner that records its calls, on a stand-in sm100 GPU, with the table restored after."""
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", dict(kconfig.TUNED_CONFIGS))
    monkeypatch.setattr(kconfig, "gpu_target", lambda device: ("sm100", "NVIDIA B200"))
    monkeypatch.setenv(kconfig.TUNED_FILE_ENV, str(tmp_path / "tuned.json"))
    yield
    kconfig.set_first_use_tuner(None)
    kconfig.config_for.cache_clear()


def test_a_shape_is_tuned_at_its_first_call_once_the_user_opts_in(first_use, monkeypatch):
    from tfla_bench.kernels.chunkwise import resolve_config

    calls = []

    def fake_search(shape, target, gpu, compiler, on_trial=None, device="cuda"):
        calls.append((shape, target, gpu, compiler.processes, device))
        config = dataclasses.replace(
            kconfig.default_config("tfla", 16, 32, 16, torch.bfloat16, "sig"), num_warps=2
        )
        return kconfig.tuned_entry(shape.config_key(target), config, tuned_fwbw_ms=1.0), ""

    monkeypatch.setattr(tuning, "tune_entry", fake_search)
    q = torch.zeros(2, 4, 64, 16, dtype=torch.bfloat16)
    resolve_config("tfla", None, q, 32, 16, "sig")
    assert calls == []  # not opted in: the config is looked up, nothing is tuned
    tuning.tune_at_first_use(processes=3)
    resolve_config("tfla", None, q, 32, 16, "sig")
    resolve_config("tfla", None, q, 32, 16, "sig")  # the entry is there now: not tuned again
    resolve_config("tfla", None, q.float(), 32, 16, "sig")  # float32: never tuned
    resolve_config(
        "tfla", kconfig.default_config("tfla", 16, 32, 16, torch.bfloat16, "sig"), q, 32, 16, "sig"
    )
    assert calls == [
        (tuning.Shape("tfla", "sig", 2, 4, 64, 16, 32, 16, torch.bfloat16), "sm100", "NVIDIA B200", 3, "cpu")
    ]
    (saved,) = json.loads(kconfig.user_tuned_file().read_text())
    assert saved["target"] == "sm100" and saved["config"]["num_warps"] == 2
    got = kconfig.config_for("tfla", 16, 32, 16, torch.bfloat16, "sig", ("sm100", "NVIDIA B200"))
    assert got.num_warps == 2
    tuning.tune_at_first_use(False)
    resolve_config("tfla", None, q, 32, 32, "sig")
    assert len(calls) == 1


def test_a_failed_first_use_search_warns_and_keeps_the_config(first_use):
    def broken(*args):
        raise RuntimeError("out of resources")

    kconfig.set_first_use_tuner(broken)
    with pytest.warns(
        UserWarning, match="tuning tfla exp at .* failed, its config is kept: out of resources"
    ):
        kconfig.tune_first_use("tfla", "exp", (1, 2, 64, 16, 16, 16), torch.float16, torch.device("cpu"))
