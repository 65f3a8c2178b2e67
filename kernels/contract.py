"""What our kernels accept: the limits and the chunk and head-dim rules of `mlstm_tfla` and
`mlstm_limit_chunk`, in one place. The kernels' entry points raise a `ValueError` with these
reasons; their adapters return them from `check`. It imports neither torch nor Triton, so the
adapters can state the rules on a machine without either.
"""

from __future__ import annotations

import os

SEQ_LEN_MULTIPLE = 16
MIN_CHUNK, MAX_CHUNK = 16, 4096
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 1024
HEAD_DIM_MULTIPLE = 16


def interpreted() -> bool:
    """Whether Triton runs our kernels in its interpreter (`TRITON_INTERPRET` set and not 0): on the
    CPU, or copying through it, far slower than compiled; Triton reads it when a kernel is defined."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def is_power_of_two(value: int) -> bool:
    """Whether `value` is a positive power of two."""
    return value > 0 and value & (value - 1) == 0


def head_dim_reason(name: str, dim: int) -> str | None:
    """Why head dim `dim` (called `name`) is not a multiple of 16 in [16, 1024], or None."""
    if MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM and dim % HEAD_DIM_MULTIPLE == 0:
        return None
    return f"{name} must be a multiple of {HEAD_DIM_MULTIPLE} in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {dim}"


def chunk_reason(chunk: object, max_chunk: int | None = MAX_CHUNK) -> str | None:
    """Why `chunk` is not a power of two in [16, `max_chunk`] (no upper bound for None), or None."""
    valid = isinstance(chunk, int) and not isinstance(chunk, bool) and is_power_of_two(chunk)
    if max_chunk is None:
        if valid and chunk >= MIN_CHUNK:
            return None
        return f"chunk_size must be a power of two >= {MIN_CHUNK}, got {chunk!r}"
    if valid and MIN_CHUNK <= chunk <= max_chunk:
        return None
    return f"chunk_size must be a power of two in [{MIN_CHUNK}, {max_chunk}], got {chunk!r}"
