"""How long `tfla-bench site` takes and how much it writes, for many large runs or for given ones.

python experiments/site_benchmark.py                       # 100 synthetic runs of 300 rows
python experiments/site_benchmark.py --runs 20             # fewer
python experiments/site_benchmark.py --from results/runs   # the committed runs

The synthetic runs (`tests/synthetic_run.py`, `site_rows`) are Fig. 5-like sweeps of 300 rows (15
kernels, fw and fwbw, 10 sequence lengths), one spec, three in four on an H100 and one in four on an
H200, a commit every two runs. It builds the site into a temporary folder through the CLI, as a user
would, and prints the wall time, the CPU time (which other work on the machine leaves alone) and the
site's size beside the targets (100 such runs in under 120 s and 50 MB, the committed runs in under
60 s), then the time of a rebuild into the same folder, where nothing changed and every page is
reused. The exit code is 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SYNTHETIC_TARGET_S, SYNTHETIC_TARGET_BYTES = 120.0, 50e6
COMMITTED_TARGET_S = 60.0


def write_synthetic(folder: Path, count: int) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from synthetic_run import H100_NAME, site_rows, write_run

    for i in range(count):
        gpu = "NVIDIA H200" if i % 4 == 3 else H100_NAME
        date = f"2026-11-{1 + i // 10:02d}T{i % 10:02d}:00:00Z"
        write_run(
            folder / f"fig5_consttoken-{i:03d}",
            site_rows(i),
            gpu_name=gpu,
            started_at=date,
            git_sha=f"{i // 2:07x}",
        )


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the site's drawing processes): what the
    build costs whatever else shares the machine."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="synthetic runs to build (default 100)")
    parser.add_argument("--from", dest="source", type=Path, help="build these runs (a folder of runs)")
    parser.add_argument("--keep", type=Path, help="build the site here and keep it")
    args = parser.parse_args()
    from tfla_bench.cli.main import main as cli

    with tempfile.TemporaryDirectory() as tmp:
        source = args.source
        if source is None:
            source = Path(tmp) / "runs"
            write_synthetic(source, args.runs)
        out = args.keep or Path(tmp) / "site"
        start, cpu_start = time.perf_counter(), _cpu_s()
        code = cli(["site", str(source), "--out", str(out)])
        seconds, cpu_s = time.perf_counter() - start, _cpu_s() - cpu_start
        size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
        files = sum(1 for path in out.rglob("*") if path.is_file())
        # The same again into the same folder: every page and history figure is reused.
        start = time.perf_counter()
        code = code or cli(["site", str(source), "--out", str(out)])
        rebuild_s = time.perf_counter() - start
    if code:
        return code
    if args.source is None:
        share = args.runs / 100
        target_s, target_bytes = SYNTHETIC_TARGET_S * share, SYNTHETIC_TARGET_BYTES * share
    else:
        target_s, target_bytes = COMMITTED_TARGET_S, float("inf")
    what = str(args.source) if args.source else f"{args.runs} synthetic runs of 300 rows"
    weight = f" (target {target_bytes / 1e6:.0f} MB)" if target_bytes != float("inf") else ""
    print(
        f"{what}: {seconds:.1f} s (target {target_s:.0f} s; {cpu_s:.0f} CPU-s over {os.cpu_count()} CPUs), "
        f"{size / 1e6:.1f} MB{weight} in {files} files; the same rebuilt into that folder: {rebuild_s:.1f} s"
    )
    return 0 if seconds <= target_s and size <= target_bytes else 1


if __name__ == "__main__":
    sys.exit(main())
