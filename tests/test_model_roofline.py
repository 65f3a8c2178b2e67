"""Runtime bounds, intensity, roofline, optimal chunk sizes and accelerator specs of the analytic model."""

import math

import pytest

from tfla_bench.errors import UserError
from tfla_bench.model.counts import MlstmShape, mlstm_bytes, mlstm_flops
from tfla_bench.model.hardware import (
    ACCELERATORS,
    Accelerator,
    detect_accelerator,
    get_accelerator,
    resolve_accelerator,
)
from tfla_bench.model.roofline import (
    Estimate,
    argmin_chunk_size,
    best_power_of_two_chunk_size,
    chunk_optima,
    chunkwise_runtime_s,
    flop_optimal_chunk_size,
    power_of_two_chunk_sizes,
    roofline_flops_per_s,
    runtime_ms_lower,
    runtime_ms_upper,
    runtime_optimal_chunk_size,
)

TOY = Accelerator("toy", peak_flops_per_s=1e15, bandwidth_bytes_per_s=1e12)


def test_runtime_bounds_intensity_and_roofline_by_hand():
    # 2e12 FLOPs / 1e15 FLOP/s = 2 ms; 1e9 bytes / 1e12 bytes/s = 1 ms.
    estimate = Estimate(flops=2e12, bytes_moved=1e9, accelerator=TOY)
    assert estimate.compute_ms == pytest.approx(2.0)
    assert estimate.memory_ms == pytest.approx(1.0)
    assert estimate.runtime_ms_lower == pytest.approx(2.0)
    assert estimate.runtime_ms_upper == pytest.approx(3.0)
    assert runtime_ms_lower(2e12, 1e9, TOY) == pytest.approx(2.0)
    assert runtime_ms_upper(2e12, 1e9, TOY) == pytest.approx(3.0)
    assert estimate.arithmetic_intensity == pytest.approx(2000.0)
    assert estimate.bound == "compute"
    assert estimate.roofline_flops_per_s == pytest.approx(1e15)
    # 1e11 FLOPs over 1e10 bytes: intensity 10 < ridge 1000, roofline 1e12 * 10 = 1e13 FLOP/s.
    memory_bound = Estimate(flops=1e11, bytes_moved=1e10, accelerator=TOY)
    assert memory_bound.bound == "memory"
    assert memory_bound.roofline_flops_per_s == pytest.approx(1e13)
    assert memory_bound.runtime_ms_lower == pytest.approx(10.0)
    assert memory_bound.runtime_ms_upper == pytest.approx(10.1)


def test_roofline_meets_at_the_ridge_point():
    ridge = TOY.intensity_flops_per_byte
    assert ridge == pytest.approx(1000.0)
    assert roofline_flops_per_s(ridge, TOY) == pytest.approx(TOY.peak_flops_per_s)
    assert roofline_flops_per_s(ridge / 2, TOY) == pytest.approx(TOY.peak_flops_per_s / 2)
    assert roofline_flops_per_s(ridge * 2, TOY) == pytest.approx(TOY.peak_flops_per_s)


def _paper_flop_optimum(dhv, p_qk, fc):
    """Paper eq. 113 (mLSTMsig), written out independently of the coefficients."""
    return math.sqrt((2 * dhv**2 * p_qk + 5) / (2 * fc * (dhv * (1 + p_qk) + 3) + 1))


def _paper_runtime_optimum(dhv, p_qk, fc, i_acc, state_bytes):
    """Paper eq. 120 (mLSTMsig, no overlap)."""
    numerator = 2 * dhv**2 * p_qk + 5 + 2 * i_acc * dhv**2 * p_qk * state_bytes
    return math.sqrt(numerator / (2 * fc * (dhv * (1 + p_qk) + 3) + 1))


@pytest.mark.parametrize(
    ("dhv", "p_qk", "fc"), [(512, 0.5, 0.5), (256, 1.0, 0.66), (128, 0.5, 1.0), (1024, 0.25, 0.5)]
)
def test_closed_forms_match_the_papers_equations(dhv, p_qk, fc):
    shape = MlstmShape("sig", 2**20, int(p_qk * dhv), dhv, causal_factor=fc, state_bytes=2)
    assert flop_optimal_chunk_size(shape.flop_terms(), shape.seq_len) == pytest.approx(
        _paper_flop_optimum(dhv, p_qk, fc), rel=1e-12
    )
    for accelerator in ACCELERATORS.values():
        closed = runtime_optimal_chunk_size(
            shape.flop_terms(), shape.byte_terms(), accelerator, shape.seq_len
        )
        paper = _paper_runtime_optimum(dhv, p_qk, fc, accelerator.intensity_flops_per_byte, 2)
        assert closed == pytest.approx(paper, rel=1e-12)


