"""The on-disk cache of `registry.availability`: each adapter's `available_reason`, kept while nothing
it could depend on has changed.

Asking `available()` means importing the adapters' libraries (fla, mamba_ssm, flash_attn, the CUTLASS
DSL, ...): `tfla-bench list` took 21.5 s on an H200 with every baseline installed, nearly all of it
importing. The answers change only when the machine does, so they are kept in a JSON file,
`$XDG_CACHE_HOME/tfla-bench/availability.json` (`~/.cache` by default) or `$TFLA_BENCH_AVAILABILITY_FILE`,
as `{"version", "key", "adapters": {name: {"reason", "asked_at", "adapter", "source"}}}`.

The key (`machine_key`, stored as its SHA-256) holds what an answer can depend on, each found without
importing a library or torch:

- the Python executable, its version and `sys.path` (but the folder Python was started from,
  `LAUNCH_ENTRY`);
- every installed distribution: the name of its dist-info or egg-info folder (name and version) and
  that folder's mtime, found by listing the folders of that path as `importlib.metadata` does but
  without parsing the metadata (on a 2-core machine 1 ms for 89 distributions, where
  `metadata.distributions()` with names and versions took 230 ms); and the site directories' own
  mtimes, which change with any install or removal, one without a dist-info folder too;
- the source the adapters' `available()` runs: size and mtime of every module of
  `tfla_bench.adapters`, `tfla_bench.kernels` and `tfla_bench.baselines`; each entry also keeps the
  SHA-256 of its adapter's own module (`source`), which covers plugins from entry points and
  `TFLA_BENCH_PLUGINS`, and the adapter's class (`adapter`);
- whether a CUDA GPU is visible, as the driver shows it: the device files `/dev/nvidia0`, ..., the
  driver's version and each GPU's model (`/proc/driver/nvidia`);
- the environment variables of `KEY_ENV` (`TRITON_INTERPRET`, `CUDA_VISIBLE_DEVICES`, ...).

An entry is used only under the same key, for the same adapter class with the same module source; any
other adapter is asked afresh and its answer written back. A file that is missing, unreadable or
corrupt counts as empty, and one that cannot be written leaves the answers unsaved: the cache never
fails a command. But a file that `$TFLA_BENCH_AVAILABILITY_FILE` names is the user's choice: one that
holds no availability record (a JSON object with `version`; the variable naming a run's
`results.csv`) is never replaced, one warning says so, and the answers go unsaved.
What the key cannot see (a library rebuilt in place in an editable install, a GPU
that failed and recovered) needs `tfla-bench list --fresh`, which asks every adapter again.
"""

from __future__ import annotations

import hashlib
import json
import os
import site
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from importlib import util
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfla_bench.adapters.registry import Adapter

CACHE_FILE_ENV = "TFLA_BENCH_AVAILABILITY_FILE"
FORMAT_VERSION = 1
# The packages whose modules an adapter's `available()` runs (the registry, the probes of `support`,
# our kernels' contract, the adapters themselves).
SOURCE_PACKAGES = ("tfla_bench.adapters", "tfla_bench.kernels", "tfla_bench.baselines")
# What the answers read from the environment: the interpreter switch, the GPUs CUDA may see (also in
# a container), the plugin modules, and where CUDA and its libraries are found.
KEY_ENV = (
    "TRITON_INTERPRET",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "TFLA_BENCH_PLUGINS",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
)
# The entry Python put first on `sys.path` for how it was started: the script's folder (`tfla-bench`'s
# bin folder), or the current directory for `python -c` and `-m`. It is left out of the key, so that
# `tfla-bench list` and `python -c "... main()" check` (what `make gpu` runs) of one installation
# share their answers; a library that only that folder would shadow is not seen.
LAUNCH_ENTRY = sys.path[0] if sys.path and not sys.flags.safe_path else None
DEVICE_DIR = Path("/dev")
DRIVER_DIR = Path("/proc/driver/nvidia")


def cache_path() -> Path:
    """`$TFLA_BENCH_AVAILABILITY_FILE`, else `$XDG_CACHE_HOME/tfla-bench/availability.json` (`~/.cache`
    by default)."""
    named = os.environ.get(CACHE_FILE_ENV)
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tfla-bench" / "availability.json"


def _mtime(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def import_path() -> list[str]:
    """`sys.path` but `LAUNCH_ENTRY`."""
    return [entry for entry in sys.path if entry != LAUNCH_ENTRY]


def distributions() -> list[tuple[str, str, int | None]]:
    """(folder of `import_path()`, dist-info or egg-info name, its mtime) of every installed distribution."""
    found = []
    for entry in import_path():
        try:
            with os.scandir(entry or ".") as listing:
                names = sorted(
                    item.name for item in listing if item.name.endswith((".dist-info", ".egg-info"))
                )
        except OSError:
            continue
        found += [(entry, name, _mtime(Path(entry or ".") / name)) for name in names]
    return found


def site_directories() -> list[tuple[str, int | None]]:
    """Each site directory and its mtime, which changes whenever something is installed there or removed."""
    folders = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        folders.add(site.getusersitepackages())
    return [(folder, _mtime(folder)) for folder in sorted(folders)]


def source_stamps() -> list[tuple[str, int, int]]:
    """(path, size, mtime) of every module of `SOURCE_PACKAGES`."""
    stamps = []
    for package in SOURCE_PACKAGES:
        spec = util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(folder).rglob("*.py")):
                try:
                    stat = path.stat()
                except OSError:
                    continue
                stamps.append((str(path), stat.st_size, stat.st_mtime_ns))
    return stamps


