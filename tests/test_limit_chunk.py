"""`mlstm_limit_chunk` (our one-level chunkwise Triton kernel) against the float64 PyTorch references.

On the CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), so
shapes are small; one case overrides the blocks to 16 so that the head-dim loops and the state
programs run several blocks. The interpreter computes bfloat16 wrongly, so bfloat16 is checked by
the `gpu` tests only, at the paper's sizes.

Error bound for float32 (CPU): relative RMS error `||x - x_ref|| / ||x_ref|| < 1e-4` on the output,
the final state and every gradient. float32's unit roundoff is 6e-8; the kernels' sums have at most
a few hundred terms (random-sign rounding grows like sqrt(n): ~1e-6), and the within-chunk log-gate
sums reach |b| ~ 300 for forget pre-activations of -5 at L = 64, so exp(b_t - b_j) carries a relative
error ~|b| * 6e-8 ~ 2e-5 in the worst rows; the measured errors are 1e-7..1e-5 (the largest on
d log_f, a sum of differences). A real mistake (a gate off by one step, a dropped
chunk-boundary term, a wrong max state) moves the result by O(1/T) ~ 1e-2; scaling one weight by
1.01 already gives 3e-3.

mLSTMexp gradients are compared through a loss that is invariant to a per-step scale of h
(RMS-normalized h times fixed weights), plus the unstabilized final state `C * exp(m)` times fixed
weights: the kernels drop the gradient through the normalizer and the max state (appendix B.3),
which is exact exactly then.
"""

from dataclasses import replace

import pytest
import torch
from mlstm_support import (
    DEVICE,
    assert_all_close,
    assert_config_within_reference,
    assert_within_rms,
    make_inputs,
    make_state,
    make_weights,
    record_state_dtypes,
    rel_rms,
    run_with_grads,
)

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.kernels.config import (
    SRAM_BYTES,
    TUNED_CONFIGS,
    default_config,
    gpu_target,
    max_chunk_size,
    on_chip_bytes,
    unsupported_reason,
)
from tfla_bench.kernels.limit_chunk import mlstm_limit_chunk
from tfla_bench.kernels.reference import mlstm_chunkwise, mlstm_recurrent
from tfla_bench.model.counts import LINEAR_RNN_BACKWARD, mlstm_bytes, mlstm_flops

FP32_RTOL = 1e-4


def small_config(chunk_size):
    # 16-wide head-dim blocks, and state kernels that loop over tiles of 16 steps (by default they take
    # a whole chunk per step): several blocks and steps per loop
    config = default_config("limit_chunk", 32, 64, chunk_size, torch.float32)
    return replace(
        config, qk=16, v=16, bwd_qk=16, bwd_v=16, state_seq=16, state_qk=16, state_v=16, state_one_tile=False
    )


GRAD_NAMES = ["dq", "dk", "dv", "di", "df", "dC0", "dn0", "dm0"]
STATE_NAMES = ["C", "n", "m"]


def chunkwise_fp64(q, k, v, i, f, state):
    # the chunkwise reference (checked against the recurrent one in test_reference.py) is faster at long T
    return mlstm_chunkwise(q.double(), k.double(), v.double(), i.double(), f.double(), chunk_size=64)


def reference(q, k, v, i, f, state):
    initial = tuple(s.double() for s in state) if state else None
    return mlstm_recurrent(q.double(), k.double(), v.double(), i.double(), f.double(), initial_state=initial)


def limit_chunk(chunk_size, config=None):
    def fn(q, k, v, i, f, state):
        return mlstm_limit_chunk(
            q, k, v, i, f, chunk_size=chunk_size, initial_state=state, return_final_state=True, config=config
        )

    return fn


def check_against_reference(
    batch, heads, seq_len, dqk, dv, chunk_size, *, config=None, with_state=True, seed=0, **ranges
):
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=seed, **ranges)
    state = make_state("exp", False, batch, heads, dqk, dv) if with_state else []
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    h_ref, s_ref, g_ref = run_with_grads(reference, inputs, state, weights)
    h, s, g = run_with_grads(limit_chunk(chunk_size, config), inputs, state, weights)
    assert h.dtype == inputs[0].dtype and h.shape == h_ref.shape
    assert_all_close([h, *s], [h_ref, *s_ref], FP32_RTOL, ["h", *STATE_NAMES])
    assert_all_close(g, g_ref, FP32_RTOL, GRAD_NAMES[: len(g)])


