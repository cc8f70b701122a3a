"""Read a file the user named without ever blocking on it: a FIFO with no writer, a device
(/dev/zero) or a socket is refused before a byte is read."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotRegularFile(OSError):
    """A FIFO, device, socket or directory where a regular file was expected."""


class FileTooLarge(OSError):
    """A regular file over the reader's limit."""


def regular_file_problem(path: Path, what: str = "file") -> str | None:
    """Why `path` cannot be read as a regular file (missing, a folder, a FIFO...), or None;
    `what` the file should be, for the advice."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return "no such file"
    except OSError as err:  # a symlink loop, a name too long, a folder we may not enter
        return err.strerror or type(err).__name__
    if stat.S_ISDIR(info.st_mode):
        return f"is a folder; name a {what}"
    if not stat.S_ISREG(info.st_mode):
        return f"is not a regular file (a FIFO, device or socket); name a {what}"
    return None


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of the regular file `path` (at most `limit` of them, else FileTooLarge).
    Opened non-blocking, so a FIFO cannot hang us, and checked on the open descriptor, so
    nothing swaps the file in between. Other failures are the OSError open() raises."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise NotRegularFile(errno.EISDIR, "is a directory", str(path))
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(
                errno.EINVAL, "not a regular file (a FIFO, device or socket)", str(path)
            )
        if limit is not None and info.st_size > limit:
            raise FileTooLarge(errno.EFBIG, f"file is {info.st_size} bytes", str(path))
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read() if limit is None else handle.read(limit + 1)
    finally:
        os.close(fd)
    if limit is not None and len(raw) > limit:
        raise FileTooLarge(errno.EFBIG, f"file is over {limit} bytes", str(path))
    return raw
