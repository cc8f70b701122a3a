"""Errors a user can act on: each renders as one line naming the file, line and key."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RecipeError(Exception):
    """Bad input in a recipe file; the CLI prints `str(err)` and exits 2."""

    file: Path | str
    message: str
    key: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = _display(self.file)
        if self.line is not None:
            where += f":{self.line}"
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}"


def _display(file: Path | str) -> str:
    """A path relative to the working directory when it lies below it, as the user typed it."""
    path = Path(file)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return str(file)


class UsageError(Exception):
    """Bad command-line input that is not about one recipe file (exit 2)."""


@dataclass
class SettingError(Exception):
    """A recipe key whose value cannot be used here; the caller adds file and line."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def unreadable_reason(err: ValueError | OSError) -> str:
    """Why a file we read could not be used, in one line: the first field pydantic rejected (or
    its JSON error) rather than its "1 validation error for X" header."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError):
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"]))
        return f"{where}: {first['msg']}" if where else first["msg"]
    if isinstance(err, OSError):
        return err.strerror or type(err).__name__
    return str(err).splitlines()[0]


def os_error_line(err: OSError) -> str:
    """An operating-system error in one line: the path(s) it names and the system's reason."""
    reason = err.strerror or str(err) or type(err).__name__
    paths = [str(name) for name in (err.filename, err.filename2) if name is not None]
    return f"{' -> '.join(paths)}: {reason}" if paths else reason


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def say_error(message: object) -> None:
    """Print one error line on stderr: `recipeval: message`, with control characters (a newline
    in a file name, an escape sequence) shown escaped so the line stays one line."""
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(message))
    print(f"recipeval: {text}", file=sys.stderr)
