"""`experiments/kernel_ptx.py`: the compiled code of our kernels' variants, for checking a refactor.

Its kernels compile for sm90 on the CPU (`triton.compile` with a CUDA target needs no GPU), in a process
without Triton's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "experiments" / "kernel_ptx.py"

TOY = """
import triton
import triton.language as tl


@triton.jit
def load(ptr, offs, n):
    return tl.load(ptr + offs, mask=offs < n)


@triton.jit
def scaled(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
{moved}    tl.store(y_ptr + offs, {x} * {factor}, mask=offs < n)
"""
INLINE_LOAD = "tl.load(x_ptr + offs, mask=offs < n)"
VARIANT = {
    "kernel": "toy_kernel:scaled",
    "args": {
        "x_ptr": {"type": "*fp32", "div16": True},
        "y_ptr": {"type": "*fp32", "div16": True},
        "n": {"type": "i32", "div16": True, "value": 4096},
        "BLOCK": {"constexpr": 128},
    },
    "options": {"num_warps": 4},
}


def compiled(folder: Path, factor: str, moved: str = "", x: str = INLINE_LOAD) -> dict:
    """The toy kernel's variant compiled by the tool, in a process without the interpreter."""
    folder.mkdir(parents=True)
    (folder / "toy_kernel.py").write_text(TOY.format(factor=factor, moved=moved, x=x))
    script = (
        "import json, sys, kernel_ptx; print(json.dumps(kernel_ptx.compile_variant(json.loads(sys.argv[1]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(VARIANT)],
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        | {"PYTHONPATH": f"{folder}{os.pathsep}{TOOL.parent}", "TRITON_CACHE_DIR": str(folder / "cache")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_moving_the_source_keeps_the_digests_and_changing_it_does_not(tmp_path):
    first = compiled(tmp_path / "a", "2.0")
    assert "error" not in first and len(first["ptx"]) == len(first["sass"]) == 16
    moved = compiled(tmp_path / "b", "2.0", moved="    # a comment and a blank line move the store\n\n")
    assert (moved["ptx"], moved["sass"]) == (first["ptx"], first["sass"])
    # the load through a function of its own: the PTX gains only the labels that mark the inlined call
    through = compiled(tmp_path / "through", "2.0", x="load(x_ptr, offs, n)")
    assert (through["ptx"], through["sass"]) == (first["ptx"], first["sass"])
    changed = compiled(tmp_path / "c", "3.0")
    assert changed["ptx"] != first["ptx"] and changed["sass"] != first["sass"]


def test_the_record_holds_every_kernel_of_ours_and_compare_names_what_changed(tmp_path):
    sys.path.insert(0, str(TOOL.parent))
    try:
        import kernel_ptx
    finally:
        sys.path.pop(0)
    out = tmp_path / "launches.json"
    done = subprocess.run(
        [sys.executable, str(TOOL), str(out), "--record"],
        env=os.environ | {"TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    launches = json.loads(out.read_text())
    assert {v["kernel"].split(":")[1] for v in launches} == {
        "fwd_kernel_gates", "fwd_kernel_states", "tfla_fwd_kernel_h", "bwd_kernel_gates",
        "bwd_kernel_dstates", "tfla_bwd_kernel_dq", "tfla_bwd_kernel_dkv", "limit_chunk_fwd_kernel_h",
        "limit_chunk_bwd_kernel_dqkv", "tfla_bwd_kernel_dkv_fused",
    }  # fmt: skip
    outputs = [v for v in launches if v["kernel"].endswith("tfla_fwd_kernel_h")]
    blocks = {v["args"]["BLOCK_DV"]["constexpr"] for v in outputs}
    assert len(blocks) > 1  # the sm90 configs of several shapes, not one default

    before = [dict(VARIANT, ptx="p", sass="s"), dict(VARIANT, kernel="toy_kernel:gone", ptx="p", sass="s")]
    now = [dict(VARIANT, ptx="q", sass="s"), dict(VARIANT, kernel="toy_kernel:new", ptx="p", sass="s")]
    assert kernel_ptx.compare(now, before) == [
        "gone: toy_kernel:gone",
        "new: toy_kernel:new",
        "ptx changed: toy_kernel:scaled {'num_warps': 4}",
    ]
    assert kernel_ptx.compare(before, before) == []
