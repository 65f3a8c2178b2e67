"""The one exception type for mistakes a user can make (bad flag, bad spec, unsupported shape).

The CLI turns a `UserError` into one line on stderr and exit code 2. Bugs raise anything else.
"""


class UserError(Exception):
    """A mistake of the user's, reported as one line and exit code 2."""
