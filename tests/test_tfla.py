"""`mlstm_tfla` (our Triton TFLA kernels) against the float64 PyTorch references.

On the CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), so
the shapes are small and the block sizes are overridden to exercise multi-tile loops. The `gpu`
tests repeat the checks in bfloat16 at the paper's sizes.

Error bound for float32 (CPU): relative RMS error `||x - x_ref|| / ||x_ref|| < 1e-4` on the output,
the final state and every gradient. float32's unit roundoff is 6e-8; the kernels' sums have at most
a few thousand terms (random-sign rounding grows like sqrt(n): ~3e-6) and the log-gate cumulative
sums reach |b| ~ 50 here, so exp(b_t - b_j) carries a relative error ~|b| * 6e-8 ~ 3e-6; the
measured errors are 1e-7..1e-5. A real mistake (one gate off by a step, a chunk-boundary term
dropped, a wrong max state) moves the result by O(1/T) ~ 1e-2, two orders above the bound.

mLSTMexp gradients are compared through a loss that is invariant to a per-step scale of h
(RMS-normalized h times fixed weights): the kernels drop the gradient through the normalizer
(appendix B.3), which is exact exactly then.
"""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
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
from tfla_bench.kernels import config as config_module
from tfla_bench.kernels import tfla as tfla_module
from tfla_bench.kernels.chunkwise import RowDots, Settings, gates_backward, gates_forward
from tfla_bench.kernels.config import (
    KernelConfig,
    config_for,
    default_config,
    float32_states,
    gpu_target,
    register_tuned,
)
from tfla_bench.kernels.gates import chunk_gates, chunk_log_gate_grads, log_gates
from tfla_bench.kernels.reference import mlstm_chunkwise, mlstm_recurrent, state_names
from tfla_bench.kernels.tfla import mlstm_tfla

FP32_RTOL = 1e-4
# Small tiles for the CPU interpreter, so a chunk spans several tiles and a head dim several blocks.
SMALL_TILES = dict(
    seq_q=16,
    seq_kv=16,
    qk=16,
    v=16,
    bwd_seq_q=16,
    bwd_seq_kv=16,
    bwd_qk=16,
    bwd_v=16,
    state_seq=16,
    state_qk=16,
    state_v=16,
)


def small_config(gate, dqk, dv, chunk_size):
    return replace(default_config("tfla", dqk, dv, chunk_size, torch.float32, gate), **SMALL_TILES)


def reference_fn(gate, normalize):
    def fn(q, k, v, i, f, state):
        return mlstm_recurrent(
            q.double(),
            k.double(),
            v.double(),
            i.double(),
            f.double(),
            gate=gate,
            normalize=normalize,
            initial_state=tuple(s.double() for s in state) if state else None,
        )

    return fn


def tfla_fn(gate, normalize, chunk_size, config=None):
    def fn(q, k, v, i, f, state):
        return mlstm_tfla(
            q,
            k,
            v,
            i,
            f,
            gate=gate,
            normalize=normalize,
            chunk_size=chunk_size,
            initial_state=state,
            return_final_state=True,
            config=config,
        )

    return fn


GRAD_NAMES = ["dq", "dk", "dv", "di", "df"]


def check_against_reference(
    gate,
    normalize,
    batch,
    heads,
    seq_len,
    dqk,
    dv,
    chunk_size,
    *,
    with_state=True,
    config=None,
    seed=0,
    i_range=(-3.0, 3.0),
    f_range=(-1.0, 6.0),
):
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=seed, i_range=i_range, f_range=f_range)
    state = make_state(gate, normalize, batch, heads, dqk, dv) if with_state else []
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    h_ref, s_ref, g_ref = run_with_grads(reference_fn(gate, normalize), inputs, state, weights, gate)
    h, s, g = run_with_grads(tfla_fn(gate, normalize, chunk_size, config), inputs, state, weights, gate)
    names = state_names(gate, normalize)
    assert_all_close([h, *s], [h_ref, *s_ref], FP32_RTOL, ["h", *names])
    assert_all_close(g, g_ref, FP32_RTOL, GRAD_NAMES + [f"d{n}0" for n in names][: len(state)])


# (gate, normalize, B, NH, T, Dqk, Dv, L, small blocks): T/L from 1 to 8, partial last chunks
# (T=48 with L=32, T=96 with L=64), Dqk != Dv.
# The interpreter takes over a minute for each case marked slow (16-wide tiles at Dqk 32, Dv 64):
# `make test-slow` runs them, `make test` the others, which include a 16-wide-tile case too.
SLOW = pytest.mark.slow
CASES = [
    ("exp", False, 2, 3, 48, 16, 32, 16, False),
    pytest.param(("exp", False, 2, 3, 96, 32, 64, 64, True), marks=SLOW),
    ("exp", False, 2, 3, 256, 16, 32, 32, False),
    pytest.param(("exp", False, 2, 3, 64, 32, 64, 64, True), marks=SLOW),
    ("sig", False, 2, 3, 48, 16, 32, 32, False),
    pytest.param(("sig", False, 2, 3, 96, 32, 64, 32, True), marks=SLOW),
    ("sig", False, 2, 3, 256, 16, 32, 64, False),
    ("sig", True, 2, 3, 96, 16, 32, 64, True),
]


