"""Write generated variants as recipe files: each extends its base recipe and sets only what
it changes, plus a `sweep` block saying where it came from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from recipeval.readfile import read_regular
from recipeval.recipe import load_recipe
from recipeval.recipe.schema import Sweep

# An emitted variant is a few KiB: a larger .yaml in the folder is not one of ours.
VARIANT_LIMIT = 1024 * 1024


class EmitError(ValueError):
    """An output folder that cannot take the variants."""


def prepare_folder(folder: Path) -> Path:
    """The emit folder, created; a file in its place is an error (exit 2 at the CLI)."""
    if folder.exists() and not folder.is_dir():
        raise EmitError(f"--emit {folder}: exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_variant(
    base: Path, folder: Path, name: str, changes: dict[str, Any], sweep: Sweep, comment: str
) -> Path:
    """DIR/<name>.yaml extending `base` with `changes` (nested recipe keys); loaded back before
    it is left in place, so a variant on disk is always a valid recipe."""
    body = {
        "name": name,
        "extends": os.path.relpath(base.resolve(), folder.resolve()),
        **changes,
        "sweep": sweep.model_dump(exclude_none=True, exclude_defaults=True)
        | {"kind": sweep.kind, "base": sweep.base},
    }
    path = folder / f"{name}.yaml"
    if path.resolve() in {file.resolve() for file in load_recipe(base).files}:
        raise EmitError(f"--emit {folder}: {path.name} would replace the recipe it extends")
    text = "".join(f"# {line}\n" for line in comment.splitlines())
    text += yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=100)
    # the pid keeps two emits into one folder off each other's unfinished file
    tmp = path.with_name(f".{name}.{os.getpid()}.tmp.yaml")
    try:
        tmp.write_text(text)
        load_recipe(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise EmitError(
            f"--emit {folder}: cannot write {path.name}: {err.strerror or err}"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def remove_stale_variants(folder: Path, keep: list[Path], inputs: list[Path]) -> list[Path]:
    """Remove the variants an earlier --emit left in `folder` that this one did not write:
    the workflow runs every recipe in a sweep folder, so they would run beside the new ones.
    Only files with a `sweep` block go; anything else a user put there stays, and so do
    `inputs` (the recipes this run read, their parents included: an emitted variant may be
    explored again into its own folder) and another run's unfinished dot-files."""
    kept = {path.resolve() for path in [*keep, *inputs]}
    removed = []
    for path in sorted(folder.glob("*.yaml")):
        if path.resolve() in kept or path.name.startswith(".") or not path.is_file():
            continue
        try:
            body = yaml.safe_load(read_regular(path, limit=VARIANT_LIMIT).decode())
        # a user's file of any shape is not ours: too large, nested past the parser's
        # recursion, a date like 2001-02-30 (ValueError)
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError, ValueError):
            continue
        if isinstance(body, dict) and "sweep" in body:
            path.unlink()
            removed.append(path)
    return removed


__all__ = ["EmitError", "prepare_folder", "remove_stale_variants", "write_variant"]
