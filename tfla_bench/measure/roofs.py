"""Measured roofs of the present GPU: what it really reaches, beside its data-sheet peaks.

Three numbers, each the best over a few configurations of the median of timed calls (CUDA events):

- dense bf16 matmul FLOP/s: `torch.matmul` of two random square matrices (random, not zeros: the
  tensor cores draw less power on zeros and clock higher), 2 n^3 FLOPs per call, n in `MATMUL_SIZES`;
- HBM bandwidth: a device-to-device copy of `HBM_COPY_BYTES`, far above any L2, read plus write
  counted (2 x bytes per copy), the better of a memcpy and an elementwise kernel (`COPY_METHODS`);
- L2 bandwidth: copies within a working set of half the L2 (source and destination a quarter each),
  `L2_COPIES` of them captured in one CUDA graph so launch gaps stay small; read plus write counted.
  Gaps between the graph's kernels still count, so this is a lower bound of the L2's bandwidth.

The roofs of one GPU depend on its clocks, power limit and driver, so they are saved per GPU name
and driver version in a JSON file (`~/.cache/tfla-bench/roofs.json`, or `$TFLA_BENCH_ROOFS_FILE`)
and reused by later runs: `tfla-bench sweep` copies them into `env.json` (measuring them first
when none are saved) and `tfla-bench model ... --gpu measured` uses them.

`python -m tfla_bench.measure.roofs DEVICE` prints the saved roofs of DEVICE's GPU as one JSON line, after
measuring and saving them when none are saved; the sweep runs it in a child process so that the
parent never creates a CUDA context.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tfla_bench.errors import UserError
from tfla_bench.measure.settings import Rule
from tfla_bench.model.hardware import Accelerator, detect_accelerator

ROOFS_FILE_ENV = "TFLA_BENCH_ROOFS_FILE"
MATMUL_SIZES = (4096, 8192, 16384)
HBM_COPY_BYTES = 1 << 30
L2_COPIES = 64
# A copy captured in a CUDA graph as a memcpy node may run on a copy engine rather than the SMs, which
# moved 2.43 TB/s on an H100 where kernels reach more (results/runs/fig5_consttoken_8192-20261125-184719):
# both a memcpy and an elementwise kernel (`torch.neg`, one read and one write per element) are timed.
COPY_METHODS = ("memcpy", "kernel")
TIMED_CALLS = 20
WARMUP_CALLS = 3
# Seconds the sweep waits for the child that measures the roofs (CUDA start-up and three benchmarks).
CHILD_TIMEOUT_S = 600.0
# What a roof may be: below one FLOP or byte a second, or past these, the model's times and
# intensities overflow (`tfla-bench model --peak-flops / --bandwidth` take the same ranges).
FLOPS_RULE = Rule("number", 1, 1e18, unit=" FLOP/s")
BANDWIDTH_RULE = Rule("number", 1, 1e16, unit=" bytes/s")
# Each field of a record and what it holds.
FIELD_RULES: dict[str, Rule | type] = {
    "gpu_name": str,
    "driver": str,
    "matmul_flops_per_s": FLOPS_RULE,
    "matmul_size": Rule("int", 1, 2**31),
    "hbm_bytes_per_s": BANDWIDTH_RULE,
    "l2_bytes_per_s": BANDWIDTH_RULE,
    "l2_working_set_bytes": Rule("int", 1, 2**50),
    "measured_at": str,
    "torch": str,
}


@dataclass(frozen=True)
class MeasuredRoofs:
    """The measured roofs of one GPU under one driver.

    Attributes:
        gpu_name: `torch.cuda.get_device_name()`, e.g. `NVIDIA H100 80GB HBM3`.
        driver: the NVIDIA driver version (`nvidia-smi`), or `unknown`.
        matmul_flops_per_s: best dense bf16 matmul rate.
        matmul_size: the square size n that reached it.
        hbm_bytes_per_s: device-memory copy bandwidth, read plus write.
        l2_bytes_per_s: copy bandwidth within half the L2, read plus write.
        l2_working_set_bytes: the L2 working set (source plus destination).
        measured_at: UTC time, ISO 8601.
        torch: the torch version that measured them.
    """

    gpu_name: str
    driver: str
    matmul_flops_per_s: float
    matmul_size: int
    hbm_bytes_per_s: float
    l2_bytes_per_s: float
    l2_working_set_bytes: int
    measured_at: str
    torch: str

    @property
    def key(self) -> str:
        """The cache key: GPU name and driver."""
        return cache_key(self.gpu_name, self.driver)

    def accelerator(self) -> Accelerator:
        """The roofs as the model's accelerator (HBM roof; the L2 roof is drawn apart)."""
        return Accelerator(
            "measured", self.matmul_flops_per_s, self.hbm_bytes_per_s, f"{self.gpu_name} measured"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "measured roofs record") -> MeasuredRoofs:
        """Parse a saved record (`where` names it in messages).

        Raises:
            UserError: not an object, a field missing, or a field not of its `FIELD_RULES`.
        """
        if not isinstance(data, dict):
            raise UserError(f"{where}: expected an object of measured roofs, got {json.dumps(data)[:40]}")
        for name, rule in FIELD_RULES.items():
            if name not in data:
                raise UserError(f"{where}: lacks the field {name!r}")
            value = data[name]
            if isinstance(rule, Rule) and not rule.accepts(value):
                raise UserError(f"{where}: {name} is {json.dumps(value)[:40]}; expected {rule.expected()}")
            if rule is str and not isinstance(value, str):
                raise UserError(f"{where}: {name} is {json.dumps(value)[:40]}; expected a string")
        return cls(**{name: data[name] for name in FIELD_RULES})


