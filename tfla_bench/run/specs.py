"""Experiment specs: TOML files in `experiments/` (or CLI flags) expanded into `Case`s.

A spec names kernels, modes, dtype(s), the measurement settings and a `[shape]` table whose keys
may each be a value or a list. Lists are expanded as a cartesian product (`expand = "grid"`) or
element by element (`expand = "zip"`, all lists of one length). Derived shapes:

- `tokens = N` instead of `batch`: batch = N / seq_len (the paper's constant-token runs);
- `embedding_dim = E` instead of `num_heads`: num_heads = E / head_dim_v.

`[override.<family or adapter name>]` replaces shape keys, `modes`, `params`, `warmup` and `reps`
for the matching kernels (the adapter-name table wins over the family table). `params` (top level
or per override) become `Case.params`; a list value there is expanded like a shape list.

Timing: `warmup` and `reps` fix the number of untimed and timed calls (the paper's method); a spec
without `reps` times adaptively (`rel_ci`, `budget_s`, `min_reps`, `max_reps`), and one without
`warmup` warms up for `warmup_s` seconds. Every measurement setting and its allowed values are in
`tfla_bench.measure.settings`, which checks them.

`chunk_size` is dropped (None) for adapters whose `uses_chunk_size` is false, and duplicate cases
are removed.

Every mistake in a spec is a `UserError` naming the file, the key and what was expected.
"""

from __future__ import annotations

import codecs
import dataclasses
import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import DTYPES, MODES, Case
from tfla_bench.errors import UserError
from tfla_bench.measure import settings
from tfla_bench.measure.settings import MeasureSettings

SHAPE_KEYS = (
    "tokens",
    "batch",
    "seq_len",
    "num_heads",
    "embedding_dim",
    "head_dim_qk",
    "head_dim_v",
    "chunk_size",
)
OVERRIDE_KEYS = (*SHAPE_KEYS, "modes", "params", "warmup", "reps")
TOP_KEYS = (
    "name",
    "description",
    "published",
    "kernels",
    "modes",
    "dtype",
    "warmup",
    "reps",
    "warmup_s",
    "rel_ci",
    "budget_s",
    "min_time_s",
    "min_reps",
    "max_reps",
    "expand",
    "l2_flush",
    "cuda_graph",
    "clock",
    "power_cap",
    "grad",
    "timeout_s",
    "autotune_ms",
    "energy",
    "energy_method",
    "energy_s",
    "params",
    "shape",
    "override",
)
EXPAND_MODES = ("grid", "zip")
# The largest shape integer: a tensor dimension past 2**31 would not fit any GPU, and tokens, batch
# and seq_len are multiplied together, which past this stops being exact in a float.
MAX_SHAPE = 2**31
# The most cases one spec may expand to: a sweep of more (a grid of many long lists) would take
# longer to list than to plan, and far longer than any GPU allocation to run.
MAX_CASES = 100_000
SHAPE_EXPECTED = f"a positive integer (at most {MAX_SHAPE:,}) or a non-empty list of them"
# seq_len varies fastest, so consecutive cases of one kernel trace a curve over sequence length.
_AXIS_ORDER = (
    "tokens",
    "batch",
    "embedding_dim",
    "num_heads",
    "head_dim_qk",
    "head_dim_v",
    "chunk_size",
    "seq_len",
)
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Override:
    """Per-family or per-adapter replacements: shape keys, modes, params, warmup and reps.

    The paper timed some kernels with other warmup/reps than the rest of a figure (FlashAttention in
    the const-token runs: 25/100 against 10/30); a run row records the warmup and reps it used.
    """

    shape: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    warmup: int | None = None
    reps: int | None = None