# (B, NH, T, Dqk, Dv, L, small blocks): T/L from 1 to 8, Dqk != Dv, partial last chunks (T=40 with
# L=16: 16 + 16 + 8; T=96 with L=64: 64 + 32).
CASES = [
    (2, 3, 48, 16, 32, 16, False),
    (2, 3, 96, 32, 64, 32, True),
    (2, 3, 256, 16, 32, 32, False),
    (2, 3, 64, 32, 64, 64, False),
    (2, 3, 40, 16, 32, 16, False),
    (2, 3, 96, 16, 32, 64, False),
]


def case_id(case):
    batch, heads, seq_len, dqk, dv, chunk, small = case
    return f"B{batch}-T{seq_len}-H{heads}-Dqk{dqk}-Dv{dv}-L{chunk}" + ("-blocks16" if small else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_recurrent_reference(case):
    batch, heads, seq_len, dqk, dv, chunk, small = case
    config = small_config(chunk) if small else None
    check_against_reference(batch, heads, seq_len, dqk, dv, chunk, config=config)


def test_without_initial_state():
    check_against_reference(2, 3, 48, 16, 32, 16, with_state=False)


def test_exp_trained_gate_ranges():
    # Input gates near -10 and forget gates from -5 to 12 (the paper's trained ranges, Fig. 4): the
    # within-chunk cumulative log forget gates reach -300 at L = 64; everything stays finite.
    check_against_reference(2, 3, 128, 16, 32, 64, i_range=(-11.0, -9.0), f_range=(-5.0, 12.0))


def test_forget_gate_gradient_sums_stay_chunk_local():
    # d log_f_s sums the loss terms of the pairs t >= s > j. A reverse cumulative sum of q.dq - k.dk over
    # the whole sequence gets it exactly too, but adds up the rounding errors of every later row; with
    # forget gates in (-2, 0) (a memory of a few steps) d log_f_s is a sum of a few pairs next to ~T of
    # those errors. Chunk-local sums (appendix B.3) add up at most L of them. Measured on the CPU
    # interpreter: relative RMS error on d log_f 4.4e-6 (dk: 2.6e-6); the whole-sequence cumsum gave
    # 7.8e-5, 30 times the error of dk.
    batch, heads, seq_len, dqk, dv, chunk = 4, 1, 1024, 16, 16, 64
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, f_range=(-2.0, 0.0))
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    _, _, g_ref = run_with_grads(chunkwise_fp64, inputs, [], weights)
    _, _, g = run_with_grads(limit_chunk(chunk), inputs, [], weights)
    errors = {name: rel_rms(a, b) for name, a, b in zip(GRAD_NAMES[:5], g, g_ref, strict=True)}
    assert errors["df"] < 1.5e-5, errors
    assert errors["df"] < 4 * errors["dk"], errors


def test_chunk_size_invariance():
    # float32 allows chunks up to 64 (the on-chip rule); 16, 32 and 64 give the same function.
    inputs = [x.to(DEVICE) for x in make_inputs(2, 3, 128, 16, 32, seed=3)]
    outputs = {
        chunk: mlstm_limit_chunk(*inputs, chunk_size=chunk, return_final_state=True) for chunk in (16, 32, 64)
    }
    h_64, state_64 = outputs[64]
    for chunk in (16, 32):
        h, state = outputs[chunk]
        assert rel_rms(h, h_64) < FP32_RTOL
        for name, a, b in zip(STATE_NAMES, state, state_64, strict=True):
            assert rel_rms(a, b) < FP32_RTOL, name


