"""Read one YAML recipe file into plain data plus the line of every key path.

PyYAML's composed node tree carries positions; we walk it once so that any later error
(pydantic's, a merge conflict, a check) can point at `file:line` for a dotted key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from recipeval.errors import RecipeError

KeyPath = tuple[str | int, ...]
# Where a value came from: (file, line).
Origin = tuple[Path, int]


def _scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    return loader.construct_object(node, deep=True)


def _to_data(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: KeyPath,
    file: Path,
    origins: dict[KeyPath, Origin],
) -> Any:
    origins[path] = (file, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(loader, key_node)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                raise RecipeError(
                    file,
                    "duplicate key (YAML would silently keep the last one)",
                    ".".join(map(str, path + (key,))),
                    key_node.start_mark.line + 1,
                )
            out[key] = _to_data(loader, value_node, path + (key,), file, origins)
            origins[path + (key,)] = (file, key_node.start_mark.line + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _to_data(loader, item, path + (i,), file, origins) for i, item in enumerate(node.value)
        ]
    return _scalar(loader, node)


def read_yaml_mapping(file: Path) -> tuple[dict[str, Any], dict[KeyPath, Origin]]:
    """Parse `file` as a YAML mapping; return the data and the origin of every key path."""
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise RecipeError(file, "file not found") from None
    except IsADirectoryError:
        raise RecipeError(file, "is a directory, expected a recipe .yaml file") from None
    except OSError as err:
        raise RecipeError(file, f"cannot read: {err.strerror}") from None
    if b"\x00" in raw:
        raise RecipeError(file, "binary file, expected a YAML recipe (UTF-8 text)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError(
            file, f"not UTF-8 text (byte {err.start}), expected a YAML recipe"
        ) from None
    if not text.strip() or all(
        not line.strip() or line.lstrip().startswith("#") for line in text.splitlines()
    ):
        raise RecipeError(
            file, "empty file, expected a YAML mapping with at least `name` or `extends`"
        )
    loader = yaml.SafeLoader(text)
    origins: dict[KeyPath, Origin] = {}
    try:
        node = loader.get_single_node()
        if node is None:
            raise RecipeError(file, "empty document, expected a YAML mapping")
        if not isinstance(node, yaml.MappingNode):
            kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
            raise RecipeError(
                file,
                f"top level is {kind}, expected a mapping of recipe keys",
                None,
                node.start_mark.line + 1,
            )
        data = _to_data(loader, node, (), file, origins)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        problem = err.problem or err.context or "invalid YAML"
        raise RecipeError(file, f"YAML syntax error: {problem}", None, line) from None
    except yaml.YAMLError as err:
        raise RecipeError(file, f"YAML error: {err}") from None
    finally:
        loader.dispose()
    return data, origins
