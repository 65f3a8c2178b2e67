"""What the command groups share of their options: the option that more than one command declares
alike, and the parsers of list-valued options."""

from __future__ import annotations

from typing import Annotated

import typer

from tfla_bench.errors import UserError

JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON object instead of a table")]


def _names(values: list[str] | None, flag: str = "") -> list[str]:
    """Repeated and comma-separated option values, flattened, without duplicates; with `flag`, a
    `UserError` naming it where a value given holds no name (`-k ""` from an unset variable would
    otherwise mean every kernel, or be dropped beside another `-k`)."""
    names = [part.strip() for value in values or [] for part in value.split(",") if part.strip()]
    empty = next((value for value in values or [] if not value.replace(",", "").strip()), None)
    if flag and empty is not None:
        raise UserError(f"{flag}: expected a name or a comma list of names, got {empty!r}")
    return list(dict.fromkeys(names))


def _ints(flag: str, text: str) -> int | list[int]:
    """`2048` -> 2048, `2048,8192` -> [2048, 8192]; a `UserError` naming the flag otherwise."""
    values = _int_list(flag, text)
    return values[0] if len(values) == 1 else values


def _int_list(flag: str, text: str) -> list[int]:
    """`2048` -> [2048], `2048,8192` -> [2048, 8192]; a `UserError` naming the flag otherwise."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        values = [int(part) for part in parts]
    except ValueError as exc:
        raise UserError(f"{flag}: expected an integer or a comma list of integers, got {text!r}") from exc
    if not values or any(value <= 0 for value in values):
        raise UserError(f"{flag}: expected positive integers, got {text!r}")
    return values
