"""Spec parsing and expansion: constant tokens, embedding dim, grid/zip, overrides, errors."""

from pathlib import Path

import pytest

from tfla_bench.adapters import registry
from tfla_bench.errors import UserError
from tfla_bench.run import specs

pytestmark = pytest.mark.usefixtures("plugin_adapters")

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


BASE = """
name = "t"
kernels = ["sdpa_math", "test_chunked"]
modes = ["fw"]
dtype = "float32"
[shape]
tokens = 65536
seq_len = [2048, 8192]
num_heads = 16
head_dim_qk = 128
head_dim_v = 256
chunk_size = [64, 128]
"""


def test_constant_tokens_and_chunk_size_only_where_used(tmp_path):
    cases = specs.expand(specs.load_spec(write(tmp_path, BASE)))
    attention = [c for c in cases if c.kernel == "sdpa_math"]
    chunked = [c for c in cases if c.kernel == "test_chunked"]
    # sdpa_math ignores chunk_size: the two chunk sizes collapse into one case per seq_len.
    assert [(c.batch, c.seq_len, c.chunk_size) for c in attention] == [(32, 2048, None), (8, 8192, None)]
    assert sorted((c.batch, c.seq_len, c.chunk_size) for c in chunked) == [
        (8, 8192, 64),
        (8, 8192, 128),
        (32, 2048, 64),
        (32, 2048, 128),
    ]
    assert all(c.batch * c.seq_len == 65536 for c in cases)
    assert len({c.key for c in cases}) == len(cases)


def test_embedding_dim_gives_heads_and_zip_pairs_lists(tmp_path):
    text = """
name = "z"
kernels = ["sdpa_math"]
modes = ["fw", "fwbw"]
expand = "zip"
[shape]
batch = 2
seq_len = [256, 512]
embedding_dim = 1024
head_dim_qk = [64, 128]
head_dim_v = [128, 256]
"""
    cases = specs.expand(specs.load_spec(write(tmp_path, text)))
    fw = [(c.seq_len, c.head_dim_qk, c.head_dim_v, c.num_heads) for c in cases if c.mode == "fw"]
    assert fw == [(256, 64, 128, 8), (512, 128, 256, 4)]
    assert [c.mode for c in cases] == ["fw", "fw", "fwbw", "fwbw"]
    assert {c.dtype for c in cases} == {"bfloat16"}


def test_grid_is_the_cartesian_product_with_seq_len_fastest(tmp_path):
    text = BASE.replace('kernels = ["sdpa_math", "test_chunked"]', 'kernels = ["sdpa_math"]').replace(
        "head_dim_qk = 128", "head_dim_qk = [64, 128]"
    )
    cases = specs.expand(specs.load_spec(write(tmp_path, text)))
    assert [(c.head_dim_qk, c.seq_len) for c in cases] == [(64, 2048), (64, 8192), (128, 2048), (128, 8192)]


def test_family_and_kernel_overrides_kernel_wins(tmp_path):
    text = (
        BASE.replace('kernels = ["sdpa_math", "test_chunked"]', 'kernels = ["sdpa_math", "sdpa_flash"]')
        + """
[override.attention]
embedding_dim = 4096
head_dim_qk = 128
head_dim_v = 128
params = { causal = false }
[override.sdpa_flash]
num_heads = 8
modes = ["fw", "fwbw"]
params = { causal = [true, false] }
"""
    )
    cases = specs.expand(specs.load_spec(write(tmp_path, text)))
    math_cases = [c for c in cases if c.kernel == "sdpa_math"]
    flash = [c for c in cases if c.kernel == "sdpa_flash"]
    assert {(c.num_heads, c.head_dim_qk, c.head_dim_v, c.param("causal")) for c in math_cases} == {
        (32, 128, 128, False)
    }
    assert {c.mode for c in math_cases} == {"fw"}
    # The kernel table replaces embedding_dim by num_heads and lists causal; the family dims stay.
    assert {(c.num_heads, c.head_dim_v) for c in flash} == {(8, 128)}
    assert {(c.mode, c.param("causal")) for c in flash} == {
        ("fw", True),
        ("fw", False),
        ("fwbw", True),
        ("fwbw", False),
    }
    assert len(flash) == 8


