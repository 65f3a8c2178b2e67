"""`tfla-bench model ...` and `tfla-bench roofline`: JSON, tables, exit code 2 on bad input, figures."""

import contextlib
import io
import json

import pytest

from tfla_bench.cli.main import main
from tfla_bench.plots import catalog
from tfla_bench.plots.model_figures import FIGURE_NAMES

# docs/model.md's example: mLSTMsig chunkwise, T = 8192, L = 128, d_qk = 128, d_hv = 256, batch 8, heads 16.
EXAMPLE = [
    "--gate", "sig", "--formulation", "chunkwise", "--seq-len", "8192", "--chunk-size", "128",
    "--head-dim-qk", "128", "--head-dim-v", "256", "--batch", "8", "--heads", "16",
]  # fmt: skip
# Per chunk: a = 256 + 128 + 3 + 1 = 388, b = 131072 + 256 + 256 + 11 = 131595, c = 65536 + 5 = 65541;
# 64 chunks, 128 heads x sequences.
EXAMPLE_FLOPS = 128 * 64 * (388 * 128**2 + 131595 * 128 + 65541)
# Per chunk: 4*128*2 + 3*128*2*384 + 2*4*128*256 = 1024 + 294912 + 262144 = 558080 bytes.
EXAMPLE_BYTES = 128 * 64 * 558080
BASE_KEYS = {"flops", "bytes", "arithmetic_intensity", "runtime_ms_lower", "runtime_ms_upper"}


def run(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_json(capsys, *args):
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("command", ["flops", "bytes", "runtime", "intensity"])
def test_json_output_of_each_subcommand(capsys, command):
    payload = run_json(capsys, "model", command, *EXAMPLE)
    assert BASE_KEYS <= payload.keys()
    assert payload["flops"] == EXAMPLE_FLOPS
    assert payload["bytes"] == EXAMPLE_BYTES
    assert payload["arithmetic_intensity"] == pytest.approx(EXAMPLE_FLOPS / EXAMPLE_BYTES)
    compute_ms, memory_ms = EXAMPLE_FLOPS / 989e12 * 1e3, EXAMPLE_BYTES / 3.35e12 * 1e3
    assert payload["runtime_ms_upper"] == pytest.approx(compute_ms + memory_ms)
    assert payload["runtime_ms_lower"] == pytest.approx(max(compute_ms, memory_ms))
    assert payload["gpu"] == "h100"


def test_optimal_chunk_json(capsys):
    payload = run_json(
        capsys, "model", "optimal-chunk", "--seq-len", "8192", "--head-dim-qk", "256", "--head-dim-v", "512"
    )
    assert BASE_KEYS <= payload.keys()
    # Paper eq. 113: sqrt((2*512^2*0.5 + 5) / (2*0.5*(768 + 3) + 1)) = sqrt(262149 / 772).
    assert payload["flop_optimal_chunk_size"] == pytest.approx((262149 / 772) ** 0.5)
    assert payload["flop_optimal_chunk_size_numeric"] == pytest.approx(
        payload["flop_optimal_chunk_size"], rel=1e-3
    )
    assert payload["runtime_optimal_chunk_size_numeric"] == pytest.approx(
        payload["runtime_optimal_chunk_size"], rel=1e-3
    )
    best = payload["best_power_of_two_chunk_size"]
    assert best & (best - 1) == 0 and 8192 % best == 0
    # Without --chunk-size the counts are shown at the best power of two.
    assert payload["chunk_size"] == best


def test_formulations_and_gpu_options(capsys):
    recurrent = run_json(capsys, "model", "flops", "--gate", "exp", "--formulation", "recurrent",
                         "--seq-len", "64", "--head-dim-qk", "8", "--head-dim-v", "16")  # fmt: skip
    # 64 * (6*8*16 + 16 + 7*8 + 12) = 64 * 852 per head and sequence, times the default batch 8 x heads 16
    assert recurrent["flops"] == 8 * 16 * 64 * 852
    assert recurrent["chunk_size"] is None
    custom = run_json(capsys, "model", "runtime", *EXAMPLE, "--gpu", "custom",
                      "--peak-flops", "1e15", "--bandwidth", "1e12")  # fmt: skip
    assert custom["runtime_ms_upper"] == pytest.approx(
        EXAMPLE_FLOPS / 1e15 * 1e3 + EXAMPLE_BYTES / 1e12 * 1e3
    )
    overridden = run_json(capsys, "model", "intensity", *EXAMPLE, "--gpu", "a100", "--bandwidth", "1e12")
    assert overridden["peak_flops_per_s"] == 312e12
    assert overridden["bandwidth_bytes_per_s"] == 1e12


@pytest.mark.parametrize("command", ["flops", "bytes", "runtime", "intensity"])
def test_every_flag_defaults_to_the_fig5_setting(capsys, command):
    assert run_json(capsys, "model", command) == run_json(capsys, "model", command, *EXAMPLE)


def test_optimal_chunk_without_flags_is_the_fig5_setting_at_its_best_chunk(capsys):
    payload = run_json(capsys, "model", "optimal-chunk")
    assert (payload["seq_len"], payload["head_dim_qk"], payload["head_dim_v"]) == (8192, 128, 256)
    assert (payload["batch"], payload["heads"], payload["gate"]) == (8, 16, "sig")
    assert payload["chunk_size"] == payload["best_power_of_two_chunk_size"] != 128


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("flops", "FLOPs per head per sequence"),
        ("runtime", "runtime, no overlap"),
        ("optimal-chunk", "closed form"),
    ],
)
def test_tables(capsys, command, expected):
    code, out, _ = run(capsys, "model", command, *EXAMPLE)
    assert code == 0
    assert expected in out
    assert "mLSTMsig chunkwise forward on H100 SXM" in out


