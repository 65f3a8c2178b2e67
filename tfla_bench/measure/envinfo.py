"""The environment record of a run (`env.json` beside `results.csv`; `tfla_bench.run.rundir` writes it).

GPU facts come from the benchmark worker (`DeviceInfo`), so the parent process never creates a
CUDA context of its own, and from `nvidia-smi` (driver, clocks, power limit) when it is present.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tfla_bench
from tfla_bench.adapters import registry
from tfla_bench.adapters.registry import installed_version
from tfla_bench.measure.worker import DeviceInfo

if TYPE_CHECKING:
    from tfla_bench.run.specs import Spec

# What the kernels build on that no adapter names as its own (`Adapter.packages`): the suite and its
# stack, the libraries under fla and Mamba, and the cuDNN under torch's SDPA.
STACK_PACKAGES = (
    "tfla-bench",
    "torch",
    "triton",
    "numpy",
    "einops",
    "flash-linear-attention",
    "tilelang",
    "nvidia-cudnn-cu12",
    "nvidia-cudnn-cu13",
)


def recorded_packages() -> list[str]:
    """The distributions whose versions `env.json` records: the stack, then every adapter's packages."""
    adapter_packages = (name for adapter in registry.adapters() for name in adapter.packages)
    return list(dict.fromkeys([*STACK_PACKAGES, *adapter_packages]))


_SMI_FIELDS = {
    "driver_version": "driver",
    "clocks.sm": "sm_clock_mhz",
    "clocks.max.sm": "max_sm_clock_mhz",
    "clocks.mem": "memory_clock_mhz",
    "clocks.max.mem": "max_memory_clock_mhz",
    "power.limit": "power_limit_w",
}


def now_iso() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def collect(
    spec: Spec, devices: list[str], device_infos: list[DeviceInfo], measurement: dict[str, Any]
) -> dict[str, Any]:
    """Build the environment record.

    Args:
        spec: the spec being run (its name and published dataset are recorded).
        devices: the worker devices (`cpu` or `cuda:<i>`).
        device_infos: what each started worker reported about its device, in device order; the
            top-level GPU facts are the first one's.
        measurement: the measurement settings (warmup, reps, flush, graph, grad, timeout, clock).
    """
    import torch

    cuda = torch.cuda.is_available()
    first_gpu = int(devices[0].partition(":")[2] or 0) if devices and devices[0].startswith("cuda") else None
    smi = nvidia_smi(first_gpu) if first_gpu is not None else {}
    device_info = device_infos[0] if device_infos else None
    info = device_info if device_info is not None and device_info.device.startswith("cuda") else None
    return {
        "gpu_name": info.name if info else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "sm_count": info.sm_count if info else None,
        "gpu_memory_bytes": info.memory_bytes if info else None,
        "l2_cache_bytes": info.l2_cache_bytes if info else None,
        "compute_capability": info.compute_capability if info else None,
        "clocks": {key: value for key, value in smi.items() if key != "driver"} or None,
        # NVML's clock maxima and power limit, or the note saying why rows carry no GPU state.
        "nvml": info.nvml if info else None,
        "driver": smi.get("driver"),
        "cuda": torch.version.cuda,
        "cudnn": info.cudnn if info else None,
        "torch": torch.__version__,
        "triton": installed_version("triton"),
        "python": platform.python_version(),
        "packages": {name: installed_version(name) for name in recorded_packages()},
        # A copy of the tree shipped to a GPU node has no .git, or a stale one: the env names its commit.
        **_git_state(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "tfla_bench": tfla_bench.__version__,
        "spec": spec.name,
        "spec_source": spec.source,
        "description": spec.description,
        "published": spec.published,
        "devices": devices,
        "device_info": dataclasses.asdict(device_info) if device_info else None,
        # One entry per worker's device, so a run over several GPUs names each of them.
        "device_infos": [dataclasses.asdict(entry) for entry in device_infos],
        "started_at": now_iso(),
        "command": sys.argv,
        "measurement": measurement,
    }


def _repo_root() -> Path:
    return Path(tfla_bench.__file__).resolve().parent.parent


GIT_SHA_ENV = "TFLA_BENCH_GIT_SHA"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(_repo_root()), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _git_state() -> dict[str, Any]:
    """`git_sha` and `git_dirty`: from `TFLA_BENCH_GIT_SHA` when set (dirty then unknown), else from git."""
    named = os.environ.get(GIT_SHA_ENV)
    if named:
        return {"git_sha": named, "git_dirty": None}
    return {"git_sha": _git("rev-parse", "HEAD"), "git_dirty": _git_dirty()}


def _git_dirty() -> bool | None:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def nvidia_smi(index: int) -> dict[str, Any]:
    """Driver, clocks and power limit of GPU `index` from `nvidia-smi` (empty when it is missing)."""
    query = ",".join(_SMI_FIELDS)
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    values = [value.strip() for value in done.stdout.strip().splitlines()[0].split(",")]
    record: dict[str, Any] = {}
    for key, value in zip(_SMI_FIELDS.values(), values, strict=False):
        if key == "driver":
            record[key] = value
            continue
        try:
            record[key] = float(value)
        except ValueError:
            record[key] = None
    return record