def case_id(case):
    gate, normalize, batch, heads, seq_len, dqk, dv, chunk, small = case
    name = f"{gate}{'-norm' if normalize else ''}-B{batch}-T{seq_len}-H{heads}-Dqk{dqk}-Dv{dv}-L{chunk}"
    return name + ("-tiles16" if small else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_recurrent_reference(case):
    gate, normalize, batch, heads, seq_len, dqk, dv, chunk, small = case
    config = small_config(gate, dqk, dv, chunk) if small else None
    check_against_reference(gate, normalize, batch, heads, seq_len, dqk, dv, chunk, config=config)


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_the_widest_tiles_and_launches_the_tuner_steps_to_match_the_reference(gate):
    # Every sequence tile the whole chunk, every head-dim block the whole head dim, and the most warps
    # and stages on the tuner's ladders (`tfla_bench.measure.tuning.LADDERS`).
    whole = dict.fromkeys(("seq_q", "seq_kv", "bwd_seq_q", "bwd_seq_kv", "state_seq"), 32)
    whole |= dict.fromkeys(("qk", "v", "bwd_qk", "bwd_v", "state_qk", "state_v"), 32)
    whole |= dict.fromkeys(("num_warps", "bwd_num_warps", "state_num_warps"), 16)
    whole |= dict.fromkeys(("num_stages", "bwd_num_stages", "state_num_stages"), 5)
    config = replace(default_config("tfla", 32, 32, 32, torch.float32, gate), **whole)
    check_against_reference(gate, False, 1, 2, 64, 32, 32, 32, config=config)


# (gate, normalize, T, Dqk, Dv, L): dK and dV in one kernel; 16-wide blocks, so the dQ kernel's two
# d_qk slices at Dqk 32 meet the fused kernel's one.
FUSED_CASES = [
    ("exp", False, 48, 16, 32, 16),
    ("sig", False, 96, 32, 16, 32),
    ("sig", True, 64, 16, 32, 32),
    pytest.param(("exp", False, 64, 32, 64, 32), marks=SLOW),
]


@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: "{}{}-T{}-Dqk{}-Dv{}-L{}".format(*c))
def test_dk_and_dv_in_one_kernel_match_the_reference(case):
    gate, normalize, seq_len, dqk, dv, chunk = case
    config = replace(small_config(gate, dqk, dv, chunk), bwd_fused_kv=True)
    check_against_reference(gate, normalize, 2, 3, seq_len, dqk, dv, chunk, config=config)


def test_dk_and_dv_in_one_kernel_need_small_power_of_two_head_dims():
    config = replace(small_config("sig", 48, 64, 32), bwd_fused_kv=True)
    q, k, v, i, f = good_inputs(dqk=48, dv=64)
    with pytest.raises(ValueError, match=r"^config.bwd_fused_kv needs .* got tfla Dqk 48 Dv 64$"):
        mlstm_tfla(q, k, v, i, f, gate="sig", chunk_size=32, config=config)
    config_module.check_config("tfla", replace(config, bwd_fused_kv=False), 48, 64, 32)
    with pytest.raises(ValueError, match=r"Dqk \+ Dv <= 512, got tfla Dqk 256 Dv 512$"):
        config_module.check_config("tfla", config, 256, 512, 32)


# (gate, normalize, T, Dqk, Dv, chunk): the last chunk partial, so a descriptor's tiles reach past T
TMA_CASES = [("exp", False, 80, 32, 64, 32), ("sig", True, 80, 64, 32, 32), ("sig", False, 48, 16, 32, 32)]


@pytest.mark.parametrize("case", TMA_CASES, ids=lambda c: "{}{}-T{}-Dqk{}-Dv{}-L{}".format(*c))
def test_tiles_through_tensor_descriptors_give_the_pointer_loads_results_to_the_bit(case):
    gate, normalize, seq_len, dqk, dv, chunk = case
    config = replace(small_config(gate, dqk, dv, chunk), seq_q=32, bwd_seq_kv=32)
    inputs = make_inputs(1, 2, seq_len, dqk, dv)
    state = make_state(gate, normalize, 1, 2, dqk, dv)
    weights = make_weights(1, 2, seq_len, dqk, dv)
    pointers = run_with_grads(tfla_fn(gate, normalize, chunk, config), inputs, state, weights, gate)
    for flags in ({"tma": True}, {"bwd_tma": True}, {"tma": True, "bwd_tma": True}):
        got = run_with_grads(
            tfla_fn(gate, normalize, chunk, replace(config, **flags)), inputs, state, weights, gate
        )
        # h, the final state, and the gradients of the inputs and of the initial state
        for n, (a, b) in enumerate(
            zip([got[0], *got[1], *got[2]], [pointers[0], *pointers[1], *pointers[2]], strict=True)
        ):
            assert torch.equal(a, b), f"{flags}, result {n}: {(a - b).abs().max():.1e} from the pointer loads"


def test_inputs_a_descriptor_cannot_take_load_through_pointers(monkeypatch):
    # q, k and v 8 bytes into their buffers: a descriptor needs 16-byte aligned addresses
    config = small_config("sig", 16, 16, 16)
    q, k, v, i, f = (x.to(DEVICE) for x in make_inputs(1, 2, 32, 16, 16))
    q2, k2, v2 = (torch.cat([x.new_zeros(2), x.flatten()])[2:].view(x.shape) for x in (q, k, v))
    assert q2.data_ptr() % 16 == 8 and q2.is_contiguous()
    described = []
    real = tfla_module.tma_rows
    monkeypatch.setattr(tfla_module, "tma_rows", lambda x, *blocks: described.append(x) or real(x, *blocks))
    h = mlstm_tfla(
        q2, k2, v2, i, f, gate="sig", chunk_size=16, config=replace(config, tma=True, bwd_tma=True)
    )
    assert described == []
    assert torch.equal(h, mlstm_tfla(q, k, v, i, f, gate="sig", chunk_size=16, config=config))
    mlstm_tfla(q, k, v, i, f, gate="sig", chunk_size=16, config=replace(config, tma=True))
    assert len(described) == 3  # aligned: q, k and v through descriptors


def test_a_carried_config_and_one_without_tensor_descriptors_load_through_pointers(monkeypatch, tmp_path):
    tuned = replace(small_config("sig", 32, 32, 32), tma=True, bwd_tma=True)
    carried = config_module.adapted("tfla", tuned, 64, 64, 32, torch.bfloat16)
    assert (carried.tma, carried.bwd_tma) == (False, False)  # timed at the tuned shape only
    entry = config_module.tuned_entry(("sm90", "tfla", 32, 32, 32, torch.bfloat16, "sig"), tuned)
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps([entry]))
    monkeypatch.setattr(config_module, "TUNED_CONFIGS", {})
    monkeypatch.setattr(config_module, "tma_supported", lambda: False)
    config_module.load_tuned(path)
    (loaded,) = config_module.TUNED_CONFIGS.values()
    assert (loaded.tma, loaded.bwd_tma) == (False, False)
    with pytest.raises(ValueError, match=r"^config.tma and config.bwd_tma need tensor descriptors"):
        config_module.check_config("tfla", tuned, 32, 32, 32)


