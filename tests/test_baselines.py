"""Baseline adapters on CPU: availability reasons, input factories, constraints, FLOP/byte counts,
fla's Hopper backward refusal and the mamba-ssm import without its CUDA extension."""

import importlib
import importlib.machinery
import math
import sys
import types

import pytest
import torch

from tfla_bench.adapters import registry
from tfla_bench.adapters.support import CUDA_MISSING
from tfla_bench.adapters.workloads import Case
from tfla_bench.baselines import _attention as attention
from tfla_bench.baselines import _mamba, gla, lightning2, simple_gla
from tfla_bench.model.counts import mlstm_flops

ADAPTERS = {
    "fa2": ("attention", "BTHD"),
    "fa3": ("attention", "BTHD"),
    "fa4": ("attention", "BTHD"),
    "gla": ("gla", "BTHD"),
    "simple_gla": ("gla", "BTHD"),
    "lightning2": ("lightning", "BHTD"),
    "mamba2": ("mamba2", "BTHD"),
    "mamba2_split_conv": ("mamba2", "BTHD"),
    "mamba": ("mamba", "BDT"),
    "mlstm_kernels_exp": ("mlstm", "BHTD"),
    "mlstm_kernels_sig": ("mlstm", "BHTD"),
    "mlstm_kernels_limit": ("mlstm", "BHTD"),
}
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA reason")


def make_case(
    kernel, mode="fw", dtype="bfloat16", batch=2, seq_len=128, heads=4, dqk=32, dv=64, chunk=None, **params
):
    return Case(kernel, mode, dtype, batch, seq_len, heads, dqk, dv, chunk, dict(params))


