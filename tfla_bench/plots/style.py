"""How a line looks: the palette rules that turn a kernel, its family and its params into colour,
line style and marker, and the fixed look of each GPU in the model figures.

The rules, so that a figure reads at a glance:

- A kernel takes its hue from its adapter's base style (`plot_style`); the adapters of one family
  keep to one range of hues (mLSTM purple/red/magenta, attention blues, Mamba oranges, GLA greens,
  LightningAttention browns).
- Within one hue, our kernel and the official peer of the same gate differ by line style (ours
  solid with filled markers, the peer dashed) and by marker.
- Params that change what is computed change the look: a non-causal run is a lighter tint of its
  kernel's hue with hollow markers; any other param away from its adapter's default
  (`param_defaults`) a darker or lighter shade and its own marker, picked by a stable hash, so the
  same params look the same in every figure.
- A kernel without a base style (a plug-in's, or one of an old run that is not installed here)
  takes one of its family's hues, the base colours of the family's registered adapters, and a
  marker by a stable hash of its name.

`resolve_style(base, family, kernel, params, defaults)` applies these rules to a base style;
`row_style(kernel, family, params)` finds the adapter's base style and param defaults first.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from matplotlib.colors import to_hex, to_rgb

from tfla_bench.adapters import registry
from tfla_bench.adapters.registry import DASH_DOT, DASHED, DOTTED, SOLID, PlotStyle
from tfla_bench.adapters.workloads import parse_bool
from tfla_bench.model.hardware import ACCELERATORS, Accelerator


@dataclass(frozen=True)
class LineStyle:
    """The look of one drawn series: a base style with its params applied."""

    color: str
    linestyle: str
    marker: str
    fillstyle: str = "full"

    def line(self) -> dict[str, Any]:
        """Keyword arguments for `Axes.plot`."""
        return {
            "color": self.color,
            "linestyle": self.linestyle,
            "marker": self.marker,
            "fillstyle": self.fillstyle,
        }

    def points(self) -> dict[str, Any]:
        """Keyword arguments for `Axes.scatter` (hollow markers keep only their edge)."""
        face = self.color if self.fillstyle == "full" else "none"
        return {"marker": self.marker, "facecolors": face, "edgecolors": self.color}


# The hues of a family none of whose adapters is registered here.
OTHER_PALETTE = ("#525252", "#969696", "#bcbd22", "#1b9e77")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")

# Params that never change the look: a seed changes the inputs, not the computation.
IGNORED_PARAMS = ("seed",)
NON_CAUSAL_TINT = 0.5
VARIANT_SHADES = (-0.35, 0.35, -0.55, 0.55)


def _stable_index(text: str, size: int) -> int:
    return zlib.crc32(text.encode()) % size


def _parse(value: Any) -> Any:
    # results.csv gives params back as text or floats; "true"/"false" compare as bools.
    flag = parse_bool(value) if isinstance(value, str) else None
    if flag is not None:
        return flag
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def param_variant(
    params: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> tuple[tuple[str, Any], ...]:
    """The params that change a line's look: set, not ignored, and not at their default, sorted.

    Keys may carry the results.csv prefix `param_`; unset values (None, NaN, "") are dropped.
    `defaults` are the adapter's `param_defaults`.
    """
    defaults = defaults or {}
    variant = []
    for key, value in params.items():
        name = key.removeprefix("param_")
        if value is None or value == "" or (isinstance(value, float) and value != value):
            continue
        value = _parse(value)
        if name in IGNORED_PARAMS or defaults.get(name, object()) == value:
            continue
        variant.append((name, value))
    return tuple(sorted(variant, key=lambda item: item[0]))


def shade(color: str, amount: float) -> str:
    """`color` mixed towards white (amount > 0) or black (amount < 0) by |amount|."""
    rgb = to_rgb(color)
    target = 1.0 if amount > 0 else 0.0
    return to_hex(tuple(c + (target - c) * abs(amount) for c in rgb))


def family_palette(family: str) -> tuple[str, ...]:
    """The family's hues: the base colours of its registered adapters (`OTHER_PALETTE` for none)."""
    colors = {a.plot_style.color for a in registry.adapters() if a.family == family and a.plot_style}
    return tuple(sorted(colors)) or OTHER_PALETTE


def family_color(family: str, kernel: str) -> str:
    """A colour from the family's hues for a kernel without a base style (stable by name)."""
    palette = family_palette(family)
    return palette[_stable_index(kernel, len(palette))]


def resolve_style(
    base: PlotStyle | None,
    family: str,
    kernel: str,
    params: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> LineStyle:
    """The look of a kernel's series at its params, by the module's rules.

    Args:
        base: the kernel's base style, or None to take one from its family's hues.
        family: the kernel's family (`mlstm`, `attention`, ...).
        kernel: the adapter name (picks the fallback colour and marker).
        params: the series' params (with or without the `param_` prefix).
        defaults: the adapter's `param_defaults` (a param at its default leaves the look alone).
    """
    if base is None:
        base = PlotStyle(family_color(family, kernel), SOLID, MARKERS[_stable_index(kernel, len(MARKERS))])
    variant = param_variant(params or {}, defaults)
    if not variant:
        return LineStyle(base.color, base.linestyle, base.marker)
    if variant == (("causal", False),):
        return LineStyle(shade(base.color, NON_CAUSAL_TINT), base.linestyle, base.marker, "none")
    key = repr(variant)
    others = [m for m in MARKERS if m != base.marker]
    amount = VARIANT_SHADES[_stable_index(key, len(VARIANT_SHADES))]
    causal = dict(variant).get("causal", True)
    return LineStyle(
        shade(base.color, amount),
        base.linestyle,
        others[_stable_index(key, len(others))],
        "full" if causal else "none",
    )


def base_style(kernel: str) -> PlotStyle | None:
    """The kernel's base style: its adapter's `plot_style`, None if it has none or is not registered here."""
    adapter = registry.find(kernel)  # a run may name kernels that are not installed here
    return adapter.plot_style if adapter is not None else None


def row_style(kernel: str, family: str, params: Mapping[str, Any] | None = None) -> LineStyle:
    """`resolve_style` with the kernel's own base style and param defaults (none when not registered)."""
    adapter = registry.find(kernel)
    defaults = adapter.param_defaults if adapter is not None else None
    return resolve_style(base_style(kernel), family, kernel, params, defaults)


# In the order of the model's GPU table; no purple, red or magenta, so roofs never look like the
# mLSTM kernels drawn under them.
ACCELERATOR_COLORS = ("#1b9e77", "#d95f02", "#1f78b4", "#6baed6", "#33a02c", "#e6ab02", "#a6761d", "#666666")
ACCELERATOR_LINESTYLES = (SOLID, DASHED, DASH_DOT, DOTTED)
ACCELERATOR_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def accelerator_style(accelerator: Accelerator) -> LineStyle:
    """A fixed colour, line style and marker per GPU of the model, the same in every figure.

    GPUs whose curves nearly coincide (H100 and H200 share the compute roof) differ in all three.
    A GPU not in the model table takes the last entry of each.
    """
    names = list(ACCELERATORS)
    index = names.index(accelerator.name) if accelerator.name in names else len(ACCELERATOR_COLORS) - 1
    return LineStyle(
        ACCELERATOR_COLORS[index % len(ACCELERATOR_COLORS)],
        ACCELERATOR_LINESTYLES[index % len(ACCELERATOR_LINESTYLES)],
        ACCELERATOR_MARKERS[index % len(ACCELERATOR_MARKERS)],
    )
