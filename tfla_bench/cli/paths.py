"""Output paths, checked before a command does any work, and the one way a write that fails after
the work began is reported.

Every file or folder a command writes (`--out`, `--json`, `--csv`, a report, figures, a run
directory) goes through `output_file` or `output_dir` first, so a path that cannot be written is one
`UserError` line (exit 2) before minutes of measuring or plotting, not a traceback after them: an
empty path, a name too long for the file system, a new name holding a control character, a symlink
that leads nowhere (a loop or a missing target), a file where a folder is needed or the reverse, a
file or folder a run directory keeps of itself (`rundir.own_part`), a file without its owner's write
bit (`rundir.refuse_not_writable`: root's access would ignore it), a folder that cannot be written,
or a file system with less than `MIN_FREE_BYTES` free. A check writes nothing: missing folders are created by
the writer, and a path passes when they can be.

A write that fails once the command has begun writing (the disk filled up meanwhile) is a
`RunFailed` (exit 1) from `writes`, which names what was written and removes what it left half done.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tfla_bench.errors import RunFailed, UserError, control_char
from tfla_bench.run import rundir

# Below this a report or a figure would not fit (a report embeds its figures: about a megabyte).
MIN_FREE_BYTES = 1 << 20


def path_option(flag: str) -> Callable[[str], Path]:
    """A typer `parser=` for an output option: the text as a `Path`, refusing an empty one (which
    `Path` reads as the current folder, so the output would land among whatever is there)."""

    def parse(text: str | Path) -> Path:
        if isinstance(text, Path):  # an option's default, which click passes through the parser too
            return text
        if not text.strip():
            raise UserError(f"{flag}: expected a path, got an empty one")
        return Path(text)

    parse.__name__ = "PATH"  # typer shows the parser's name as the option's metavar
    return parse


def output_file(path: Path, flag: str, keep: Iterable[Path] = ()) -> Path:
    """Check that `path` can be written as a file: not a folder, and its folder exists or can be made.

    Args:
        path: the file a command will write (an existing file is replaced).
        flag: how the user named it (`--json`, or a description such as `report`), for the message.
        keep: input files the command reads, which an output must not replace.

    Raises:
        UserError: `path` is a folder or one of `keep`, a parent is a file, or the folder is not writable.
    """
    with _refusing_os_errors(flag, path):
        _check_name(path, flag)
        if path.is_dir():
            raise UserError(f"{flag} {path}: is a folder; give a file name")
        if any(_same_file(path, kept) for kept in keep):
            raise UserError(f"{flag} {path}: would replace an input of this command; give another file")
        _check_not_a_runs_own(path, flag)
        _check_not_published(path, flag)
        rundir.refuse_not_writable([path], flag)
        _check_folder(path.parent, flag, path)
    return path


def output_files(outputs: Iterable[tuple[Path | None, str]], keep: Iterable[Path] = ()) -> None:
    """`output_file` for each `(path, flag)` given (a None path is an output not asked for), and no
    two of them one file, where the second write would replace the first.

    Raises:
        UserError: what `output_file` refuses, or two flags naming one file.
    """
    given = [(path, flag) for path, flag in outputs if path is not None]
    for index, (path, flag) in enumerate(given):
        output_file(path, flag, keep)
        for other, other_flag in given[:index]:
            if _same_file(path, other):
                raise UserError(f"{flag} {path}: the same file as {other_flag}; give each output a file")


def output_dir(path: Path, flag: str) -> Path:
    """Check that files can be written in the folder `path`, which exists or can be made.

    Args:
        path: the folder a command will write into.
        flag: how the user named it (`--out`, or a description such as `figures`), for the message.

    Raises:
        UserError: `path` or a parent is a file, or it (or its nearest existing parent) is not writable.
    """
    with _refusing_os_errors(flag, path):
        _check_name(path, flag)
        if path.exists() and not path.is_dir():
            raise UserError(f"{flag} {path}: is a file; give a folder")
        _check_not_a_runs_own(path, flag)
        _check_not_published(path, flag)
        _check_folder(path, flag, path)
    return path


def replacing(path: Path) -> str:
    """What the line that names a written file adds when the write replaces one: ask before writing."""
    return " (replaced the previous one)" if path.exists() else ""


@contextmanager
def writes(what: str, folder: Path | None = None) -> Iterator[None]:
    """Turn a failed write inside the block into a `RunFailed` naming `what` and the reason.

    Args:
        what: the output, as the message names it (`the report out/report.html`).
        folder: an output folder the block fills; one it created and left empty is removed, and the
            files it did write are named in the message.
    """
    existed = folder is not None and folder.is_dir()
    before = set(folder.iterdir()) if folder is not None and existed else set()
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if folder is None or not folder.is_dir():
            raise RunFailed(f"cannot write {what} ({reason})") from None
        written = sorted(path.name for path in set(folder.iterdir()) - before)
        if not existed and not written:
            shutil.rmtree(folder, ignore_errors=True)
            raise RunFailed(f"cannot write {what} ({reason}); removed the empty folder {folder}") from None
        kept = f"{len(written)} file(s) written before are kept: {', '.join(written)}" if written else ""
        raise RunFailed(f"cannot write {what} ({reason}){'; ' + kept if kept else ''}") from None


@contextmanager
def _refusing_os_errors(flag: str, path: Path) -> Iterator[None]:
    """Asking the file system about a path can itself fail (a name too long): one line, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise UserError(f"{flag} {path}: {exc.strerror or exc}") from None


