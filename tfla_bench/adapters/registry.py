"""The kernel registry: the `Adapter` base class, the facts an adapter carries, and where adapters come from.

An adapter is one class in one module, and it carries every fact about its kernel: name, family,
layout, constraints, availability, inputs, call, FLOPs and bytes, its correctness-gate reference and
gate shape (`GateShape`), the published series it answers to (`PublishedSeries`) and its plot style
(`PlotStyle`). Other modules ask the registry's adapters; none keeps a table of adapter names.

Where adapters come from (all imported by `load()`, in every process that needs them), recorded as
each adapter's `origin` (shown by `tfla-bench list`):

- built-ins: every module of the packages `tfla_bench.kernels.adapters` and `tfla_bench.baselines`
  (walked, so a new adapter is one new module); each registers its class with `@register`;
- third-party packages: the entry-point group `tfla_bench.adapters`; an entry point names a module
  (importing it registers its adapters) or a callable (called once). A plugin that fails to load
  does not stop the suite: it becomes an unavailable pseudo-adapter named after the entry point,
  whose reason is the import error, so `tfla-bench list` and the sweep rows show what broke;
- ad hoc modules: the environment variable `TFLA_BENCH_PLUGINS=module1,module2` names modules that
  `load()` imports as well (for adapters outside an installed package, and for tests). A module
  named there that does not import is the user's mistake: a `UserError`.

Benchmark workers are separate processes (spawned, not forked), so they see only what they import.
They call `load()`, inherit `TFLA_BENCH_PLUGINS` from the parent's environment, and are also sent
the module that defines each case's adapter (`adapter_module`), which they import when the name is
not registered yet. An adapter registered in the parent by any importable module therefore reaches
the worker without further set-up.

An adapter never imports its library at module import time: `available()` tries the import and
returns the reason it cannot run, so a missing package is a row with a reason, not a crash.
Those imports are most of what `list` and a sweep's plan spend, so `availability` keeps the answers
on disk until something they depend on changes (`tfla_bench.adapters.availability_cache`).
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from tfla_bench.adapters import availability_cache
from tfla_bench.adapters.workloads import DTYPES, MODES, Case, Shape
from tfla_bench.errors import UserError, exception_line

if TYPE_CHECKING:
    import torch

ENTRY_POINT_GROUP = "tfla_bench.adapters"
# The words every `row_note` of a timing that is no speed claim carries, which the report looks for.
NO_SPEED_CLAIM = "no speed claim"
PLUGINS_ENV = "TFLA_BENCH_PLUGINS"
BUILT_IN_PACKAGES = ("tfla_bench.kernels.adapters", "tfla_bench.baselines")
# Processes that import the adapters' libraries side by side in `availability`.
MAX_PROBE_PROCESSES = 8


class GateShape(Shape):
    """The shape of the small forward case the correctness gate runs (chunk_size None: the adapter's
    default).

    Sequences should span several chunks so that the inter-chunk state passing is checked, with
    Dqk != Dv wherever the kernel allows it.
    """


@dataclass(frozen=True)
class PublishedSeries:
    """The kernel of the paper's published CSVs that an adapter runs the same computation as.

    Attributes:
        kernel: the `kernel_name` in the published CSVs.
        params: `Case.params` a run's row must carry to match (e.g. `causal=False` for the paper's
            non-causal SDPA runs); a row without the param column has the adapter's
            `param_defaults`.
        uses_chunk_size: whether the chunk size is part of the match (the mLSTM kernels). Otherwise
            a chunk size is compared only when both sides record one (Mamba 2's chunk 256).
        note: what the published kernel is and why it maps this way.
        rank: order among the adapters of one published kernel (ours 0 before the official peer 1).
    """

    kernel: str
    params: dict[str, Any] = field(default_factory=dict)
    uses_chunk_size: bool = False
    note: str = ""
    rank: int = 0


SOLID, DASHED, DOTTED, DASH_DOT = "-", "--", ":", "-."


@dataclass(frozen=True)
class PlotStyle:
    """A kernel's base look in every figure, before its params are applied (`tfla_bench.plots.style`).

    Attributes:
        color: the kernel's hue (one per gate for the mLSTM kernels, shared by ours and the peer).
        linestyle: solid for our kernels, dashed for the official peers.
        marker: a matplotlib marker.
    """

    color: str
    linestyle: str = SOLID
    marker: str = "o"


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
        autotuned: whether the kernel's first call autotunes Triton configs (`sweep --precompile`
            splits their compiling over processes; see `tfla_bench.run.precompile`).
        precompile: what a precompile run (`tfla_bench.run.precompile`) of a case needs to leave the
            case's kernels compiled in the cache that every process shares: `smaller` (the default:
            compiled code depends on the shape only through Triton's specialization of integer
            arguments, so a smaller case with the same specialization compiles it), `sequence` (the
            kernels take the batch as a compile-time constant, not the sequence length: a case
            with the batch kept and the sequence shortened compiles it), `own` (the kernels take
            sizes or strides as compile-time constants, so only the case's own shape does), or
            `none` (nothing is compiled at run time into a shared cache: CUDA extensions,
            cuDNN, plain PyTorch, a JIT that keeps its code in the process).
        constraints: a short human-readable summary of `check`'s rules for `tfla-bench list`.
        gate_shape: the case the correctness gate runs (`tfla_bench.run.correctness`).
        published: the published series this kernel answers to, or None.
        param_defaults: the defaults of the params that change what is computed: a row without the
            param's column has it (`published.params` matching), and a figure draws a series whose
            params are at these defaults in the kernel's base look.
        plot_style: base colour, line style and marker in figures; None: taken from the family's palette.
        packages: the distributions whose installed versions each measured row records (`library`).
        origin: where the registry found the adapter (set by `register`).
    """

    name: str = ""
    family: str = ""
    layout: str = "BHTD"
    modes: tuple[str, ...] = MODES
    dtypes: tuple[str, ...] = DTYPES
    cpu_capable: bool = False
    uses_chunk_size: bool = False
    autotuned: bool = False
    precompile: str = "smaller"
    constraints: str = ""
    gate_shape: GateShape = GateShape(
        batch=2, seq_len=256, num_heads=2, head_dim_qk=64, head_dim_v=64, chunk_size=64
    )
    published: PublishedSeries | None = None
    param_defaults: dict[str, Any] = {}
    plot_style: PlotStyle | None = None
    packages: tuple[str, ...] = ()
    origin: str = ""

    def library(self) -> str:
        """The installed versions of `packages`, e.g. `fla-core 0.6.0`; empty when none is installed."""
        return ", ".join(
            f"{name} {version}" for name in self.packages if (version := installed_version(name)) is not None
        )

    def available(self) -> str | None:
        """Why this adapter cannot run on this machine (package or extension missing, wrong GPU), or None."""
        return None

    def check(self, case: Case) -> str | None:
        """Why this case is unsupported (head-dim limits, chunk-size rules), or None."""
        return None

    def dtype_reason(self, dtype: str) -> str | None:
        """Why one of `dtypes` cannot run here (e.g. an interpreter without bfloat16), or None;
        `check` returns it for such a case, and the correctness gate picks a dtype without one."""
        return None

    def row_note(self) -> str:
        """What every row this adapter measures here must say about its timing (e.g. that an
        interpreter ran the kernel, so the time is no speed claim), or empty."""
        return ""

    def make_inputs(self, case: Case, device: str) -> dict[str, Any]:
        """Inputs for `forward` in the library's layout and value ranges.

        Tensors that receive gradients in `fwbw` have `requires_grad=True`. Besides tensors, the
        dict may hold plain settings that `forward` needs from `case.params` (e.g. `causal`); the
        runner only touches the tensors (it resets their `.grad`).
        """
        raise NotImplementedError

    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        """Run the kernel once and return the output tensor that the backward pass starts from."""
        raise NotImplementedError

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """The same math in plain PyTorch (for the correctness gate), or None if there is none."""
        return None

    def flops(self, case: Case, mode: str) -> float:
        """Analytic FLOPs of one call in `mode`, for the whole batch and all heads."""
        raise NotImplementedError

    def bytes(self, case: Case, mode: str) -> float:
        """Analytic bytes moved to and from device memory by one call in `mode`."""
        raise NotImplementedError


class BrokenPlugin(Adapter):
    """Stands in for an entry-point plugin that failed to load; always unavailable with the error."""

    family = "plugin"
    layout = "-"

    def __init__(self, name: str = "", reason: str = "") -> None:
        self.name = name
        self.reason = reason
        self.constraints = "plugin failed to load"

    def available(self) -> str | None:
        return self.reason

    def flops(self, case: Case, mode: str) -> float:
        return float("nan")

    def bytes(self, case: Case, mode: str) -> float:
        return float("nan")


_ADAPTERS: dict[str, Adapter] = {}
_loaded = False
# What `load()` is importing now; an adapter registered outside it gets `_origin_of_module`.
_loading_origin: str | None = None


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (`fla-core`), or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@contextmanager
def _origin(text: str) -> Iterator[None]:
    global _loading_origin
    outer, _loading_origin = _loading_origin, text
    try:
        yield
    finally:
        _loading_origin = outer


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: instantiate the adapter and add it to the registry under `cls.name`."""
    adapter = cls()
    if not adapter.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if adapter.name in _ADAPTERS and type(_ADAPTERS[adapter.name]) is not cls:
        raise ValueError(f"two adapters are named {adapter.name!r}")
    adapter.origin = _loading_origin or _origin_of_module(cls.__module__)
    _ADAPTERS[adapter.name] = adapter
    return cls


def _origin_of_module(module: str) -> str:
    """The origin of an adapter whose module was imported outside `load()` (directly, by a test)."""
    built_in = any(module.startswith(f"{package}.") for package in BUILT_IN_PACKAGES)
    return f"built-in {module}" if built_in else f"module {module}"


def adapter_modules(package_name: str) -> list[str]:
    """Every module below the package `package_name`, walked recursively, in name order."""
    package = importlib.import_module(package_name)
    prefix = f"{package_name}."
    return sorted(module.name for module in pkgutil.walk_packages(package.__path__, prefix))


def load() -> None:
    """Import the built-in adapter modules and the entry-point plugins (once), and the modules in
    `TFLA_BENCH_PLUGINS` (checked on every call, so a variable set later is still honoured)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for package in BUILT_IN_PACKAGES:
            for module in adapter_modules(package):
                with _origin(f"built-in {module}"):
                    importlib.import_module(module)
        load_entry_points()
    load_plugin_modules(plugin_modules_from_env())


def load_entry_points() -> None:
    """Load every entry point of `tfla_bench.adapters`; a failing one becomes a `BrokenPlugin`."""
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            with _origin(f"entry point {entry.name} = {entry.value}"):
                loaded = entry.load()
                if callable(loaded):
                    loaded()
        except Exception as exc:  # a third-party plugin's failure must not stop the suite
            if entry.name not in _ADAPTERS:
                reason = f"plugin {entry.value!r} failed to load: {exception_line(exc)}"
                broken = BrokenPlugin(entry.name, reason)
                broken.origin = f"entry point {entry.name} = {entry.value}"
                _ADAPTERS[entry.name] = broken


def plugin_modules_from_env() -> list[str]:
    """The module names listed in `TFLA_BENCH_PLUGINS` (comma-separated), in order."""
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def load_plugin_modules(modules: list[str]) -> None:
    """Import adapter modules by name; a module that does not import, or raises while it is imported
    (a syntax error, its own exception), is a `UserError` naming where."""
    for module in modules:
        try:
            with _origin(f"{PLUGINS_ENV} {module}"):
                importlib.import_module(module)
        except ImportError as exc:
            raise UserError(f"cannot import adapter module {module!r} ({PLUGINS_ENV}): {exc}") from exc
        except UserError:
            raise
        except Exception as exc:  # the plugin's own code failed: where, in one line
            frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
            where = (
                f" ({frame.filename}, line {frame.lineno})"
                if frame and not isinstance(exc, SyntaxError)
                else ""
            )
            raise UserError(
                f"adapter module {module!r} ({PLUGINS_ENV}) failed while it was imported: "
                f"{exception_line(exc)}{where}"
            ) from exc


def adapters() -> list[Adapter]:
    """Every registered adapter, sorted by family and name."""
    load()
    return sorted(_ADAPTERS.values(), key=lambda a: (a.family, a.name))


def families() -> set[str]:
    """The family names of all registered adapters."""
    return {adapter.family for adapter in adapters()}


def find(name: str) -> Adapter | None:
    """The adapter called `name`, or None (e.g. a kernel of an old run whose plugin is not loaded)."""
    load()
    return _ADAPTERS.get(name)


def available_reason(adapter: Adapter) -> str | None:
    """`adapter.available()`; a probe that raises is a reason too, not a crash of the caller."""
    try:
        return adapter.available()
    except Exception as exc:  # a third-party adapter's probe must not stop a listing or a sweep
        return f"available() raised {exception_line(exc)}"


@dataclass(frozen=True)
class Availability:
    """`availability_answers`' result.

    Attributes:
        reasons: each adapter's `available_reason`, by name.
        cached: the names whose answer came from the cache.
        cached_since: when the oldest of those answers was asked (seconds since the epoch); None when
            every adapter was asked now.
    """

    reasons: dict[str, str | None]
    cached: frozenset[str]
    cached_since: float | None


def availability(
    chosen: list[Adapter], processes: int | None = None, *, fresh: bool = False
) -> dict[str, str | None]:
    """Each adapter's `available_reason`, by name (`availability_answers`)."""
    return availability_answers(chosen, processes, fresh=fresh).reasons


def availability_answers(
    chosen: list[Adapter], processes: int | None = None, *, fresh: bool = False
) -> Availability:
    """Each adapter's `available_reason`: from the cache (`availability_cache`) where it holds the
    adapter's answer under the present key, else asked (`ask_available`) and written to the cache.

    Args:
        chosen: the adapters.
        processes: the processes that ask side by side (`ask_available`).
        fresh: ask every adapter, whatever the cache holds (and write their answers to it).
    """
    cache = availability_cache.AvailabilityCache.open()
    # A broken plugin's reason was found when it loaded: nothing to import, nothing to keep.
    cacheable = [adapter for adapter in chosen if not isinstance(adapter, BrokenPlugin)]
    cached = {} if fresh else cache.lookup(cacheable)
    asked = ask_available([adapter for adapter in chosen if adapter.name not in cached], processes)
    if any(adapter.name in asked for adapter in cacheable):
        cache.store(cacheable, asked)
    reasons = {name: entry.reason for name, entry in cached.items()} | asked
    since = min((entry.asked_at for entry in cached.values()), default=None)
    return Availability({adapter.name: reasons[adapter.name] for adapter in chosen}, frozenset(cached), since)


def remember_availability(reasons: dict[str, str | None]) -> None:
    """Write answers of `available_reason` found elsewhere (the correctness gate's workers) to the
    cache, by adapter name."""
    chosen = [
        adapter for name in reasons if (adapter := find(name)) and not isinstance(adapter, BrokenPlugin)
    ]
    if chosen:
        availability_cache.AvailabilityCache.open().store(chosen, reasons)


def ask_available(chosen: list[Adapter], processes: int | None = None) -> dict[str, str | None]:
    """Each adapter's `available_reason`, by name, asked now.

    Nearly all of it is importing the libraries, which one process does one after another; so the
    adapters' modules are asked in `processes` spawned processes side by side (default: one per two
    host cores, at most `MAX_PROBE_PROCESSES`), each importing the module that registers its
    adapters as a worker does. With one process, or where a process is lost, they are asked here.
    """
    by_module: dict[str, list[Adapter]] = {}
    for adapter in chosen:
        by_module.setdefault(type(adapter).__module__, []).append(adapter)
    if processes is None:
        processes = min(len(by_module), MAX_PROBE_PROCESSES, (os.cpu_count() or 2) // 2)
    reasons: dict[str, str | None] = {}
    if processes > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [
                pool.submit(_available_in, module, [a.name for a in group])
                for module, group in by_module.items()
            ]
            for future in futures:
                try:
                    reasons |= future.result()
                except Exception:  # a lost process: its adapters are asked here below
                    pass
    return {a.name: reasons[a.name] if a.name in reasons else available_reason(a) for a in chosen}


def _available_in(module: str, names: list[str]) -> dict[str, str | None]:
    """`available_reason` of the named adapters, in a process of `availability`'s pool."""
    load()
    if any(name not in _ADAPTERS for name in names):
        importlib.import_module(module)
    return {name: available_reason(_ADAPTERS[name]) for name in names if name in _ADAPTERS}


def get(name: str) -> Adapter:
    """The adapter called `name`; a `UserError` naming the closest and the known names otherwise."""
    load()
    if name not in _ADAPTERS:
        closest = difflib.get_close_matches(name, list(_ADAPTERS), n=3, cutoff=0.6)
        hint = f" (closest: {', '.join(closest)})" if closest else ""
        known = ", ".join(sorted(_ADAPTERS))
        raise UserError(f"unknown kernel {name!r}{hint}; known kernels: {known}")
    return _ADAPTERS[name]
