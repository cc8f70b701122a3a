"""Write a file so that a reader never sees half of it: write beside it, then rename over it
(a rename within one folder is atomic), so a crash leaves the old file or the new one."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

# Linux's limit on one path component.
NAME_MAX = 255


def atomic_write(path: Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` writes the content to a temporary name beside `path`; then it replaces
    `path`. The temporary file is removed when `write` fails, and an OSError names `path`,
    the file the caller asked for, not the temporary name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if len(os.fsencode(tmp.name)) > NAME_MAX:  # a name the system allows, but not 12 more bytes
        digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:16]
        tmp = path.with_name(f".{digest}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from err
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