@dataclass(frozen=True)
class Spec:
    """A parsed experiment spec.

    Attributes:
        name: run directories are `runs/<name>-<timestamp>` by default.
        source: where the spec came from (a file path or `command line`), used in error messages.
        kernels: adapter names, in the order their cases run.
        modes: `fw` and/or `fwbw`.
        dtypes: input dtypes (the TOML key is `dtype`, a string or a list).
        shape: shape keys (see module docstring) to a value or a list of values.
        params: kernel-specific `Case.params` for every kernel (a list value is expanded).
        overrides: family or adapter name to its `Override`.
        expand: `grid` or `zip`.
        measurement: the `MeasureSettings`.
        description: free text.
        published: the `figure` value of the published dataset this spec reruns, or None.
    """

    name: str
    source: str
    kernels: tuple[str, ...]
    modes: tuple[str, ...]
    dtypes: tuple[str, ...]
    shape: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Override] = field(default_factory=dict)
    expand: str = "grid"
    measurement: MeasureSettings = field(default_factory=MeasureSettings)
    description: str = ""
    published: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The spec in its TOML table form; `parse_spec(spec.to_dict(), ...)` gives it back."""
        table: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "kernels": list(self.kernels),
            "modes": list(self.modes),
            "dtype": list(self.dtypes),
            "expand": self.expand,
            **{k: v for k, v in dataclasses.asdict(self.measurement).items() if v is not None},
            "params": dict(self.params),
            "shape": dict(self.shape),
            "override": {},
        }
        if self.published is not None:
            table["published"] = self.published
        for name, override in self.overrides.items():
            entry: dict[str, Any] = dict(override.shape)
            if override.modes is not None:
                entry["modes"] = list(override.modes)
            if override.params:
                entry["params"] = dict(override.params)
            for key in ("warmup", "reps"):
                if getattr(override, key) is not None:
                    entry[key] = getattr(override, key)
            table["override"][name] = entry
        return table

    def with_measurement(self, **settings: Any) -> Spec:
        """A copy with some measurement settings replaced (`None` values are ignored)."""
        given = {key: value for key, value in settings.items() if value is not None}
        if not given:
            return self
        raw = self.to_dict()
        raw.update(given)
        # A warmup or reps given here (the command line) applies to every kernel, overrides included.
        for entry in raw["override"].values():
            for key in ("warmup", "reps"):
                if key in given:
                    entry.pop(key, None)
        return parse_spec(raw, self.source)

    def measurement_for(self, adapter: registry.Adapter) -> MeasureSettings:
        """The settings for one adapter's cases: family, then adapter overrides of warmup and reps."""
        settings = self.measurement
        for target in (adapter.family, adapter.name):
            override = self.overrides.get(target)
            if override is None:
                continue
            for key in ("warmup", "reps"):
                if getattr(override, key) is not None:
                    settings = dataclasses.replace(settings, **{key: getattr(override, key)})
        return settings


def spec_dir() -> Path:
    """The experiment specs' folder: `experiments/` of the checkout holding this package (a source tree
    or an editable install), else the copy an installed wheel ships as `tfla_bench/experiments`."""
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent / "experiments"
    return checkout if checkout.is_dir() else package / "experiments"


def shipped_names() -> list[str]:
    """The names of the specs in `spec_dir()`, e.g. `smoke`."""
    return sorted(path.stem for path in spec_dir().glob("*.toml"))


def find_spec(given: str | Path) -> Path:
    """The spec file `given` names: a path, or the name of a shipped spec (`smoke` for
    `experiments/smoke.toml`); a `UserError` listing the shipped names when it is neither."""
    path = Path(given)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path  # a path: `load_spec` says what is wrong with it
    shipped = spec_dir() / f"{path.name}.toml"
    if shipped.is_file():
        return shipped
    names = ", ".join(shipped_names()) or "none"
    raise UserError(f"no spec file {str(given)!r}, and no shipped spec of that name (known: {names})")