def test_paper_value_of_the_flop_optimum():
    # Eq. 113, d_hv = 512, p_qk = 0.5, F_c = 0.5: (2*512^2*0.5 + 5) / (2*0.5*(768 + 3) + 1) = 262149 / 772.
    shape = MlstmShape("sig", 8192, 256, 512)
    assert flop_optimal_chunk_size(shape.flop_terms(), 8192) == pytest.approx(
        math.sqrt(262149 / 772), rel=1e-12
    )


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.parametrize(
    ("seq_len", "dqk", "dhv", "fc", "state_bytes"),
    [(8192, 256, 512, 0.5, 4), (65536, 128, 256, 0.66, 2), (4096, 64, 64, 1.0, 4), (32768, 512, 512, 0.5, 2)],
)
def test_closed_form_optima_agree_with_the_numeric_argmin(gate, seq_len, dqk, dhv, fc, state_bytes):
    shape = MlstmShape(gate, seq_len, dqk, dhv, causal_factor=fc, state_bytes=state_bytes)
    for accelerator in ACCELERATORS.values():
        optima = chunk_optima(shape.flop_terms(), shape.byte_terms(), accelerator, seq_len)
        assert optima.flop_optimal_chunk_size_numeric == pytest.approx(
            optima.flop_optimal_chunk_size, rel=1e-3
        )
        assert optima.runtime_optimal_chunk_size_numeric == pytest.approx(
            optima.runtime_optimal_chunk_size, rel=1e-3
        )
        assert 1 < optima.flop_optimal_chunk_size < optima.runtime_optimal_chunk_size < seq_len


def test_optimum_beyond_the_sequence_is_clipped_to_t():
    shape = MlstmShape("sig", 64, 256, 512)
    optima = chunk_optima(shape.flop_terms(), shape.byte_terms(), get_accelerator("b200"), 64)
    assert optima.runtime_optimal_chunk_size == 64
    assert optima.runtime_optimal_chunk_size_numeric == pytest.approx(64, rel=1e-6)
    assert optima.best_power_of_two_chunk_size == 64


def test_argmin_of_a_known_function():
    # x + 400/x has its minimum at x = 20; a cost rising everywhere has it at the left end.
    assert argmin_chunk_size(lambda x: x + 400 / x, 1000) == pytest.approx(20, rel=1e-6)
    assert argmin_chunk_size(lambda x: x, 1000) == pytest.approx(1, rel=1e-6)
    assert argmin_chunk_size(lambda x: x, 1) == 1.0


def test_best_power_of_two_is_the_best_divisor():
    assert power_of_two_chunk_sizes(96) == [1, 2, 4, 8, 16, 32]
    assert power_of_two_chunk_sizes(4096)[-1] == 4096
    # (x - 40)^2 over the powers of two dividing 96: 32 wins (64 does not divide 96).
    assert best_power_of_two_chunk_size(lambda x: (x - 40) ** 2, 96) == 32
    shape = MlstmShape("sig", 8192, 256, 512, batch=8, heads=8)
    h100 = get_accelerator("h100")

    def runtime(chunk):
        return chunkwise_runtime_s(shape.flop_terms(), shape.byte_terms(), h100, 8192, chunk)

    best = best_power_of_two_chunk_size(runtime, 8192)
    assert runtime(best) == min(runtime(2**k) for k in range(14))
    optimum = runtime_optimal_chunk_size(shape.flop_terms(), shape.byte_terms(), h100, 8192)
    assert best in (2 ** math.floor(math.log2(optimum)), 2 ** math.ceil(math.log2(optimum)))


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.parametrize("state_bytes", [2, 4])
def test_intensity_grows_with_the_chunk_size(gate, state_bytes):
    """Paper eq. 119 / Fig. 21."""
    dims = dict(seq_len=8192, head_dim_qk=256, head_dim_v=512)
    intensities = [
        mlstm_flops(gate, "chunkwise", chunk_size=2**k, **dims)
        / mlstm_bytes(gate, "chunkwise", chunk_size=2**k, state_bytes=state_bytes, **dims)
        for k in range(14)
    ]
    assert all(later > earlier for earlier, later in zip(intensities, intensities[1:], strict=False))
    # Small chunks are memory-bound and large chunks compute-bound on every GPU of the table.
    for accelerator in ACCELERATORS.values():
        assert intensities[0] < accelerator.intensity_flops_per_byte < intensities[-1]