def test_the_tma_options_are_tfla_options_whose_query_tiles_end_in_their_chunk():
    config = small_config("sig", 32, 32, 32)
    config_module.check_config("tfla", replace(config, tma=True, bwd_tma=True), 32, 32, 32)
    uneven = replace(config, bwd_tma=True, bwd_seq_q=32, bwd_seq_kv=16)
    with pytest.raises(ValueError, match=r"^config.bwd_tma needs bwd_seq_q <= bwd_seq_kv, got 32 > 16$"):
        config_module.check_config("tfla", uneven, 32, 32, 32)
    config_module.check_config("tfla", replace(uneven, bwd_tma=False), 32, 32, 32)
    limit = replace(default_config("limit_chunk", 32, 32, 32, torch.float32), tma=True)
    with pytest.raises(
        ValueError,
        match=r"^config.tma and config.bwd_tma are options of the TFLA kernel, not of limit_chunk$",
    ):
        config_module.check_config("limit_chunk", limit, 32, 32, 32)


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_without_initial_state(gate):
    check_against_reference(gate, False, 2, 3, 48, 16, 32, 16, with_state=False)


def test_exp_trained_gate_ranges():
    # Input gates near -10 and forget gates from -5 to 12 (the paper's trained ranges, Fig. 4).
    check_against_reference("exp", False, 2, 3, 96, 16, 32, 32, i_range=(-11.0, -9.0), f_range=(-5.0, 12.0))


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_chunk_size_invariance(gate):
    inputs = [x.to(DEVICE) for x in make_inputs(2, 3, 128, 16, 32, seed=3)]
    outputs = {chunk: mlstm_tfla(*inputs, gate=gate, chunk_size=chunk) for chunk in (16, 32, 64, 128)}
    for chunk in (16, 32, 64):
        assert rel_rms(outputs[chunk], outputs[128]) < FP32_RTOL


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_state_passing(gate):
    # Two halves with the carried state (and chained gradients) equal one full run.
    batch, heads, seq_len, dqk, dv, split = 2, 3, 96, 16, 32, 48
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=4)
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    h_full, s_full, g_full = run_with_grads(tfla_fn(gate, False, 32), inputs, [], weights, gate)

    def two_halves(q, k, v, i, f, state):
        first = (q[:, :, :split], k[:, :, :split], v[:, :, :split], i[..., :split], f[..., :split])
        second = (q[:, :, split:], k[:, :, split:], v[:, :, split:], i[..., split:], f[..., split:])
        h_a, s_a = mlstm_tfla(*first, gate=gate, chunk_size=16, return_final_state=True)
        h_b, s_b = mlstm_tfla(*second, gate=gate, chunk_size=32, initial_state=s_a, return_final_state=True)
        return torch.cat([h_a, h_b], dim=2), s_b

    h, s, g = run_with_grads(two_halves, inputs, [], weights, gate)
    assert_all_close([h, *s], [h_full, *s_full], FP32_RTOL, ["h", *state_names(gate, False)])
    assert_all_close(g, g_full, FP32_RTOL, GRAD_NAMES)


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_padding_matches_the_unpadded_reference(gate):
    # T = 40 is not a multiple of 16: pad=True appends steps that leave the state unchanged.
    check_pad = make_inputs(2, 3, 40, 16, 32, seed=5)
    state = make_state(gate, False, 2, 3, 16, 32)
    weights = make_weights(2, 3, 40, 16, 32)
    h_ref, s_ref, g_ref = run_with_grads(reference_fn(gate, False), check_pad, state, weights, gate)

    def padded(q, k, v, i, f, state):
        return mlstm_tfla(
            q, k, v, i, f, gate=gate, chunk_size=32, initial_state=state, return_final_state=True, pad=True
        )

    h, s, g = run_with_grads(padded, check_pad, state, weights, gate)
    assert h.shape == h_ref.shape
    assert_all_close([h, *s], [h_ref, *s_ref], FP32_RTOL, ["h", *state_names(gate, False)])
    assert_all_close(g, g_ref, FP32_RTOL, GRAD_NAMES + ["dC0", "dn0", "dm0"][: len(state)])