def test_state_passing():
    # Two halves with the carried state (and chained gradients) equal one full run.
    batch, heads, seq_len, dqk, dv, split = 2, 3, 96, 16, 32, 48
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=4)
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    h_full, s_full, g_full = run_with_grads(limit_chunk(32), inputs, [], weights)

    def two_halves(q, k, v, i, f, state):
        first = (q[:, :, :split], k[:, :, :split], v[:, :, :split], i[..., :split], f[..., :split])
        second = (q[:, :, split:], k[:, :, split:], v[:, :, split:], i[..., split:], f[..., split:])
        h_a, s_a = mlstm_limit_chunk(*first, chunk_size=16, return_final_state=True)
        h_b, s_b = mlstm_limit_chunk(*second, chunk_size=32, initial_state=s_a, return_final_state=True)
        return torch.cat([h_a, h_b], dim=2), s_b

    h, s, g = run_with_grads(two_halves, inputs, [], weights)
    assert_all_close([h, *s], [h_full, *s_full], FP32_RTOL, ["h", *STATE_NAMES])
    assert_all_close(g, g_full, FP32_RTOL, GRAD_NAMES[:5])


def test_16_bit_states_of_a_checked_config_give_the_float32_states_result(monkeypatch):
    # limit_chunk keeps float32 states unless a tuning search checked 16-bit ones (`states16`); the
    # readers cast the states to the input dtype, so both give the same output and gradients but the
    # gate gradients' chunk sums, which read the rounded states.
    inputs = make_inputs(1, 2, 96, 32, 64, seed=9)
    inputs[:3] = [x.half() for x in inputs[:3]]
    state = make_state("exp", False, 1, 2, 32, 64)
    weights = make_weights(1, 2, 96, 32, 64)
    config = replace(small_config(32), states16=True)
    seen = record_state_dtypes(monkeypatch)
    wide = run_with_grads(limit_chunk(32, small_config(32)), inputs, state, weights)
    narrow = run_with_grads(limit_chunk(32, config), inputs, state, weights)
    assert seen[0] == torch.float32 and seen[-1] == torch.float16
    assert rel_rms(narrow[0], wide[0]) < 1e-6
    for name, a, b in zip(GRAD_NAMES, narrow[2], wide[2], strict=False):
        assert torch.equal(a, b) or rel_rms(a, b) < (1e-3 if name in ("di", "df") else 1e-6), name
    h_ref = run_with_grads(reference, inputs, state, weights)[0]
    assert rel_rms(narrow[0], h_ref) < 5e-3


def test_second_backward_gives_the_same_gradients():
    inputs = [x.to(DEVICE).requires_grad_() for x in make_inputs(1, 2, 32, 16, 16, seed=6)]
    h = mlstm_limit_chunk(*inputs, chunk_size=16)
    first = torch.autograd.grad(h.square().sum(), inputs, retain_graph=True)
    second = torch.autograd.grad(h.square().sum(), inputs)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_on_chip_limits():
    # The limits table of the module docstring: 16-bit inputs run chunks 16..128 at the paper's head
    # dims (Fig. 5: 128/256, Fig. 6: 256/512), 256 does not fit; float32 stops at 64.
    for dqk, dv in ((128, 256), (256, 512), (64, 64)):
        for dtype in (torch.bfloat16, torch.float16):
            assert max_chunk_size(dqk, dv, dtype) == 128
            for chunk in (16, 32, 64, 128):
                assert unsupported_reason(chunk, dqk, dv, dtype) is None
                config = default_config("limit_chunk", dqk, dv, chunk, dtype)
                assert on_chip_bytes("output", chunk, config.qk, config.v, 2) <= SRAM_BYTES
                assert on_chip_bytes("gradient", chunk, config.bwd_qk, config.bwd_v, 2) <= SRAM_BYTES
                for block_qk, block_v in ((config.qk, config.v), (config.bwd_qk, config.bwd_v)):
                    assert dqk % block_qk == 0 and dv % block_v == 0
        assert "the largest chunk_size that fits is 128" in unsupported_reason(256, dqk, dv, torch.bfloat16)
        assert max_chunk_size(dqk, dv, torch.float32) == 64
        assert unsupported_reason(128, dqk, dv, torch.float32) is not None
    # the Fig. 5 setting keeps the widest blocks (two d_hv programs of 128 per chunk); at L = 128 the
    # blocks shrink to make room for the L x L tiles
    config = default_config("limit_chunk", 128, 256, 64, torch.bfloat16)
    assert (config.qk, config.v, config.bwd_qk, config.bwd_v) == (64, 128, 64, 64)
    assert (config.num_warps, config.num_stages, config.bwd_num_warps, config.bwd_num_stages) == (4, 2, 8, 1)
    assert config.state_one_tile
    assert (config.seq_q, config.bwd_seq_kv, config.state_seq, config.state_qk, config.state_v) == (
        64,
        64,
        64,
        64,
        64,
    )
    config = default_config("limit_chunk", 128, 256, 128, torch.bfloat16)
    assert (config.qk, config.v, config.bwd_qk, config.bwd_v) == (64, 64, 32, 32)
    assert (config.num_warps, config.num_stages, config.bwd_num_warps) == (8, 1, 8)
    assert default_config("limit_chunk", 128, 256, 32, torch.bfloat16).bwd_num_warps == 4


