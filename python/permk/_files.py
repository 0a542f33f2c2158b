"""Files that are either wholly the old content or wholly the new: :func:`atomic_write`.

A write goes to a temporary file beside the target (same directory, so same file system),
is flushed and fsynced, then renamed over the target (``os.replace``, atomic on POSIX), and the
directory is fsynced so the rename itself survives a crash. A failure or a kill at any point
leaves the old file as it was; a failure also removes the temporary file.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import IO, Any, Callable

__all__ = ["atomic_write"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write(fh)`` (its return value is ignored) on a binary file that becomes ``path``
    only once ``write`` returns (see the module docstring); returns the path written (a symlink's
    target). The new file's mode follows the umask, as a
    plain ``open(path, "wb")`` would."""
    p = Path(os.path.realpath(path))  # through a symlink: the file it names is replaced, not the link
    tmp = p.with_name(f".{p.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:  # named by the file asked for, not the temporary one
        raise type(e)(e.errno, e.strerror, str(p)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(p.parent)
    return p


def _fsync_directory(directory: Path) -> None:
    """fsync a directory (the rename in it); a no-op where directories cannot be opened."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - not POSIX
        return
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