def test_second_backward_recomputes_the_states():
    inputs = [x.to(DEVICE).requires_grad_() for x in make_inputs(1, 2, 32, 16, 16, seed=6)]
    h = mlstm_tfla(*inputs, gate="sig", chunk_size=16)
    first = torch.autograd.grad(h.square().sum(), inputs, retain_graph=True)
    second = torch.autograd.grad(h.square().sum(), inputs)
    for a, b in zip(first, second, strict=True):
        assert rel_rms(a, b) < 1e-6


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_half_precision_states_keep_float32_boundaries(gate):
    # The chunk states are stored in the input dtype (the kernels' products read them so); the
    # initial and final states and their gradients stay float32, and all stay within the float16
    # budget of the float64 reference. (Triton's interpreter computes bfloat16 products wrongly, so
    # the CPU checks this with float16; the GPU tests run bfloat16.)
    batch, heads, seq_len, dqk, dv, chunk = 1, 2, 96, 32, 64, 32
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=13)
    inputs[:3] = [x.half() for x in inputs[:3]]
    state = make_state(gate, False, batch, heads, dqk, dv)
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    h_ref, s_ref, g_ref = run_with_grads(reference_fn(gate, False), inputs, state, weights, gate)
    config = replace(small_config(gate, dqk, dv, chunk), qk=32, bwd_qk=32)
    h, s, g = run_with_grads(tfla_fn(gate, False, chunk, config), inputs, state, weights, gate)
    assert h.dtype == torch.float16
    assert [x.dtype for x in s] == [torch.float32] * len(s)
    names = ["h", "C", *GRAD_NAMES, "dC0"]
    for name, a, b in zip(names, [h, s[0], *g[:6]], [h_ref, s_ref[0], *g_ref[:6]], strict=True):
        assert rel_rms(a, b) < {**FP16_RTOL, "dC0": 2e-3}[name], f"{name}: {rel_rms(a, b):.2e}"


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gate_kernels_match_the_pytorch_gates(gate):
    # fwd_kernel_gates / bwd_kernel_gates against gates.log_gates, chunk_gates, chunk_log_gate_grads
    # and autograd through log sigmoid: a partial last chunk, gates far into the tails of the sigmoid
    # (log sigmoid(30) = -9e-14 must not round to 0) and the padding values -inf / +inf.
    bh, seq_len, chunk = 3, 80, 32
    gen = torch.Generator().manual_seed(14)
    i = torch.randn(bh, seq_len, generator=gen) * 8
    f = torch.randn(bh, seq_len, generator=gen) * 8 + 3
    f[:, 5], f[:, 6], i[:, 7], i[:, 8] = 30.0, -30.0, -30.0, 30.0
    i[:, -3:], f[:, -3:] = float("-inf"), float("inf")
    s = Settings(gate, chunk, 1e-6, False, default_config("tfla", 16, 16, chunk, torch.float32, gate))
    log_i, sums = gates_forward(i.to(DEVICE), f.to(DEVICE), s, row_max=True)
    ref_i, ref_f = log_gates(i.double(), f.double(), gate)
    ref = chunk_gates(ref_i, ref_f, chunk)
    assert torch.equal(log_i.isinf().cpu(), ref_i.isinf())
    finite = ref_i.isfinite()
    assert torch.allclose(log_i.cpu().double()[finite], ref_i[finite], rtol=1e-6, atol=0)
    # float32 sums of |log f| up to ~100 here: an absolute error of a few float32 ulps of 100
    for name, got in zip(("b", "g", "a_max"), sums[:3], strict=True):
        assert torch.allclose(got.cpu().double(), getattr(ref, name), rtol=1e-6, atol=3e-5), name
    assert gates_forward(i.to(DEVICE), f.to(DEVICE), s)[1].row_max is None  # limit_chunk's: none kept
    if gate == "sig":
        assert sums.row_max is None
    else:
        # the within-chunk prefix max of log_i - b (the bound of each row of the log gate matrix)
        chunks = F.pad(ref_i - ref.b, (0, -seq_len % chunk), value=float("-inf")).unflatten(-1, (-1, chunk))
        row_max = chunks.cummax(-1).values.flatten(-2)[..., :seq_len]
        valid = slice(0, seq_len - 3)
        got = sums.row_max.cpu().double()[:, valid]
        assert torch.allclose(got, row_max[:, valid], rtol=1e-6, atol=3e-5)

    # gradients: row dots in two head-dim slices and dg in three state blocks, summed by the kernel
    dots = RowDots(*(torch.randn(2, bh, seq_len, generator=gen) for _ in range(3)))
    dg = torch.randn(3, bh, sums.g.shape[-1], generator=gen)
    di, df = gates_backward(
        i.to(DEVICE), f.to(DEVICE), RowDots(*(x.to(DEVICE) for x in dots)), dg.to(DEVICE), s
    )
    i64, f64 = i.double().requires_grad_(), f.double().requires_grad_()
    dlog_i, dlog_f = chunk_log_gate_grads(*(x.sum(0).double() for x in dots), dg.sum(0).double(), chunk)
    torch.autograd.backward(log_gates(i64, f64, gate), (dlog_i, dlog_f))
    valid = slice(0, seq_len - 3)
    assert torch.allclose(di.cpu().double()[:, valid], i64.grad[:, valid], rtol=1e-5, atol=1e-5)
    assert torch.allclose(df.cpu().double()[:, valid], f64.grad[:, valid], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(di).all() and torch.isfinite(df).all()


def test_state_dtype_follows_the_float32_states_rule(monkeypatch):
    # 16-bit states for mLSTMsig and for a single d_qk block of mLSTMexp; float32 for mLSTMexp over
    # several blocks (config.float32_states), with the same result either way.
    seen = record_state_dtypes(monkeypatch)
    inputs = make_inputs(1, 2, 64, 32, 32, seed=15)
    inputs[:3] = [x.half().to(DEVICE) for x in inputs[:3]]
    inputs[3:] = [x.to(DEVICE) for x in inputs[3:]]
    outputs = {}
    for gate, qk, narrow in (("sig", 16, False), ("exp", 32, False), ("exp", 16, False), ("exp", 16, True)):
        config = replace(small_config(gate, 32, 32, 32), qk=qk, states16=narrow)
        outputs[gate, qk, narrow] = mlstm_tfla(*inputs, gate=gate, chunk_size=32, config=config)
    assert seen == [torch.float16, torch.float16, torch.float32, torch.float16]
    assert rel_rms(outputs["exp", 16, False], outputs["exp", 32, False]) < 2e-3
    # a tuned config whose 16-bit states were checked (`states16`): they are rounded where the
    # readers would round the float32 ones, so h is the same
    assert rel_rms(outputs["exp", 16, True], outputs["exp", 16, False]) < 1e-6
    assert float32_states("limit_chunk", "exp", 32, small_config("exp", 32, 32, 32))
    assert not float32_states(
        "limit_chunk", "exp", 32, replace(small_config("exp", 32, 32, 32), states16=True)
    )


def test_default_config():
    # the Fig. 5 setting; the config does not depend on the number of sequences and heads
    config = default_config("tfla", 128, 256, 128, torch.bfloat16, "sig")
    assert (config.seq_q, config.seq_kv, config.qk, config.v) == (128, 64, 128, 128)
    assert (config.num_warps, config.num_stages) == (8, 2)
    assert (config.bwd_seq_q, config.bwd_seq_kv, config.bwd_qk, config.bwd_v) == (32, 64, 128, 128)
    assert (config.bwd_num_warps, config.bwd_num_stages) == (4, 2)
    assert (config.state_seq, config.state_qk, config.state_v, config.state_num_warps) == (64, 32, 128, 4)
    assert config.state_num_stages == 3 and not config.state_one_tile
    assert default_config("tfla", 128, 256, 128, torch.bfloat16, "exp").seq_kv == 64
    # mLSTMexp at Dqk 256: one d_qk block (16-bit states), one stage of 128-row query tiles
    wide = [default_config("tfla", 256, 512, chunk, torch.bfloat16, "exp") for chunk in (64, 256)]
    assert [(c.qk, c.seq_q, c.num_stages) for c in wide] == [(256, 64, 2), (256, 128, 1)]
    assert default_config("tfla", 256, 512, 256, torch.bfloat16, "sig").qk == 128
    small = default_config("tfla", 48, 80, 16, torch.float32, "sig")
    assert (small.seq_q, small.qk, small.v, small.state_seq, small.num_warps) == (16, 16, 16, 16, 4)
    assert isinstance(small, KernelConfig)


def test_tuned_config_takes_the_place_of_the_default(monkeypatch):
    monkeypatch.setattr(config_module, "TUNED_CONFIGS", {})
    config_for.cache_clear()
    shape = ("tfla", 16, 32, 32, torch.float32, "exp")
    h100, a100 = ("sm90", "NVIDIA H100 80GB HBM3"), ("sm80", "NVIDIA A100-SXM4-80GB")
    assert config_for(*shape, h100) == default_config(*shape)
    tuned = small_config("exp", 16, 32, 32)
    register_tuned("sm90", *shape, tuned)
    assert config_for(*shape, h100) == tuned
    assert config_for(*shape, a100) == default_config(*shape)
    hits = config_for.cache_info().hits
    config_for(*shape, a100)
    assert config_for.cache_info().hits == hits + 1  # one lookup per call after the first
    with pytest.raises(ValueError, match="config.qk must be a power of two >= 16 dividing the head dim 16"):
        register_tuned("sm90", *shape, replace(tuned, qk=32))
    with pytest.raises(ValueError, match="kernel must be one of"):
        default_config("flash", 16, 32, 32, torch.float32)
    config_for.cache_clear()


def test_state_blocks_are_split_until_half_the_sms_have_a_program():
    from tfla_bench.kernels.config import filled_state_blocks

    entry = replace(default_config("tfla", 128, 256, 128, torch.bfloat16, "exp"), state_qk=64, state_v=128)
    # Fig. 5 at T 65,536: B 1 x NH 16 with 2 x 2 blocks is 64 programs on 132 SMs; the key block is
    # halved, 128 programs
    filled = filled_state_blocks(entry, 16, 128, 256, 132)
    assert (filled.state_qk, filled.state_v) == (32, 128)
    assert replace(filled, state_qk=64, state_v=128) == entry  # nothing else changes
    # T 32,768 (B 2): 128 programs leave fewer than half the SMs idle, the entry as it is
    assert filled_state_blocks(entry, 32, 128, 256, 132) is entry
    # the key block down to 32, then the value block, none below 32: one head of 8 programs
    narrow = replace(entry, state_qk=32, state_v=128)
    split = [filled_state_blocks(narrow, 1, 128, 256, sms) for sms in (15, 16, 10**6)]
    assert [(c.state_qk, c.state_v) for c in split] == [(32, 128), (32, 64), (32, 32)]
    assert filled_state_blocks(entry, 16, 128, 256, 0) is entry  # no SMs: not on a GPU


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_split_state_blocks_match_the_reference(gate, monkeypatch):
    # The split is the one change to a config that a call makes itself; the kernels at its blocks
    # against the float64 reference, output and every gradient.
    from tfla_bench.kernels import chunkwise

    monkeypatch.setattr(chunkwise, "sm_count", lambda device: 16)
    q = torch.zeros(1, 2, 64, 64)
    chosen = chunkwise.resolve_config("tfla", None, q, 64, 32, gate)
    assert (chosen.state_qk, chosen.state_v) == (32, 32)  # 2 heads x 2 x 1 blocks: halved to 2 x 2
    check_against_reference(gate, False, 1, 2, 64, 64, 64, 32, config=None)


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_state_kernels_one_chunk_per_step(gate):
    # The recurrent kernels' one-tile path (limit_chunk's default) on TFLA, for both gates.
    config = replace(
        default_config("tfla", 16, 32, 32, torch.float32, gate), state_one_tile=True, state_seq=32
    )
    check_against_reference(gate, False, 2, 3, 96, 16, 32, 32, config=config)


def good_inputs(**shape):
    dims = dict(batch=1, heads=2, seq_len=32, dqk=16, dv=16) | shape
    return [
        x.to(DEVICE)
        for x in make_inputs(dims["batch"], dims["heads"], dims["seq_len"], dims["dqk"], dims["dv"])
    ]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x: x.update(q=x["q"][0]), "q must have shape"),
        (lambda x: x.update(k=x["k"][:, :, :16]), "k must have the shape of q"),
        (lambda x: x.update(v=x["v"][:, :1]), "v must have shape"),
        (lambda x: x.update(i=x["i"][..., :16]), "i must have shape"),
        (lambda x: x.update(f=x["f"][..., None]), "f must have shape"),
        (lambda x: x.update(q=x["q"].double(), k=x["k"].double()), "q must be bfloat16, float16 or float32"),
        (lambda x: x.update(v=x["v"].half()), "v must have the dtype of q"),
        (lambda x: x.update(f=x["f"].long()), "f must be a floating-point tensor"),
        (lambda x: x.update(chunk_size=24), "chunk_size must be a power of two"),
        (lambda x: x.update(chunk_size=64), "chunk_size must be at most the sequence length T=32"),
        (lambda x: x.update(gate="relu"), "gate must be one of"),
        (lambda x: x.update(q=x["q"][..., :8], k=x["k"][..., :8]), "head dim Dqk"),
        (lambda x: x.update(v=torch.zeros(1, 2, 32, 24, device=DEVICE)), "head dim Dv"),
        (
            lambda x: x.update(initial_state=(torch.zeros(1, 2, 16, 16, device=DEVICE),)),
            "initial_state must be a tuple",
        ),
        (
            lambda x: x.update(gate="sig", initial_state=torch.zeros(1, 2, 16, 8, device=DEVICE)),
            "initial_state C must have shape",
        ),
        (
            lambda x: x.update(config=replace(small_config("exp", 16, 16, 16), seq_q=32)),
            "config.seq_q must be a power of two in \\[16, chunk_size=16\\]",
        ),
        (
            lambda x: x.update(config=replace(small_config("exp", 16, 16, 16), bwd_v=32)),
            "config.bwd_v must be a power of two >= 16 dividing",
        ),
        (
            lambda x: x.update(config=replace(small_config("exp", 16, 16, 16), state_num_stages=0)),
            "config.state_num_stages must be at least 1",
        ),
        (lambda x: x.update(config={"seq_q": 16}), "config must be a KernelConfig"),
    ],
)
def test_bad_input_raises_value_error(change, match):
    q, k, v, i, f = good_inputs()
    args = dict(q=q, k=k, v=v, i=i, f=f, chunk_size=16)
    change(args)
    with pytest.raises(ValueError, match=match):
        mlstm_tfla(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("i"), args.pop("f"), **args)


