"""Accelerator specs for the runtime and roofline model: dense bf16 peak FLOP/s and HBM bandwidth.

V100, A100, H100 (SXM) and B200 are the TFLA paper's table 18 (non-sparse values). H100 PCIe
and H200 are not in the paper; they come from NVIDIA's data sheets (dense bf16 = half the
with-sparsity number). These are data-sheet peaks: a measured roofline sits below them (on an
H100 80GB HBM3, ~798e12 FLOP/s for a bf16 8192^3 matmul and ~3.0e12 bytes/s for a device-to-device
copy; `docs/model_formulas.md`), which `--peak-flops` / `--bandwidth` can express.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from tfla_bench.errors import UserError


@dataclass(frozen=True)
class Accelerator:
    """A GPU as the roofline model sees it.

    Attributes:
        name: short key (`h100`, `a100`, ... or `custom`).
        peak_flops_per_s: dense bf16 tensor-core peak, FLOP/s (alpha in the paper).
        bandwidth_bytes_per_s: device-memory bandwidth, bytes/s (beta in the paper).
        label: human-readable name for tables and plot legends; the upper-cased name if empty.
    """

    name: str
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    label: str = ""

    def __post_init__(self) -> None:
        for field_name in ("peak_flops_per_s", "bandwidth_bytes_per_s"):
            value = getattr(self, field_name)
            if not math.isfinite(value) or value <= 0:
                raise UserError(f"{field_name} of accelerator {self.name!r} must be positive, got {value}")

    @property
    def intensity_flops_per_byte(self) -> float:
        """Accelerator intensity I_acc = peak / bandwidth, the roofline's ridge point (FLOP/byte)."""
        return self.peak_flops_per_s / self.bandwidth_bytes_per_s

    @property
    def display_name(self) -> str:
        """The label, or the upper-cased name when there is none."""
        return self.label or self.name.upper()


ACCELERATORS: dict[str, Accelerator] = {
    "v100": Accelerator("v100", 120e12, 0.9e12, "V100"),
    "a100": Accelerator("a100", 312e12, 1.935e12, "A100"),
    "h100": Accelerator("h100", 989e12, 3.35e12, "H100 SXM"),
    "h100-pcie": Accelerator("h100-pcie", 756e12, 2.0e12, "H100 PCIe"),
    "h200": Accelerator("h200", 989e12, 4.8e12, "H200"),
    "b200": Accelerator("b200", 2250e12, 7.7e12, "B200"),
}

CUSTOM = "custom"
AUTO = "auto"
MEASURED = "measured"


def get_accelerator(name: str) -> Accelerator:
    """The accelerator called `name` (case-insensitive); a `UserError` listing the known names otherwise.

    Args:
        name: a key of `ACCELERATORS`, e.g. `"h100"` or `"h100-pcie"`.
    """
    key = name.strip().lower()
    if key not in ACCELERATORS:
        raise UserError(
            f"unknown GPU {name!r}; known GPUs: {', '.join(ACCELERATORS)} (or auto, measured, custom)"
        )
    return ACCELERATORS[key]


def _mentions(device_name: str, model: str) -> bool:
    # "h200" must not match inside "gh200" (Grace Hopper, a different memory system).
    return re.search(rf"(?<![a-z0-9]){model}(?![0-9])", device_name) is not None


def detect_accelerator(device_name: str) -> Accelerator | None:
    """Map a CUDA device name (`torch.cuda.get_device_name()`) to a known accelerator, or None.

    Args:
        device_name: e.g. `"NVIDIA H100 80GB HBM3"` (-> h100), `"NVIDIA H100 PCIe"` (-> h100-pcie),
            `"NVIDIA A100-SXM4-80GB"` (-> a100), `"Tesla V100-SXM2-32GB"` (-> v100).

    Variants whose specs differ from every entry (H100 NVL, GH200) give None.

    Examples::

        >>> detect_accelerator("NVIDIA H200").name
        'h200'
    """
    name = device_name.lower()
    if _mentions(name, "b200"):
        return ACCELERATORS["b200"]
    if _mentions(name, "h200"):
        return ACCELERATORS["h200"]
    if _mentions(name, "h100"):
        if "nvl" in name:
            return None
        return ACCELERATORS["h100-pcie" if "pcie" in name else "h100"]
    if _mentions(name, "a100"):
        return ACCELERATORS["a100"]
    if _mentions(name, "v100"):
        return ACCELERATORS["v100"]
    return None


def _present_accelerator() -> Accelerator:
    import torch  # only `--gpu auto` needs torch; importing it costs seconds

    if not torch.cuda.is_available():
        raise UserError(
            "--gpu auto needs a CUDA GPU; name one (e.g. --gpu h100) or pass --peak-flops and --bandwidth"
        )
    device_name = torch.cuda.get_device_name(0)
    accelerator = detect_accelerator(device_name)
    if accelerator is None:
        raise UserError(f"unknown GPU {device_name!r}; pass --peak-flops and --bandwidth (with --gpu custom)")
    return accelerator


def resolve_accelerator(
    name: str,
    *,
    peak_flops_per_s: float | None = None,
    bandwidth_bytes_per_s: float | None = None,
    measured: Callable[[], Accelerator] | None = None,
) -> Accelerator:
    """The accelerator a command line names, with optional overrides of its peak and bandwidth.

    Args:
        name: a key of `ACCELERATORS`; `"auto"` for the present CUDA GPU; `"measured"` for the
            accelerator `measured` returns; `"custom"` for one defined by both overrides.
        peak_flops_per_s: replaces the peak FLOP/s.
        bandwidth_bytes_per_s: replaces the memory bandwidth.
        measured: the measured roofs (the CLI passes `tfla_bench.measure.roofs.measured_accelerator`, which
            lives above the model: it measures and reads saved files).
    """
    key = name.strip().lower()
    if key == CUSTOM:
        if peak_flops_per_s is None or bandwidth_bytes_per_s is None:
            raise UserError("--gpu custom needs both --peak-flops and --bandwidth")
        return Accelerator(CUSTOM, peak_flops_per_s, bandwidth_bytes_per_s, "custom")
    if key == MEASURED:
        if measured is None:
            raise UserError("--gpu measured is not available here")
        base = measured()
    else:
        base = _present_accelerator() if key == AUTO else get_accelerator(key)
    if peak_flops_per_s is None and bandwidth_bytes_per_s is None:
        return base
    return replace(
        base,
        peak_flops_per_s=base.peak_flops_per_s if peak_flops_per_s is None else peak_flops_per_s,
        bandwidth_bytes_per_s=base.bandwidth_bytes_per_s
        if bandwidth_bytes_per_s is None
        else bandwidth_bytes_per_s,
        label=f"{base.display_name} (custom)",
    )
