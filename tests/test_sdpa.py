"""The torch SDPA adapters: math on CPU against the reference; FLASH and cuDNN forced on the GPU."""

import pytest
import torch

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.measure.settings import MeasureSettings
from tfla_bench.measure.worker import measure_case
from tfla_bench.model.counts import ATTENTION_BACKWARD


def case(kernel="sdpa_math", mode="fw", dtype="float32", dqk=16, dv=24, seq_len=40, **params) -> Case:
    return Case(
        kernel,
        mode,
        dtype,
        batch=2,
        seq_len=seq_len,
        num_heads=3,
        head_dim_qk=dqk,
        head_dim_v=dv,
        params=params,
    )


def manual_attention(q, k, v, causal):
    """Attention written out position by position (float64), independent of the adapter's reference."""
    q, k, v = (t.detach().double() for t in (q, k, v))
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    for t in range(q.shape[-2]):
        visible = t + 1 if causal else k.shape[-2]
        scores = q[..., t : t + 1, :] @ k[..., :visible, :].transpose(-1, -2) / q.shape[-1] ** 0.5
        out[..., t : t + 1, :] = torch.softmax(scores, dim=-1) @ v[..., :visible, :]
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_math_forward_and_reference_match_manual_attention(causal):
    adapter = registry.get("sdpa_math")
    inputs = adapter.make_inputs(case(causal=causal), "cpu")
    assert inputs["causal"] is causal
    assert inputs["q"].shape == (2, 3, 40, 16) and inputs["v"].shape == (2, 3, 40, 24)
    expected = manual_attention(inputs["q"], inputs["k"], inputs["v"], causal)
    torch.testing.assert_close(adapter.forward(inputs).double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adapter.reference(inputs).double(), expected, rtol=1e-5, atol=1e-5)


def test_inputs_require_grad_only_in_fwbw():
    adapter = registry.get("sdpa_math")
    assert not any(
        t.requires_grad for t in adapter.make_inputs(case(mode="fw"), "cpu").values() if torch.is_tensor(t)
    )
    fwbw = adapter.make_inputs(case(mode="fwbw", dtype="bfloat16"), "cpu")
    assert all(fwbw[name].requires_grad and fwbw[name].dtype == torch.bfloat16 for name in "qkv")


def test_counts_scale_with_causality_mode_and_dtype():
    adapter = registry.get("sdpa_cudnn")
    causal = adapter.flops(case(causal=True), "fw")
    full = adapter.flops(case(causal=False), "fw")
    assert full == pytest.approx(2 * causal)
    assert causal == pytest.approx(2 * 2 * 3 * 40**2 * (16 + 24) * 0.5)
    assert adapter.flops(case(), "fwbw") == pytest.approx(causal * (1 + ATTENTION_BACKWARD.flops))
    assert adapter.bytes(case(dtype="float32"), "fw") == pytest.approx(
        2 * adapter.bytes(case(dtype="bfloat16"), "fw")
    )


def test_checks():
    assert "unknown param(s) causa" in registry.get("sdpa_math").check(case(causa=False))
    assert "causal must be true or false" in registry.get("sdpa_math").check(case(causal="no"))
    assert registry.get("sdpa_math").check(case(causal=False)) is None
    assert "Dqk = Dv" in registry.get("sdpa_flash").check(case(kernel="sdpa_flash"))
    assert registry.get("sdpa_flash").check(case(kernel="sdpa_flash", dqk=128, dv=128)) is None
    assert "multiple of 8" in registry.get("sdpa_cudnn").check(case(kernel="sdpa_cudnn", dqk=20, dv=24))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_gpu_backends_need_cuda():
    assert registry.get("sdpa_flash").available() == "needs CUDA"
    assert registry.get("sdpa_cudnn").available() == "needs CUDA"
    assert registry.get("sdpa_math").available() is None


def test_math_fwbw_measures_on_cpu():
    adapter = registry.get("sdpa_math")
    result = measure_case(adapter, case(mode="fwbw"), MeasureSettings(warmup=1, reps=2), "cpu").row
    assert result.status == "ok", result.error
    assert result.median_ms > 0 and result.peak_memory_bytes is None


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["sdpa_math", "sdpa_flash", "sdpa_cudnn"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_backends_match_reference(kernel, causal):
    adapter = registry.get(kernel)
    assert adapter.available() is None
    gpu_case = case(kernel, mode="fwbw", dtype="bfloat16", dqk=128, dv=128, seq_len=256, causal=causal)
    inputs = adapter.make_inputs(gpu_case, "cuda")
    out = adapter.forward(inputs)
    reference = adapter.reference(inputs)
    error = (out.float() - reference).norm() / reference.norm()
    assert error < 2e-2
    out.backward(torch.randn_like(out))
    assert all(inputs[name].grad is not None for name in "qkv")


@pytest.mark.gpu
def test_forced_backend_does_not_fall_back():
    # FLASH cannot run Dqk != Dv; with the backend forced, SDPA must raise instead of using another one.
    adapter = registry.get("sdpa_flash")
    inputs = adapter.make_inputs(case("sdpa_flash", dtype="bfloat16", dqk=64, dv=128), "cuda")
    with pytest.raises(RuntimeError):
        adapter.forward(inputs)


@pytest.mark.gpu
def test_gpu_measurement_reports_memory_above_inputs():
    adapter = registry.get("sdpa_cudnn")
    gpu_case = case("sdpa_cudnn", mode="fwbw", dtype="bfloat16", dqk=128, dv=128, seq_len=1024)
    result = measure_case(adapter, gpu_case, MeasureSettings(warmup=2, reps=5), "cuda:0").row
    assert result.status == "ok", result.error
    inputs_bytes = 3 * 2 * 3 * 1024 * 128 * 2
    assert result.peak_memory_bytes >= inputs_bytes
    assert 0 < result.peak_memory_above_inputs_bytes <= result.peak_memory_bytes - inputs_bytes
