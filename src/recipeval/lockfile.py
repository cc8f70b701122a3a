"""An exclusive lock on a file in a folder that several processes share (a history, a Ray head's
record): flock, so the kernel releases it when its holder dies."""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recipeval.readfile import NotRegularFile


@contextmanager
def locked_file(path: Path) -> Iterator[None]:
    """Hold `path`'s lock, creating the file. A FIFO, folder or link there is NotRegularFile:
    opening a FIFO for writing would wait for a reader forever."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise NotRegularFile(errno.EINVAL, "not a regular file; remove it", str(path))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