def test_sequence_length_not_multiple_of_16_names_t():
    q, k, v, i, f = good_inputs(seq_len=40)
    with pytest.raises(ValueError, match="T=40 must be a multiple of 16"):
        mlstm_tfla(q, k, v, i, f, chunk_size=16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_tensors_on_different_devices():
    q, k, v, i, f = good_inputs()
    with pytest.raises(ValueError, match="k must be on the device of q"):
        mlstm_tfla(q, k.cpu(), v, i, f, chunk_size=16)


# ---- GPU: bfloat16 at the paper's sizes against the float32 chunkwise reference -------------------
# Error budget for bfloat16 inputs (unit roundoff 2^-9 ~ 2e-3): both sides see the same bf16 q, k, v;
# the kernels round S * D, the states and dH to bf16 before their products (~2e-3 relative each,
# random sign, so sums keep ~2e-3 relative) and round h, dq, dk, dv to bf16 (another ~2e-3). The
# forget-gate gradient adds a within-chunk reverse cumsum of q.dq - k.dk, which cancels the pairs
# after each step and so loses about 4x. Measured with the CPU interpreter (bf16 dot emulated in
# fp32) at this very case: h 6e-3, C 4e-3, dq 1e-2, dk 1e-2, dv 4e-3, di 9e-3, df 3e-2; the bounds
# leave ~3x for the GPU's accumulation order. Two bf16 runs (another chunk size, split state) are
# compared with the sum of two such errors.
BF16_RTOL = {"h": 2e-2, "C": 2e-2, "dq": 3e-2, "dk": 3e-2, "dv": 2e-2, "di": 3e-2, "df": 8e-2}
BF16_RUN_TO_RUN_RTOL = 3e-2


def chunkwise_fp32(gate):
    def fn(q, k, v, i, f, state):
        return mlstm_chunkwise(
            q.float(),
            k.float(),
            v.float(),
            i.float(),
            f.float(),
            gate=gate,
            chunk_size=64,
            initial_state=state,
        )

    return fn


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gpu_bf16_paper_size(gate):
    batch, heads, seq_len, dqk, dv = 1, 2, 8192, 128, 256
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=8, i_range=(-11.0, 2.0), f_range=(-5.0, 12.0))
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]  # both sides see the same bf16 q, k, v
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    reference = run_with_grads(chunkwise_fp32(gate), inputs, [], weights, gate)
    result = run_with_grads(tfla_fn(gate, False, 128), inputs, [], weights, gate)
    assert result[0].dtype == torch.bfloat16
    assert_within_rms(result, reference, BF16_RTOL, GRAD_NAMES)


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gpu_tiles_through_tensor_descriptors_give_the_pointer_loads_results(gate):
    """Fig. 5's head dims and chunk, bf16: with `tma` and `bwd_tma`, the chosen config's results; the
    row dot products of the gate gradients may sum in another order (float32 rounding: about 2e-6 in
    df on an H200)."""
    batch, heads, seq_len, dqk, dv = 1, 4, 8192, 128, 256
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=8)
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    chosen = config_module.config_for(
        "tfla", dqk, dv, 128, torch.bfloat16, gate, config_module.gpu_target(torch.device(DEVICE))
    )
    config = replace(chosen, bwd_seq_q=min(chosen.bwd_seq_q, chosen.bwd_seq_kv), tma=False, bwd_tma=False)
    pointers = run_with_grads(tfla_fn(gate, False, 128, config), inputs, [], weights, gate)
    tma = run_with_grads(
        tfla_fn(gate, False, 128, replace(config, tma=True, bwd_tma=True)), inputs, [], weights, gate
    )
    assert torch.equal(tma[0], pointers[0])
    for name, a, b in zip(GRAD_NAMES, tma[2], pointers[2], strict=True):
        assert rel_rms(a, b) < 1e-5, f"{name}: relative RMS {rel_rms(a, b):.1e} from the pointer loads"


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gpu_split_state_blocks_give_the_chosen_configs_results(gate):
    """Fig. 5's head dims and chunk at one batch of 16 heads, whose state blocks a call splits to fill
    the SMs (`config.filled_state_blocks`): the chosen config's results at its own blocks. The gate
    gradients sum one term per state block, so they may round otherwise."""
    batch, heads, seq_len, dqk, dv = 1, 16, 4096, 128, 256
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=8)
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    chosen = config_module.config_for(
        "tfla", dqk, dv, 128, torch.bfloat16, gate, config_module.gpu_target(torch.device(DEVICE))
    )
    sms = config_module.sm_count(torch.device(DEVICE))
    if config_module.filled_state_blocks(chosen, batch * heads, dqk, dv, sms) == chosen:
        pytest.skip(f"the chosen config's state blocks fill this GPU's {sms} SMs")
    whole = run_with_grads(tfla_fn(gate, False, 128, chosen), inputs, [], weights, gate)
    filled = run_with_grads(tfla_fn(gate, False, 128), inputs, [], weights, gate)
    assert torch.equal(filled[0], whole[0])
    for name, a, b in zip(GRAD_NAMES, filled[2], whole[2], strict=True):
        if name in ("di", "df"):
            assert rel_rms(a, b) < 1e-5, f"{name}: relative RMS {rel_rms(a, b):.1e} from the whole blocks"
        else:
            assert torch.equal(a, b), name