def good_inputs(seq_len=32):
    return [x.to(DEVICE) for x in make_inputs(1, 2, seq_len, 16, 16)]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x: x.update(q=x["q"][0]), "q must have shape"),
        (lambda x: x.update(k=x["k"][:, :, :16]), "k must have the shape of q"),
        (lambda x: x.update(v=x["v"][:, :1]), "v must have shape"),
        (lambda x: x.update(i=x["i"][..., :16]), "i must have shape"),
        (lambda x: x.update(f=x["f"].long()), "f must be a floating-point tensor"),
        (lambda x: x.update(q=x["q"].double(), k=x["k"].double()), "q must be bfloat16, float16 or float32"),
        (lambda x: x.update(v=x["v"].half()), "v must have the dtype of q"),
        (lambda x: x.update(chunk_size=24), "chunk_size must be a power of two"),
        (lambda x: x.update(chunk_size=64), "chunk_size must be at most the sequence length T=32"),
        (lambda x: x.update(q=x["q"][..., :8], k=x["k"][..., :8]), "head dim Dqk"),
        (lambda x: x.update(eps=-1.0), "eps must be >= 0"),
        (lambda x: x.update(initial_state=(torch.zeros(1, 2, 16, 16),)), "initial_state must be a tuple"),
        (
            lambda x: x.update(
                initial_state=(torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 16), torch.zeros(1, 2))
            ),
            "initial_state C must have shape",
        ),
        (
            lambda x: x.update(config=replace(small_config(16), bwd_v=32)),
            "config.bwd_v must be a power of two >= 16 dividing the head dim 16",
        ),
        (
            lambda x: x.update(config=replace(small_config(16), num_warps=3)),
            "config.num_warps must be a power of two",
        ),
        (
            lambda x: x.update(config=replace(small_config(16), state_one_tile=True, state_seq=32)),
            "config.state_seq must be chunk_size=16 with state_one_tile, got 32",
        ),
        (
            lambda x: x.update(config=replace(small_config(16), seq_kv=32)),
            "config.seq_kv must be chunk_size=16 \\(limit_chunk keeps the whole chunk in one tile\\)",
        ),
    ],
)
def test_bad_input_raises_value_error(change, match):
    q, k, v, i, f = good_inputs()
    args = dict(q=q, k=k, v=v, i=i, f=f, chunk_size=16)
    change(args)
    with pytest.raises(ValueError, match=match):
        mlstm_limit_chunk(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("i"), args.pop("f"), **args)


@pytest.mark.parametrize(
    ("dtype", "chunk"), [(torch.bfloat16, 256), (torch.float32, 128)], ids=["bf16-L256", "fp32-L128"]
)
def test_chunk_beyond_the_on_chip_limit_names_the_limit(dtype, chunk):
    q, k, v, i, f = good_inputs(seq_len=256)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    with pytest.raises(ValueError, match=f"L x L intra-chunk tile per program: chunk_size {chunk} "):
        mlstm_limit_chunk(q, k, v, i, f, chunk_size=chunk)


# ---- the registry adapter ---------------------------------------------------------------------------


def adapter_case(chunk_size=64, dtype="bfloat16", mode="fw", dqk=256, dv=512, seq_len=8192, **params):
    return Case("limit_chunk", mode, dtype, 8, seq_len, 8, dqk, dv, chunk_size=chunk_size, params=params)