def load_spec(path: str | Path) -> Spec:
    """Read and validate a TOML spec file.

    Args:
        path: the spec file.

    Returns:
        The parsed `Spec`; a `UserError` naming the file and key on any mistake.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read spec {path}: {exc.strerror or exc}") from exc
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise UserError(f"{path}: saved as UTF-16; TOML is UTF-8: save it as UTF-8")
    try:
        # TOML is UTF-8 whatever the locale; an editor's byte-order mark is allowed.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a TOML text file (byte {exc.start} is not UTF-8)") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from exc
    return parse_spec(raw, str(path))


def parse_spec(raw: dict[str, Any], source: str) -> Spec:
    """Validate a spec table (as read from TOML) and build the `Spec`.

    Args:
        raw: the TOML table.
        source: file name or `command line`, for error messages.
    """
    where = _Where(source)
    where.only_keys(raw, TOP_KEYS, "the spec")
    for required in ("name", "kernels", "shape"):
        if required not in raw:
            raise UserError(f"{source}: missing key {required!r}")
    name = where.string(raw["name"], "name")
    if not _NAME_RE.fullmatch(name):
        raise UserError(f"{source}: key 'name': expected letters, digits, '_', '-' or '.', got {name!r}")
    kernels = where.string_list(raw["kernels"], "kernels", allow_scalar=True)
    modes = where.choice_list(raw.get("modes", list(MODES)), "modes", MODES)
    dtypes = where.choice_list(raw.get("dtype", "bfloat16"), "dtype", DTYPES)
    expand = where.choice(raw.get("expand", "grid"), "expand", EXPAND_MODES)
    measurement = settings.from_table(raw, source)
    shape = where.shape(raw["shape"], "shape", SHAPE_KEYS)
    _check_shape_alternatives(shape, source, "[shape]", base=None)
    overrides = {}
    override_table = raw.get("override", {})
    if not isinstance(override_table, dict):
        raise UserError(f"{source}: key 'override': expected tables [override.<family or kernel>]")
    for target, table in override_table.items():
        label = f"override.{target}"
        if not isinstance(table, dict):
            raise UserError(f"{source}: key {label!r}: expected a table, got {table!r}")
        where.only_keys(table, OVERRIDE_KEYS, f"[{label}]")
        override_shape = where.shape({k: v for k, v in table.items() if k in SHAPE_KEYS}, label, SHAPE_KEYS)
        _check_shape_alternatives(override_shape, source, f"[{label}]", base=shape)
        override_modes = (
            where.choice_list(table["modes"], f"{label}.modes", MODES) if "modes" in table else None
        )
        override_params = where.params(table.get("params", {}), f"{label}.params")
        override_runs = {
            key: settings.check(key, table[key], f"{source}: key '{label}.{key}'")
            for key in ("warmup", "reps")
            if key in table
        }
        overrides[target] = Override(override_shape, override_modes, override_params, **override_runs)
    published = raw.get("published")
    return Spec(
        name=name,
        source=source,
        kernels=kernels,
        modes=modes,
        dtypes=dtypes,
        shape=shape,
        params=where.params(raw.get("params", {}), "params"),
        overrides=overrides,
        expand=expand,
        measurement=measurement,
        description=where.string(raw.get("description", ""), "description"),
        published=None if published is None else where.string(published, "published"),
    )


def expand(spec: Spec, only: list[str] | None = None) -> list[Case]:
    """All cases of a spec, in run order: kernel, then mode, then dtype, then shape (seq_len fastest).

    Args:
        spec: the parsed spec.
        only: restrict to these kernels (each must be one of the spec's kernels).

    Returns:
        The cases, without duplicates. Unknown kernel names and override targets raise `UserError`.
    """
    kernels = list(spec.kernels)
    if only:
        missing = [name for name in only if name not in kernels]
        if missing:
            registry.get(missing[0])  # an unknown name gets the list of known kernels
            raise UserError(
                f"kernel {missing[0]!r} is not in spec {spec.name!r} (its kernels: {', '.join(kernels)})"
            )
        kernels = [name for name in kernels if name in only]
    try:
        adapters = [registry.get(name) for name in kernels]
    except UserError as exc:
        raise UserError(f"{spec.source}: {exc}") from exc
    targets = registry.families() | {adapter.name for adapter in registry.adapters()}
    for target in spec.overrides:
        if target not in targets:
            raise UserError(
                f"{spec.source}: [override.{target}] matches no kernel family or kernel name "
                f"(families: {', '.join(sorted(registry.families()))})"
            )
    cases: dict[str, Case] = {}
    count = 0
    for adapter in adapters:
        shape, modes, params = _resolve(spec, adapter)
        axes = {key: shape[key] for key in _AXIS_ORDER if key in shape and key != "seq_len"}
        axes.update({f"params.{key}": value for key, value in params.items()})
        axes["seq_len"] = shape["seq_len"]
        if not adapter.uses_chunk_size:
            axes.pop("chunk_size", None)  # one case for every chunk size
        count += len(modes) * len(spec.dtypes) * _point_count(axes, spec.expand)
        if count > MAX_CASES:
            raise UserError(
                f"{spec.source}: the spec expands to more than {MAX_CASES:,} cases ({count:,} with "
                f"{adapter.name}'s); split it into several specs, or pair its lists with expand = 'zip'"
            )
        for mode in modes:
            for dtype in spec.dtypes:
                for point in _points(axes, spec.expand, spec.source, adapter.name):
                    case = _case(spec, adapter, mode, dtype, point)
                    cases.setdefault(case.key, case)
    return list(cases.values())


def _resolve(spec: Spec, adapter: registry.Adapter) -> tuple[dict[str, Any], tuple[str, ...], dict[str, Any]]:
    """Shape, modes and params for one adapter after applying family then adapter overrides."""
    shape = dict(spec.shape)
    modes = spec.modes
    params = dict(spec.params)
    for target in (adapter.family, adapter.name):
        override = spec.overrides.get(target)
        if override is None:
            continue
        for key, value in override.shape.items():
            # Giving one of two alternative keys replaces the other one from the base table.
            for pair in (("tokens", "batch"), ("num_heads", "embedding_dim")):
                if key in pair:
                    for other in pair:
                        shape.pop(other, None)
            shape[key] = value
        modes = override.modes if override.modes is not None else modes
        params.update(override.params)
    return shape, modes, params


def _point_count(axes: dict[str, Any], how: str) -> int:
    """How many points `_points` gives, counted without making them."""
    lengths = [len(value) for value in axes.values() if isinstance(value, list)]
    if how == "zip":
        return max(lengths, default=1)
    return math.prod(lengths)


def _points(axes: dict[str, Any], how: str, source: str, kernel: str) -> list[dict[str, Any]]:
    """Expand list-valued axes as a grid or zipped; scalars are broadcast."""
    lists = {key: value for key, value in axes.items() if isinstance(value, list)}
    if how == "zip" and lists:
        lengths = {key: len(value) for key, value in lists.items()}
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{key} has {n}" for key, n in lengths.items())
            raise UserError(f"{source}: expand = 'zip' needs lists of one length for {kernel}: {listed}")
        combos = [dict(zip(lists, values, strict=True)) for values in zip(*lists.values(), strict=True)]
    else:
        combos = [dict(zip(lists, values, strict=True)) for values in itertools.product(*lists.values())]
    return [{**axes, **combo} for combo in combos]


def _case(spec: Spec, adapter: registry.Adapter, mode: str, dtype: str, point: dict[str, Any]) -> Case:
    seq_len = point["seq_len"]
    if "tokens" in point:
        tokens = point["tokens"]
        if tokens % seq_len:
            raise UserError(
                f"{spec.source}: tokens {tokens} is not a multiple of seq_len {seq_len} ({adapter.name})"
            )
        batch = tokens // seq_len
    else:
        batch = point["batch"]
    if "embedding_dim" in point:
        embedding_dim, head_dim_v = point["embedding_dim"], point["head_dim_v"]
        if embedding_dim % head_dim_v:
            raise UserError(
                f"{spec.source}: embedding_dim {embedding_dim} is not a multiple of head_dim_v "
                f"{head_dim_v} ({adapter.name})"
            )
        num_heads = embedding_dim // head_dim_v
    else:
        num_heads = point["num_heads"]
    params = {key.removeprefix("params."): value for key, value in point.items() if key.startswith("params.")}
    return Case(
        kernel=adapter.name,
        mode=mode,
        dtype=dtype,
        batch=batch,
        seq_len=seq_len,
        num_heads=num_heads,
        head_dim_qk=point["head_dim_qk"],
        head_dim_v=point["head_dim_v"],
        chunk_size=point.get("chunk_size") if adapter.uses_chunk_size else None,
        params=params,
    )


def shape_integer(value: Any) -> bool:
    """Whether `value` is a shape integer: an int (not a bool) in [1, `MAX_SHAPE`]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SHAPE


def _param_value(value: Any) -> bool:
    """A kernel parameter is a string, a boolean, an int of 64 bits or a finite float."""
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    return isinstance(value, float) and math.isfinite(value)


def _check_shape_alternatives(shape: dict[str, Any], source: str, table: str, base: dict | None) -> None:
    """Exactly one of tokens/batch and of num_heads/embedding_dim; seq_len and head dims present."""
    for pair in (("tokens", "batch"), ("num_heads", "embedding_dim")):
        given = [key for key in pair if key in shape]
        if len(given) == 2:
            raise UserError(f"{source}: {table} gives both {pair[0]!r} and {pair[1]!r}; give one")
        if base is None and not given:
            raise UserError(f"{source}: {table} needs {pair[0]!r} or {pair[1]!r}")
    if base is None:
        for key in ("seq_len", "head_dim_qk", "head_dim_v"):
            if key not in shape:
                raise UserError(f"{source}: {table} needs {key!r}")


class _Where:
    """Type checks that name the spec's source and key in their `UserError`."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, expected: str, value: Any) -> UserError:
        return UserError(f"{self.source}: key {key!r}: expected {expected}, got {value!r}")

    def only_keys(self, table: dict[str, Any], allowed: tuple[str, ...], what: str) -> None:
        for key in table:
            if key not in allowed:
                raise UserError(
                    f"{self.source}: unknown key {key!r} in {what}; allowed keys: {', '.join(allowed)}"
                )

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def string_list(self, value: Any, key: str, allow_scalar: bool = False) -> tuple[str, ...]:
        if allow_scalar and isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "a non-empty list of strings", value)
        return tuple(value)

    def choice(self, value: Any, key: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(key, f"one of {', '.join(choices)}", value)
        return value

    def choice_list(self, value: Any, key: str, choices: tuple[str, ...]) -> tuple[str, ...]:
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values or any(v not in choices for v in values):
            raise self.fail(key, f"one or a list of {', '.join(choices)}", value)
        return tuple(dict.fromkeys(values))

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def shape(self, value: Any, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, "a table", value)
        self.only_keys(value, allowed, f"[{key}]")
        shape = {}
        for name, entry in value.items():
            items = entry if isinstance(entry, list) else [entry]
            if not items or not all(shape_integer(v) for v in items):
                raise self.fail(f"{key}.{name}", SHAPE_EXPECTED, entry)
            shape[name] = list(entry) if isinstance(entry, list) else entry
        return shape

    def params(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, "a table such as { causal = true }", value)
        params = {}
        for name, entry in value.items():
            items = entry if isinstance(entry, list) else [entry]
            if not items or not all(_param_value(v) for v in items):
                raise self.fail(
                    f"{key}.{name}", "a string, finite number or boolean, or a list of them", entry
                )
            params[name] = entry
        return params