# float16 (unit roundoff 2^-11): measured the same way at T = 2048 with the default gate ranges,
# h 3e-4, dq/dk/dv/di 5e-4, df 2e-3. (At the trained gate ranges some h_t underflow in float16,
# which makes the RMS-normalized test loss itself undefined; bfloat16 covers those ranges.)
FP16_RTOL = {"h": 2e-3, "C": 2e-3, "dq": 3e-3, "dk": 3e-3, "dv": 3e-3, "di": 3e-3, "df": 1e-2}


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gpu_fp16(gate):
    batch, heads, seq_len, dqk, dv = 1, 2, 2048, 128, 256
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=11)
    inputs[:3] = [x.half() for x in inputs[:3]]
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    reference = run_with_grads(chunkwise_fp32(gate), inputs, [], weights, gate)
    result = run_with_grads(tfla_fn(gate, False, 128), inputs, [], weights, gate)
    assert result[0].dtype == torch.float16
    assert_within_rms(result, reference, FP16_RTOL, GRAD_NAMES)


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gpu_bf16_state_passing_and_chunk_invariance(gate):
    inputs = [x.cuda() for x in make_inputs(2, 4, 8192, 128, 256, seed=9)]
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]
    h_full = mlstm_tfla(*inputs, gate=gate, chunk_size=128)
    for chunk in (64, 256, 1024):
        assert rel_rms(mlstm_tfla(*inputs, gate=gate, chunk_size=chunk), h_full) < BF16_RUN_TO_RUN_RTOL
    half = [x[:, :, :4096] for x in inputs]
    rest = [x[:, :, 4096:] for x in inputs]
    h_a, state = mlstm_tfla(*half, gate=gate, chunk_size=128, return_final_state=True)
    h_b = mlstm_tfla(*rest, gate=gate, chunk_size=128, initial_state=state)
    assert rel_rms(torch.cat([h_a, h_b], dim=2), h_full) < BF16_RUN_TO_RUN_RTOL


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gpu_state_offsets_past_int32(gate):
    # 2048 chunks of a 1024 x 1024 state: the last state starts 2^31 elements into its head's states,
    # past int32. At chunk size 64 (1024 chunks) every offset fits; the two must agree.
    batch, heads, seq_len, dim = 1, 1, 65536, 1024
    inputs = make_inputs(batch, heads, seq_len, dim, dim, seed=12)
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]
    weights = make_weights(batch, heads, seq_len, dim, dim)
    at_64 = run_with_grads(tfla_fn(gate, False, 64), inputs, [], weights, gate)
    at_32 = run_with_grads(tfla_fn(gate, False, 32), inputs, [], weights, gate)
    assert_within_rms(at_32, at_64, BF16_RTOL, GRAD_NAMES)


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gpu_bf16_long_sequence_wide_heads(gate):
    # T 65,536 with Dqk = Dv = 512: 512 chunks of a 512 x 512 state per head, against the float32
    # chunkwise reference with the error budget of the paper-size test.
    batch, heads, seq_len, dim = 1, 1, 65536, 512
    inputs = make_inputs(batch, heads, seq_len, dim, dim, seed=13, i_range=(-11.0, 2.0), f_range=(-5.0, 12.0))
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]
    weights = make_weights(batch, heads, seq_len, dim, dim)
    reference = run_with_grads(chunkwise_fp32(gate), inputs, [], weights, gate)
    result = run_with_grads(tfla_fn(gate, False, 128), inputs, [], weights, gate)
    assert_within_rms(result, reference, BF16_RTOL, GRAD_NAMES)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [64, 256, 1024])
