"""The analytic counts pinned against hand arithmetic from the TFLA paper's tables (docs/model_formulas.md).

Every expected value below is written out from the table's formula with the configuration's
numbers substituted, step by step in the comment above it; none calls the code under test.
"""

import math

import pytest

from tfla_bench.errors import UserError
from tfla_bench.model.counts import (
    ATTENTION_BACKWARD,
    LINEAR_RNN_BACKWARD,
    MlstmShape,
    attention_bytes,
    attention_flops,
    check_chunk_size,
    mlstm_bytes,
    mlstm_flops,
)

# Three configurations: T, L, d_qk, d_hv, F_causal, bytes of q/k/v, of the gates i/f and of the states C/n/m.
C1 = dict(
    seq_len=64,
    chunk_size=16,
    head_dim_qk=8,
    head_dim_v=16,
    causal_factor=0.5,
    qkv_bytes=2,
    gate_bytes=2,
    state_bytes=4,
)
C2 = dict(
    seq_len=1024,
    chunk_size=128,
    head_dim_qk=64,
    head_dim_v=128,
    causal_factor=0.66,
    qkv_bytes=2,
    gate_bytes=4,
    state_bytes=2,
)
C3 = dict(
    seq_len=8192,
    chunk_size=64,
    head_dim_qk=256,
    head_dim_v=512,
    causal_factor=1.0,
    qkv_bytes=4,
    gate_bytes=4,
    state_bytes=4,
)
FLOP_KEYS = ("seq_len", "chunk_size", "head_dim_qk", "head_dim_v", "causal_factor")
BYTE_KEYS = ("seq_len", "chunk_size", "head_dim_qk", "head_dim_v", "qkv_bytes", "gate_bytes", "state_bytes")


def _flops(gate, formulation, config):
    return mlstm_flops(gate, formulation, **{k: config[k] for k in FLOP_KEYS})


def _bytes(gate, formulation, config):
    return mlstm_bytes(gate, formulation, **{k: config[k] for k in BYTE_KEYS})