def from_env(env: dict[str, Any], where: str = "env.json roofs") -> MeasuredRoofs | None:
    """The measured roofs a run recorded in its env.json, or None (not recorded, or measuring failed);
    `rundir.read_env` has checked them."""
    record = env.get("roofs")
    if not isinstance(record, dict) or "error" in record:
        return None
    return MeasuredRoofs.from_dict(record, where)


def versus_datasheet(roofs: MeasuredRoofs) -> list[tuple[str, float, float | None, str]]:
    """(roof, measured, data-sheet value or None, unit) for the matmul, HBM and L2 roofs and the ridge."""
    sheet = detect_accelerator(roofs.gpu_name)
    return [
        (
            f"dense bf16 matmul (best n = {roofs.matmul_size})",
            roofs.matmul_flops_per_s / 1e12,
            sheet.peak_flops_per_s / 1e12 if sheet else None,
            "TFLOP/s",
        ),
        (
            "HBM copy, read + write",
            roofs.hbm_bytes_per_s / 1e12,
            sheet.bandwidth_bytes_per_s / 1e12 if sheet else None,
            "TB/s",
        ),
        (
            f"L2 copy in {roofs.l2_working_set_bytes / 1e6:.1f} MB, read + write",
            roofs.l2_bytes_per_s / 1e12,
            None,
            "TB/s",
        ),
        (
            "ridge point (matmul / HBM)",
            roofs.matmul_flops_per_s / roofs.hbm_bytes_per_s,
            sheet.intensity_flops_per_byte if sheet else None,
            "FLOP/B",
        ),
    ]


def cache_key(gpu_name: str, driver: str) -> str:
    return f"{gpu_name} / driver {driver}"


def cache_path() -> Path:
    """`$TFLA_BENCH_ROOFS_FILE`, else `$XDG_CACHE_HOME/tfla-bench/roofs.json` (`~/.cache` by default)."""
    named = os.environ.get(ROOFS_FILE_ENV)
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tfla-bench" / "roofs.json"