def _same_file(path: Path, other: Path) -> bool:
    """Whether two paths name one file: the same path, or links (symbolic or hard) to one file."""
    if path.exists() and other.exists():
        return path.samefile(other)
    return path.resolve() == other.resolve()


def _check_not_a_runs_own(path: Path, flag: str) -> None:
    """An output never replaces a file a run directory keeps of itself, nor goes inside its folders."""
    own = rundir.own_part(path)
    if own is not None:
        raise UserError(
            f"{flag} {path}: would write over {own.name} of the run {own.parent}, its own; give another path"
        )


def _check_not_published(path: Path, flag: str) -> None:
    """An output never goes into the folder of the paper's published CSVs, which `compare` reads."""
    from tfla_bench.analyse.published import published_dir  # pandas: only where a command writes

    published = published_dir()
    if published.is_dir() and any(_same_file(place, published) for place in (path, *path.parents)):
        raise UserError(
            f"{flag} {path}: lies in {published}, the paper's published data that compare reads; "
            "give another path"
        )


def _check_name(path: Path, flag: str) -> None:
    """Each name along `path` fits the file system, none is a symlink that leads nowhere, and a
    name still to be made holds no control character (a newline: a pasted command, a script's
    unquoted variable), which would follow the folder into every listing and message."""
    control = control_char(str(path))
    if control is not None and not path.exists():
        raise UserError(f"{flag} {str(path)!r}: holds a control character ({control!r}); give a plain name")
    for part in path.parts:
        if len(os.fsencode(part)) > 255:
            raise UserError(f"{flag} {path}: a name in it has {len(os.fsencode(part))} bytes; at most 255")
    for place in (path, *path.parents):
        # exists() follows the link and is False for a loop or a missing target; mkdir would then fail.
        if place.is_symlink() and not place.exists():
            raise UserError(
                f"{flag} {path}: {place} is a symlink that leads nowhere (a loop or a missing target)"
            )


def _check_folder(folder: Path, flag: str, path: Path) -> None:
    """The nearest existing ancestor of `folder` (itself included) is a folder we can create files in,
    on a file system with room for the output."""
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
    status = os.statvfs(existing)
    free = status.f_bavail * status.f_frsize
    if free < MIN_FREE_BYTES:
        raise UserError(
            f"{flag} {path}: no space left in {existing} ({free:,} bytes free; "
            f"at least {MIN_FREE_BYTES:,} needed)"
        )
