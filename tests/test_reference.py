"""The PyTorch references agree with each other and with the formulas they implement (float64), and
the gate functions of `gates.py` do what they say."""

import math

import pytest
import torch
import torch.nn.functional as F

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.kernels.gates import chunk_gates, log_gates, reverse_cumsum
from tfla_bench.kernels.reference import (
    decay_linear_attention,
    mlstm_chunkwise,
    mlstm_parallel,
    mlstm_recurrent,
    softmax_attention,
    ssd_reference,
    state_names,
    zero_state,
)

# float64 formulations of the same function differ only by rounding: ~1e-13 relative.
FP64_RTOL = 1e-10
CONFIGS = [("exp", False), ("sig", False), ("sig", True)]
CONFIG_IDS = ["exp", "sig", "sig-normalize"]


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm()).item()


def make_inputs(batch=2, heads=3, seq_len=40, dqk=8, dv=12, seed=0, f_shift=2.0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k = randn(batch, heads, seq_len, dqk), randn(batch, heads, seq_len, dqk)
    v = randn(batch, heads, seq_len, dv)
    i, f = 3 * randn(batch, heads, seq_len), 3 * randn(batch, heads, seq_len) + f_shift
    return q, k, v, i, f


def random_state(gate, normalize, batch=2, heads=3, dqk=8, dv=12, seed=1):
    gen = torch.Generator().manual_seed(seed)
    parts = {
        "C": torch.randn(batch, heads, dqk, dv, generator=gen, dtype=torch.float64),
        "n": torch.rand(batch, heads, dqk, generator=gen, dtype=torch.float64),
        "m": torch.randn(batch, heads, generator=gen, dtype=torch.float64),
    }
    return tuple(parts[name] for name in state_names(gate, normalize))


@pytest.mark.parametrize(("gate", "normalize"), CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("with_state", [False, True], ids=["empty", "state"])
@pytest.mark.parametrize("chunk_size", [16, 40], ids=["L16-partial", "L40-whole"])
def test_formulations_agree(gate, normalize, with_state, chunk_size):
    q, k, v, i, f = make_inputs()
    state = random_state(gate, normalize) if with_state else None
    h_rec, s_rec = mlstm_recurrent(q, k, v, i, f, gate=gate, normalize=normalize, initial_state=state)
    h_par, s_par = mlstm_parallel(q, k, v, i, f, gate=gate, normalize=normalize, initial_state=state)
    h_chk, s_chk = mlstm_chunkwise(
        q, k, v, i, f, gate=gate, normalize=normalize, initial_state=state, chunk_size=chunk_size
    )
    assert rel_rms(h_par, h_rec) < FP64_RTOL
    assert rel_rms(h_chk, h_rec) < FP64_RTOL
    assert len(s_rec) == len(s_par) == len(s_chk) == len(state_names(gate, normalize))
    for a, b, c in zip(s_rec, s_par, s_chk, strict=True):
        assert rel_rms(b, a) < FP64_RTOL
        assert rel_rms(c, a) < FP64_RTOL


@pytest.mark.parametrize(("gate", "normalize"), CONFIGS, ids=CONFIG_IDS)
def test_formulations_have_the_same_gradients(gate, normalize):
    inputs = [x.requires_grad_() for x in make_inputs(seq_len=24)]
    weights = torch.randn(2, 3, 24, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    grads = []
    for fn in (mlstm_recurrent, mlstm_parallel, lambda *a, **kw: mlstm_chunkwise(*a, chunk_size=8, **kw)):
        h, _ = fn(*inputs, gate=gate, normalize=normalize)
        grads.append(torch.autograd.grad((h * weights).sum(), inputs))
    for other in grads[1:]:
        for a, b in zip(other, grads[0], strict=True):
            assert rel_rms(a, b) < FP64_RTOL


@pytest.mark.parametrize(("gate", "normalize"), CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("fn", [mlstm_recurrent, mlstm_parallel], ids=["recurrent", "parallel"])
def test_state_passing(gate, normalize, fn):
    q, k, v, i, f = make_inputs()
    h_full, s_full = fn(q, k, v, i, f, gate=gate, normalize=normalize)
    split = 17
    h_a, s_a = fn(
        q[:, :, :split],
        k[:, :, :split],
        v[:, :, :split],
        i[..., :split],
        f[..., :split],
        gate=gate,
        normalize=normalize,
    )
    h_b, s_b = fn(
        q[:, :, split:],
        k[:, :, split:],
        v[:, :, split:],
        i[..., split:],
        f[..., split:],
        gate=gate,
        normalize=normalize,
        initial_state=s_a,
    )
    assert rel_rms(torch.cat([h_a, h_b], dim=2), h_full) < FP64_RTOL
    for a, b in zip(s_b, s_full, strict=True):
        assert rel_rms(a, b) < FP64_RTOL


def test_exp_output_does_not_depend_on_the_initial_max_state():
    # With an empty memory numerator and denominator scale together, so m_0 = 0 and m_0 = -inf
    # (the default) give the same h when eps = 0; the returned (C, n, m) differ but C * exp(m) agrees.
    q, k, v, i, f = make_inputs()
    i, f = i - 10, f + 10  # small input gates, long memory: the two max-state conventions stay apart
    h_default, (C_a, _, m_a) = mlstm_recurrent(q, k, v, i, f, gate="exp", eps=0.0)
    C0, n0, _ = zero_state(2, 3, 8, 12, gate="exp", dtype=torch.float64)
    h_zero, (C_b, _, m_b) = mlstm_recurrent(
        q, k, v, i, f, gate="exp", eps=0.0, initial_state=(C0, n0, torch.zeros(2, 3, dtype=torch.float64))
    )
    assert rel_rms(h_zero, h_default) < FP64_RTOL
    assert not torch.equal(m_a, m_b)
    unstabilized = C_a * m_a.exp()[..., None, None]
    assert rel_rms(C_b * m_b.exp()[..., None, None], unstabilized) < FP64_RTOL


def test_exp_trained_gate_ranges_stay_finite_in_float32():
    # The paper's trained ranges: input gates near -10, forget gates from -5 to 12.
    q, k, v, _, _ = make_inputs(seq_len=64)
    gen = torch.Generator().manual_seed(3)
    i = -10 + torch.rand(2, 3, 64, generator=gen, dtype=torch.float64)
    f = -5 + 17 * torch.rand(2, 3, 64, generator=gen, dtype=torch.float64)
    h64, _ = mlstm_recurrent(q, k, v, i, f, gate="exp")
    h32, _ = mlstm_chunkwise(q.float(), k.float(), v.float(), i.float(), f.float(), gate="exp", chunk_size=16)
    assert torch.isfinite(h32).all()
    assert rel_rms(h32.double(), h64) < 1e-5


def test_scale_invariant_loss_makes_dropping_the_denominator_gradient_exact():
    # The identity the TFLA backward relies on (appendix B.3): through an RMS-normalized output,
    # the gradients w.r.t. the log gates are d log_i_j = k_j . dk_j and
    # d log_f_s = sum_{t >= s} (q_t . dq_t - k_t . dk_t).
    q, k, v, i, f = (x.requires_grad_() for x in make_inputs(seq_len=24))
    h, _ = mlstm_parallel(q, k, v, i, f, gate="exp")
    weights = torch.randn(h.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    loss = (h / h.pow(2).mean(-1, keepdim=True).sqrt() * weights).sum()
    dq, dk, di, df = torch.autograd.grad(loss, [q, k, i, f])
    kdk, qdq = (k * dk).sum(-1), (q * dq).sum(-1)
    assert rel_rms(kdk, di) < FP64_RTOL  # log_i = i for the exponential input gate
    # log_f = log sigmoid(f), whose derivative is sigmoid(-f)
    assert rel_rms(reverse_cumsum(qdq - kdk) * torch.sigmoid(-f), df) < FP64_RTOL


@pytest.mark.parametrize("seq_len", [32, 37])
def test_chunk_gates(seq_len):
    gen = torch.Generator().manual_seed(0)
    log_i, log_f = log_gates(
        torch.randn(2, seq_len, generator=gen), torch.randn(2, seq_len, generator=gen), "sig"
    )
    gates = chunk_gates(log_i, log_f, 8)
    n_chunks = -(-seq_len // 8)
    assert gates.g.shape == gates.a_max.shape == (2, n_chunks)
    for c in range(n_chunks):
        span = slice(8 * c, min(8 * c + 8, seq_len))
        b = log_f[:, span].cumsum(-1)
        torch.testing.assert_close(gates.b[:, span], b)
        torch.testing.assert_close(gates.g[:, c], b[:, -1])
        a = b[:, -1:] - b + log_i[:, span]
        torch.testing.assert_close(gates.a[:, span], a)
        torch.testing.assert_close(gates.a_max[:, c], a.amax(-1))


def test_log_gates():
    i, f = torch.tensor([-10.0, 0.0, 3.0]), torch.tensor([-5.0, 0.0, 12.0])
    log_i, log_f = log_gates(i, f, "exp")
    torch.testing.assert_close(log_i, i)
    torch.testing.assert_close(log_f, torch.sigmoid(f).log())
    log_i_sig, _ = log_gates(i, f, "sig")
    torch.testing.assert_close(log_i_sig, torch.sigmoid(i).log())
    assert log_gates(i.double(), f, "sig")[0].dtype == torch.float64
    with pytest.raises(ValueError, match="gate"):
        log_gates(i, f, "relu")


def test_reverse_cumsum_is_the_adjoint_of_cumsum():
    x, y = torch.randn(3, 11, dtype=torch.float64), torch.randn(3, 11, dtype=torch.float64)
    assert torch.allclose((x.cumsum(-1) * y).sum(), (x * reverse_cumsum(y)).sum())


def test_wrong_initial_state_is_rejected():
    q, k, v, i, f = make_inputs()
    with pytest.raises(ValueError, match="initial_state"):
        mlstm_recurrent(q, k, v, i, f, gate="exp", initial_state=(torch.zeros(2, 3, 8, 12),))


EXACT = 1e-10  # float64 formulas of the same function agree to rounding


def rand(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def causal_mask(seq_len):
    return torch.ones(seq_len, seq_len, dtype=torch.bool).tril()


def test_zero_decay_is_causal_linear_attention():
    q, k, v = rand(2, 3, 9, 4), rand(2, 3, 9, 4), rand(2, 3, 9, 5)
    expected = ((q @ k.transpose(-1, -2)) * causal_mask(9)) @ v * 0.5
    out = decay_linear_attention(q, k, v, torch.zeros(2, 3, 9), scale=0.5)
    torch.testing.assert_close(out, expected, rtol=EXACT, atol=EXACT)


def test_constant_decay_is_the_lightning_decay_mask():
    q, k, v = rand(1, 2, 12, 4), rand(1, 2, 12, 4), rand(1, 2, 12, 4)
    slopes = torch.tensor([0.5, 0.125], dtype=torch.float64)
    distance = (torch.arange(12)[:, None] - torch.arange(12)[None, :]).to(torch.float64)
    mask = torch.exp(-slopes[:, None, None] * distance) * causal_mask(12)
    expected = ((q @ k.transpose(-1, -2)) * mask) @ v
    log_decay = (-slopes[None, :, None]).expand(1, 2, 12)
    torch.testing.assert_close(decay_linear_attention(q, k, v, log_decay), expected, rtol=EXACT, atol=EXACT)


def test_per_channel_decay_is_gla_parallel_form():
    q, k, v = rand(1, 2, 10, 3), rand(1, 2, 10, 3), rand(1, 2, 10, 4)
    g = F.logsigmoid(rand(1, 2, 10, 3))
    cum = g.cumsum(2)  # G_t = sum_{s <= t} g_s, per channel
    # o_t = sum_{s <= t} sum_c q_tc k_sc exp(G_tc - G_sc) v_s
    scores = torch.einsum("bhtc,bhsc,bhtsc->bhts", q, k, torch.exp(cum[:, :, :, None] - cum[:, :, None, :]))
    expected = (scores * causal_mask(10)) @ v
    torch.testing.assert_close(decay_linear_attention(q, k, v, g), expected, rtol=EXACT, atol=EXACT)


def test_channel_uniform_decay_equals_scalar_decay():
    q, k, v = rand(2, 2, 7, 3), rand(2, 2, 7, 3), rand(2, 2, 7, 2)
    g = F.logsigmoid(rand(2, 2, 7))
    scalar = decay_linear_attention(q, k, v, g)
    per_channel = decay_linear_attention(q, k, v, g[..., None].expand(-1, -1, -1, 3))
    torch.testing.assert_close(scalar, per_channel, rtol=EXACT, atol=EXACT)


def test_ssd_reference_is_the_ssd_sum():
    batch, seq_len, heads, groups, state, head_dim = 1, 8, 4, 2, 3, 2
    x = rand(batch, seq_len, heads, head_dim)
    dt = torch.rand(batch, seq_len, heads, dtype=torch.float64) * 0.1
    a = -torch.rand(heads, dtype=torch.float64) * 4
    b, c = rand(batch, seq_len, groups, state), rand(batch, seq_len, groups, state)
    out = ssd_reference(x, dt, a, b, c)
    expected = torch.zeros_like(out)
    for h in range(heads):
        grp = h // (heads // groups)
        for t in range(seq_len):
            for s in range(t + 1):
                decay = torch.exp(a[h] * dt[0, s + 1 : t + 1, h].sum())
                weight = (c[0, t, grp] @ b[0, s, grp]) * dt[0, s, h] * decay
                expected[0, t, h] += weight * x[0, s, h]
    torch.testing.assert_close(out, expected, rtol=EXACT, atol=EXACT)


def test_selective_scan_reference_is_the_mamba_recurrence():
    adapter = registry.get("mamba")
    inputs = adapter.make_inputs(Case("mamba", "fw", "float32", 1, 6, 1, 3, 2), "cpu")
    u, delta, z = (inputs[name].double()[0] for name in ("u", "delta", "z"))
    a, b, c, d = (inputs[name].double() for name in ("A", "B", "C", "D"))
    state = torch.zeros(2, 3, dtype=torch.float64)
    expected = torch.zeros(2, 6, dtype=torch.float64)
    for t in range(6):  # h = exp(delta A) h + delta B u; y = C h + D u; out = y silu(z)
        state = torch.exp(delta[:, t, None] * a) * state + delta[:, t, None] * b[0, :, t] * u[:, t, None]
        expected[:, t] = (state @ c[0, :, t] + d * u[:, t]) * F.silu(z[:, t])
    torch.testing.assert_close(adapter.reference(inputs)[0], expected, rtol=EXACT, atol=EXACT)


def test_split_conv_reference_with_an_identity_conv():
    adapter = registry.get("mamba2_split_conv")
    inputs = adapter.make_inputs(Case("mamba2_split_conv", "fw", "float32", 1, 16, 2, 4, 3, 16), "cpu")
    weight = torch.zeros_like(inputs["conv1d_weight"])
    weight[:, -1] = 1.0  # the last tap multiplies the current token: conv = identity
    inputs.update(conv1d_weight=weight, conv1d_bias=torch.zeros_like(inputs["conv1d_bias"]))
    z, xbc, dt_raw = torch.split(inputs["zxbcdt"].double(), [6, 6 + 8, 2], dim=-1)
    x, b, c = torch.split(F.silu(xbc), [6, 4, 4], dim=-1)
    x = x.unflatten(-1, (2, 3))
    dt = F.softplus(dt_raw + inputs["dt_bias"].double())
    y = ssd_reference(x, dt, inputs["A"], b[:, :, None], c[:, :, None]) + x
    expected = (y * F.silu(z.unflatten(-1, (2, 3)))).flatten(-2)
    torch.testing.assert_close(adapter.reference(inputs), expected, rtol=EXACT, atol=EXACT)


@pytest.mark.parametrize("causal", [True, False])
def test_softmax_attention(causal):
    q, k, v = rand(1, 2, 6, 4), rand(1, 2, 6, 4), rand(1, 2, 6, 3)
    scores = q @ k.transpose(-1, -2) / 2.0
    if causal:
        scores = scores.masked_fill(~causal_mask(6), -math.inf)
    expected = torch.softmax(scores, -1) @ v
    out = softmax_attention(q, k, v, causal=causal)
    torch.testing.assert_close(out, expected, rtol=EXACT, atol=EXACT)
