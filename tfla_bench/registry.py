"""The kernel registry: one `Adapter` per benchmarkable kernel.

Adapters in `tfla_bench.kernels.adapters` and in every module of `tfla_bench.baselines` register
themselves with the `@register` class decorator when imported; third-party packages plug in
through the entry-point group `tfla_bench.adapters` (the entry point names a module to import, or
a callable to call, that registers its adapters).

An adapter never imports its library at module import time: `available()` tries the import and
returns the reason it cannot run, so a missing package is a row with a reason, not a crash.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from tfla_bench.errors import UserError
from tfla_bench.workloads import DTYPES, MODES, Case

if TYPE_CHECKING:
    import torch

ENTRY_POINT_GROUP = "tfla_bench.adapters"


class Adapter:
    """Base class of every kernel adapter; subclasses set the class attributes and override methods.

    Attributes:
        name: the registry name used on the CLI and in result rows.
        family: kernel family (`mlstm`, `attention`, `gla`, `mamba2`, `lightning`, ...).
        layout: the input layout the library expects, e.g. `BHTD` or `BTHD`.
        modes: supported modes, a subset of `("fw", "fwbw")`.
        dtypes: supported input dtypes.
        cpu_capable: whether the adapter runs without CUDA.
        uses_chunk_size: whether `Case.chunk_size` is a parameter of this kernel.
        constraints: a short human-readable summary of `check`'s rules for `tfla-bench list`.
    """

    name: str = ""
    family: str = ""
    layout: str = "BHTD"
    modes: tuple[str, ...] = MODES
    dtypes: tuple[str, ...] = DTYPES
    cpu_capable: bool = False
    uses_chunk_size: bool = False
    constraints: str = ""

    def available(self) -> str | None:
        """Why this adapter cannot run on this machine (package or extension missing, wrong GPU), or None."""
        return None

    def check(self, case: Case) -> str | None:
        """Why this case is unsupported (head-dim limits, chunk-size rules), or None."""
        return None

    def make_inputs(self, case: Case, device: str) -> dict[str, torch.Tensor]:
        """Inputs for `forward` in the library's layout and value ranges.

        Tensors that receive gradients in `fwbw` have `requires_grad=True`.
        """
        raise NotImplementedError

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Run the kernel once and return the output tensor that the backward pass starts from."""
        raise NotImplementedError

    def reference(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The same math in plain PyTorch (for the correctness gate), or None if there is none."""
        return None

    def flops(self, case: Case, mode: str) -> float:
        """Analytic FLOPs of one call in `mode`, for the whole batch and all heads."""
        raise NotImplementedError

    def bytes(self, case: Case, mode: str) -> float:
        """Analytic bytes moved to and from device memory by one call in `mode`."""
        raise NotImplementedError


_ADAPTERS: dict[str, Adapter] = {}
_loaded = False


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: instantiate the adapter and add it to the registry under `cls.name`."""
    adapter = cls()
    if not adapter.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if adapter.name in _ADAPTERS and type(_ADAPTERS[adapter.name]) is not cls:
        raise ValueError(f"two adapters are named {adapter.name!r}")
    _ADAPTERS[adapter.name] = adapter
    return cls


def load() -> None:
    """Import the built-in adapter modules and the entry-point plugins (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import tfla_bench.baselines as baselines

    importlib.import_module("tfla_bench.kernels.adapters")
    for module in pkgutil.iter_modules(baselines.__path__):
        importlib.import_module(f"tfla_bench.baselines.{module.name}")
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        loaded = entry.load()
        if callable(loaded):
            loaded()


def adapters() -> list[Adapter]:
    """Every registered adapter, sorted by family and name."""
    load()
    return sorted(_ADAPTERS.values(), key=lambda a: (a.family, a.name))


def get(name: str) -> Adapter:
    """The adapter called `name`; a `UserError` listing the known names otherwise."""
    load()
    if name not in _ADAPTERS:
        known = ", ".join(sorted(_ADAPTERS))
        raise UserError(f"unknown kernel {name!r}; known kernels: {known}")
    return _ADAPTERS[name]
