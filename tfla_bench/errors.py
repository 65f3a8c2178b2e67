"""The exception types the CLI turns into one line on stderr instead of a traceback.

A `UserError` (bad flag, bad spec, unsupported shape, bad path) exits with code 2. A `RunFailed`
(the environment stopped a sweep that had started: a full disk, a directory made read-only) exits
with code 1, every finished row kept. Bugs raise anything else.
"""


class UserError(Exception):
    """A mistake of the user's, reported as one line and exit code 2."""


class RunFailed(Exception):
    """A started run stopped by its environment, reported as one line and exit code 1."""