def load_saved() -> list[MeasuredRoofs]:
    """Every saved record, oldest first; none when the file does not exist.

    Raises:
        UserError: the file is not a JSON object of records.
    """
    path = cache_path()
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read the measured roofs in {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected an object of measured-roofs records, got {json.dumps(data)[:40]}")
    records = [
        MeasuredRoofs.from_dict(record, f"{path}: measured roofs {key!r}") for key, record in data.items()
    ]
    return sorted(records, key=lambda roofs: roofs.measured_at)


def saved(gpu_name: str, driver: str) -> MeasuredRoofs | None:
    """The saved roofs of this GPU under this driver, or None."""
    key = cache_key(gpu_name, driver)
    return next((roofs for roofs in load_saved() if roofs.key == key), None)


def save(roofs: MeasuredRoofs) -> Path:
    """Add (or replace) the record of `roofs`' GPU and driver; written to a temporary file, then renamed."""
    path = cache_path()
    records = {record.key: record.to_dict() for record in load_saved()}
    records[roofs.key] = roofs.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(records, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def measured_accelerator() -> Accelerator:
    """The saved roofs as an accelerator for `--gpu measured`: the present GPU's under its driver, or
    without a CUDA GPU the latest saved record; a `UserError` when there are none."""
    # torch takes seconds to import; only this path needs it.
    import torch

    if torch.cuda.is_available():
        gpu_name, driver = torch.cuda.get_device_name(0), driver_version(0)
        roofs = saved(gpu_name, driver)
        if roofs is None:
            raise UserError(
                f"no measured roofs for {gpu_name} (driver {driver}) in {cache_path()}; "
                "run `tfla-bench roofs` first"
            )
        return roofs.accelerator()
    records = load_saved()
    if not records:
        raise UserError(f"no measured roofs in {cache_path()}; run `tfla-bench roofs` on a GPU first")
    return records[-1].accelerator()


def driver_version(index: int) -> str:
    """The NVIDIA driver version from `nvidia-smi`, or `unknown`."""
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import envinfo

    return envinfo.nvidia_smi(index).get("driver") or "unknown"


def measure(device: str) -> MeasuredRoofs:
    """Measure the roofs of the CUDA `device` (see the module docstring for the method)."""
    # torch takes seconds to import; only this path needs it.
    import torch

    # imports torch at import time, which only this path needs.
    from tfla_bench.measure.envinfo import now_iso

    torch.cuda.set_device(device)
    props = torch.cuda.get_device_properties(device)
    matmul_rates = {n: _matmul_flops_per_s(n, device) for n in MATMUL_SIZES}
    best = max(matmul_rates, key=matmul_rates.__getitem__)
    l2_side = max(props.L2_cache_size // 4, 1 << 20)
    return MeasuredRoofs(
        gpu_name=props.name,
        driver=driver_version(torch.device(device).index or 0),
        matmul_flops_per_s=matmul_rates[best],
        matmul_size=best,
        hbm_bytes_per_s=_copy_bytes_per_s(HBM_COPY_BYTES, 1, device),
        l2_bytes_per_s=_copy_bytes_per_s(l2_side, L2_COPIES, device),
        l2_working_set_bytes=2 * l2_side,
        measured_at=now_iso(),
        torch=torch.__version__,
    )


def _median_ms(fn: Any, device: str) -> float:
    # imports torch at import time, which only this path needs.
    from tfla_bench.measure import timing

    for _ in range(WARMUP_CALLS):
        fn()
    return timing.time_calls(fn, rule=timing.StopRule(reps=TIMED_CALLS), device=device).median_ms


def _matmul_flops_per_s(n: int, device: str) -> float:
    # torch takes seconds to import; only this path needs it.
    import torch

    generator = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=generator) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    median_ms = _median_ms(lambda: torch.matmul(a, b, out=out), device)
    return 2 * n**3 / (median_ms * 1e-3)


def _copy_bytes_per_s(size_bytes: int, copies: int, device: str) -> float:
    """Bandwidth of `copies` back-to-back copies of `size_bytes` in one CUDA graph, read plus write: the
    better of `COPY_METHODS`."""
    return max(_graph_copy_bytes_per_s(size_bytes, copies, device, method) for method in COPY_METHODS)


def _graph_copy_bytes_per_s(size_bytes: int, copies: int, device: str, method: str) -> float:
    # torch takes seconds to import; only this path needs it.
    import torch

    source = torch.randn(size_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)

    def copy() -> None:
        if method == "memcpy":
            target.copy_(source)
        else:
            torch.neg(source, out=target)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        copy()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(copies):
            copy()
    median_ms = _median_ms(graph.replay, device)
    return 2 * source.numel() * 4 * copies / (median_ms * 1e-3)


def start_for_sweep(device: str) -> subprocess.Popen:
    """Start the child process that loads the saved roofs of `device`'s GPU, or measures them now; a
    sweep starts it before its plan and reads it with `for_sweep`."""
    command = [sys.executable, "-m", "tfla_bench.measure.roofs", device]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cancel(child: subprocess.Popen) -> None:
    """Kill a child of `start_for_sweep` whose roofs are not wanted, and reap it."""
    child.kill()
    child.communicate()


def for_sweep(device: str, child: subprocess.Popen | None = None) -> dict[str, Any]:
    """The roofs of `device`'s GPU for `env.json`: saved ones, else measured now in a child process
    (`child`, from `start_for_sweep`, or one started here).

    Returns:
        `MeasuredRoofs.to_dict()`, or `{"error": reason}` when the child failed (the sweep goes on).
    """
    child = child or start_for_sweep(device)
    try:
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        cancel(child)
        return {"error": f"measuring the roofs took more than {CHILD_TIMEOUT_S:g} s"}
    lines = stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        tail = (stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
        return {"error": f"measuring the roofs failed: {tail}"}
    return json.loads(lines[-1])


def _main(device: str) -> None:
    # torch takes seconds to import; only this path needs it.
    import torch

    torch.cuda.set_device(device)
    roofs = saved(torch.cuda.get_device_name(device), driver_version(torch.device(device).index or 0))
    if roofs is None:
        roofs = measure(device)
        save(roofs)
    print(json.dumps(roofs.to_dict()))


if __name__ == "__main__":
    _main(sys.argv[1])