def test_gpu_bf16_exp_one_qk_block_of_256(chunk):
    # Dqk 256: mLSTMexp's default output kernel takes the whole d_qk in one block and keeps its chunk
    # states 16-bit (two blocks of 128 need float32 states); against the float32 chunkwise reference
    # at the trained gate ranges, where the states carry.
    batch, heads, seq_len, dqk, dv = 1, 2, 4096, 256, 512
    assert not float32_states("tfla", "exp", dqk, default_config("tfla", dqk, dv, chunk, torch.bfloat16))
    inputs = make_inputs(batch, heads, seq_len, dqk, dv, seed=14, i_range=(-11.0, 2.0), f_range=(-5.0, 12.0))
    inputs[:3] = [x.bfloat16() for x in inputs[:3]]
    weights = make_weights(batch, heads, seq_len, dqk, dv)
    reference = run_with_grads(chunkwise_fp32("exp"), inputs, [], weights, "exp")
    result = run_with_grads(tfla_fn("exp", False, chunk), inputs, [], weights, "exp")
    assert_within_rms(result, reference, BF16_RTOL, GRAD_NAMES)


def tuned_key_id(key):
    target, _, dqk, dv, chunk, dtype, gate = key
    return f"{gate}-Dqk{dqk}-Dv{dv}-L{chunk}-{str(dtype).removeprefix('torch.')}-{target.replace(' ', '_')}"


