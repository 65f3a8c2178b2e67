"""Output paths, checked before a command does any work.

Every file or folder a command writes (`--out`, `--json`, `--csv`, a report, figures, a run
directory) goes through `output_file` or `output_dir` first, so a path that cannot be written is one
`UserError` line before minutes of measuring or plotting, not a traceback after them. A check writes
nothing: missing folders are created by the writer, and a path passes when they can be.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

from tfla_bench.errors import UserError


def output_file(path: Path, flag: str, keep: Iterable[Path] = ()) -> Path:
    """Check that `path` can be written as a file: not a folder, and its folder exists or can be made.

    Args:
        path: the file a command will write (an existing file is replaced).
        flag: how the user named it (`--json`, or a description such as `report`), for the message.
        keep: input files the command reads, which an output must not replace.

    Raises:
        UserError: `path` is a folder or one of `keep`, a parent is a file, or the folder is not writable.
    """
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder; give a file name")
    if any(path.resolve() == kept.resolve() for kept in keep):
        raise UserError(f"{flag} {path}: would replace an input of this command; give another file")
    if path.exists():
        try:
            path.open("a").close()
        except OSError as exc:
            raise UserError(f"{flag} {path}: cannot write ({exc.strerror})") from None
    _check_folder(path.parent, flag, path)
    return path


def output_dir(path: Path, flag: str) -> Path:
    """Check that files can be written in the folder `path`, which exists or can be made.

    Args:
        path: the folder a command will write into.
        flag: how the user named it (`--out`, or a description such as `figures`), for the message.

    Raises:
        UserError: `path` or a parent is a file, or it (or its nearest existing parent) is not writable.
    """
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: is a file; give a folder")
    _check_folder(path, flag, path)
    return path


def _check_folder(folder: Path, flag: str, path: Path) -> None:
    """The nearest existing ancestor of `folder` (itself included) is a folder we can create files in."""
    existing = folder if str(folder) else Path(".")
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, not a folder")
    # os.access reads permission bits, which root ignores; creating a file is the test that holds.
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write in {existing} ({exc.strerror})") from None
