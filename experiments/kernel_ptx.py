"""The PTX and SASS of every kernel variant our mLSTM kernels launch, compiled for sm90 on the CPU:
a check that a change to the kernels' source leaves the compiled code as it was.

    python experiments/kernel_ptx.py OUT.json [--compare BEFORE.json] [--processes 2]

Two steps, each in a process of its own:

1. Record: `mlstm_tfla` and `mlstm_limit_chunk` run under Triton's interpreter (TRITON_INTERPRET=1)
   at the calls of `CALLS`, with each kernel launch recorded instead of run: the kernel, the type of
   each argument (a tensor's dtype, an integer's width), its constexprs and launch options. The
   configs are the ones an sm90 GPU would take at those shapes (`config.config_for`), passed as
   `config=`, so the variants are the ones the sweeps compile (and dK and dV in one kernel, which
   configs may choose at small head dims).
2. Compile: each distinct variant with `triton.compile` for `GPUTarget("cuda", 90, 32)` (no GPU
   needed), pointers and integers that divide by 16 marked so, as Triton specializes them at a launch.
   The digest of its PTX is taken without the lines that name source positions (`.loc`, `.file`, the
   debug sections) and without the labels that mark where an inlined `triton.jit` function begins and
   ends (`$L__tmp3:`, which no instruction branches to), which a change that only moves code alters;
   the SASS's (`cuobjdump -sass` of the cubin) without its comments.

OUT.json lists every variant with its two digests. `--compare BEFORE.json` then says which variants
differ, appeared or went away, and exits 1 if any did.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# (kernel, gate, Dqk, Dv, chunk, options): Fig. 5's shape, Fig. 17's large and small head dims, the
# limit kernel's shape; the options those calls take besides the defaults.
CALLS = [
    (kernel, gate, dqk, dv, chunk, options)
    for kernel, gate, dqk, dv, chunk in [
        ("tfla", "sig", 128, 256, 128),
        ("tfla", "exp", 128, 256, 128),
        ("tfla", "sig", 256, 512, 256),
        ("tfla", "exp", 256, 512, 128),
        ("tfla", "exp", 64, 64, 64),
        ("limit_chunk", "exp", 64, 64, 64),
        ("limit_chunk", "exp", 128, 256, 64),
    ]
    for options in ({}, {"initial_state": True, "return_final_state": True})
] + [
    ("tfla", "sig", 128, 256, 128, {"normalize": True}),
    ("tfla", "sig", 64, 64, 64, {"bwd_fused_kv": True}),
    ("tfla", "exp", 64, 64, 64, {"bwd_fused_kv": True}),
    ("tfla", "sig", 128, 256, 128, {"tma": True}),
    ("tfla", "exp", 128, 256, 128, {"tma": True}),
]
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "int32": "i32", "int64": "i64"}
LAUNCH_OPTIONS = ("num_warps", "num_stages")
DEBUG_LINE = re.compile(r"^\s*(\.loc|\.file)\b|^\$L__tmp\d+:$")


def record() -> list[dict]:
    """Step 1 (under TRITON_INTERPRET=1): every launch of the calls of `CALLS`, run as records only."""
    import torch
    import triton.runtime.interpreter as interpreter

    from tfla_bench.kernels import config as kconfig
    from tfla_bench.kernels.limit_chunk import mlstm_limit_chunk
    from tfla_bench.kernels.tfla import mlstm_tfla

    launches: list[dict] = []

    def run(self, *args, grid, warmup, **kwargs):
        params = inspect.signature(self.fn).parameters
        given = dict(zip(params, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}
        constexpr = {name for name, param in params.items() if "constexpr" in str(param.annotation)}
        launches.append(
            {
                "kernel": f"{self.fn.__module__}:{self.fn.__name__}",
                "args": {
                    name: {"constexpr": value} if name in constexpr else describe(value)
                    for name, value in given.items()
                },
                "options": {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs},
            }
        )

    interpreter.InterpretedFunction.run = run
    functions = {"tfla": mlstm_tfla, "limit_chunk": mlstm_limit_chunk}
    for kernel, gate, dqk, dv, chunk, options in CALLS:
        cfg = kconfig.config_for(kernel, dqk, dv, chunk, torch.bfloat16, gate, ("sm90", "sm90"))
        tma = options.get("tma", False)  # every tile through a TMA descriptor
        cfg = dataclasses.replace(cfg, bwd_fused_kv=options.get("bwd_fused_kv", False), tma=tma, bwd_tma=tma)
        q, k = (torch.randn(1, 1, 2 * chunk, dqk, dtype=torch.bfloat16, requires_grad=True) for _ in "qk")
        v = torch.randn(1, 1, 2 * chunk, dv, dtype=torch.bfloat16, requires_grad=True)
        i, f = (torch.randn(1, 1, 2 * chunk, requires_grad=True) for _ in "if")
        state = None
        if options.get("initial_state"):
            state = (torch.zeros(1, 1, dqk, dv), torch.zeros(1, 1, dqk), torch.zeros(1, 1))
            state = state if gate == "exp" else state[:1]
        gated = {"gate": gate} if kernel == "tfla" else {}  # limit_chunk is mLSTMexp only
        got = functions[kernel](
            q, k, v, i, f, **gated, chunk_size=chunk, config=cfg, initial_state=state,
            return_final_state=options.get("return_final_state", False),
            **({"normalize": True} if options.get("normalize") else {}),
        )  # fmt: skip
        h = got[0] if isinstance(got, tuple) else got
        h.float().sum().backward()
    return launches


def describe(value) -> dict:
    """An argument as Triton specializes it: a pointer's dtype, an integer's width and divisibility."""
    import torch
    from triton.runtime.jit import mangle_type
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(value, TensorDescriptor):
        return {"type": mangle_type(value)}  # "tensordesc<bf16[1, 64, 128]>"
    if isinstance(value, torch.Tensor):
        return {"type": "*" + DTYPES[str(value.dtype).removeprefix("torch.")], "div16": True}
    if isinstance(value, bool):
        return {"constexpr": value}
    if isinstance(value, int):
        width = "i32" if -(2**31) <= value < 2**31 else "i64"
        return {"type": width, "div16": value % 16 == 0, "value": value}
    if isinstance(value, float):
        return {"type": "fp32", "value": value}
    return {"constexpr": value}


def compile_variant(variant: dict) -> dict:
    """Step 2: one variant compiled for sm90; its digests (or the error it met)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    module, name = variant["kernel"].split(":")
    fn = getattr(importlib.import_module(module), name)
    args = variant["args"]
    signature, constexprs, attrs = {}, {}, {}
    defaults = {param.name: param.default for param in fn.params}
    for index, arg_name in enumerate(fn.arg_names):
        # a parameter the launch left out takes its default (a constexpr the launches never set)
        arg = args.get(arg_name, {"constexpr": defaults[arg_name]})
        if "constexpr" in arg:
            signature[arg_name] = "constexpr"
            constexprs[arg_name] = arg["constexpr"]
        else:
            signature[arg_name] = arg["type"]
            if arg.get("div16"):
                attrs[(index,)] = [["tt.divisibility", 16]]
    try:
        compiled = compile(
            ASTSource(fn, signature, constexprs, attrs),
            target=GPUTarget("cuda", 90, 32),
            options=variant["options"],
        )
    except Exception as exc:  # a variant that does not compile is a finding, not a stop
        return variant | {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    ptx = "\n".join(line for line in compiled.asm["ptx"].split("\n") if not DEBUG_LINE.match(line))
    ptx = ptx.split(".section\t.debug")[0]
    return variant | {"ptx": digest(ptx), "sass": digest(sass(compiled.asm["cubin"]))}


def sass(cubin: bytes) -> str:
    """The cubin's SASS without comments and addresses (`cuobjdump` bundled with Triton)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        done = subprocess.run([str(tool), "-sass", file.name], capture_output=True, text=True, check=True)
    lines = (re.sub(r"/\*.*?\*/", "", line).strip() for line in done.stdout.splitlines())
    return "\n".join(line for line in lines if line and "Function" not in line)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def key(variant: dict) -> str:
    return json.dumps([variant["kernel"], variant["args"], variant["options"]], sort_keys=True)


def compare(now: list[dict], before: list[dict]) -> list[str]:
    """What changed from `before` to `now`, a line per variant."""
    old, new = {key(v): v for v in before}, {key(v): v for v in now}
    lines = [f"gone: {old[k]['kernel']}" for k in old.keys() - new.keys()]
    lines += [f"new: {new[k]['kernel']}" for k in new.keys() - old.keys()]
    for k in old.keys() & new.keys():
        changed = [part for part in ("ptx", "sass", "error") if old[k].get(part) != new[k].get(part)]
        if changed:
            lines.append(f"{' and '.join(changed)} changed: {new[k]['kernel']} {new[k]['options']}")
    return sorted(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path, help="an earlier OUT.json: exit 1 where a variant differs")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)  # step 1's process
    args = parser.parse_args()
    if args.record:
        args.out.write_text(json.dumps(record()))
        return 0
    if args.compare and not args.compare.is_file():
        print(f"error: {args.compare}: no such file", file=sys.stderr)
        return 2
    env = os.environ | {"TRITON_INTERPRET": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        launches = Path(tmp) / "launches.json"
        subprocess.run([sys.executable, __file__, str(launches), "--record"], env=env, check=True)
        variants = list({key(v): v for v in json.loads(launches.read_text())}.values())
    print(f"{len(variants)} kernel variants recorded; compiling them for sm90", flush=True)
    os.environ.pop("TRITON_INTERPRET", None)
    with ProcessPoolExecutor(args.processes) as pool:
        done = sorted(pool.map(compile_variant, variants), key=key)
    args.out.write_text(json.dumps(done, indent=1) + "\n")
    failed = [v for v in done if "error" in v]
    print(f"wrote {args.out}: {len(done)} variants, {len(failed)} did not compile")
    for v in failed:
        print(f"  {v['kernel']}: {v['error']}")
    if args.compare:
        lines = compare(done, json.loads(args.compare.read_text()))
        print("\n".join(lines) if lines else f"every variant's PTX and SASS as in {args.compare}")
        return 1 if lines else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