# Chunkwise: T/L chunks times (a*L^2 + b*L + c). Parallel and recurrent: whole-sequence counts.
HAND_FLOPS = [
    # a = 2Fc*dhv + 2Fc*dqk + 8Fc + 1 = 16 + 8 + 4 + 1 = 29
    # b = 2Fc + 4dqk*dhv + 2dhv + 6dqk + 13 = 1 + 512 + 32 + 48 + 13 = 606
    # c = 2dqk*dhv + 2dqk + 5 = 256 + 16 + 5 = 277
    pytest.param("exp", "chunkwise", C1, 4 * (29 * 16**2 + 606 * 16 + 277), id="exp-chunkwise-C1"),
    # a = 2Fc*dhv + 2Fc*dqk + 6Fc + 1 = 16 + 8 + 3 + 1 = 28
    # b = 4dqk*dhv + dhv + 2dqk + 11 = 512 + 16 + 16 + 11 = 555
    # c = 2dqk*dhv + 5 = 256 + 5 = 261
    pytest.param("sig", "chunkwise", C1, 4 * (28 * 16**2 + 555 * 16 + 261), id="sig-chunkwise-C1"),
    # Fc(4T^2 + 2T) = 0.5 * (16384 + 128) = 8256
    # 2Fc*dhv + Fc(2dqk + 2) + 6 = 16 + 9 + 6 = 31
    # T(0.5T + 2.5) = 64 * 34.5
    pytest.param("exp", "parallel", C1, 8256 + 64**2 * 31 + 64 * 34.5, id="exp-parallel-C1"),
    # 2Fc*dhv + Fc(2dqk + 2) + 6 = 16 + 9 + 6 = 31
    # T(0.5T + 4.5) = 64 * 36.5
    pytest.param("sig", "parallel", C1, 64**2 * 31 + 64 * 36.5, id="sig-parallel-C1"),
    # 6dqk*dhv + dhv + 7dqk + 12 = 768 + 16 + 56 + 12 = 852
    pytest.param("exp", "recurrent", C1, 64 * 852, id="exp-recurrent-C1"),
    # 6dqk*dhv + dqk + 2 = 768 + 8 + 2 = 778
    pytest.param("sig", "recurrent", C1, 64 * 778, id="sig-recurrent-C1"),
    # a = 2Fc*dhv + 2Fc*dqk + 8Fc + 1 = 168.96 + 84.48 + 5.28 + 1 = 259.72
    # b = 2Fc + 4dqk*dhv + 2dhv + 6dqk + 13 = 1.32 + 32768 + 256 + 384 + 13 = 33422.32
    # c = 2dqk*dhv + 2dqk + 5 = 16384 + 128 + 5 = 16517
    pytest.param(
        "exp", "chunkwise", C2, 8 * (259.72 * 128**2 + 33422.32 * 128 + 16517), id="exp-chunkwise-C2"
    ),
    # a = 2Fc*dhv + 2Fc*dqk + 6Fc + 1 = 168.96 + 84.48 + 3.96 + 1 = 258.4
    # b = 4dqk*dhv + dhv + 2dqk + 11 = 32768 + 128 + 128 + 11 = 33035
    # c = 2dqk*dhv + 5 = 16384 + 5 = 16389
    pytest.param("sig", "chunkwise", C2, 8 * (258.4 * 128**2 + 33035 * 128 + 16389), id="sig-chunkwise-C2"),
    # Fc(4T^2 + 2T) = 0.66 * (4194304 + 2048) = 2769592.32
    # 2Fc*dhv + Fc(2dqk + 2) + 6 = 168.96 + 85.8 + 6 = 260.76
    # T(0.5T + 2.5) = 1024 * 514.5
    pytest.param("exp", "parallel", C2, 2769592.32 + 1024**2 * 260.76 + 1024 * 514.5, id="exp-parallel-C2"),
    # 2Fc*dhv + Fc(2dqk + 2) + 6 = 168.96 + 85.8 + 6 = 260.76
    # T(0.5T + 4.5) = 1024 * 516.5
    pytest.param("sig", "parallel", C2, 1024**2 * 260.76 + 1024 * 516.5, id="sig-parallel-C2"),
    # 6dqk*dhv + dhv + 7dqk + 12 = 49152 + 128 + 448 + 12 = 49740
    pytest.param("exp", "recurrent", C2, 1024 * 49740, id="exp-recurrent-C2"),
    # 6dqk*dhv + dqk + 2 = 49152 + 64 + 2 = 49218
    pytest.param("sig", "recurrent", C2, 1024 * 49218, id="sig-recurrent-C2"),
    # a = 2Fc*dhv + 2Fc*dqk + 8Fc + 1 = 1024 + 512 + 8 + 1 = 1545
    # b = 2Fc + 4dqk*dhv + 2dhv + 6dqk + 13 = 2 + 524288 + 1024 + 1536 + 13 = 526863
    # c = 2dqk*dhv + 2dqk + 5 = 262144 + 512 + 5 = 262661
    pytest.param("exp", "chunkwise", C3, 128 * (1545 * 64**2 + 526863 * 64 + 262661), id="exp-chunkwise-C3"),
    # a = 2Fc*dhv + 2Fc*dqk + 6Fc + 1 = 1024 + 512 + 6 + 1 = 1543
    # b = 4dqk*dhv + dhv + 2dqk + 11 = 524288 + 512 + 512 + 11 = 525323
    # c = 2dqk*dhv + 5 = 262144 + 5 = 262149
    pytest.param("sig", "chunkwise", C3, 128 * (1543 * 64**2 + 525323 * 64 + 262149), id="sig-chunkwise-C3"),
    # Fc(4T^2 + 2T) = 1 * (268435456 + 16384) = 268451840
    # 2Fc*dhv + Fc(2dqk + 2) + 6 = 1024 + 514 + 6 = 1544
    # T(0.5T + 2.5) = 8192 * 4098.5
    pytest.param("exp", "parallel", C3, 268451840 + 8192**2 * 1544 + 8192 * 4098.5, id="exp-parallel-C3"),
    # 2Fc*dhv + Fc(2dqk + 2) + 6 = 1024 + 514 + 6 = 1544
    # T(0.5T + 4.5) = 8192 * 4100.5
    pytest.param("sig", "parallel", C3, 8192**2 * 1544 + 8192 * 4100.5, id="sig-parallel-C3"),
    # 6dqk*dhv + dhv + 7dqk + 12 = 786432 + 512 + 1792 + 12 = 788748
    pytest.param("exp", "recurrent", C3, 8192 * 788748, id="exp-recurrent-C3"),
    # 6dqk*dhv + dqk + 2 = 786432 + 256 + 2 = 786690
    pytest.param("sig", "recurrent", C3, 8192 * 786690, id="sig-recurrent-C3"),
]

