"""The exception types the CLI turns into one line on stderr instead of a traceback, and the one-line
form (`exception_line`) in which rows, reasons and verdicts quote any other exception.

A `UserError` (bad flag, bad spec, unsupported shape, bad path) exits with code 2. A `RunFailed`
(the environment stopped a sweep that had started: a full disk, a directory made read-only) exits
with code 1, every finished row kept. Bugs raise anything else. Ctrl-C ends a command with one line
that starts with `interrupted` (`interrupted_line`) and exit code 130.
"""

_INTERRUPTED_SAID: list[str] = []


class UserError(Exception):
    """A mistake of the user's, reported as one line and exit code 2."""


class RunFailed(Exception):
    """A started run stopped by its environment, reported as one line and exit code 1."""


def control_char(text: str) -> str | None:
    """The first control character of `text` (a newline, a tab, DEL), or None: a value holding one
    would break the one line that names it, or the file it is written into."""
    return next((char for char in text if ord(char) < 32 or ord(char) == 127), None)


def exception_line(exc: BaseException) -> str:
    """`TypeName: last non-blank line of the message` (just `TypeName` for an empty message)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__


def interrupted_line(kept: str = "") -> str:
    """The one line a command stopped by Ctrl-C prints: `interrupted`, with what it kept; a command
    that printed it itself (a sweep, naming where its rows are) is not followed by a second one."""
    _INTERRUPTED_SAID.append(kept)
    return f"interrupted: {kept}" if kept else "interrupted"


def interrupted_said() -> bool:
    """Whether this process printed its `interrupted_line` already."""
    return bool(_INTERRUPTED_SAID)