def visible_gpus() -> list[str]:
    """The NVIDIA GPUs as the driver shows them, without importing torch: the device files, the
    driver's version and each GPU's model; empty on a machine without them."""
    devices = sorted(
        path.name for path in DEVICE_DIR.glob("nvidia[0-9]*") if path.name.removeprefix("nvidia").isdigit()
    )
    facts = []
    for path in [DRIVER_DIR / "version", *sorted(DRIVER_DIR.glob("gpus/*/information"))]:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        facts += [line.strip() for line in lines if line.startswith(("NVRM", "Model"))]
    return devices + facts


def machine_key() -> dict[str, Any]:
    """Everything an adapter's answer may depend on, besides its own module (see the module's doc)."""
    return {
        "python": [sys.executable, sys.version],
        "sys_path": import_path(),
        "distributions": distributions(),
        "site_directories": site_directories(),
        "source": source_stamps(),
        "gpus": visible_gpus(),
        "env": {name: os.environ.get(name) for name in KEY_ENV},
    }


def key_digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def adapter_class(adapter: Adapter) -> str:
    """`module.QualName` of the adapter's class."""
    return f"{type(adapter).__module__}.{type(adapter).__qualname__}"


def module_source(adapter: Adapter) -> str | None:
    """SHA-256 of the file of the module that defines the adapter's class; None where it has none."""
    path = getattr(sys.modules.get(type(adapter).__module__), "__file__", None)
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass(frozen=True)
class Entry:
    """One adapter's cached answer.

    Attributes:
        reason: its `available_reason`: None when available, else why not.
        asked_at: when it was asked, in seconds since the epoch.
        adapter: its class (`adapter_class`).
        source: its module's SHA-256 (`module_source`).
    """

    reason: str | None
    asked_at: float
    adapter: str
    source: str

    def answers_for(self, adapter: Adapter) -> bool:
        """Whether this entry was asked of this adapter, from the same source."""
        return self.adapter == adapter_class(adapter) and self.source == module_source(adapter)


def _entry(record: Any) -> Entry:
    """A stored entry; a `ValueError` when it is not one."""
    entry = Entry(**record) if isinstance(record, dict) else None
    if entry is None or not (
        (entry.reason is None or isinstance(entry.reason, str))
        and isinstance(entry.asked_at, int | float)
        and isinstance(entry.adapter, str)
        and isinstance(entry.source, str)
    ):
        raise ValueError(f"not an availability entry: {record!r}")
    return entry


@dataclass
class AvailabilityCache:
    """The cache file at `path` as read under this process's `key`: the entries kept under that key
    (none when the file was written under another key, or is missing, unreadable or corrupt)."""

    path: Path
    key: str
    entries: dict[str, Entry]
    foreign: bool = False  # the file is there and holds something else: it is never replaced

    @classmethod
    def open(cls) -> AvailabilityCache:
        """The cache at `cache_path()` under the present `machine_key()`."""
        path, key = cache_path(), key_digest(machine_key())
        try:
            text = path.read_text()
        except OSError:
            return cls(path, key, {})
        try:
            stored = json.loads(text)
        except ValueError:
            stored = None
        if not (isinstance(stored, dict) and "version" in stored):
            named = bool(os.environ.get(CACHE_FILE_ENV)) and bool(text.strip())
            return cls(path, key, {}, foreign=named)
        try:
            if stored.get("version") != FORMAT_VERSION or stored.get("key") != key:
                return cls(path, key, {})
            return cls(path, key, {name: _entry(record) for name, record in stored["adapters"].items()})
        except (ValueError, TypeError, KeyError, AttributeError):
            return cls(path, key, {})

    def lookup(self, adapters: Iterable[Adapter]) -> dict[str, Entry]:
        """The entries that answer for `adapters`, by name."""
        return {
            adapter.name: entry
            for adapter in adapters
            if (entry := self.entries.get(adapter.name)) is not None and entry.answers_for(adapter)
        }

    def store(self, adapters: Iterable[Adapter], reasons: Mapping[str, str | None]) -> None:
        """Keep the `reasons` of `adapters` (by name) beside the other entries, and write the file; an
        adapter whose module has no source file is not kept. Writing fails silently; a `foreign` file
        is left as it is, with one warning on stderr."""
        if self.foreign:
            print(
                f"warning: ${CACHE_FILE_ENV} {self.path}: holds no availability record; left as it is, "
                "and the answers are not saved",
                file=sys.stderr,
            )
            return
        now = time.time()
        for adapter in adapters:
            source = module_source(adapter) if adapter.name in reasons else None
            if source is not None:
                self.entries[adapter.name] = Entry(reasons[adapter.name], now, adapter_class(adapter), source)
        record = {
            "version": FORMAT_VERSION,
            "key": self.key,
            "adapters": {name: asdict(entry) for name, entry in sorted(self.entries.items())},
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, scratch = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as out:
                    json.dump(record, out, indent=1)
                os.replace(scratch, self.path)
            except BaseException:
                os.unlink(scratch)
                raise
        except OSError:
            pass  # an unwritable cache: the answers stand, only the next command asks again
