"""Tune our kernels' `KernelConfig` for this GPU at given shapes (see tfla_bench.measure.tuning).

python experiments/tune_kernels.py tfla:sig:8,16,8192,128,256:128 [more shapes] \
    [--out kernels/tuned_configs.json] [--tables results/kernels] [--processes 14]

A shape is KERNEL:GATE:B,NH,T,DQK,DV:L (bfloat16; limit_chunk takes the gate `exp`). Each shape's
entry replaces the one of the same GPU and shape in OUT; the search's table goes to
TABLES/tuning-<kernel>-<gate>-<shape>.md. The entry records the default's and the tuned config's
median fw and fwbw times, measured side by side at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from tfla_bench.kernels import config as kconfig
from tfla_bench.measure import timing, tuning


def parse_shape(text: str) -> tuning.Shape:
    try:
        kernel, gate, dims, chunk = text.split(":")
        batch, heads, seq_len, dqk, dv = (int(x) for x in dims.split(","))
        shape = tuning.Shape(kernel, gate, batch, heads, seq_len, dqk, dv, int(chunk))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KERNEL:GATE:B,NH,T,DQK,DV:L") from None
    if (
        kernel not in tuning.KERNELS
        or gate not in ("exp", "sig")
        or (kernel == "limit_chunk" and gate != "exp")
    ):
        raise argparse.ArgumentTypeError(f"{text!r}: kernel tfla (gate exp or sig) or limit_chunk (gate exp)")
    return shape


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", type=parse_shape)
    parser.add_argument("--out", type=Path, default=kconfig.TUNED_FILE)
    parser.add_argument("--tables", type=Path, default=Path("results/kernels"))
    parser.add_argument("--processes", type=int, default=14)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: tuning needs a CUDA GPU", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    entries = json.loads(args.out.read_text()) if args.out.exists() else []
    args.tables.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes:
        print(f"== {shape.label()} on {gpu}", flush=True)
        base = kconfig.default_config(
            shape.kernel, shape.head_dim_qk, shape.head_dim_v, shape.chunk_size, shape.dtype, shape.gate
        )

        def show(trial: tuning.Trial, base: kconfig.KernelConfig = base) -> None:
            ms = f"{trial.median_ms:.3f} ms" if trial.median_ms is not None else trial.error[:100]
            print(f"  {trial.group:5s} {tuning.changed_fields(trial.config, base)}: {ms}", flush=True)

        inputs = tuning.make_inputs(shape, "cuda")
        best, trials = tuning.tune(shape, processes=args.processes, on_trial=show, inputs=inputs)
        rule = timing.StopRule(rel_ci=0.005, budget_s=2.0, min_reps=20)
        facts = {}
        for mode in ("fw", "fwbw"):
            for name, config in (("default", base), ("tuned", best)):
                call = tuning.make_call(shape, inputs, config, mode)
                facts[f"{name}_{mode}_ms"] = round(tuning.time_call(call, "cuda", rule), 4)
        facts.update(torch=torch.__version__, triton=__import__("triton").__version__)
        print(f"  -> {tuning.changed_fields(best, base)}: {facts}", flush=True)
        facts.update(batch=shape.batch, heads=shape.heads, seq_len=shape.seq_len)
        entry = kconfig.tuned_entry(shape.config_key(gpu), best, **facts)
        key = [entry[name] for name in kconfig.KEY_FIELDS]
        entries = [e for e in entries if [e.get(name) for name in kconfig.KEY_FIELDS] != key]
        entries.append(entry)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(entries, indent=1) + "\n")
        slug = f"{shape.kernel}-{shape.gate}-B{shape.batch}-NH{shape.heads}-T{shape.seq_len}"
        slug += f"-Dqk{shape.head_dim_qk}-Dv{shape.head_dim_v}-L{shape.chunk_size}"
        (args.tables / f"tuning-{slug}.md").write_text(tuning.markdown(shape, trials, base, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
