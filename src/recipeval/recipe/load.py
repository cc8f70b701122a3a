"""Load a recipe file: follow `extends`, deep-merge, validate, and keep each key's origin
so every error points at the file and line that set it."""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from recipeval.errors import RecipeError
from recipeval.recipe.exec_env import refused_exec_env
from recipeval.recipe.schema import STAGES, Recipe
from recipeval.recipe.yamlfile import KeyPath, Origin, key_text, read_yaml_mapping
from recipeval.secrets import fingerprint_secret

# Flags that `render` derives from structured keys; setting them in `args` would let the two
# disagree, so the loader points at the structured key instead.
DERIVED_FLAGS: dict[str, str] = {
    "tensor-model-parallel-size": "parallel.tp",
    "sequence-parallel": "parallel.sequence_parallel",
    "pipeline-model-parallel-size": "parallel.pp",
    "decoder-first-pipeline-num-layers": "parallel.pp_first_stage_layers",
    "decoder-last-pipeline-num-layers": "parallel.pp_last_stage_layers",
    "context-parallel-size": "parallel.cp",
    "expert-model-parallel-size": "parallel.ep",
    "expert-tensor-parallel-size": "parallel.etp",
    "actor-num-nodes": "cluster.nodes",
    "actor-num-gpus-per-node": "cluster.gpus_per_node",
    "num-gpus-per-node": "cluster.gpus_per_node",
    "num-layers": "model.layers",
    "hidden-size": "model.hidden_size",
    "ffn-hidden-size": "model.ffn_hidden_size",
    "num-attention-heads": "model.attention_heads",
    "num-query-groups": "model.kv_heads",
    "num-experts": "model.experts",
    "moe-ffn-hidden-size": "model.moe_ffn_hidden_size",
    "moe-router-topk": "model.moe_router_topk",
    "vocab-size": "model.vocab_size",
    "max-position-embeddings": "model.max_position_embeddings",
}


class InvalidRecipe(Exception):
    """One or more recipe errors; each renders as one line."""

    def __init__(self, errors: list[RecipeError]):
        super().__init__(errors)
        self.errors = errors

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


@dataclass
class LoadedRecipe:
    """A validated recipe with where it came from."""

    recipe: Recipe
    path: Path
    files: list[Path]  # the leaf first, then its ancestors
    origins: dict[KeyPath, Origin] = field(repr=False)

    @property
    def sha256(self) -> str:
        return recipe_sha256(self.recipe)

    def origin(self, key: str | KeyPath) -> Origin:
        """File and line that set `key` (dotted or tuple), or of its nearest set ancestor."""
        parts = tuple(key.split(".")) if isinstance(key, str) else key
        for n in range(len(parts), -1, -1):
            if parts[:n] in self.origins:
                return self.origins[parts[:n]]
        return (self.path, 1)

    def error(self, key: str, message: str) -> RecipeError:
        file, line = self.origin(key)
        return RecipeError(file, message, key, line)


# Optional keys added to the format later (dotted: nested): unset, they stay out of the
# identity, so a new key in the schema does not change the hash of every existing recipe.
_UNSET_NOT_HASHED = ("sweep.after", "sweep", "allow_exec_env")