@pytest.mark.parametrize(
    "args",
    [
        ["model", "flops", *EXAMPLE, "--gate", "tanh"],
        ["model", "bytes", *EXAMPLE, "--formulation", "blocked"],
        ["model", "flops", *EXAMPLE, "--seq-len", "0"],
        ["model", "flops", *EXAMPLE, "--head-dim-qk", "0"],
        ["model", "runtime", *EXAMPLE, "--head-dim-v", "-8"],
        ["model", "runtime", *EXAMPLE, "--batch", "0"],
        ["model", "runtime", *EXAMPLE, "--heads", "-1"],
        ["model", "intensity", *EXAMPLE, "--chunk-size", "0"],
        ["model", "intensity", *EXAMPLE, "--chunk-size", "16384"],
        ["model", "flops", *EXAMPLE, "--chunk-size", "96"],
        ["model", "flops", "--seq-len", "64", "--head-dim-qk", "8", "--head-dim-v", "8"],
        ["model", "flops", *EXAMPLE, "--causal-factor", "1.5"],
        ["model", "runtime", *EXAMPLE, "--qkv-bytes", "1e300"],
        ["model", "runtime", *EXAMPLE, "--gpu", "custom", "--peak-flops", "inf", "--bandwidth", "1e12"],
        ["roofline", "--gpu", "custom", "--peak-flops", "1e15", "--bandwidth", "nan"],
        ["model", "bytes", *EXAMPLE, "--state-bytes", "0"],
        ["model", "runtime", *EXAMPLE, "--gpu", "tpu"],
        ["model", "runtime", *EXAMPLE, "--gpu", "custom", "--peak-flops", "1e15"],
        ["model", "runtime", *EXAMPLE, "--gpu", "h100", "--bandwidth", "-1"],
        ["model", "optimal-chunk", *EXAMPLE, "--formulation", "parallel"],
        ["model", "flops", "--head-dim-qk", "8", "--head-dim-v", "8", "--seq-len", "100"],
        ["roofline", "--gpu", "tpu"],
        ["model", "flops", *EXAMPLE, "--formulation", "parallel", "--chunk-size", "0"],
        ["roofline", "--peak-flops", "1e15"],
        ["roofline", "--gpu", "h100,custom"],
        ["roofline", "--measured", "/no/such/run"],
    ],
    ids=lambda args: " ".join(args[:2] + args[-2:]),
)
def test_bad_input_exits_2_with_one_line(capsys, args):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert err.startswith("error: ")
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in out + err


def test_gpu_auto_without_cuda_is_a_user_error(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run(capsys, "model", "runtime", *EXAMPLE, "--gpu", "auto")
    assert code == 2
    assert "CUDA" in err


@pytest.fixture(scope="module")
def roofline_run(tmp_path_factory):
    """One real `roofline` run for the module (writing the figures is the slow part)."""
    out_dir = tmp_path_factory.mktemp("figures")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["roofline", "--out", str(out_dir)])
    return code, stdout.getvalue(), out_dir


def test_roofline_writes_every_figure(roofline_run):
    code, out, out_dir = roofline_run
    assert code == 0
    for name in FIGURE_NAMES:
        for suffix in (".png", ".svg"):
            path = out_dir / f"{name}{suffix}"
            assert path.stat().st_size > 10_000, path
            assert str(path) in out
    assert len(FIGURE_NAMES) == 8


def test_roofline_svgs_are_byte_identical_when_written_again(roofline_run, tmp_path):
    _, _, first = roofline_run
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["roofline", "--out", str(tmp_path)]) == 0
    for name in FIGURE_NAMES:
        svg = f"{name}.svg"
        assert (tmp_path / svg).read_bytes() == (first / svg).read_bytes(), svg


def test_roofline_summary_lists_each_default_gpu(roofline_run):
    _, out, _ = roofline_run
    for gpu in ("V100", "A100", "H100 SXM", "H200", "B200"):
        assert gpu in out
    assert "Optimal chunk sizes" in out


def test_roofline_custom_gpu_and_measured_run(capsys, monkeypatch, tmp_path):
    calls = {}

    def fake_write(out_dir, accelerators):
        calls["figures"] = [a.name for a in accelerators]
        return [out_dir / "model.png"]

    def fake_measured(run, out_dir, accelerators):
        calls["measured"] = (*run, out_dir, [a.name for a in accelerators])
        return [out_dir / "measured.png"]

    monkeypatch.setattr(catalog, "write_model_figures", fake_write)
    monkeypatch.setattr(catalog, "measured_run", lambda run_dir, gpu: (run_dir, gpu))
    monkeypatch.setattr(catalog, "plot_measured_roofline", fake_measured)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code, out, err = run(
        capsys, "roofline", "--gpu", "h100,a100", "--gpu", "h200", "--peak-flops", "798e12",
        "--bandwidth", "3.0e12", "--out", str(tmp_path), "--measured", str(run_dir),
        "--measured-gpu", "GPU X",
    )  # fmt: skip
    assert code == 0, err
    assert calls["figures"] == ["h100", "a100", "h200", "custom"]
    assert calls["measured"] == (run_dir, "GPU X", tmp_path, ["h100", "a100", "h200", "custom"])
    assert "measured.png" in out and "custom" in out