HAND_BYTES = [
    # per chunk: 4L*b_if + 3L*b_qkv(dhv + dqk) + 2b_Cmn(L + dqk*dhv + dqk + 1)
    # = 128 + 2304 + 8 * (16 + 128 + 8 + 1) = 3656
    pytest.param("exp", "chunkwise", C1, 4 * 3656, id="exp-chunkwise-C1"),
    # per chunk: 4L*b_if + 3L*b_qkv(dhv + dqk) + 2b_Cmn*dqk*dhv
    # = 128 + 2304 + 1024 = 3456
    pytest.param("sig", "chunkwise", C1, 4 * 3456, id="sig-chunkwise-C1"),
    # b_Cmn + b_if + b_qkv(dhv + dqk) = 4 + 2 + 48 = 54
    pytest.param("exp", "parallel", C1, 2 * 64 * 54, id="exp-parallel-C1"),
    # b_if + b_qkv(dhv + dqk) = 2 + 48 = 50
    pytest.param("sig", "parallel", C1, 2 * 64 * 50, id="sig-parallel-C1"),
    # 2b_Cmn(dqk*dhv + dqk + 1) + 2b_if + 2b_qkv(dhv + dqk) = 1096 + 4 + 96 = 1196
    pytest.param("exp", "recurrent", C1, 64 * 1196, id="exp-recurrent-C1"),
    # 2b_Cmn*dqk*dhv + 2b_if + 2b_qkv(dhv + dqk) = 1024 + 4 + 96 = 1124
    pytest.param("sig", "recurrent", C1, 64 * 1124, id="sig-recurrent-C1"),
    # per chunk: 4L*b_if + 3L*b_qkv(dhv + dqk) + 2b_Cmn(L + dqk*dhv + dqk + 1)
    # = 2048 + 147456 + 4 * (128 + 8192 + 64 + 1) = 183044
    pytest.param("exp", "chunkwise", C2, 8 * 183044, id="exp-chunkwise-C2"),
    # per chunk: 4L*b_if + 3L*b_qkv(dhv + dqk) + 2b_Cmn*dqk*dhv
    # = 2048 + 147456 + 32768 = 182272
    pytest.param("sig", "chunkwise", C2, 8 * 182272, id="sig-chunkwise-C2"),
    # b_Cmn + b_if + b_qkv(dhv + dqk) = 2 + 4 + 384 = 390
    pytest.param("exp", "parallel", C2, 2 * 1024 * 390, id="exp-parallel-C2"),
    # b_if + b_qkv(dhv + dqk) = 4 + 384 = 388
    pytest.param("sig", "parallel", C2, 2 * 1024 * 388, id="sig-parallel-C2"),
    # 2b_Cmn(dqk*dhv + dqk + 1) + 2b_if + 2b_qkv(dhv + dqk) = 33028 + 8 + 768 = 33804
    pytest.param("exp", "recurrent", C2, 1024 * 33804, id="exp-recurrent-C2"),
    # 2b_Cmn*dqk*dhv + 2b_if + 2b_qkv(dhv + dqk) = 32768 + 8 + 768 = 33544
    pytest.param("sig", "recurrent", C2, 1024 * 33544, id="sig-recurrent-C2"),
    # per chunk: 4L*b_if + 3L*b_qkv(dhv + dqk) + 2b_Cmn(L + dqk*dhv + dqk + 1)
    # = 1024 + 589824 + 8 * (64 + 131072 + 256 + 1) = 1641992
    pytest.param("exp", "chunkwise", C3, 128 * 1641992, id="exp-chunkwise-C3"),
    # per chunk: 4L*b_if + 3L*b_qkv(dhv + dqk) + 2b_Cmn*dqk*dhv
    # = 1024 + 589824 + 1048576 = 1639424
    pytest.param("sig", "chunkwise", C3, 128 * 1639424, id="sig-chunkwise-C3"),
    # b_Cmn + b_if + b_qkv(dhv + dqk) = 4 + 4 + 3072 = 3080
    pytest.param("exp", "parallel", C3, 2 * 8192 * 3080, id="exp-parallel-C3"),
    # b_if + b_qkv(dhv + dqk) = 4 + 3072 = 3076
    pytest.param("sig", "parallel", C3, 2 * 8192 * 3076, id="sig-parallel-C3"),
    # 2b_Cmn(dqk*dhv + dqk + 1) + 2b_if + 2b_qkv(dhv + dqk) = 1050632 + 8 + 6144 = 1056784
    pytest.param("exp", "recurrent", C3, 8192 * 1056784, id="exp-recurrent-C3"),
    # 2b_Cmn*dqk*dhv + 2b_if + 2b_qkv(dhv + dqk) = 1048576 + 8 + 6144 = 1054728
    pytest.param("sig", "recurrent", C3, 8192 * 1054728, id="sig-recurrent-C3"),
]


