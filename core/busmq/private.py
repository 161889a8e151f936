"""Files that hold messages or secrets, kept from other local users whatever the umask.

Directories busmq creates for data (the embedded Redis's, the federation outbox's) are
0700 and files in them 0600; an existing one that others can reach is tightened, with a
warning. A secret file that others can read is refused, as OpenSSH refuses such a key:
the fix is a ``chmod``, and the message says which.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .errors import BusError

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


class ExposedSecretError(BusError, PermissionError):
    """A secret file that other local users can read (or write)."""


def make_dirs(path: Path) -> Path:
    """Create ``path`` and its missing parents, each 0700 (whatever the umask); leave
    those that exist as they are. Returns ``path``."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
        directory.chmod(DIR_MODE)
    return missing[0] if missing else path


def private_dir(path: Path) -> Path:
    """Create ``path`` (and its missing parents) 0700, or tighten it to 0700 if others
    can reach it; returns ``path``."""
    make_dirs(path)
    _tighten(path, stat.S_IMODE(path.stat().st_mode), DIR_MODE, lambda: path.chmod(DIR_MODE))
    return path


def private_file(path: Path) -> None:
    """Make sure ``path`` exists and is 0600 (tightened if others could reach it)."""
    os.close(_open_private(path, os.O_WRONLY | os.O_CREAT))


def open_private(path: Path, *, truncate: bool = True) -> IO[str]:
    """``path`` opened for writing text, created 0600 (an existing file is tightened)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else os.O_APPEND)
    fd = _open_private(path, flags)
    try:
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def _open_private(path: Path, flags: int) -> int:
    fd = os.open(path, flags, FILE_MODE)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        _tighten(path, mode, FILE_MODE, lambda: os.fchmod(fd, FILE_MODE))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _tighten(path: Path, mode: int, private: int, chmod: Callable[[], None]) -> None:
    """Make ``path`` (now ``mode``) ``private`` if others can reach it, saying so. A
    process that is not its owner (a volume mounted for a group, say) cannot: it warns
    and goes on, rather than refuse to start on a directory it may write."""
    if not mode & _OTHERS:
        return
    try:
        chmod()
    except PermissionError:
        log.warning(
            "%s is open to other local users (mode %04o) and this process, not its owner, "
            "cannot make it private: restrict it (chmod %o %s)",
            path, mode, private, path,
        )  # fmt: skip
    else:
        log.warning(
            "%s was open to other local users (mode %04o): made private (%04o)",
            path, mode, private,
        )  # fmt: skip


def read_secret_file(path: str | Path) -> str:
    """The text of a secret file; :class:`ExposedSecretError` if others can read it."""
    path = Path(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & _OTHERS:
        raise ExposedSecretError(
            f"secret file {str(path)!r} is open to other local users (mode {mode:04o}); "
            f"it must be readable by its owner only: chmod 600 {path}"
        )
    return path.read_text()