def test_runtime_optimal_chunk_grows_as_sqrt_of_head_dim():
    """Paper Fig. 24: L_opt,Runtime = O(sqrt(d_hv)); quadrupling d_hv about doubles it."""
    h100 = get_accelerator("h100")

    def optimum(dhv):
        shape = MlstmShape("sig", 2**24, dhv // 2, dhv)
        return runtime_optimal_chunk_size(shape.flop_terms(), shape.byte_terms(), h100, shape.seq_len)

    optima = [optimum(dhv) for dhv in (64, 256, 1024, 4096)]
    assert all(later > earlier for earlier, later in zip(optima, optima[1:], strict=False))
    ratios = [later / earlier for earlier, later in zip(optima, optima[1:], strict=False)]
    assert ratios == pytest.approx([2.0] * 3, rel=0.03)


def test_runtime_optimal_chunk_grows_as_sqrt_of_accelerator_intensity():
    """Paper Fig. 25: L_opt,Runtime = O(sqrt(I_acc)); quadrupling I_acc about doubles it."""
    shape = MlstmShape("sig", 2**24, 256, 512)

    def optimum(i_acc):
        accelerator = Accelerator("sweep", i_acc * 1e12, 1e12)
        return runtime_optimal_chunk_size(shape.flop_terms(), shape.byte_terms(), accelerator, shape.seq_len)

    optima = [optimum(i_acc) for i_acc in (25, 100, 400, 1600)]
    ratios = [later / earlier for earlier, later in zip(optima, optima[1:], strict=False)]
    assert ratios == pytest.approx([2.0] * 3, rel=0.01)
    # Newer GPUs with a higher intensity need larger chunks (paper summary point 8).
    v100, h100 = get_accelerator("v100"), get_accelerator("h100")
    assert runtime_optimal_chunk_size(shape.flop_terms(), shape.byte_terms(), v100, 8192) < (
        runtime_optimal_chunk_size(shape.flop_terms(), shape.byte_terms(), h100, 8192)
    )


def test_accelerator_table():
    assert set(ACCELERATORS) == {"v100", "a100", "h100", "h100-pcie", "h200", "b200"}
    h100 = get_accelerator("H100")
    assert (h100.peak_flops_per_s, h100.bandwidth_bytes_per_s) == (989e12, 3.35e12)
    assert get_accelerator("b200").intensity_flops_per_byte == pytest.approx(2250 / 7.7)
    with pytest.raises(UserError, match="unknown GPU"):
        get_accelerator("tpu-v5")
    with pytest.raises(UserError, match="positive"):
        Accelerator("broken", 0.0, 1e12)


@pytest.mark.parametrize(
    ("device_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_detect_accelerator(device_name, expected):
    detected = detect_accelerator(device_name)
    assert (detected.name if detected else None) == expected


def test_resolve_accelerator_overrides_and_custom(monkeypatch):
    assert resolve_accelerator("a100") is ACCELERATORS["a100"]
    overridden = resolve_accelerator("h100", bandwidth_bytes_per_s=3.0e12)
    assert (overridden.peak_flops_per_s, overridden.bandwidth_bytes_per_s) == (989e12, 3.0e12)
    custom = resolve_accelerator("custom", peak_flops_per_s=798e12, bandwidth_bytes_per_s=3.0e12)
    assert custom.intensity_flops_per_byte == pytest.approx(266.0)
    with pytest.raises(UserError, match="both"):
        resolve_accelerator("custom", peak_flops_per_s=798e12)

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="CUDA"):
        resolve_accelerator("auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    assert resolve_accelerator("auto").name == "h100"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA L4")
    with pytest.raises(UserError, match="NVIDIA L4"):
        resolve_accelerator("auto")
