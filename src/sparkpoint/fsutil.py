"""Durable file operations shared by the embedded log and local state."""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: errors of the disk a user must fix, not retried: full, over quota, read-only, not allowed
USER_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def user_disk_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a disk error the user must fix (:data:`USER_ERRNOS`), also as
    RocksDB reports a full disk (an error whose text says so, not an OSError)."""
    if isinstance(exc, OSError):
        return exc.errno in USER_ERRNOS
    return "No space left on device" in str(exc)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (creations, renames, deletions) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Make every file under ``root``, and the directories holding them, durable (files that
    another writer made, Spark's for instance, which does not fsync)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(Path(folder) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))
    fsync_dir(root.parent)


def atomic_write(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new content, never a mix.

    Durable when it returns: the file and the rename are both fsynced. With ``durable=False``
    neither is: a killed process still leaves the old or the new content, but a machine that
    loses power may leave the old one, or an empty or partial file (for a file whose reader
    treats that as absent, and whose absence costs only work done again).
    """
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)
