"""`make gpu` (`tfla_bench.gpu_setup`): what it installs, builds and replaces, with a stand-in pip."""

from pathlib import Path

import pytest

from tfla_bench import gpu_setup


class Pip:
    """A stand-in for every command the set-up runs: records them, installs nothing, exits 0."""

    def __init__(self):
        self.commands: list[list[str]] = []

    def __call__(self, command):
        self.commands.append(list(command))
        return 0

    def installs(self):
        return [c for c in self.commands if c[1:4] == ["-m", "pip", "install"]]


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A GPU machine as the set-up sees it: installed versions, importable modules, built wheels."""
    state = {"versions": {}, "modules": set(), "built": []}
    monkeypatch.setattr(gpu_setup, "installed", lambda name: state["versions"].get(name))
    monkeypatch.setattr(gpu_setup, "has_module", lambda name: name in state["modules"])
    monkeypatch.setattr(gpu_setup, "cuda_major", lambda: "13")

    def build_all(builds, wheelhouse, fa_src):
        for build in builds:
            (wheelhouse / f"{build.distribution}-1.0-cp312-cp312-linux_x86_64.whl").write_bytes(b"")
            state["built"].append(build.package)
        return {build.package: "built" for build in builds}

    monkeypatch.setattr(gpu_setup, "build_all", build_all)
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    for name in ("fla_core-0.6.0-py3-none-any.whl", "mamba_ssm-2.3.2.post1-py3-none-any.whl"):
        (wheelhouse / name).write_bytes(b"")
    state["wheelhouse"] = wheelhouse
    return state


def test_offline_installs_what_the_wheelhouse_has_and_names_what_it_lacks(machine, capsys):
    pip = Pip()
    src = machine["wheelhouse"]  # any folder: the build is a stand-in
    assert (
        gpu_setup.main(["--wheelhouse", str(machine["wheelhouse"]), "--flash-attn-src", str(src)], pip) == 0
    )
    first = pip.installs()[0]
    assert "--no-index" in first and "fla-core==0.6.0" in first and "lightning-attn==0.0.5" not in first
    out = capsys.readouterr().out
    assert "not in" in out and "lightning-attn==0.0.5" in out
    assert machine["built"] == ["causal-conv1d", "mamba-ssm", "fa3"]  # flash-attn 2 only when asked
    replace = pip.installs()[1]
    assert "--force-reinstall" in replace  # a pure-Python mamba-ssm of the same version is replaced
    assert sum(w.endswith("linux_x86_64.whl") for w in replace) == 3
    assert f"built causal-conv1d, mamba-ssm, fa3 into {machine['wheelhouse']}: carry that folder" in out
    assert [c[-1] for c in pip.commands if c[1] == "-c"] == ["check"]
    assert "== CUDA wheels:" in out and out.count(" s\n") >= 3  # every step says its time


def test_a_second_run_only_checks(machine, capsys):
    machine["versions"] = {name: version or "1" for name, version in gpu_setup.WHEELS}
    machine["versions"]["nvidia-cutlass-dsl-libs-cu13"] = "4.8.1"
    machine["modules"] = {b.module for b in gpu_setup.CUDA_BUILDS}
    pip = Pip()
    assert gpu_setup.main(["--wheelhouse", str(machine["wheelhouse"])], pip) == 0
    assert pip.installs() == [] and machine["built"] == []
    out = capsys.readouterr().out
    assert "every pure-Python baseline is installed" in out and "every CUDA extension imports" in out


def test_a_wheel_built_on_an_earlier_run_is_installed_not_built_again(machine):
    (machine["wheelhouse"] / "causal_conv1d-1.7.0-cp312-cp312-linux_x86_64.whl").write_bytes(b"")
    machine["modules"] = {"flash_attn_interface", "selective_scan_cuda"}
    pip = Pip()
    assert gpu_setup.main(["--wheelhouse", str(machine["wheelhouse"]), "--skip-check"], pip) == 0
    assert machine["built"] == []
    assert any("causal_conv1d-1.7.0" in arg for arg in pip.installs()[-1])


def test_fa3_without_a_source_or_a_clone_is_one_clear_error(machine, capsys, tmp_path):
    machine["modules"] = {"causal_conv1d_cuda", "selective_scan_cuda"}

    def offline(command):
        return 128 if command[0] == "git" else 0

    assert (
        gpu_setup.main(["--wheelhouse", str(machine["wheelhouse"]), "--work", str(tmp_path / "w")], offline)
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: FA3 needs flash-attention's source") and "FLASH_ATTN_SRC" in err


def test_online_downloads_the_sources_of_the_builds(machine, tmp_path):
    machine["modules"] = {"flash_attn_interface"}
    pip = Pip()
    assert gpu_setup.main(["--work", str(tmp_path / "w"), "--skip-check"], pip) == 0
    assert "--no-index" not in pip.installs()[0]
    download = next(c for c in pip.commands if "download" in c)
    assert download[-2:] == ["causal-conv1d==1.7.0", "mamba-ssm==2.3.2.post1"]
    assert Path(download[download.index("-d") + 1]) == tmp_path / "w" / "wheels" / "sdist"


def test_flash_attn_2_is_built_only_when_asked(machine):
    assert "flash-attn" not in [b.package for b in gpu_setup.builds_needed(False)]
    assert "flash-attn" in [b.package for b in gpu_setup.builds_needed(True)]


def test_flash_attention_4_goes_in_whole_or_not_at_all(machine, capsys):
    # Without the CUTLASS DSL's CUDA library wheel, the rest of the DSL breaks `import mamba_ssm`.
    for name in ("flash_attn_4-4.0.0b36", "nvidia_cutlass_dsl-4.8.1", "quack_kernels-0.6.5"):
        (machine["wheelhouse"] / f"{name}-py3-none-any.whl").write_bytes(b"")
    pip = Pip()
    assert gpu_setup.main(["--wheelhouse", str(machine["wheelhouse"]), "--skip-check"], pip) == 0
    first = pip.installs()[0]
    assert not [arg for arg in first if arg.startswith(("flash-attn-4", "nvidia-cutlass-dsl", "quack"))]
    assert "FlashAttention 4 left out" in capsys.readouterr().out
    (machine["wheelhouse"] / "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-linux_x86_64.whl").write_bytes(
        b""
    )
    for name in gpu_setup.FA4_WHEELS[1:]:
        stem = name.replace("-", "_")
        (machine["wheelhouse"] / f"{stem}-{dict(gpu_setup.WHEELS)[name]}-py3-none-any.whl").write_bytes(b"")
    pip = Pip()
    assert gpu_setup.main(["--wheelhouse", str(machine["wheelhouse"]), "--skip-check"], pip) == 0
    assert (
        "flash-attn-4==4.0.0b36" in pip.installs()[0] and "nvidia-cutlass-dsl-libs-cu13" in pip.installs()[0]
    )
