"""Read one YAML recipe file into plain data plus the line of every key path.

PyYAML's composed node tree carries positions; we walk it once so that any later error
(pydantic's, a merge conflict, a check) can point at `file:line` for a dotted key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from recipeval.errors import RecipeError
from recipeval.readfile import FileTooLarge, NotRegularFile, read_regular

KeyPath = tuple[str | int, ...]
# Where a value came from: (file, line).
Origin = tuple[Path, int]


def key_text(path: KeyPath) -> str:
    """A key path as an error names it: mapping keys dotted, list items indexed
    (`source.args[2]`)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


# Budgets: a recipe is a few KB of plain mappings. Past these, a file is hostile or broken,
# and refusing it early keeps validate, env-check and `snakemake -n` fast and small.
MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 64  # nesting of mappings/lists (and of merge keys), far below Python's recursion limit
MAX_NODES = 100_000  # values after alias and merge expansion: a 1 KB alias bomb stops here
MERGE_TAG = "tag:yaml.org,2002:merge"


class BudgetError(yaml.YAMLError):
    """The document is past a budget; `line` is where the budget ran out."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting past MAX_DEPTH while composing (PyYAML's composer
    recurses once per level) and merge keys whose expansion would pass MAX_NODES."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise BudgetError(
                    f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark.line + 1
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Flatten the merged mappings first, so the size of the result is known before
        # PyYAML copies their entries into this one.
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise BudgetError(
                    "merge keys (<<) nested too deep or merging themselves",
                    node.start_mark.line + 1,
                )
            total = 0
            for key, value in node.value:
                if key.tag != MERGE_TAG:
                    total += 1
                    continue
                subs = value.value if isinstance(value, yaml.SequenceNode) else [value]
                for sub in subs:
                    if isinstance(sub, yaml.MappingNode):
                        self.flatten_mapping(sub)
                        total += len(sub.value)
            if total > MAX_NODES:
                raise BudgetError(
                    f"merge keys (<<) expand past {MAX_NODES} entries", node.start_mark.line + 1
                )
            super().flatten_mapping(node)
        finally:
            self._depth -= 1


class _Builder:
    """Walks the composed node tree into plain data, recording each key path's line and
    counting every value it produces (aliases included) against MAX_NODES."""

    def __init__(self, loader: _BoundedLoader, file: Path, origins: dict[KeyPath, Origin]) -> None:
        self.loader = loader
        self.file = file
        self.origins = origins
        self.count = 0

    def scalar(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, OverflowError) as err:
            # e.g. an integer past Python's digit limit, a date that does not exist
            raise RecipeError(
                self.file,
                f"unreadable value: {str(err).splitlines()[0][:200]}",
                None,
                node.start_mark.line + 1,
            ) from None

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        line = node.start_mark.line + 1
        self.count += 1
        if self.count > MAX_NODES:
            raise BudgetError(
                f"more than {MAX_NODES} values after expanding aliases (an alias bomb?)", line
            )
        if len(path) > MAX_DEPTH:
            raise BudgetError(
                f"nested deeper than {MAX_DEPTH} levels (a self-referencing alias?)", line
            )
        self.origins[path] = (self.file, line)
        if isinstance(node, yaml.MappingNode):
            self.loader.flatten_mapping(node)
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise RecipeError(
                        self.file,
                        "keys must be plain names, not lists or mappings",
                        key_text(path) or None,
                        key_node.start_mark.line + 1,
                    )
                key = self.scalar(key_node)
                if isinstance(key, bool) or key is None:
                    # YAML 1.1 reads on/off/yes/no as booleans: `on: 1` rendered `--True 1`
                    raise RecipeError(
                        self.file,
                        f"key {key_node.value!r} reads as {str(key).lower()} in YAML; quote it "
                        f"('{key_node.value}') to use it as a name",
                        key_text(path) or None,
                        key_node.start_mark.line + 1,
                    )
                if not isinstance(key, str):
                    key = key_node.value  # a number as written, not Python's str of it
                if key in out:
                    raise RecipeError(
                        self.file,
                        "duplicate key (YAML would silently keep the last one)",
                        key_text(path + (key,)),
                        key_node.start_mark.line + 1,
                    )
                out[key] = self.build(value_node, path + (key,))
                self.origins[path + (key,)] = (self.file, key_node.start_mark.line + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.scalar(node)


def read_bounded(file: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; a FIFO, device (/dev/zero),
    socket or directory is refused without reading (readfile.read_regular)."""
    try:
        return read_regular(file, limit)
    except FileNotFoundError:
        raise RecipeError(file, "file not found") from None
    except (IsADirectoryError, NotRegularFile) as err:
        raise RecipeError(file, f"{err.strerror}; expected a recipe .yaml file") from None
    except FileTooLarge as err:
        raise RecipeError(file, f"{err.strerror}; recipes are limited to {limit} bytes") from None
    except OSError as err:
        raise RecipeError(file, f"cannot read: {err.strerror}") from None


def read_yaml_mapping(file: Path) -> tuple[dict[str, Any], dict[KeyPath, Origin]]:
    """Parse `file` as a YAML mapping; return the data and the origin of every key path."""
    raw = read_bounded(file)
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
    try:
        loader = _BoundedLoader(text)
    except yaml.YAMLError as err:  # the reader refuses control characters at once
        raise RecipeError(file, f"YAML error: {' '.join(str(err).split())}") from None
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
        data = _Builder(loader, file, origins).build(node, ())
    except BudgetError as err:
        raise RecipeError(file, err.message, None, err.line) from None
    except RecursionError:
        raise RecipeError(file, f"nested too deep (limit {MAX_DEPTH} levels)") from None
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
