"""Compare the two ways a sweep reads the energy per call (`tfla_bench.measure.energy`): around the
timed calls, less what their flushes, spins and idle GPU drew (`around`), and a series of calls of
its own after them (`series`).

python experiments/compare_energy_methods.py OUT [--spec fig5_consttoken] [--kernel tfla_sig,fa3]
    [--seq-len 512,8192,65536] [--mode fw,fwbw]      (OUT: the CSV table; docs/energy.md has the H200's)

On one CUDA GPU with nvidia-ml-py, each case of the spec that the filters keep is measured four
times in this process, as a sweep's worker measures it (`worker.measure_case`), with the spec's
settings and the method in the order series, around, around, series, so a drift of the GPU's state
over the four falls on both alike. The first case measured with `around` also pays the worker's
calibration (`energy.calibrate`); its `around_s` says so. `--no-l2-flush` times the calls without
the flush, so that the two methods differ only in the spins, the tail and the calls' pace: set
beside a run with the flush, it tells what the flush's subtraction and the flushed L2 move.

Columns: kernel, mode, seq_len, median_ms, series_call_ms (the series' window over its calls: a
call's time back to back, its share of the idle tail included), series_mj and around_mj (the mean of
each method's two energies per call; `around_mj` is a series' own where the case fell back, as
`note` says), ratio (around / series; the summary line leaves out the cases that fell back),
series_spread and around_spread (each method's two values apart, over their mean), outside_share
(the share of the window's rise charged to what ran beside the calls, the mean of the two), series_s
and around_s (the worker's time from the end of the first call to the end of its energy,
`Measurement.calls_s`, the mean of the two), and note (why an `around` measurement fell back to a
series of its own, where one did).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from tfla_bench.adapters import registry
from tfla_bench.errors import UserError
from tfla_bench.measure import worker
from tfla_bench.run import specs

COLUMNS = (
    "kernel",
    "mode",
    "seq_len",
    "median_ms",
    "series_call_ms",
    "series_mj",
    "around_mj",
    "ratio",
    "series_spread",
    "around_spread",
    "outside_share",
    "series_s",
    "around_s",
    "note",
)
ORDER = ("series", "around", "around", "series")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit code 2, as every command of the suite
        self.exit(2, f"error: {message}\n")


def listed(kind: type) -> Any:
    """A parser of comma-separated values of `kind`."""

    def parse(text: str) -> list:
        try:
            values = [kind(part) for part in text.split(",") if part]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        return values

    return parse


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the CSV file to write")
    parser.add_argument("--spec", default="fig5_consttoken", help="a spec name or file (tfla-bench specs)")
    parser.add_argument("--kernel", type=listed(str), default=["tfla_sig"], help="the spec's kernels to keep")
    parser.add_argument("--seq-len", type=listed(int), default=None, help="the sequence lengths to keep")
    parser.add_argument("--mode", type=listed(str), default=["fw", "fwbw"], help="fw, fwbw or both")
    parser.add_argument(
        "--no-l2-flush",
        dest="l2_flush",
        action="store_false",
        help="time the calls without the L2 flush: the window then holds the calls, spins and tail only",
    )
    return parser.parse_args(argv)


def cases(args: argparse.Namespace) -> tuple[list, Any]:
    """The spec's cases that the filters keep, and its settings; a `UserError` when none is kept."""
    spec = specs.load_spec(specs.find_spec(args.spec))
    kept = [
        case
        for case in specs.expand(spec, args.kernel)
        if case.mode in args.mode and (args.seq_len is None or case.seq_len in args.seq_len)
    ]
    if not kept:
        raise UserError(f"no case of {args.spec} is kept by --kernel, --seq-len and --mode")
    return kept, dataclasses.replace(spec.measurement, l2_flush=args.l2_flush)


def compare(case: Any, settings: Any) -> dict[str, Any] | None:
    """The table's row of one case, or None (printed) where a measurement is not ok or has no energy."""
    adapter = registry.get(case.kernel)
    reason = adapter.available() or adapter.check(case)
    if reason:
        print(f"{case.key}: skipped, {reason}", flush=True)
        return None
    got: dict[str, list[worker.Measurement]] = {"series": [], "around": []}
    for method in ORDER:
        chosen = dataclasses.replace(settings, energy=True, energy_method=method)
        result = worker.measure_case(adapter, case, chosen, "cuda:0")
        if result.row.status != "ok" or result.row.energy_mj is None:
            print(f"{case.key} ({method}): {result.row.status}, {result.row.error or result.energy_missing}")
            return None
        got[method].append(result)
    mj = {method: [m.row.energy_mj for m in got[method]] for method in got}
    mean = {method: statistics.fmean(values) for method, values in mj.items()}
    shares = [m.energy.outside_share for m in got["around"] if m.energy and m.energy.method == "around"]
    notes = sorted({m.row.note for m in got["around"] if "energy from calls" in (m.row.note or "")})
    return {
        "kernel": case.kernel,
        "mode": case.mode,
        "seq_len": case.seq_len,
        "median_ms": round(statistics.fmean(m.row.median_ms for m in got["series"]), 4),
        "series_call_ms": round(
            statistics.fmean(m.energy.seconds * 1e3 / m.energy.calls for m in got["series"]), 4
        ),
        "series_mj": round(mean["series"], 3),
        "around_mj": round(mean["around"], 3),
        "ratio": round(mean["around"] / mean["series"], 4),
        "series_spread": round(abs(mj["series"][0] - mj["series"][1]) / mean["series"], 4),
        "around_spread": round(abs(mj["around"][0] - mj["around"][1]) / mean["around"], 4),
        "outside_share": round(statistics.fmean(shares), 4) if shares else "",
        "series_s": round(statistics.fmean(m.calls_s or 0.0 for m in got["series"]), 3),
        "around_s": round(statistics.fmean(m.calls_s or 0.0 for m in got["around"]), 3),
        "note": "; ".join(notes),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("error: comparing the energy methods needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        registry.load()
        kept, settings = cases(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:  # row by row: a stopped comparison keeps its rows
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for case in kept:
            row = compare(case, settings)
            if row is not None:
                rows.append(row)
                writer.writerow(row)
                handle.flush()
                print(", ".join(f"{key} {row[key]}" for key in COLUMNS), flush=True)
    ratios = [row["ratio"] for row in rows if not row["note"]]
    if ratios:
        within = sum(abs(ratio - 1) <= 0.02 for ratio in ratios)
        print(
            f"{torch.cuda.get_device_name()}: {len(ratios)} cases read around their timed calls, around / "
            f"series median {statistics.median(ratios):.4f}, {within} within 2%; wrote {args.out}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