def canonical_json(recipe: Recipe) -> str:
    """The recipe's canonical text: fully resolved, key-sorted, compact JSON. `source` is
    provenance, not a setting: naming the upstream commit leaves the identity unchanged."""
    data = recipe.model_dump(mode="json", exclude={"extends", "source"})
    for key in _UNSET_NOT_HASHED:
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.get(part) or {}
        if node.get(leaf) in (None, []):
            node.pop(leaf, None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def recipe_sha256(recipe: Recipe) -> str:
    return hashlib.sha256(canonical_json(recipe).encode()).hexdigest()


def deep_merge(
    base: dict[str, Any],
    over: dict[str, Any],
    base_origins: dict[KeyPath, Origin],
    over_origins: dict[KeyPath, Origin],
    path: KeyPath = (),
) -> dict[str, Any]:
    """Merge `over` into `base`: mappings recursively, anything else (lists too) replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value, base_origins, over_origins, path + (key,))
        else:
            out[key] = value
            prefix = path + (key,)
            for stale in [p for p in base_origins if p[: len(prefix)] == prefix]:
                del base_origins[stale]
    return out


# An `extends` chain longer than this, or more files read for one recipe (a parent listed
# many times at many levels multiplies the reads), is a mistake or an attack, not a recipe.
MAX_EXTENDS_DEPTH = 16
MAX_RECIPE_FILES = 64


def _read_chain(
    file: Path,
    stack: tuple[Path, ...],
    budget: list[int] | None = None,
) -> tuple[dict[str, Any], dict[KeyPath, Origin], list[Path]]:
    budget = [MAX_RECIPE_FILES] if budget is None else budget
    budget[0] -= 1
    data, origins = read_yaml_mapping(file)
    parents = data.pop("extends", None)
    if parents is None:
        return data, origins, [file]
    line = origins.get(("extends",), (file, 1))[1]
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise RecipeError(file, "expected a relative path or a list of paths", "extends", line)
    merged: dict[str, Any] = {}
    merged_origins: dict[KeyPath, Origin] = {}
    files = [file]
    for rel in parents:
        try:  # a NUL byte or an over-long name is bad input, not a crash
            parent = (file.parent / rel).resolve()
            parent.is_file()
        except (OSError, ValueError, RuntimeError) as err:  # RuntimeError: a symlink loop
            raise RecipeError(
                file, f"parent recipe {rel[:100]!r} is not a usable path: {err}", "extends", line
            ) from None
        if parent in stack or parent == file:
            cycle = " -> ".join(str(p) for p in (*stack, file, parent))
            raise RecipeError(file, f"extends cycle: {cycle}", "extends", line)
        if len(stack) + 1 >= MAX_EXTENDS_DEPTH:
            raise RecipeError(
                file, f"extends chain longer than {MAX_EXTENDS_DEPTH} files", "extends", line
            )
        if budget[0] <= 0:
            raise RecipeError(
                file,
                f"extends reads more than {MAX_RECIPE_FILES} files for one recipe",
                "extends",
                line,
            )
        if not parent.is_file():
            found = "is not a regular file" if parent.exists() else "not found"
            raise RecipeError(
                file, f"parent recipe {rel!r} {found} (looked for {parent})", "extends", line
            )
        pdata, porigins, pfiles = _read_chain(parent, (*stack, file), budget)
        # `name` belongs to the file that declares it; a child never inherits its parent's.
        pdata.pop("name", None)
        merged = deep_merge(merged, pdata, merged_origins, porigins)
        merged_origins.update(porigins)
        files.extend(pfiles)
    merged = deep_merge(merged, data, merged_origins, origins)
    merged_origins.update(origins)
    return merged, merged_origins, files


def merged_mapping(file: Path) -> dict[str, Any]:
    """A recipe file with its `extends` chain merged, not validated (a base may be partial)."""
    return _read_chain(file.resolve(), ())[0]


def _describe(err: dict[str, Any], model_fields: list[str] | None) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        hint = ""
        if model_fields:
            close = difflib.get_close_matches(key, model_fields, n=1)
            hint = (
                f" (did you mean {close[0]!r}?)"
                if close
                else f"; allowed: {', '.join(model_fields)}"
            )
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"]
    msg = msg.removeprefix("Value error, ")
    value = err.get("input")
    if kind not in ("missing",) and not isinstance(value, dict | list):
        msg += f" (got {_shown(tuple(err['loc']), value)})"
    return msg


def _shown(loc: tuple[Any, ...], value: Any) -> str:
    """A refused value as an error quotes it: cut short, and a secret only by its fingerprint,
    as the history keeps it (fingerprint_secret, by the key it is under)."""
    key = next((p for p in reversed(loc) if isinstance(p, str) and not _is_union_tag(p)), "")
    hidden = fingerprint_secret(key, value)
    if hidden is not value:
        return f"a secret, shown as its fingerprint {hidden}"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:60] + f"... ({len(shown)} chars)"


def _fields_at(loc: tuple[Any, ...]) -> list[str] | None:
    """Allowed keys of the model that owns `loc`'s last element, for 'did you mean'."""
    model: Any = Recipe
    for part in loc[:-1]:
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return None
        model = info.annotation
        if getattr(model, "model_fields", None) is None:
            return None
    return list(getattr(model, "model_fields", {}).keys()) or None


def _cross_checks(recipe: Recipe) -> list[tuple[str, str]]:
    """Constraints between keys that pydantic's per-field types cannot express."""
    problems: list[tuple[str, str]] = []
    if recipe.platform == "cpu" and recipe.cluster.gpus_per_node:
        problems.append(("cluster.gpus_per_node", "platform cpu needs gpus_per_node: 0"))
    if recipe.platform != "cpu" and not recipe.cluster.gpus_per_node:
        problems.append(
            ("cluster.gpus_per_node", f"platform {recipe.platform} needs gpus_per_node >= 1")
        )
    model = recipe.model
    if model.kv_heads is not None and model.attention_heads % model.kv_heads:
        problems.append(
            (
                "model.kv_heads",
                f"attention_heads ({model.attention_heads}) must be a multiple of kv_heads ({model.kv_heads})",
            )
        )
    arg_maps = [("args", recipe.args), ("model.args", recipe.model.args)]
    for stage in STAGES:
        options = getattr(recipe.stages, stage)
        arg_maps.append((f"stages.{stage}.args", options.args))
    for name, variant in recipe.stages.logprob_diff.variants.items():
        arg_maps.append((f"stages.logprob_diff.variants.{name}.args", variant.args))
    for where, args in arg_maps:
        for flag in args:
            if flag.startswith("-"):
                problems.append((f"{where}.{flag}", "write flag names without the leading '--'"))
            elif flag in DERIVED_FLAGS:
                problems.append(
                    (
                        f"{where}.{flag}",
                        f"set {DERIVED_FLAGS[flag]} instead; render derives this flag",
                    )
                )
    return problems


def load_recipe(path: str | Path) -> LoadedRecipe:
    """Load, merge and validate a recipe file. Raises InvalidRecipe (all problems found)."""
    file = Path(path).absolute()
    try:
        data, origins, files = _read_chain(file, ())
    except RecipeError as err:
        raise InvalidRecipe([err]) from None
    data.setdefault("name", file.stem.removesuffix(".recipe"))
    if isinstance(data.get("env"), dict):
        # `env: {NAME: null}` removes a variable a parent recipe set, as in stage overlays.
        data["env"] = {k: v for k, v in data["env"].items() if v is not None}
    loaded_origins = dict(origins)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        probe = LoadedRecipe(recipe=None, path=file, files=files, origins=loaded_origins)  # type: ignore[arg-type]
        raise InvalidRecipe(
            [
                RecipeError(
                    *probe.origin(loc)[:1],
                    message,
                    key_text(loc) or None,
                    probe.origin(loc)[1],
                )
                for loc, message in validation_messages(exc)
            ]
        ) from None
    loaded = LoadedRecipe(recipe=recipe, path=file, files=files, origins=loaded_origins)
    problems = _cross_checks(recipe) + refused_exec_env(recipe)
    if problems:
        raise InvalidRecipe([loaded.error(key, msg) for key, msg in problems])
    return loaded


def validation_messages(exc: ValidationError) -> list[tuple[tuple[Any, ...], str]]:
    """One message per key. A union (e.g. an `args` value) fails once per member type; those
    collapse into a single 'expected one of' message."""
    by_loc: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for err in exc.errors():
        loc = tuple(err["loc"])
        # pydantic appends the union member's type to the path (args.x.str, args.x.list[...]).
        while loc and isinstance(loc[-1], str) and _is_union_tag(loc[-1]):
            loc = loc[:-1]
        by_loc.setdefault(loc, []).append(err)
    out = []
    for loc, errs in by_loc.items():
        if len(errs) == 1:
            out.append((loc, _describe(errs[0], _fields_at(loc))))
            continue
        value = errs[0].get("input")
        out.append(
            (
                loc,
                (
                    "expected a string, number, true/false, a list of scalars, or null"
                    f" (got {type(value).__name__} {_shown(loc, value)})"
                ),
            )
        )
    return out


_UNION_TAGS = {"str", "int", "float", "bool", "list", "none"}


def _is_union_tag(part: str) -> bool:
    return part in _UNION_TAGS or "[" in part
