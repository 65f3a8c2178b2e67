"""What the command groups share of their options: the option that more than one command declares
alike, and the parsers of list-valued options."""

from __future__ import annotations

from typing import Annotated

import typer

from tfla_bench.errors import UserError

JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON object instead of a table")]


def name_option(flag: str):
    """A typer `parser=` for an option naming one thing: the text, refusing an empty one (an unset
    variable), which would otherwise mean the default or nothing without a word."""

    def parse(text: str) -> str:
        if not text.strip():
            raise UserError(f"{flag}: expected a name, got an empty one")
        return text

    parse.__name__ = "NAME"  # typer shows the parser's name as the option's metavar
    return parse


def _names(values: list[str] | None, flag: str = "") -> list[str]:
    """Repeated and comma-separated option values, flattened, without duplicates; with `flag`, a
    `UserError` naming it where a value given holds an empty name (`-k ""` from an unset variable
    would otherwise mean every kernel, or be dropped beside another `-k`; `a,,b` a name left out)."""
    names = [part.strip() for value in values or [] for part in value.split(",") if part.strip()]
    empty = next((v for v in values or [] if not all(part.strip() for part in v.split(","))), None)
    if flag and empty is not None:
        raise UserError(f"{flag}: expected a name or a comma list of names, got {empty!r}")
    return list(dict.fromkeys(names))


def _ints(flag: str, text: str) -> int | list[int]:
    """`2048` -> 2048, `2048,8192` -> [2048, 8192]; a `UserError` naming the flag otherwise."""
    values = _int_list(flag, text)
    return values[0] if len(values) == 1 else values


def _int_list(flag: str, text: str) -> list[int]:
    """`2048` -> [2048], `2048,8192` -> [2048, 8192]; a `UserError` naming the flag otherwise."""
    parts = [part.strip() for part in text.split(",")]
    try:
        values = [int(part) for part in parts]  # an empty item (`512,`, `128,,256`) is no integer
    except ValueError as exc:
        raise UserError(f"{flag}: expected an integer or a comma list of integers, got {text!r}") from exc
    if not values or any(value <= 0 for value in values):
        raise UserError(f"{flag}: expected positive integers, got {text!r}")
    return values