@pytest.mark.parametrize(("gate", "formulation", "config", "expected"), HAND_FLOPS)
def test_mlstm_flops_match_hand_counts(gate, formulation, config, expected):
    assert _flops(gate, formulation, config) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("gate", "formulation", "config", "expected"), HAND_BYTES)
def test_mlstm_bytes_match_hand_counts(gate, formulation, config, expected):
    assert _bytes(gate, formulation, config) == pytest.approx(expected, rel=1e-12)


def test_parallel_and_recurrent_ignore_the_chunk_size():
    for formulation in ("parallel", "recurrent"):
        with_chunk = _flops("sig", formulation, C1)
        without = mlstm_flops("sig", formulation, seq_len=64, chunk_size=None, head_dim_qk=8, head_dim_v=16)
        assert with_chunk == without


def test_shape_counts_scale_with_batch_and_heads():
    # C1, sig chunkwise: 4 * (28 * 16**2 + 555 * 16 + 261) = 65236 FLOPs and 4 * 3456 = 13824 bytes per head.
    shape = MlstmShape("sig", 64, 8, 16, batch=3, heads=5)
    assert shape.flops("chunkwise", 16) == 3 * 5 * 65236
    assert shape.bytes_moved("chunkwise", 16) == 3 * 5 * 13824


@pytest.mark.parametrize(
    ("seq_len", "dqk", "dv", "causal", "expected_flops", "expected_bytes"),
    [
        # 4 T^2 D Fc = 4 * 16384 * 64 * 0.5; bytes T (2 Dqk + 2 Dv) b = 128 * 256 * 2
        (128, 64, 64, 0.5, 2097152, 65536),
        # 2 T^2 (Dqk + Dv) Fc = 2 * 65536 * 192 * 1.0; bytes 256 * (128 + 256) * 2
        (256, 64, 128, 1.0, 25165824, 196608),
        # 4 T^2 D Fc = 4 * 8192**2 * 128 * 0.5 = 17179869184; bytes 8192 * 512 * 2
        (8192, 128, 128, 0.5, 17179869184, 8388608),
    ],
)
def test_attention_counts_match_hand_counts(seq_len, dqk, dv, causal, expected_flops, expected_bytes):
    assert (
        attention_flops(seq_len=seq_len, head_dim_qk=dqk, head_dim_v=dv, causal_factor=causal)
        == expected_flops
    )
    assert attention_bytes(seq_len=seq_len, head_dim_qk=dqk, head_dim_v=dv) == expected_bytes