def test_to_dict_round_trips_and_measurement_overrides(tmp_path):
    spec = specs.load_spec(write(tmp_path, BASE + "[override.test_chunked_family]\nchunk_size = 32\n"))
    again = specs.parse_spec(spec.to_dict(), "copy")
    assert specs.expand(again) == specs.expand(spec)
    changed = spec.with_measurement(reps=3, timeout_s=5.0, l2_flush=False, grad=None)
    assert (changed.measurement.reps, changed.measurement.timeout_s, changed.measurement.l2_flush) == (
        3,
        5.0,
        False,
    )
    assert changed.measurement.grad == spec.measurement.grad == "fixed"
    assert spec.measurement.clock == "events"
    assert spec.with_measurement(clock="kernels").measurement.clock == "kernels"
    assert spec.measurement.power_cap == "gaps"
    assert spec.with_measurement(power_cap="again").measurement.power_cap == "again"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE.replace('name = "t"', 'name = "t"\nrepz = 3'), "unknown key 'repz'"),
        (
            BASE.replace("num_heads = 16", 'num_heads = "16"'),
            "key 'shape.num_heads': expected a positive integer",
        ),
        (BASE.replace("num_heads = 16", "num_heads = 16\nnum_head = 2"), "unknown key 'num_head' in [shape]"),
        (BASE.replace('modes = ["fw"]', 'modes = ["bw"]'), "key 'modes': expected one or a list of fw, fwbw"),
        (BASE.replace('name = "t"', 'name = "t"\nclock = "wall"'), "key 'clock': expected one of events"),
        (
            BASE.replace('name = "t"', 'name = "t"\npower_cap = "wait"'),
            "key 'power_cap': expected one of gaps, again",
        ),
        (
            BASE.replace('name = "t"', 'name = "t"\nreps = 0'),
            "key 'reps': expected an integer in [1, 1000000]",
        ),
        (
            BASE.replace('name = "t"', 'name = "t"\nrel_ci = 0'),
            "key 'rel_ci': expected a finite number in (0, 1]",
        ),
        (
            BASE.replace('name = "t"', 'name = "t"\nbudget_s = "1s"'),
            "key 'budget_s': expected a finite number in (0, 86400] seconds",
        ),
        (
            BASE.replace('name = "t"', 'name = "t"\nautotune_ms = 0'),
            "key 'autotune_ms': expected a finite number in (0, 60000] ms",
        ),
        (
            BASE.replace('name = "t"', 'name = "t"\nwarmup_s = -1'),
            "key 'warmup_s': expected a finite number in [0, 3600] seconds",
        ),
        (
            BASE.replace('name = "t"', 'name = "t"\nmin_reps = 10\nmax_reps = 5'),
            "key 'max_reps': expected at least min_reps (10), got 5",
        ),
        (
            BASE.replace('name = "t"', 'name = "t"\nl2_flush = "yes"'),
            "key 'l2_flush': expected true or false",
        ),
        (BASE.replace("tokens = 65536", "tokens = 65536\nbatch = 4"), "gives both 'tokens' and 'batch'"),
        (BASE.replace("tokens = 65536", "tokens = 65535"), "tokens 65535 is not a multiple of seq_len 2048"),
        (BASE.replace("test_chunked", "nope"), "unknown kernel 'nope'; known kernels: "),
        (BASE + "[override.gla2]\nnum_heads = 4\n", "[override.gla2] matches no kernel family"),
        (BASE + "[override.attention]\nreps = 0\n", "override.attention.reps"),
        (BASE + "[override.attention]\ntimeout_s = 4\n", "unknown key 'timeout_s' in [override.attention]"),
        (BASE.replace("num_heads = 16", ""), "needs 'num_heads' or 'embedding_dim'"),
        ("name = 't'\nkernels = [", "not valid TOML"),
    ],
)
def test_bad_specs_name_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        specs.expand(specs.load_spec(path))
    message = str(info.value)
    assert expected in message
    assert str(path) in message or "unknown kernel" in message
    assert "\n" not in message


def test_zip_needs_lists_of_one_length(tmp_path):
    text = BASE.replace('dtype = "float32"', 'dtype = "float32"\nexpand = "zip"').replace(
        "chunk_size = [64, 128]", "chunk_size = [64, 128, 256]"
    )
    with pytest.raises(UserError, match="chunk_size has 3, seq_len has 2"):
        specs.expand(specs.load_spec(write(tmp_path, text)))


def test_a_spec_of_very_many_cases_is_one_line_before_any_is_made(tmp_path, monkeypatch):
    # 64 values in each of five lists: sdpa_math alone has 64**4 points, refused from their count alone.
    many = "[" + ", ".join(str(8 * (n + 1)) for n in range(64)) + "]"
    text = BASE.replace("seq_len = [2048, 8192]", f"seq_len = {many}").replace("tokens = 65536", "batch = 1")
    for key in ("num_heads = 16", "head_dim_qk = 128", "head_dim_v = 256", "chunk_size = [64, 128]"):
        text = text.replace(key, f"{key.split(' = ')[0]} = {many}")
    made = []
    monkeypatch.setattr(specs, "_case", lambda *args: made.append(args))
    with pytest.raises(UserError) as refused:
        specs.expand(specs.load_spec(write(tmp_path, text)))
    message = str(refused.value)
    assert f"expands to more than {specs.MAX_CASES:,} cases (16,777,216 with sdpa_math's)" in message
    assert "split it into several specs" in message and "\n" not in message and not made