def fake_installed(monkeypatch, name):
    """Make `name` look installed to `importlib.util.find_spec` without importing anything."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    monkeypatch.setitem(sys.modules, name, module)
    return module


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_registered_with_family_and_layout(name):
    adapter = registry.get(name)
    assert (adapter.family, adapter.layout) == ADAPTERS[name]
    assert adapter.constraints
    assert not adapter.cpu_capable


@pytest.mark.parametrize(
    ("name", "missing", "expected"),
    [
        (
            "fa2",
            ("flash_attn",),
            "flash-attn not installed (a CUDA build: `make cuda-wheels CUDA_WHEELS=flash-attn`",
        ),
        ("fa3", ("flash_attn_interface",), "`make cuda-wheels CUDA_WHEELS=fa3 FLASH_ATTN_SRC="),
        ("fa4", ("flash_attn",), "FlashAttention-4 not installed (pip install flash-attn-4"),
        ("gla", ("fla",), "fla-core not installed (pip install fla-core==0.6.0)"),
        ("simple_gla", ("fla",), "fla-core not installed (pip install fla-core==0.6.0)"),
        (
            "lightning2",
            ("lightning_attn",),
            "lightning-attn not installed (pip install lightning-attn==0.0.5)",
        ),
        ("mamba2", ("mamba_ssm",), "mamba-ssm not installed (MAMBA_SKIP_CUDA_BUILD=TRUE"),
        ("mamba2_split_conv", ("mamba_ssm",), "mamba-ssm not installed"),
        ("mamba", ("mamba_ssm",), "mamba-ssm not installed"),
        (
            "mlstm_kernels_exp",
            ("mlstm_kernels",),
            "mlstm-kernels not installed (pip install mlstm-kernels==2.0.6)",
        ),
        ("mlstm_kernels_sig", ("mlstm_kernels",), "mlstm-kernels not installed"),
        ("mlstm_kernels_limit", ("mlstm_kernels",), "mlstm-kernels not installed"),
    ],
)
def test_missing_package_reason(monkeypatch, name, missing, expected):
    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)  # what find_spec and import see for a missing module
    assert expected in registry.get(name).available()


@needs_no_cuda
@pytest.mark.parametrize(
    ("name", "package"),
    [
        ("fa3", "flash_attn_interface"),
        ("fa4", "flash_attn"),
        ("gla", "fla"),
        ("lightning2", "lightning_attn"),
        ("mamba2", "mamba_ssm"),
        ("mlstm_kernels_sig", "mlstm_kernels"),
    ],
)
def test_installed_package_without_cuda_reason(monkeypatch, name, package):
    fake_installed(monkeypatch, package)
    assert registry.get(name).available() == CUDA_MISSING


def test_mamba_needs_the_compiled_extension(monkeypatch):
    fake_installed(monkeypatch, "mamba_ssm")
    monkeypatch.setitem(sys.modules, "selective_scan_cuda", None)
    reason = registry.get("mamba").available()
    assert "selective_scan_cuda" in reason and "MAMBA_SKIP_CUDA_BUILD" in reason


class TestImportWithoutSelectiveScanCuda:
    """`import_ssd_combined` on fake mamba_ssm packages whose `__init__` fails like the real one."""

    SSD = (
        "from mamba_ssm.ops.triton.ssd_support import VALUE\n\n"
        "def mamba_chunk_scan_combined():\n    return VALUE\n"
    )

    @pytest.fixture
    def package(self, tmp_path, monkeypatch):
        monkeypatch.syspath_prepend(str(tmp_path))
        yield lambda init, ssd=self.SSD: self._write(tmp_path, init, ssd)
        for name in [name for name in sys.modules if name == "mamba_ssm" or name.startswith("mamba_ssm.")]:
            del sys.modules[name]

    @staticmethod
    def _write(root, init, ssd):
        files = {
            "mamba_ssm/__init__.py": init,
            "mamba_ssm/ops/__init__.py": "",
            "mamba_ssm/ops/selective_scan_interface.py": "import selective_scan_cuda\n",
            "mamba_ssm/ops/triton/__init__.py": "",
            "mamba_ssm/ops/triton/ssd_support.py": "VALUE = 42\n",
            "mamba_ssm/ops/triton/ssd_combined.py": ssd,
        }
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        importlib.invalidate_caches()

    def test_missing_extension_is_bypassed(self, package):
        package('from mamba_ssm.ops.selective_scan_interface import *\n__version__ = "fake"\n')
        module = _mamba.import_ssd_combined()
        assert module.mamba_chunk_scan_combined() == 42
        assert not hasattr(sys.modules["mamba_ssm"], "__version__")  # the failing __init__ did not run
        assert _mamba.import_ssd_combined() is module

    def test_other_missing_module_in_init_is_raised(self, package):
        package("import tfla_no_such_dependency\n")
        with pytest.raises(ModuleNotFoundError) as info:
            _mamba.import_ssd_combined()
        assert info.value.name == "tfla_no_such_dependency"

    def test_missing_module_in_ssd_code_is_raised_after_the_bypass(self, package):
        package(
            "from mamba_ssm.ops.selective_scan_interface import *\n", ssd="import tfla_no_such_triton_dep\n"
        )
        with pytest.raises(ModuleNotFoundError) as info:
            _mamba.import_ssd_combined()
        assert info.value.name == "tfla_no_such_triton_dep"

    def test_mamba_still_reports_the_missing_extension(self, package):
        package("from mamba_ssm.ops.selective_scan_interface import *\n")
        _mamba.import_ssd_combined()
        assert "selective_scan_cuda" in registry.get("mamba").available()


SQUARE = {"dqk": 32, "dv": 32}
FLASH_INPUTS = {"q": (2, 128, 4, 32), "k": (2, 128, 4, 32), "v": (2, 128, 4, 32)}
MLSTM_INPUTS = {
    "q": (2, 4, 128, 32),
    "k": (2, 4, 128, 32),
    "v": (2, 4, 128, 64),
    "i": (2, 4, 128),
    "f": (2, 4, 128),
}
INPUT_LAYOUTS = {
    "fa2": (SQUARE, FLASH_INPUTS),
    "fa3": (SQUARE, FLASH_INPUTS),
    "fa4": (SQUARE, FLASH_INPUTS),
    "gla": ({}, {"q": (2, 128, 4, 32), "k": (2, 128, 4, 32), "v": (2, 128, 4, 64), "g": (2, 128, 4, 32)}),
    "simple_gla": ({}, {"q": (2, 128, 4, 32), "k": (2, 128, 4, 32), "v": (2, 128, 4, 64), "g": (2, 128, 4)}),
    "lightning2": (
        SQUARE,
        {"q": (2, 4, 128, 32), "k": (2, 4, 128, 32), "v": (2, 4, 128, 32), "s": (4, 1, 1)},
    ),
    "mamba2": (
        {},
        {"x": (2, 128, 4, 64), "dt": (2, 128, 4), "A": (4,), "B": (2, 128, 4, 32), "C": (2, 128, 4, 32)},
    ),
    "mamba2_split_conv": (
        {},
        {
            "zxbcdt": (2, 128, 2 * 4 * 64 + 2 * 32 + 4),
            "conv1d_weight": (4 * 64 + 2 * 32, 4),
            "conv1d_bias": (4 * 64 + 2 * 32,),
            "dt_bias": (4,),
            "A": (4,),
            "D": (4,),
        },
    ),
    "mamba": (
        {},
        {
            "u": (2, 256, 128),
            "delta": (2, 256, 128),
            "A": (256, 32),
            "B": (2, 32, 128),
            "C": (2, 32, 128),
            "D": (256,),
            "z": (2, 256, 128),
        },
    ),
    "mlstm_kernels_exp": ({}, MLSTM_INPUTS),
    "mlstm_kernels_sig": ({}, MLSTM_INPUTS),
    "mlstm_kernels_limit": ({}, MLSTM_INPUTS),
}
FP32_INPUTS = {"s", "A", "D"}  # LightningAttention-2's slopes, Mamba's A and D stay fp32


@pytest.mark.parametrize("name", sorted(INPUT_LAYOUTS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_make_inputs_layout_dtype_and_gradients(name, dtype):
    dims, shapes = INPUT_LAYOUTS[name]
    adapter = registry.get(name)
    tensors = {}
    for mode in ("fw", "fwbw"):
        inputs = adapter.make_inputs(make_case(name, mode, dtype, **dims), "cpu")
        tensors[mode] = {key: value for key, value in inputs.items() if isinstance(value, torch.Tensor)}
    assert {key: tuple(value.shape) for key, value in tensors["fw"].items()} == shapes
    for key, value in tensors["fw"].items():
        assert value.dtype == (torch.float32 if key in FP32_INPUTS else getattr(torch, dtype)), key
    assert not any(value.requires_grad for value in tensors["fw"].values())
    expected_grads = set(shapes) - {"s"}
    assert {key for key, value in tensors["fwbw"].items() if value.requires_grad} == expected_grads


def test_inputs_repeat_per_seed():
    adapter = registry.get("gla")
    first, again = (adapter.make_inputs(make_case("gla"), "cpu") for _ in range(2))
    other = adapter.make_inputs(make_case("gla", seed=1), "cpu")
    assert torch.equal(first["q"], again["q"]) and not torch.equal(first["q"], other["q"])


def test_settings_travel_with_the_inputs():
    assert registry.get("fa2").make_inputs(make_case("fa2", causal=False, **SQUARE), "cpu")["causal"] is False
    assert registry.get("mamba2").make_inputs(make_case("mamba2"), "cpu")["chunk_size"] == 256
    assert registry.get("mamba2").make_inputs(make_case("mamba2", chunk=64), "cpu")["chunk_size"] == 64
    split = registry.get("mamba2_split_conv").make_inputs(make_case("mamba2_split_conv"), "cpu")
    assert (split["head_dim"], split["num_groups"]) == (64, 1)
    grouped = registry.get("mamba2").make_inputs(make_case("mamba2", num_groups=2), "cpu")
    assert grouped["B"].shape == (2, 128, 2, 32)
    assert (
        registry.get("mlstm_kernels_exp").make_inputs(make_case("mlstm_kernels_exp"), "cpu")["chunk_size"]
        == 128
    )
    assert (
        registry.get("mlstm_kernels_limit").make_inputs(make_case("mlstm_kernels_limit"), "cpu")["chunk_size"]
        == 64
    )
    assert (
        registry.get("mlstm_kernels_sig").make_inputs(make_case("mlstm_kernels_sig"), "cpu")["normalize"]
        is False
    )


def test_value_ranges():
    fla_inputs = registry.get("gla").make_inputs(make_case("gla", dtype="float32"), "cpu")
    assert fla_inputs["g"].max() <= 0  # log-sigmoid gates
    assert 0.85 < fla_inputs["g"].exp().mean() < 0.99
    ssd = registry.get("mamba2").make_inputs(make_case("mamba2", dtype="float32"), "cpu")
    assert 1e-3 <= ssd["dt"].min() and ssd["dt"].max() <= 1e-1
    assert -16 <= ssd["A"].min() and ssd["A"].max() <= -1
    split = registry.get("mamba2_split_conv").make_inputs(
        make_case("mamba2_split_conv", dtype="float32"), "cpu"
    )
    dt0 = torch.nn.functional.softplus(split["dt_bias"])
    assert 0.99e-3 <= dt0.min() and dt0.max() <= 1.01e-1
    scan = registry.get("mamba").make_inputs(make_case("mamba"), "cpu")
    assert torch.equal(scan["A"][0], -torch.arange(1.0, 33.0)) and torch.equal(scan["D"], torch.ones(256))
    peer = registry.get("mlstm_kernels_exp").make_inputs(
        make_case("mlstm_kernels_exp", dtype="float32"), "cpu"
    )
    assert abs(peer["f"].mean().item() - 3.0) < 0.1 and abs(peer["i"].mean().item()) < 0.1
    slopes = registry.get("lightning2").make_inputs(make_case("lightning2", **SQUARE), "cpu")["s"].flatten()
    assert slopes.tolist() == lightning2.alibi_slopes(4)


def test_alibi_slopes():
    assert lightning2.alibi_slopes(8) == [2.0**-e for e in range(1, 9)]
    # 6 heads: the 4-head slopes, then every other one of the 8-head slopes.
    assert lightning2.alibi_slopes(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


@pytest.mark.parametrize(
    ("name", "changes", "expected"),
    [
        ("fa2", {"dqk": 64, "dv": 128}, "head_dim_qk == head_dim_v"),
        ("fa2", {"dqk": 264, "dv": 264}, "at most 256"),
        ("fa2", {"dqk": 60, "dv": 60}, "multiple of 8"),
        ("fa2", {"dqk": 64, "dv": 64, "causal": "sometimes"}, "param causal must be true or false"),
        ("fa2", {"dqk": 64, "dv": 64, "window": 4}, "unknown param(s) window"),
        ("fa3", {"dqk": 64, "dv": 64, "impl": "cute"}, "unknown param(s) impl"),
        ("fa4", {"dqk": 64, "dv": 128}, "head_dim_qk == head_dim_v"),
        ("lightning2", {"dqk": 64, "dv": 128}, "head_dim_qk == head_dim_v"),
        ("lightning2", {"dqk": 256, "dv": 256}, "power of two in [16, 128]"),
        ("lightning2", {"dqk": 48, "dv": 48}, "power of two in [16, 128]"),
        ("mamba2", {"num_groups": 3}, "num_groups 3 must divide num_heads 4"),
        ("mamba2", {"num_groups": 0}, "param num_groups must be a positive integer"),
        ("mamba2", {"chunk": 96}, "chunk_size must be a power of two >= 16"),
        ("mamba2_split_conv", {"num_groups": 8}, "must divide num_heads"),
        ("mamba", {"dqk": 512}, "state dims up to 256"),
        ("simple_gla", {"mode": "fwbw", "dqk": 33}, "even head dims"),
        ("gla", {"causal": True}, "unknown param(s) causal"),
        ("mlstm_kernels_exp", {"seq_len": 200}, "multiple of 16"),
        ("mlstm_kernels_exp", {"seq_len": 96}, "below 128 must be a power of two"),
        ("mlstm_kernels_exp", {"seq_len": 256, "chunk": 512}, "divides seq_len 256"),
        ("mlstm_kernels_sig", {"seq_len": 384, "chunk": 192}, "power of two"),
        ("mlstm_kernels_sig", {"normalize": "yes"}, "param normalize must be true or false"),
        ("mlstm_kernels_limit", {"chunk": 48}, "power of two that divides"),
        ("mlstm_kernels_limit", {"dqk": 8}, "at least 16"),
    ],
)
def test_check_rejects_unsupported_cases(name, changes, expected):
    fields = {"dqk", "dv", "seq_len", "chunk", "mode"}
    dims = {key: value for key, value in changes.items() if key in fields}
    params = {key: value for key, value in changes.items() if key not in fields}
    reason = registry.get(name).check(make_case(name, **dims, **params))
    assert reason is not None and expected in reason


@pytest.mark.parametrize(
    "case",
    [
        make_case("fa2", batch=8, seq_len=8192, heads=32, dqk=128, dv=128),
        make_case("fa3", batch=8, seq_len=8192, heads=32, dqk=128, dv=128, causal=False),
        make_case("gla", mode="fwbw", batch=8, seq_len=8192, heads=16, dqk=128, dv=256),
        make_case("simple_gla", batch=4, seq_len=8192, heads=4, dqk=1024, dv=1024),
        make_case("lightning2", mode="fwbw", batch=8, seq_len=8192, heads=32, dqk=128, dv=128),
        make_case("mamba2", mode="fwbw", batch=8, seq_len=8192, heads=64, dqk=64, dv=64, chunk=256),
        make_case("mamba2_split_conv", batch=8, seq_len=8192, heads=64, dqk=64, dv=64),
        make_case("mamba", batch=8, seq_len=8192, heads=1, dqk=16, dv=8192),
        make_case("mlstm_kernels_exp", batch=8, seq_len=8192, heads=16, dqk=128, dv=256, chunk=128),
        make_case("mlstm_kernels_sig", batch=1, seq_len=65536, heads=16, dqk=128, dv=256, chunk=4096),
        make_case("mlstm_kernels_sig", seq_len=64, chunk=128),
        make_case("mlstm_kernels_limit", batch=8, seq_len=8192, heads=16, dqk=128, dv=256, chunk=64),
    ],
    ids=lambda case: case.kernel,
)
def test_check_accepts_the_papers_cases(case):
    assert registry.get(case.kernel).check(case) is None


def test_attention_counts_hand_worked():
    adapter = registry.get("fa2")
    case = make_case("fa2", batch=1, seq_len=4, heads=1, dqk=2, dv=2)
    # 2 matmuls of 2*T^2*D, half of them causal: 2*16*(2+2)*0.5 = 64; backward 2.5x.
    assert adapter.flops(case, "fw") == 64.0
    assert adapter.flops(case, "fwbw") == 64.0 * 3.5
    assert (
        adapter.flops(make_case("fa2", batch=1, seq_len=4, heads=1, dqk=2, dv=2, causal=False), "fw") == 128.0
    )
    # q, k, v read and o written once: 4 * (2+2+2+2) * 2 bytes.
    assert adapter.bytes(case, "fw") == 64.0


def test_linear_attention_counts_hand_worked():
    # LightningAttention-2, one 64-token block, K=V=2: 0.5*9*64^2 + 22*64 + 8 = 19848.
    assert (
        registry.get("lightning2").flops(
            make_case("lightning2", batch=1, seq_len=64, heads=1, dqk=2, dv=2), "fw"
        )
        == 19848.0
    )
    # Mamba (selective scan), B=2, T=2, D=3, N=4: 2 * 216; fwbw 3x.
    scan = make_case("mamba", batch=2, seq_len=2, heads=1, dqk=4, dv=3)
    assert (
        registry.get("mamba").flops(scan, "fw") == 432.0
        and registry.get("mamba").flops(scan, "fwbw") == 1296.0
    )
    # Mamba2, T=8 in chunks of 4, N=2, P=3, one group: 2 * (7.5*16 + 38*4 + 13) = 570.
    ssd = make_case("mamba2", batch=1, seq_len=8, heads=1, dqk=2, dv=3, chunk=4)
    assert registry.get("mamba2").flops(ssd, "fw") == 570.0


def test_peer_counts_use_the_kernels_chunk_size():
    adapter = registry.get("mlstm_kernels_limit")
    case = make_case("mlstm_kernels_limit", batch=2, seq_len=256, heads=4, dqk=32, dv=64)
    per_head = mlstm_flops("exp", "chunkwise", seq_len=256, chunk_size=64, head_dim_qk=32, head_dim_v=64)
    assert adapter.flops(case, "fw") == pytest.approx(2 * 4 * per_head)
    sig = registry.get("mlstm_kernels_sig")
    short = make_case("mlstm_kernels_sig", seq_len=64, heads=1, batch=1)  # xl_chunk runs T < 128 as one chunk
    assert sig.flops(short, "fw") == pytest.approx(
        mlstm_flops("sig", "chunkwise", seq_len=64, chunk_size=64, head_dim_qk=32, head_dim_v=64)
    )


def test_gla_chunk_size_follows_fla():
    assert [gla.gla_chunk_size(t) for t in (8, 16, 32, 40, 64, 8192)] == [16, 16, 32, 64, 64, 64]


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_counts_are_positive_and_fwbw_costs_more(name):
    dims = INPUT_LAYOUTS[name][0]
    adapter = registry.get(name)
    case = make_case(name, **dims)
    for count in (adapter.flops, adapter.bytes):
        assert 0 < count(case, "fw") < count(case, "fwbw") and math.isfinite(count(case, "fwbw"))


class TestSimpleGlaBackwardRefusal:
    """The prediction of fla 0.6.0's RuntimeError in `chunk_bwd_dqkwg`, from fake fla flags."""

    @pytest.fixture
    def flags(self, monkeypatch):
        utils = types.ModuleType("fla.utils")
        tilelang = types.ModuleType("fla.ops.common.backends.tilelang")
        tilelang.CommonTileLangBackend = types.SimpleNamespace(can_use=lambda: False)
        monkeypatch.setitem(sys.modules, "fla.utils", utils)
        monkeypatch.setitem(sys.modules, "fla.ops.common.backends.tilelang", tilelang)

        def set_flags(hopper=True, above_3_4_0=True, above_3_7_1=False, tilelang_usable=False):
            utils.IS_NVIDIA_HOPPER, utils.TRITON_ABOVE_3_4_0, utils.TRITON_ABOVE_3_7_1 = (
                hopper,
                above_3_4_0,
                above_3_7_1,
            )
            tilelang.CommonTileLangBackend.can_use = lambda: tilelang_usable

        return set_flags

    def test_hopper_with_triton_3_6_is_refused(self, flags):
        flags()
        reason = simple_gla.simple_gla_backward_refusal("bfloat16")
        assert "#640" in reason and "Triton >= 3.7.1" in reason

    @pytest.mark.parametrize(
        "setting",
        [{"above_3_7_1": True}, {"hopper": False}, {"above_3_4_0": False}],
        ids=["triton-3.7.1", "not-hopper", "triton-3.3"],
    )
    def test_other_stacks_are_not_refused(self, flags, setting):
        flags(**setting)
        assert simple_gla.simple_gla_backward_refusal("bfloat16") is None

    def test_tilelang_rescues_only_fp32(self, flags):
        flags(tilelang_usable=True)
        assert simple_gla.simple_gla_backward_refusal("float32") is None
        assert simple_gla.simple_gla_backward_refusal("bfloat16") is not None
        flags(tilelang_usable=False)
        assert simple_gla.simple_gla_backward_refusal("float32") is not None

    def test_forward_is_never_refused(self, flags):
        flags()
        assert registry.get("simple_gla").check(make_case("simple_gla", mode="fw")) is None


def test_fa2_beside_fa4_alone_names_the_build_command(monkeypatch):
    # FlashAttention-4's wheel installs flash_attn/cute only: a `flash_attn` without flash_attn_func.
    fake_installed(monkeypatch, "flash_attn")
    monkeypatch.setattr(attention, "cuda_reason", lambda: None)
    adapter = registry.get("fa2")
    monkeypatch.setattr(type(adapter), "device_reason", lambda self: None)
    reason = adapter.available()
    assert "flash_attn has no flash_attn_func" in reason
    assert "make cuda-wheels CUDA_WHEELS=flash-attn" in reason