def test_fwbw_totals_add_the_backward_factor():
    assert ATTENTION_BACKWARD.flops == 2.5
    assert ATTENTION_BACKWARD.total_flops(100.0, "fw") == 100.0
    assert ATTENTION_BACKWARD.total_flops(100.0, "fwbw") == 350.0
    assert LINEAR_RNN_BACKWARD.total_flops(100.0, "fwbw") == 100.0 * (1 + LINEAR_RNN_BACKWARD.flops)
    assert ATTENTION_BACKWARD.total_bytes(10.0, "fwbw") == 30.0
    assert LINEAR_RNN_BACKWARD.total_bytes(10.0, "fwbw") == 10.0 * (1 + LINEAR_RNN_BACKWARD.bytes)
    with pytest.raises(ValueError, match="mode"):
        LINEAR_RNN_BACKWARD.total_flops(1.0, "bw")


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.parametrize(("dqk", "dhv"), [(256, 512), (128, 256), (64, 128)])
def test_chunkwise_flops_move_from_recurrent_to_parallel(gate, dqk, dhv):
    """Paper Fig. 18: L = 1 matches the recurrent count, L = T the parallel count."""
    seq_len = 8192
    dims = dict(seq_len=seq_len, head_dim_qk=dqk, head_dim_v=dhv)
    recurrent = mlstm_flops(gate, "recurrent", chunk_size=None, **dims)
    parallel = mlstm_flops(gate, "parallel", chunk_size=None, **dims)
    chunks = [2**k for k in range(14)]
    chunkwise = [mlstm_flops(gate, "chunkwise", chunk_size=c, **dims) for c in chunks]
    assert chunkwise[0] == pytest.approx(recurrent, rel=0.01)
    # At L = T the chunkwise count keeps its inter-chunk term 4*dqk*dhv*T: within 10 % of the parallel count.
    assert chunkwise[-1] == pytest.approx(parallel, rel=0.1)
    # Past the FLOP optimum every doubling of L brings the count closer to the parallel one.
    start = min(range(len(chunks)), key=chunkwise.__getitem__)
    gaps = [abs(value - parallel) for value in chunkwise[start:]]
    assert all(later < earlier for earlier, later in zip(gaps, gaps[1:], strict=False))
    assert start > 0 and chunkwise[start] < min(recurrent, parallel)


def test_exp_counts_exceed_sig_counts_slightly():
    """Paper appendix F: mLSTMexp needs < 2 % more FLOPs at d = 64 and about 0.2 % more at d = 512."""
    for d, bound in ((64, 0.02), (512, 0.003)):
        dims = dict(seq_len=8192, chunk_size=64, head_dim_qk=d, head_dim_v=d)
        ratio = mlstm_flops("exp", "chunkwise", **dims) / mlstm_flops("sig", "chunkwise", **dims)
        assert 1 < ratio < 1 + bound


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(head_dim_qk=0), "head_dim_qk"),
        (dict(head_dim_v=-4), "head_dim_v"),
        (dict(seq_len=0), "seq_len"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(chunk_size=128), "larger than the sequence length"),
        (dict(chunk_size=None), "needs a chunk size"),
        (dict(causal_factor=1.5), "causal_factor"),
        (dict(causal_factor=math.nan), "causal_factor"),
    ],
)
def test_bad_flop_arguments_raise_user_errors(changes, message):
    arguments = {k: C1[k] for k in FLOP_KEYS} | changes
    with pytest.raises(UserError, match=message):
        mlstm_flops("sig", "chunkwise", **arguments)


def test_bad_names_and_byte_sizes_raise_user_errors():
    with pytest.raises(UserError, match="gate"):
        _flops("tanh", "chunkwise", C1)
    with pytest.raises(UserError, match="formulation"):
        _bytes("sig", "blocked", C1)
    with pytest.raises(UserError, match="state_bytes"):
        _bytes("exp", "recurrent", C1 | dict(state_bytes=0))
    with pytest.raises(UserError, match="heads"):
        MlstmShape("sig", 64, 8, 16, heads=0)


def test_check_chunk_size_rules():
    check_chunk_size(96, 32)
    for chunk, message in ((0, "positive"), (-8, "positive"), (192, "larger"), (64, "does not divide")):
        with pytest.raises(UserError, match=message):
            check_chunk_size(96, chunk)