def test_adapter_check_reports_the_on_chip_limit(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the interpreter refuses bfloat16 first
    adapter = registry.get("limit_chunk")
    assert adapter.family == "mlstm" and adapter.uses_chunk_size
    for dtype, label in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        assert f"<= {max_chunk_size(256, 512, dtype)} for {label}" in adapter.constraints
    for chunk in (16, 32, 64, 128, None):
        assert adapter.check(adapter_case(chunk)) is None, chunk
    assert "L x L intra-chunk tile" in adapter.check(adapter_case(256))
    assert "L x L intra-chunk tile" in adapter.check(adapter_case(128, dtype="float32"))
    assert "power of two" in adapter.check(adapter_case(48))
    assert "larger than seq_len" in adapter.check(adapter_case(128, seq_len=64))
    assert "head_dim_qk" in adapter.check(adapter_case(dqk=8))
    assert "unknown param" in adapter.check(adapter_case(causal=True))


def test_adapter_counts_are_the_chunkwise_exp_model():
    adapter = registry.get("limit_chunk")
    case = adapter_case(64, dqk=128, dv=256, seq_len=4096)
    shape = dict(seq_len=4096, chunk_size=64, head_dim_qk=128, head_dim_v=256)
    heads = case.batch * case.num_heads
    fw_flops = heads * mlstm_flops("exp", "chunkwise", **shape)
    # limit_chunk keeps float32 chunk states (config.float32_states); TFLA mLSTMsig's take the input dtype
    fw_bytes = heads * mlstm_bytes("exp", "chunkwise", qkv_bytes=2, gate_bytes=2, state_bytes=4, **shape)
    assert adapter.state_bytes(case) == 4
    assert registry.get("tfla_sig").state_bytes(case) == 2
    assert adapter.flops(case, "fw") == pytest.approx(fw_flops)
    assert adapter.flops(case, "fwbw") == pytest.approx(LINEAR_RNN_BACKWARD.total_flops(fw_flops, "fwbw"))
    assert adapter.bytes(case, "fwbw") == pytest.approx(LINEAR_RNN_BACKWARD.total_bytes(fw_bytes, "fwbw"))
    # the default chunk is 64, and a smaller chunk moves more state bytes
    assert adapter.flops(adapter_case(None), "fw") == adapter.flops(adapter_case(64), "fw")
    assert adapter.bytes(adapter_case(16), "fw") > adapter.bytes(adapter_case(64), "fw")


def test_adapter_forward_matches_its_reference():
    adapter = registry.get("limit_chunk")
    case = Case("limit_chunk", "fwbw", "float32", 1, 64, 2, 16, 32, chunk_size=16)
    inputs = adapter.make_inputs(case, DEVICE)
    assert inputs["chunk_size"] == 16 and inputs["q"].requires_grad and inputs["f"].requires_grad
    out = adapter.forward(inputs)
    ref = adapter.reference(inputs)
    assert out.shape == ref.shape == (1, 2, 64, 32)
    assert rel_rms(out, ref) < FP32_RTOL
    out.sum().backward()
    assert all(torch.isfinite(inputs[name].grad).all() for name in ("q", "k", "v", "i", "f"))


# ---- GPU: bfloat16 at the paper's sizes against the float32 chunkwise reference -----------------------
# Error budget for bfloat16 inputs (unit roundoff 2^-9 ~ 2e-3): both sides see the same bf16 q, k, v;
# the kernels round S*D, dS*D, the states and Q_bar to bf16 before their products (each ~2e-3
# relative, random sign, so sums keep ~2e-3 relative) and round the outputs and gradients to bf16
# (another ~2e-3). Expect ~5e-3 on h and ~1e-2 on dq, dk, dv; the gate gradients sum over up to T steps
# and are allowed 3e-2, d log_f (a difference of such sums) 8e-2 as for TFLA, whose chunk-local split
# this kernel shares (measured ~2.5e-2 for TFLA on an H100 at T 8192, where a whole-sequence reverse
# cumsum is 6.5e-2 to 2.7e-1 off).
BF16_RTOL = {"h": 2e-2, "C": 2e-2, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2, "di": 3e-2, "df": 8e-2}


def chunkwise_fp32(q, k, v, i, f, state):
    return mlstm_chunkwise(
        q.float(), k.float(), v.float(), i.float(), f.float(), chunk_size=64, initial_state=state
    )


def check_bf16(batch, heads, seq_len, dqk, dv, chunk, seed, tolerances=BF16_RTOL):
    inputs = make_inputs(
        batch, heads, seq_len, dqk, dv, seed=seed, i_range=(-11.0, 2.0), f_range=(-5.0, 12.0)
    )
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]  # both sides see the same bf16 q, k, v
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    reference = run_with_grads(chunkwise_fp32, inputs, [], weights)
    result = run_with_grads(limit_chunk(chunk), inputs, [], weights)
    assert result[0].dtype == torch.bfloat16
    assert_within_rms(result, reference, tolerances, GRAD_NAMES[:5])


