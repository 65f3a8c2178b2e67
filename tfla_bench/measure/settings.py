"""How each case is measured: the settings, their allowed values, and the one check every setting
passes through, whether it comes from a spec file, a command-line flag or a resumed run's spec.json.

Every number must be finite and inside its range; a bad value is a `UserError` that names where it
came from, the key and the allowed range, in one wording.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from tfla_bench.errors import UserError
from tfla_bench.measure.energy import MIN_SERIES_S

GRAD_MODES = ("fixed", "sum")
# How a timed call's time is read (`tfla_bench.measure.timing`): CUDA events around it, or the GPU's
# record of the kernels it ran.
CLOCKS = ("events", "kernels")
# How a case whose power cap sets in while it is timed is timed again (`tfla_bench.measure.gpustate`).
POWER_CAP_MODES = ("gaps", "again")
# Where the energy per call is read (`tfla_bench.measure.energy`): around the timed calls, less what
# the flushes, spins and idle GPU in their window drew, or in a series of calls of its own after them.
ENERGY_METHODS = ("around", "series")
# The value of a setting that a run measured with before its spec.json recorded the setting
# (`as_recorded`).
BEFORE_RECORDED = {"energy_method": "series", "energy_s": 0.5}
# The longest a case may run, first call included: a week.
MAX_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class MeasureSettings:
    """How each case is measured (see `tfla_bench.run.runner` for the method, `tfla_bench.measure.timing`
    for the rule).

    Attributes:
        warmup: a fixed number of untimed calls after the first call, or None to warm up by time.
        reps: a fixed number of timed calls (the paper's method), or None for adaptive reps.
        warmup_s: with `warmup` None, untimed calls until this many seconds have passed (at least one).
        rel_ci: adaptive target: the median's 95% confidence interval within +-rel_ci of the median.
        budget_s: adaptive: seconds of timed calls after which a case stops short of `rel_ci`.
        min_time_s: adaptive: seconds of timed calls before `rel_ci` may stop a case.
        min_reps, max_reps: adaptive: the fewest and the most timed calls.
        l2_flush: zero a buffer of at least 2x the L2 size before every timed call (GPU only).
        cuda_graph: capture one call in a CUDA graph and time its replays (GPU only).
        clock: `events` (CUDA events around each call) or `kernels` (the call's span in the GPU's
            activity record, from the end of the kernel before it); GPU only, see `tfla_bench.measure.timing`.
        power_cap: a case whose power cap sets in during its timed calls is timed again `gaps`
            (from a settled GPU, each call followed by an idle gap as long as itself) or `again` (at
            once, back to back, at the capped clock); see `tfla_bench.measure.gpustate`.
        grad: upstream gradient in fwbw: `fixed` (one `randn_like(out)` made once) or `sum` (`out.sum()`).
        timeout_s: wall-clock limit per case, first call (compile/autotune) included.
        autotune_ms: timed milliseconds per config when a library's Triton autotuner tunes in the
            first call (`tfla_bench.measure.timing.autotuning_budget`); Triton's own is 100.
        energy: read NVML's energy counter for the row's `energy_mj` and `tokens_per_joule` (GPU
            only; `tfla_bench.measure.energy`).
        energy_method: `series` (at least `energy_s` of back-to-back calls after the timed ones, its
            idle tail taken off) or `around` (the counter read around the timed calls, less what their
            flushes, spins and idle GPU drew; a case whose power cap set in, or whose calls drew too
            small a share of the window, falls back to the series).
        energy_s: the shortest energy series in seconds; a series costs about this plus one step of
            the counter (about 0.1 s on an H200) a case.
    """

    warmup: int | None = None
    reps: int | None = None
    warmup_s: float = 0.025
    rel_ci: float = 0.01
    budget_s: float = 1.0
    min_time_s: float = 0.2
    min_reps: int = 5
    max_reps: int = 2000
    l2_flush: bool = True
    cuda_graph: bool = False
    clock: str = "events"
    power_cap: str = "gaps"
    grad: str = "fixed"
    timeout_s: float = 900.0
    autotune_ms: float = 20.0
    energy: bool = True
    energy_method: str = "series"
    energy_s: float = MIN_SERIES_S


@dataclass(frozen=True)
class Rule:
    """What one setting accepts: an integer or a number in [low, high] (`low` excluded when
    `open_low`), a boolean, or one of `choices`."""

    kind: str  # "int", "number", "bool" or "choice"
    low: float = 0.0
    high: float = math.inf
    open_low: bool = False
    choices: tuple[str, ...] = ()
    unit: str = ""

    def expected(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return f"one of {', '.join(self.choices)}"
        what = "an integer" if self.kind == "int" else "a finite number"
        low, high = (
            (f"{self.low:g}", f"{self.high:g}") if self.kind == "number" else (int(self.low), int(self.high))
        )
        bracket = "(" if self.open_low else "["
        return f"{what} in {bracket}{low}, {high}]{self.unit}"

    def accepts(self, value: Any) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "choice":
            return isinstance(value, str) and value in self.choices
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if not math.isfinite(value) or value > self.high:
            return False
        return value > self.low if self.open_low else value >= self.low


RULES: dict[str, Rule] = {
    "warmup": Rule("int", 0, 1_000_000),
    "reps": Rule("int", 1, 1_000_000),
    "warmup_s": Rule("number", 0, 3600, unit=" seconds"),
    "rel_ci": Rule("number", 0, 1, open_low=True),
    "budget_s": Rule("number", 0, 86400, open_low=True, unit=" seconds"),
    "min_time_s": Rule("number", 0, 86400, unit=" seconds"),
    "min_reps": Rule("int", 1, 1_000_000),
    "max_reps": Rule("int", 1, 10_000_000),
    "l2_flush": Rule("bool"),
    "cuda_graph": Rule("bool"),
    "clock": Rule("choice", choices=CLOCKS),
    "power_cap": Rule("choice", choices=POWER_CAP_MODES),
    "grad": Rule("choice", choices=GRAD_MODES),
    "timeout_s": Rule("number", 0, MAX_TIMEOUT_S, open_low=True, unit=" seconds"),
    "autotune_ms": Rule("number", 0, 60_000, open_low=True, unit=" ms"),
    "energy": Rule("bool"),
    "energy_method": Rule("choice", choices=ENERGY_METHODS),
    "energy_s": Rule("number", 0, 600, open_low=True, unit=" seconds"),
}


def as_recorded(table: dict[str, Any]) -> dict[str, Any]:
    """A run's spec table (its spec.json, or the copy its env.json recorded) with the settings it
    does not name at the values it measured with (`BEFORE_RECORDED`): what `diff` compares, and what
    `--resume` measures the rest of the run with."""
    return {**BEFORE_RECORDED, **table}


def check(key: str, value: Any, where: str) -> Any:
    """`value` if setting `key` accepts it (an int given for a number becomes a float); otherwise a
    `UserError` that starts with `where` (a flag, or a file and its key) and names the allowed values."""
    rule = RULES[key]
    if key in ("warmup", "reps") and value is None:
        return None
    if not rule.accepts(value):
        raise UserError(f"{where}: expected {rule.expected()}, got {value!r}")
    return float(value) if rule.kind == "number" else value


def from_table(table: dict[str, Any], source: str) -> MeasureSettings:
    """The settings a spec table gives (absent keys take their defaults), each one checked."""
    defaults = MeasureSettings()
    given = {
        key: check(key, table[key], f"{source}: key {key!r}")
        for key in RULES
        if key in table and table[key] is not None
    }
    settings = MeasureSettings(**{**{f.name: getattr(defaults, f.name) for f in fields(defaults)}, **given})
    if settings.max_reps < settings.min_reps:
        raise UserError(
            f"{source}: key 'max_reps': expected at least min_reps ({settings.min_reps}), "
            f"got {settings.max_reps}"
        )
    return settings
