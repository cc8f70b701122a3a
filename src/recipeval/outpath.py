"""Check an output path given on the command line before anything runs: an empty name, a
name past the system's limits, or a path through a file or onto a device is bad input (exit 2),
not a traceback or a result written somewhere else."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from recipeval.atomic import NAME_MAX

# Linux's limit on a whole path (NAME_MAX, on one component, is the atomic writer's too).
PATH_MAX = 4095


def _name_problem(raw: str, kind: str) -> str | None:
    """Why `raw` cannot name any path (empty, NUL, past the limits), or None."""
    if not raw.strip():
        return f"is empty; name a {kind}"
    if "\x00" in raw:
        return "contains a NUL byte"
    encoded = os.fsencode(raw)
    if len(encoded) > PATH_MAX:
        return f"is {len(encoded)} bytes long; paths are limited to {PATH_MAX}"
    long_parts = [p for p in encoded.split(b"/") if len(p) > NAME_MAX]
    if long_parts:
        return f"has a name of {len(long_parts[0])} bytes; each name is limited to {NAME_MAX}"
    return None


def _ancestor_problem(path: Path) -> str | None:
    """Why `path` cannot be created: its nearest existing ancestor is not a folder."""
    for ancestor in path.absolute().parents:
        if ancestor.is_symlink() and not ancestor.exists():
            return f"lies under {ancestor}, a symbolic link that leads nowhere (a loop?)"
        if ancestor.exists():
            if not ancestor.is_dir():
                return f"lies under {ancestor}, which is not a folder"
            if not os.access(ancestor, os.W_OK | os.X_OK):
                return f"lies under {ancestor}, which this user cannot write to"
            break
    return None


def output_path_problem(raw: str, file_suffix: str | None = None) -> str | None:
    """Why `raw` cannot be an output folder (or, with `file_suffix`, a file of that suffix),
    or None when it can."""
    problem = _name_problem(raw, "folder")
    if problem:
        return problem
    path = Path(raw)
    if path.is_symlink() and not path.exists():
        return "is a symbolic link that leads nowhere (a loop, or its target is gone)"
    wants_file = file_suffix is not None and path.suffix == file_suffix
    if path.exists() and not wants_file and not path.is_dir():
        return "exists and is not a folder (a file or device); name a folder"
    if wants_file and path.exists() and not path.is_file():
        return f"exists and is not a regular {file_suffix} file"
    return _ancestor_problem(path)


def output_file_problem(raw: str) -> str | None:
    """Why `raw` cannot be an output file (written whole over what is there), or None."""
    problem = _name_problem(raw, "file")
    if problem:
        return problem
    path = Path(raw)
    if path.exists() and not path.is_file():
        return "exists and is not a regular file (a folder or device); name a file"
    return _ancestor_problem(path)


def out_folder(raw: str | os.PathLike[str]) -> Path:
    """typer parser for a results folder option (--out)."""
    raw = os.fspath(raw)  # typer hands a Path default to the parser too
    problem = output_path_problem(raw)
    if problem:
        raise typer.BadParameter(f"{raw[:80]!r} {problem}")
    return Path(raw)


def out_file(raw: str | os.PathLike[str]) -> Path:
    """typer parser for an option naming one output file (import's recipe, parse-log's table,
    nightly's verdict)."""
    raw = os.fspath(raw)  # typer hands a Path default to the parser too
    problem = output_file_problem(raw)
    if problem:
        raise typer.BadParameter(f"{raw[:80]!r} {problem}")
    return Path(raw)


def out_json_or_folder(raw: str | os.PathLike[str]) -> Path:
    """typer parser for an option that takes FILE.json or a folder (env-check --out)."""
    raw = os.fspath(raw)  # typer hands a Path default to the parser too
    problem = output_path_problem(raw, ".json")
    if problem:
        raise typer.BadParameter(f"{raw[:80]!r} {problem}")
    return Path(raw)