def test_a_dry_run_of_many_cases_lists_the_first_ones_and_counts_all(tmp_path, monkeypatch, capsys):
    from tfla_bench.cli.main import main
    from tfla_bench.run import console

    monkeypatch.setattr(console, "MAX_LISTED", 3)
    assert main(["sweep", str(write(tmp_path, BASE)), "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "6 case(s)" in out and "the first 3 of 6 cases; the plan of all: run: 6" in out
    assert out.count("sdpa_math") == 2 and out.count("test_chunked") == 1


def test_kernel_filter(tmp_path):
    spec = specs.load_spec(write(tmp_path, BASE))
    assert {c.kernel for c in specs.expand(spec, ["test_chunked"])} == {"test_chunked"}
    with pytest.raises(UserError, match="not in spec 't'"):
        specs.expand(spec, ["sdpa_flash"])
    with pytest.raises(UserError, match="unknown kernel 'nope'"):
        specs.expand(spec, ["nope"])


def test_a_shipped_spec_is_found_by_name_and_a_path_still_works(tmp_path, monkeypatch):
    assert specs.find_spec("smoke") == REPO / "experiments" / "smoke.toml"
    assert "fig5_consttoken" in specs.shipped_names() and "smoke" in specs.shipped_names()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoke").mkdir()  # a path wins over a name
    assert specs.find_spec("smoke") == Path("smoke")
    assert specs.find_spec("mine.toml") == Path("mine.toml")
    with pytest.raises(UserError, match=r"no spec file 'smok', .*\(known: .*fig5_consttoken, .*smoke"):
        specs.find_spec("smok")


def test_the_smoke_runs_tfla_beside_mlstm_torch_at_shapes_every_kernel_takes():
    cases = specs.expand(specs.load_spec(specs.find_spec("smoke")))
    assert {"tfla_sig", "mlstm_torch"} <= {case.kernel for case in cases}
    assert [case for case in cases if registry.get(case.kernel).check(case) is not None] == []
    # The interpreter takes seconds per call: the smoke times TFLA's forward pass with few calls.
    smoke = specs.load_spec(specs.find_spec("smoke"))
    assert {case.mode for case in cases if case.kernel == "tfla_sig"} == {"fw"}
    assert smoke.measurement_for(registry.get("tfla_sig")).reps <= 3


@pytest.mark.parametrize("name", ["smoke", "sdpa_h100"])
def test_experiment_specs_expand(name):
    spec = specs.load_spec(REPO / "experiments" / f"{name}.toml")
    cases = specs.expand(spec)
    assert cases and {c.kernel for c in cases} == set(spec.kernels)
    if name == "sdpa_h100":
        assert {(c.batch, c.seq_len) for c in cases} == {(32, 2048), (8, 8192)}
        assert {(c.num_heads, c.head_dim_qk, c.head_dim_v) for c in cases} == {(32, 128, 128)}
        cudnn = {c.param("causal") for c in cases if c.kernel == "sdpa_cudnn"}
        assert cudnn == {True, False}


def test_override_warmup_and_reps_apply_per_kernel_and_the_command_line_wins(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(BASE + "[override.attention]\nwarmup = 25\nreps = 100\n")
    spec = specs.load_spec(path)
    attention = next(a for a in registry.adapters() if a.family == "attention")
    other = next(a for a in registry.adapters() if a.family != "attention")
    assert (spec.measurement_for(attention).warmup, spec.measurement_for(attention).reps) == (25, 100)
    assert spec.measurement_for(other) == spec.measurement
    assert specs.parse_spec(spec.to_dict(), "round trip").measurement_for(attention).reps == 100
    forced = spec.with_measurement(reps=3)
    assert forced.measurement_for(attention).reps == 3 and forced.measurement_for(attention).warmup == 25


def test_a_spec_without_reps_times_adaptively_and_round_trips(tmp_path):
    spec = specs.load_spec(
        write(tmp_path, BASE.replace('name = "t"', 'name = "t"\nrel_ci = 0.02\nbudget_s = 3'))
    )
    settings = spec.measurement
    assert (settings.warmup, settings.reps, settings.rel_ci, settings.budget_s) == (None, None, 0.02, 3.0)
    assert (settings.min_reps, settings.max_reps, settings.warmup_s) == (5, 2000, 0.025)
    assert (
        settings.autotune_ms == 20.0 and spec.with_measurement(autotune_ms=100).measurement.autotune_ms == 100
    )
    assert "reps" not in spec.to_dict() and specs.parse_spec(spec.to_dict(), spec.source) == spec
    assert spec.with_measurement(reps=30).measurement.reps == 30
