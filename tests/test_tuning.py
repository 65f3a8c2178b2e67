"""Tuning our kernels' configs: candidate grids, the search on CPU (interpreter), the tuned-config file."""

import json

import pytest
import torch

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


def test_limit_chunk_candidates_keep_whole_chunk_tiles():
    base = kconfig.default_config("limit_chunk", 128, 256, 64, torch.bfloat16)
    for group in tuning.GROUPS:
        for candidate in tuning.candidates(shape(64, "limit_chunk", "exp"), base, group):
            assert candidate.seq_q == candidate.bwd_seq_kv == 64


def test_the_search_times_every_candidate_and_keeps_the_fastest_on_cpu(monkeypatch):
    small = tuning.Shape("tfla", "exp", 1, 1, 64, 16, 32, 16, torch.float32)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)  # the interpreter is slow
    monkeypatch.setattr(
        tuning,
        "grid",
        lambda s, group: {"fwd": {"num_warps": (4, 8)}, "bwd": {"bwd_num_warps": (2, 4)}, "state": {}}[group],
    )
    times = iter([3.0, 1.0, 2.0, 5.0, 4.0])  # fwd: base 3, warps-8 1; bwd: base 2, warps 2: 5; state: 4
    monkeypatch.setattr(tuning, "time_call", lambda call, device, rule: next(times))
    seen = []
    best, trials = tuning.tune(
        small, device="cpu", processes=0, groups=("fwd", "bwd", "state"), on_trial=seen.append
    )
    assert seen == trials and [t.group for t in trials] == ["fwd", "fwd", "bwd", "bwd", "state"]
    assert all(t.error == "" and t.rel_err <= 1e-5 for t in trials)  # float32: tiles change rounding only
    assert best.num_warps == 8 and best.bwd_num_warps == 4  # the fastest of each group, else the base
    table = tuning.markdown(small, trials, trials[0].config, "CPU")
    assert (
        "| fwd | fw | num_warps=8 | 1.000 |" in table
        and "| bwd | fwbw | num_warps=8 bwd_num_warps=2 | 5.000 |" in table
    )


def test_a_candidate_off_the_default_result_is_rejected(monkeypatch):
    small = tuning.Shape("tfla", "sig", 1, 1, 32, 16, 16, 16, torch.float32)
    monkeypatch.setattr(tuning.Shape, "small", lambda self: self)
    monkeypatch.setattr(tuning, "grid", lambda s, group: {"bwd_num_warps": (2,)})
    real = tuning.outputs
    monkeypatch.setattr(
        tuning,
        "outputs",
        lambda s, inputs, config, mode: [
            x * (1.5 if config.bwd_num_warps == 2 else 1.0) for x in real(s, inputs, config, mode)
        ],
    )
    monkeypatch.setattr(tuning, "time_call", lambda call, device, rule: 1.0)
    best, trials = tuning.tune(
        small, device="cpu", processes=0, groups=("bwd",), rule=timing.StopRule(reps=1)
    )
    assert trials[1].median_ms is None and "from the default config's result" in trials[1].error
    assert best == trials[0].config


def test_a_tuned_file_is_looked_up_by_gpu_and_shape(monkeypatch, tmp_path):
    monkeypatch.setattr(kconfig, "TUNED_CONFIGS", {})
    kconfig.config_for.cache_clear()
    base = kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "sig")
    tuned = kconfig.KernelConfig(**{**base.__dict__, "bwd_num_warps": 8})
    entry = kconfig.tuned_entry(shape(128).config_key("GPU X"), tuned, fwbw_ms=1.0)
    assert entry["dtype"] == "bfloat16" and entry["fwbw_ms"] == 1.0
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps([entry]))
    assert kconfig.load_tuned(path) == 1
    assert kconfig.config_for("tfla", 128, 256, 128, torch.bfloat16, "sig", "GPU X") == tuned
    assert kconfig.config_for("tfla", 128, 256, 128, torch.bfloat16, "sig", "GPU Y") == base
    assert kconfig.config_for("tfla", 128, 256, 128, torch.bfloat16, "exp", "GPU X") != tuned
    kconfig.config_for.cache_clear()
    monkeypatch.setenv(kconfig.TUNED_FILE_ENV, str(path))
    assert kconfig.tuned_file() == path


def test_a_broken_tuned_file_is_one_clear_error(tmp_path):
    path = tmp_path / "tuned.json"
    path.write_text('[{"gpu": "GPU X"}]')
    with pytest.raises(ValueError, match="not a tuned-config file"):
        kconfig.load_tuned(path)
    base = kconfig.default_config("tfla", 128, 256, 128, torch.bfloat16, "sig")
    too_big = kconfig.KernelConfig(**{**base.__dict__, "seq_q": 256})
    bad = kconfig.tuned_entry(("GPU X", "tfla", 128, 256, 128, torch.bfloat16, "sig"), too_big)
    path.write_text(json.dumps([bad]))
    with pytest.raises(ValueError, match="seq_q"):
        kconfig.load_tuned(path)


def test_the_compile_shape_keeps_the_integer_specializations():
    small = shape(128).small()
    assert small.batch * small.heads % 16 == 0 and (small.seq_len // small.chunk_size) % 16 == 0
    assert (small.head_dim_qk, small.head_dim_v, small.chunk_size) == (128, 256, 128)
