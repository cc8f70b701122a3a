"""The one rule for names that become file or folder names (recipe names, run ids)."""

from __future__ import annotations

import re

# One path component, never `..`, hidden or absolute; 200 leaves room for a history stamp.
SAFE_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}"
SAFE_NAME = re.compile(SAFE_NAME_PATTERN)


class UnsafeName(ValueError):
    """A name that cannot be used as a file or folder name."""


def check_name(name: str, what: str = "recipe") -> str:
    """`name` when it is a plain file name (letters, digits, . _ -; not starting with a dot);
    UnsafeName otherwise, e.g. for `../../x` or `/etc`."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise UnsafeName(
            f"{what} name {str(name)[:80]!r} cannot be a file name: use letters, digits, '.', '_' "
            "and '-', starting with a letter or digit"
        )
    return name
