"""A benchmark case (one kernel at one shape, mode and dtype), its shape, the modes and dtypes a case may
take, and the one reading of true/false text (`parse_bool`) for params, CSV cells and flags."""

from dataclasses import asdict, dataclass, field
from typing import Any

MODES = ("fw", "fwbw")
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Shape:
    """The sizes of a case: batch, sequence length, heads, head dims and the chunk size (None: the
    kernel's default, or a kernel that takes none)."""

    batch: int
    seq_len: int
    num_heads: int
    head_dim_qk: int
    head_dim_v: int
    chunk_size: int | None = None


@dataclass(frozen=True)
class _Call:
    """Which kernel a case runs, in which mode and dtype."""

    kernel: str
    mode: str
    dtype: str


@dataclass(frozen=True)
class Case(Shape, _Call):
    """One measurement: which kernel, in which mode and dtype, at which shape.

    Its fields, in this order (also as positional arguments): kernel, mode, dtype, the `Shape` fields,
    params; a dataclass takes its bases' fields from the last base to the first, so `_Call`'s lead.
    `params` holds kernel-specific settings (e.g. `causal`, `state_dim`); its keys become
    `param_<key>` columns in result rows.
    """

    params: dict[str, Any] = field(default_factory=dict, hash=False)

    def param(self, name: str, default: Any = None) -> Any:
        return self.params.get(name, default)

    @property
    def key(self) -> str:
        """A stable identifier, used to resume a run and to shard cases over GPUs."""
        extra = ",".join(f"{k}={self.params[k]}" for k in sorted(self.params))
        return (
            f"{self.kernel}|{self.mode}|{self.dtype}|B{self.batch}|T{self.seq_len}|H{self.num_heads}"
            f"|Dqk{self.head_dim_qk}|Dv{self.head_dim_v}|L{self.chunk_size}|{extra}"
        )

    def columns(self) -> dict[str, Any]:
        """The case as flat result-row columns."""
        row = asdict(self)
        params = row.pop("params")
        row.update({f"param_{k}": v for k, v in sorted(params.items())})
        return row


def parse_bool(text: str) -> bool | None:
    """`true`/`false` in any case (surrounding spaces ignored) as a bool; None for anything else."""
    lowered = text.strip().lower()
    return lowered == "true" if lowered in ("true", "false") else None
