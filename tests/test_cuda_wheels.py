"""CUDA wheel builds of the source-only baselines: architecture selection, errors, the make target."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tfla_bench import cuda_wheels
from tfla_bench.cuda_wheels import BuildError, build_fa3, keep_only_arch, main

REPO = Path(__file__).resolve().parents[1]

# The shape of the -gencode block that causal-conv1d's and mamba-ssm's setup.py hard-code.
SETUP_PY = """
cc_flag = []
cc_flag.append("-gencode")
cc_flag.append("arch=compute_75,code=sm_75")
cc_flag.append("-gencode")
cc_flag.append("arch=compute_80,code=sm_80")
if bare_metal_version >= Version("11.8"):
    cc_flag.append("-gencode")
    cc_flag.append("arch=compute_90,code=sm_90")
if bare_metal_version >= Version("12.8"):
    cc_flag.append("-gencode")
    cc_flag.append("arch=compute_100,code=sm_100")
"""


def gencode_archs(source: str) -> list[str]:
    namespace = {"Version": lambda text: tuple(int(part) for part in text.split("."))}
    exec(source.replace("bare_metal_version", "(13, 0)"), namespace)
    flags = namespace["cc_flag"]
    return [flag for flag in flags if flag.startswith("arch=")]


def test_keep_only_arch_leaves_the_target_pair_and_valid_python():
    assert gencode_archs(SETUP_PY) == [
        "arch=compute_75,code=sm_75",
        "arch=compute_80,code=sm_80",
        "arch=compute_90,code=sm_90",
        "arch=compute_100,code=sm_100",
    ]
    assert gencode_archs(keep_only_arch(SETUP_PY, "90")) == ["arch=compute_90,code=sm_90"]
    assert gencode_archs(keep_only_arch(SETUP_PY, "80")) == ["arch=compute_80,code=sm_80"]


def test_keep_only_arch_adds_an_architecture_the_script_does_not_list():
    assert gencode_archs(keep_only_arch(SETUP_PY, "89")) == ["arch=compute_89,code=sm_89"]


def test_keep_only_arch_refuses_a_script_without_gencode_pairs():
    with pytest.raises(BuildError, match="no -gencode pairs"):
        keep_only_arch("cc_flag = []\n", "90")


def test_fa3_is_hopper_only_and_needs_a_checkout(tmp_path):
    with pytest.raises(BuildError, match="Hopper"):
        build_fa3(tmp_path, tmp_path, "80", ("HDIM128",))
    with pytest.raises(BuildError, match="FLASH_ATTN_SRC"):
        build_fa3(None, tmp_path, "90", ("HDIM128",))
    with pytest.raises(BuildError, match="flash-attention checkout"):
        build_fa3(tmp_path, tmp_path, "90", ("HDIM128",))
    (tmp_path / "hopper").mkdir()
    (tmp_path / "hopper" / "setup.py").write_text("")
    with pytest.raises(BuildError, match="cutlass"):
        build_fa3(tmp_path, tmp_path, "90", ("HDIM128",))


def test_a_missing_sdist_names_the_command_that_downloads_it(tmp_path, capsys):
    assert main(["mamba-ssm", "--wheelhouse", str(tmp_path), "--arch", "90"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("FAILED mamba-ssm after") and "make wheelhouse" in err


def test_a_failed_build_quotes_its_error_line(tmp_path, monkeypatch):
    script = tmp_path / "fail.py"
    script.write_text(
        "print('compiling')\nprint('error: identifier \"x\" is undefined')\nraise SystemExit(3)\n"
    )
    with pytest.raises(BuildError, match=r'exit 3: error: identifier "x" is undefined \(log: '):
        cuda_wheels.run_logged(["python3", str(script)], tmp_path, {}, tmp_path / "logs" / "x.log")


def test_built_wheels_replace_older_wheels_of_the_same_distribution(tmp_path):
    built, house = tmp_path / "built", tmp_path / "house"
    built.mkdir(), house.mkdir()
    (house / "mamba_ssm-2.3.2.post1-py3-none-any.whl").write_bytes(b"pure")
    (house / "mamba_ssm_extra-1.0-py3-none-any.whl").write_bytes(b"other")
    (built / "mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl").write_bytes(b"cuda")
    moved = cuda_wheels.move_wheels(built, house)
    assert [path.name for path in moved] == ["mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl"]
    assert sorted(path.name for path in house.iterdir()) == [
        "mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl",
        "mamba_ssm_extra-1.0-py3-none-any.whl",
    ]


def test_make_cuda_wheels_builds_each_package_for_the_flash_attention_checkout():
    dry = subprocess.run(
        ["make", "-n", "cuda-wheels", "FLASH_ATTN_SRC=/src/flash-attention", "WHEELHOUSE=/wh", "PYTHON=py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    steps = [line for line in dry.replace("\\\n", " ").splitlines() if "tfla_bench.cuda_wheels" in line]
    assert [step.split("tfla_bench.cuda_wheels")[1].split()[0] for step in steps] == [
        "causal-conv1d",
        "mamba-ssm",
        "flash-attn",
        "fa3",
    ]
    assert all(
        "--wheelhouse /wh" in step and "--flash-attn-src /src/flash-attention" in step for step in steps
    )
    only = subprocess.run(
        ["make", "-n", "cuda-wheels", "CUDA_WHEELS=mamba-ssm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert only.count("tfla_bench.cuda_wheels") == 1 and "--flash-attn-src" not in only