# The shapes of the paper's figure specs (Fig. 5, 6, 17, tfla_vs_peer): (gate, Dqk, Dv, chunk).
PAPER_SHAPES = sorted(
    {("sig", d, d, 256) for d in (32, 64, 128, 256, 512, 1024)}
    | {("exp", d, d, 128) for d in (32, 64, 128, 256, 512, 1024)}
    | {(gate, 128, 256, chunk) for gate in ("sig", "exp") for chunk in (64, 128, 256, 512, 1024)}
    | {("sig", 256, 512, chunk) for chunk in (64, 128, 256, 512, 1024, 2048, 4096)}
)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", PAPER_SHAPES, ids=lambda s: f"{s[0]}-Dqk{s[1]}-Dv{s[2]}-L{s[3]}")
def test_gpu_the_config_chosen_at_every_paper_shape_matches_the_reference(shape):
    # Whatever config_for picks on this GPU (an entry, the nearest tuned shape carried over, or the
    # default), against the float32 chunkwise reference, output and every gradient, and against the
    # default config's result (the tuning search's check).
    gate, dqk, dv, chunk = shape
    config = config_for("tfla", dqk, dv, chunk, torch.bfloat16, gate, gpu_target(torch.device("cuda")))
    seq_len = max(4 * chunk, 1024)
    inputs = make_inputs(1, 2, seq_len, dqk, dv, seed=15, i_range=(-11.0, 2.0), f_range=(-5.0, 12.0))
    inputs[:3] = [x.to(torch.bfloat16) for x in inputs[:3]]
    weights = make_weights(1, 2, seq_len, dqk, dv)
    reference = run_with_grads(chunkwise_fp32(gate), inputs, [], weights, gate)
    result = run_with_grads(tfla_fn(gate, False, chunk, config), inputs, [], weights, gate)
    default = default_config("tfla", dqk, dv, chunk, torch.bfloat16, gate)
    baseline = run_with_grads(tfla_fn(gate, False, chunk, default), inputs, [], weights, gate)
    assert_config_within_reference(result, baseline, reference, BF16_RTOL, GRAD_NAMES)
    assert_within_rms(result, baseline, dict.fromkeys(BF16_RTOL, BF16_RUN_TO_RUN_RTOL), GRAD_NAMES)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "key", sorted((k for k in config_module.TUNED_CONFIGS if k[1] == "tfla"), key=str), ids=tuned_key_id
)
def test_gpu_every_tuned_config_matches_the_reference(key):
    # Each config of kernels/tuned_configs.json, at its head dims, chunk and dtype (one batch, two
    # heads, four chunks or more), against the float32 chunkwise reference at the trained gate ranges.
    target, _, dqk, dv, chunk, dtype, gate = key
    gpu = gpu_target(torch.device("cuda"))
    if target not in gpu:
        pytest.skip(f"tuned for {target}")
    config = config_module.TUNED_CONFIGS[key]
    # an architecture's entry is this GPU's choice unless an entry for the GPU's name takes its place
    shadowed = target == gpu[0] and (gpu[1], *key[1:]) in config_module.TUNED_CONFIGS
    assert shadowed or config_for("tfla", dqk, dv, chunk, dtype, gate, gpu) == config
    seq_len = max(4 * chunk, 1024)
    inputs = make_inputs(1, 2, seq_len, dqk, dv, seed=15, i_range=(-11.0, 2.0), f_range=(-5.0, 12.0))
    inputs[:3] = [x.to(dtype) for x in inputs[:3]]
    weights = make_weights(1, 2, seq_len, dqk, dv)
    reference = run_with_grads(chunkwise_fp32(gate), inputs, [], weights, gate)
    result = run_with_grads(tfla_fn(gate, False, chunk, config), inputs, [], weights, gate)
    baseline = run_with_grads(
        tfla_fn(gate, False, chunk, default_config("tfla", dqk, dv, chunk, dtype, gate)),
        inputs,
        [],
        weights,
        gate,
    )
    assert result[0].dtype == dtype
    assert_config_within_reference(
        result, baseline, reference, BF16_RTOL if dtype == torch.bfloat16 else FP16_RTOL, GRAD_NAMES
    )


@pytest.mark.gpu
@pytest.mark.parametrize(("gate", "normalize"), [("exp", False), ("sig", False), ("sig", True)])
def test_gpu_fp32_matches_float64_reference(gate, normalize):
    # Compiled kernels (not the interpreter) in float32 with full-precision products: the CPU bound holds.
    check_against_reference(gate, normalize, 2, 3, 1024, 64, 128, 128, seed=10)


# ---- adapters ---------------------------------------------------------------------------------------
def adapter_case(kernel, **changes):
    fields = dict(kernel=kernel, mode="fwbw", dtype="float32", batch=2, seq_len=128, num_heads=2,
                  head_dim_qk=32, head_dim_v=64, chunk_size=64)  # fmt: skip
    return Case(**(fields | changes))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        ({"seq_len": 120}, "seq_len must be a multiple of 16"),
        ({"chunk_size": 48}, "chunk_size must be a power of two"),
        ({"chunk_size": 256}, "larger than seq_len"),
        ({"head_dim_qk": 8}, "head_dim_qk must be a multiple of 16"),
        ({"head_dim_v": 2048}, "head_dim_v must be a multiple of 16 in"),
        ({"params": {"causal": True}}, "unknown param"),
    ],
)
def test_tfla_adapter_check(changes, reason):
    for name in ("tfla_exp", "tfla_sig"):
        adapter = registry.get(name)
        result = adapter.check(adapter_case(name, **changes))
        assert (result is None) if reason is None else (reason in result)
        assert adapter.uses_chunk_size
    assert registry.get("tfla_sig").check(adapter_case("tfla_sig", params={"normalize": True})) is None


def test_tfla_adapter_counts_scale_with_batch_and_mode():
    adapter = registry.get("tfla_sig")
    small, large = adapter_case("tfla_sig", batch=1), adapter_case("tfla_sig", batch=4)
    assert adapter.flops(large, "fw") == pytest.approx(4 * adapter.flops(small, "fw"))
    assert adapter.flops(small, "fwbw") > adapter.flops(small, "fw") > 0
    assert adapter.bytes(small, "fwbw") > adapter.bytes(small, "fw") > 0


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_mlstm_torch_adapter_matches_its_reference(gate):
    adapter = registry.get("mlstm_torch")
    case = adapter_case("mlstm_torch", chunk_size=None, params={"gate": gate})
    assert adapter.check(case) is None
    assert adapter.available() is None and adapter.cpu_capable
    inputs = adapter.make_inputs(case, "cpu")
    out = adapter.forward(inputs)
    out.sum().backward()
    assert inputs["q"].grad is not None
    assert rel_rms(out.detach(), adapter.reference(inputs)) < FP32_RTOL
    assert adapter.flops(case, "fw") > 0 and adapter.bytes(case, "fw") > 0
    assert "gate must be exp or sig" in adapter.check(adapter_case("mlstm_torch", params={"gate": "tanh"}))
