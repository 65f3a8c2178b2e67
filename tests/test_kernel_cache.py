"""Triton's kernel cache packed into the wheelhouse, unpacked on the next machine (`tfla_bench.kernel_cache`).

The kernels here are compiled for sm90 by Triton itself, on the CPU (`triton.compile` with a CUDA target
needs no GPU), so a carried kernel is looked up in its new place by Triton's own cache code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tfla_bench import gpu_setup, kernel_cache

# Compiles one small kernel for sm90 into $TRITON_CACHE_DIR, not interpreted, and prints whether Triton
# compiled it or loaded it from the cache.
COMPILE = """
import sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton import knobs

@triton.jit
def double(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)

compiled = []
knobs.compilation.listener = lambda **kw: compiled.append(not kw["cache_hit"])
src = ASTSource(double, signature={"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                constexprs={"BLOCK": int(sys.argv[1])})
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
print("compiled" if compiled[0] else "loaded", len(kernel.kernel))
"""


def compile_into(cache: Path, block: int = 128) -> str:
    script = cache.parent / "compile_double.py"  # Triton reads a kernel's source from its file
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(COMPILE)
    done = subprocess.run(
        [sys.executable, str(script), str(block)],
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        | {"TRITON_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def test_a_packed_kernel_loads_on_the_next_machine_without_compiling(tmp_path):
    first, second, wheelhouse = tmp_path / "first" / "cache", tmp_path / "second" / "cache", tmp_path / "wh"
    assert compile_into(first) == "compiled"
    assert compile_into(first) == "loaded"
    (first / "abc.autotune.json").write_text('{"configs_timings": []}')  # an autotuner's choice
    said = kernel_cache.pack(wheelhouse, first, "sm90", "3.6.0", "NVIDIA H200")
    archive = wheelhouse / "kernel-cache-sm90-triton3.6.0.tar.xz"
    assert archive.exists() and str(archive) in said and "make gpu" in said

    # Another machine with the same Triton and architecture, its cache elsewhere.
    shutil.rmtree(first)
    said = kernel_cache.unpack(wheelhouse, second, "sm90", "3.6.0")
    assert "packed on NVIDIA H200" in said and "1 kernels" in said
    assert (second / "abc.autotune.json").exists()
    assert not list(second.rglob("*.ptx")) and not list(second.rglob("*.llir"))  # left out
    group = json.loads(next(second.rglob("__grp__*.json")).read_text())
    assert all(Path(p).parent.parent == second for p in group["child_paths"].values())
    assert compile_into(second) == "loaded"
    assert not list(second.rglob("*.ptx"))  # Triton did not compile it again
    assert compile_into(second, block=256) == "compiled"  # another constexpr is another kernel
    manifest = json.loads((second / kernel_cache.MANIFEST).read_text())
    assert manifest["gpu"] == "NVIDIA H200" and manifest["packed_from"] == str(first)


def test_without_repointing_its_index_triton_would_compile_it_again(tmp_path, monkeypatch):
    first, second, wheelhouse = tmp_path / "a" / "cache", tmp_path / "b" / "cache", tmp_path / "wh"
    compile_into(first)
    kernel_cache.pack(wheelhouse, first, "sm90", "3.6.0", "gpu")
    shutil.rmtree(first)  # the first machine's files are not on the second
    monkeypatch.setattr(kernel_cache, "_repoint_groups", lambda cache: 0)
    kernel_cache.unpack(wheelhouse, second, "sm90", "3.6.0")
    assert compile_into(second) == "compiled"


def test_unpack_takes_only_this_machines_archive_and_says_why_not(tmp_path):
    wheelhouse, cache = tmp_path / "wh", tmp_path / "cache"
    wheelhouse.mkdir()
    assert "every kernel compiles here" in kernel_cache.unpack(wheelhouse, cache, "sm90", "3.6.0")
    (wheelhouse / "kernel-cache-sm80-triton3.6.0.tar.xz").write_bytes(b"")
    said = kernel_cache.unpack(wheelhouse, cache, "sm90", "3.6.0")
    assert "none for sm90 with Triton 3.6.0" in said and "kernel-cache-sm80-triton3.6.0.tar.xz" in said
    assert "no CUDA GPU here" in kernel_cache.unpack(wheelhouse, cache, None, "3.6.0")
    assert not cache.exists()


def test_unpack_keeps_the_kernels_already_here(tmp_path):
    source, cache, wheelhouse = tmp_path / "source", tmp_path / "cache", tmp_path / "wh"
    (source / "k1").mkdir(parents=True)
    (source / "k1" / "a.cubin").write_bytes(b"carried")
    (source / "k1" / "b.cubin").write_bytes(b"carried")
    kernel_cache.pack(wheelhouse, source, "sm90", "3.6.0", "gpu")
    (cache / "k1").mkdir(parents=True)
    (cache / "k1" / "a.cubin").write_bytes(b"compiled here")
    kernel_cache.unpack(wheelhouse, cache, "sm90", "3.6.0")
    assert (cache / "k1" / "a.cubin").read_bytes() == b"compiled here"
    assert (cache / "k1" / "b.cubin").read_bytes() == b"carried"


def test_pack_refuses_an_empty_cache_in_one_line(tmp_path):
    with pytest.raises(kernel_cache.CacheError, match="no Triton cache at"):
        kernel_cache.pack(tmp_path / "wh", tmp_path / "missing", "sm90", "3.6.0", "gpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(kernel_cache.CacheError, match="holds no compiled kernel"):
        kernel_cache.pack(tmp_path / "wh", tmp_path / "empty", "sm90", "3.6.0", "gpu")
    assert not (tmp_path / "wh").exists() or not list((tmp_path / "wh").iterdir())


def test_the_command_without_a_gpu_exits_2_on_pack_and_0_on_unpack(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kernel_cache, "this_machine", lambda: (None, "", "3.6.0"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    assert kernel_cache.main(["pack", "--wheelhouse", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: no CUDA GPU here")
    assert kernel_cache.main(["unpack", "--wheelhouse", str(tmp_path)]) == 0
    assert "every kernel compiles here" in capsys.readouterr().out


def test_make_gpu_unpacks_the_wheelhouse_cache_before_the_check(tmp_path, monkeypatch, capsys):
    wheelhouse, source, cache = tmp_path / "wh", tmp_path / "source", tmp_path / "cache"
    (source / "k").mkdir(parents=True)
    (source / "k" / "a.cubin").write_bytes(b"x")
    carried = tuned_file(tmp_path / "first" / "tuned.json", 64)
    kernel_cache.pack(wheelhouse, source, "sm90", "3.6.0", "NVIDIA H200", carried)
    (wheelhouse / "einops-0.8.2-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setattr(kernel_cache, "this_machine", lambda: ("sm90", "NVIDIA H200", "3.6.0"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.setenv("TFLA_BENCH_TUNED_CONFIGS", str(tmp_path / "second" / "tuned.json"))
    monkeypatch.setattr(gpu_setup, "builds_needed", lambda with_fa2: [])
    monkeypatch.setattr(gpu_setup, "installed", lambda name: "0")
    commands = []
    assert gpu_setup.main(["--wheelhouse", str(wheelhouse)], lambda c: commands.append(c) or 0) == 0
    out = capsys.readouterr().out
    assert "== kernel cache: unpacked kernel-cache-sm90-triton3.6.0.tar.xz" in out
    assert out.index("== kernel cache") < out.index("== check")
    assert (cache / "k" / "a.cubin").read_bytes() == b"x"
    assert "1 of its 1 tuned configs added to" in out
    assert json.loads((tmp_path / "second" / "tuned.json").read_text()) == json.loads(carried.read_text())


def tuned_file(path: Path, *chunks: int, warps: int = 4) -> Path:
    """A tuned-config file of one entry per chunk size (sm90, tfla sig, bf16, Dqk 128, Dv 256)."""
    from tfla_bench.kernels import config as kconfig

    entries = []
    for chunk in chunks:
        cfg = kconfig.default_config("tfla", 128, 256, chunk, torch.bfloat16, "sig")
        cfg = dataclasses.replace(cfg, num_warps=warps)
        entries.append(kconfig.tuned_entry(("sm90", "tfla", 128, 256, chunk, torch.bfloat16, "sig"), cfg))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries))
    return path


def test_the_tuned_configs_travel_with_the_cache_and_keep_the_ones_here(tmp_path):
    source, cache, wheelhouse = tmp_path / "source", tmp_path / "cache", tmp_path / "wh"
    (source / "k1").mkdir(parents=True)
    (source / "k1" / "a.cubin").write_bytes(b"carried")
    carried = tuned_file(tmp_path / "first" / "tuned.json", 64, 128, warps=8)
    said = kernel_cache.pack(wheelhouse, source, "sm90", "3.6.0", "gpu", carried)
    assert f"and 2 tuned configs of {carried}" in said
    here = tuned_file(tmp_path / "second" / "tuned.json", 128, 256, warps=2)
    said = kernel_cache.unpack(wheelhouse, cache, "sm90", "3.6.0", here)
    assert said.endswith(f"1 of its 2 tuned configs added to {here}")
    warps = {e["chunk_size"]: e["config"]["num_warps"] for e in json.loads(here.read_text())}
    assert warps == {128: 2, 256: 2, 64: 8}  # the entry tuned here wins where both have one
    assert not (cache / kernel_cache.TUNED_MEMBER).exists()
    from tfla_bench.kernels import config as kconfig

    assert kconfig.load_tuned(here) == 3


def test_a_cache_without_tuned_configs_packs_and_unpacks_as_before(tmp_path):
    source, cache, wheelhouse = tmp_path / "source", tmp_path / "cache", tmp_path / "wh"
    (source / "k1").mkdir(parents=True)
    (source / "k1" / "a.cubin").write_bytes(b"carried")
    said = kernel_cache.pack(wheelhouse, source, "sm90", "3.6.0", "gpu", tmp_path / "none.json")
    assert "tuned configs" not in said
    here = tmp_path / "here.json"
    assert "tuned configs" not in kernel_cache.unpack(wheelhouse, cache, "sm90", "3.6.0", here)
    assert not here.exists()


def test_a_broken_tuned_config_file_is_one_line_before_anything_is_written(tmp_path):
    source, wheelhouse = tmp_path / "source", tmp_path / "wh"
    (source / "k1").mkdir(parents=True)
    (source / "k1" / "a.cubin").write_bytes(b"carried")
    broken = tmp_path / "tuned.json"
    broken.write_text("{not json")
    with pytest.raises(kernel_cache.CacheError, match="tuned.json: not a tuned-config file"):
        kernel_cache.pack(wheelhouse, source, "sm90", "3.6.0", "gpu", broken)
    assert not wheelhouse.exists()
    carried = tuned_file(tmp_path / "first.json", 64)
    kernel_cache.pack(wheelhouse, source, "sm90", "3.6.0", "gpu", carried)
    cache = tmp_path / "cache"
    with pytest.raises(kernel_cache.CacheError, match="not a tuned-config file .*kernels are unpacked"):
        kernel_cache.unpack(wheelhouse, cache, "sm90", "3.6.0", broken)
    assert (cache / "k1" / "a.cubin").read_bytes() == b"carried"
    assert broken.read_text() == "{not json"