@pytest.mark.gpu
def test_gpu_bf16_paper_size():
    # The Fig. 5 setting: Dqk 128, Dv 256, T 8192, chunk 64.
    check_bf16(1, 2, 8192, 128, 256, 64, seed=8)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [16, 32, 64, 128])
def test_gpu_bf16_every_chunk_size_at_the_fig6_head_dims(chunk):
    # Dqk 256, Dv 512 (Fig. 6): every allowed chunk size compiles within the H100's on-chip memory.
    check_bf16(1, 2, 1024, 256, 512, chunk, seed=11)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "key",
    sorted((k for k in TUNED_CONFIGS if k[1] == "limit_chunk"), key=str),
    ids=lambda k: f"Dqk{k[2]}-Dv{k[3]}-L{k[4]}-{k[0].replace(' ', '_')}",
)
def test_gpu_every_tuned_config_matches_the_reference(key):
    # Each limit_chunk config of kernels/tuned_configs.json, at its head dims and chunk (bf16), against
    # the float32 chunkwise reference at the trained gate ranges.
    target, _, dqk, dv, chunk, dtype, _ = key
    if target not in gpu_target(torch.device("cuda")):
        pytest.skip(f"tuned for {target}")
    assert dtype == torch.bfloat16
    seq_len = max(16 * chunk, 1024)
    inputs = make_inputs(1, 2, seq_len, dqk, dv, seed=16, i_range=(-11.0, 2.0), f_range=(-5.0, 12.0))
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]
    weights = make_weights(1, 2, seq_len, dqk, dv)
    reference = run_with_grads(chunkwise_fp32, inputs, [], weights)
    result = run_with_grads(limit_chunk(chunk, TUNED_CONFIGS[key]), inputs, [], weights)
    default = run_with_grads(limit_chunk(chunk), inputs, [], weights)
    assert_config_within_reference(result, default, reference, BF16_RTOL, GRAD_NAMES[:5])


@pytest.mark.gpu
def test_gpu_bf16_long_sequence_wide_heads():
    # T 65,536 with Dqk = Dv = 512: 1024 chunks of a 512 x 512 state per head. dq sums 512-wide rows
    # of bf16-rounded products against states built over 65,536 steps: 2.31e-2 on an H100, so dq, dk
    # and dv get 3e-2 here.
    wide = {**BF16_RTOL, "dq": 3e-2, "dk": 3e-2, "dv": 3e-2}
    check_bf16(1, 1, 65536, 512, 512, 64, seed=13, tolerances=wide)


@pytest.mark.gpu
def test_gpu_bf16_state_passing_and_chunk_invariance():
    inputs = [x.cuda() for x in make_inputs(2, 4, 8192, 128, 256, seed=9)]
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]
    h_full = mlstm_limit_chunk(*inputs, chunk_size=64)
    for chunk in (16, 32, 128):
        assert rel_rms(mlstm_limit_chunk(*inputs, chunk_size=chunk), h_full) < BF16_RTOL["h"]
    h_a, state = mlstm_limit_chunk(*(x[:, :, :4096] for x in inputs), return_final_state=True)
    h_b = mlstm_limit_chunk(*(x[:, :, 4096:] for x in inputs), initial_state=state)
    assert rel_rms(torch.cat([h_a, h_b], dim=2), h_full) < BF16_RTOL["h"]


@pytest.mark.gpu
def test_gpu_fp32_matches_float64_reference():
    # Compiled kernels (not the interpreter) in float32 with full-precision products: the CPU bound holds.
    check_against_reference(2, 3, 1024, 64, 128, 64, seed=10)
