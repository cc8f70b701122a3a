"""A recipe's identity: SHA-256 of its canonical resolved form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PR_RECIPE, TINY_RECIPE

from recipeval.recipe import InvalidRecipe, load_recipe, resolve


def _leaves(data: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _leaves(v, path + (k,))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _leaves(v, path + (i,))]
    return [path]


def _set(data: Any, path: tuple, value: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if value is None:
        return "x"
    return f"{value}x"


def test_reformatting_does_not_change_the_hash(tmp_path: Path):
    original = load_recipe(TINY_RECIPE).sha256
    data = yaml.safe_load(TINY_RECIPE.read_text())
    reordered = dict(reversed(list(data.items())))
    reordered["model"] = dict(sorted(data["model"].items()))
    (tmp_path / "flow.yaml").write_text(
        "# a comment\n" + yaml.safe_dump(reordered, default_flow_style=True, sort_keys=False)
    )
    (tmp_path / "block.yaml").write_text(yaml.safe_dump(reordered, indent=4, sort_keys=True))
    assert load_recipe(tmp_path / "flow.yaml").sha256 == original
    assert load_recipe(tmp_path / "block.yaml").sha256 == original


def test_changing_any_value_changes_the_hash(tmp_path: Path):
    base_data = yaml.safe_load(TINY_RECIPE.read_text())
    original = load_recipe(TINY_RECIPE).sha256
    seen = {original}
    checked = 0
    for path in _leaves(base_data):
        if path == ("name",):
            continue
        data = yaml.safe_load(TINY_RECIPE.read_text())
        _set(data, path, _changed(_get(data, path)))
        file = tmp_path / "tiny-grpo-cpu.yaml"
        file.write_text(yaml.safe_dump(data))
        try:
            digest = load_recipe(file).sha256
        except InvalidRecipe:
            continue  # the change made the recipe invalid: nothing to hash
        assert digest not in seen, f"changing {'.'.join(map(str, path))} kept the hash"
        seen.add(digest)
        checked += 1
    assert checked >= 30


def test_inherited_values_are_part_of_the_hash(tmp_path: Path):
    base = tmp_path / "base.yaml"
    base.write_text(TINY_RECIPE.read_text().replace("name: tiny-grpo-cpu\n", ""))
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nname: child\n")
    before = load_recipe(child).sha256
    base.write_text(base.read_text().replace("lr: 3e-4", "lr: 1e-4"))
    assert load_recipe(child).sha256 != before


def test_extends_deep_merges_and_replaces_lists(tmp_path: Path):
    child = tmp_path / "child.yaml"
    child.write_text(
        f"extends: {PR_RECIPE}\nname: child\nparallel: {{tp: 8}}\n"
        "args: {eval-prompt-data: [x], sglang-mem-fraction-static: null}\n"
    )
    recipe = load_recipe(child).recipe
    assert recipe.parallel.tp == 8 and recipe.parallel.pp == 4  # merged, not replaced
    assert recipe.args["eval-prompt-data"] == ["x"]  # lists replaced
    resolved = resolve(recipe)
    assert "sglang-mem-fraction-static" not in resolved.args  # null drops an inherited flag
    assert recipe.env["SGLANG_HACK_FLASHMLA_BACKEND"] == "unified_kv_triton"


def test_name_is_not_inherited(tmp_path: Path):
    child = tmp_path / "my-child.yaml"
    child.write_text(f"extends: {PR_RECIPE}\n")
    assert load_recipe(child).recipe.name == "my-child"


def test_stage_overlay_and_variant(tmp_path: Path):
    recipe = load_recipe(TINY_RECIPE).recipe
    bench = resolve(recipe, "bench")
    assert bench.args["rollout-max-response-len"] == 8192
    assert resolve(recipe).args["rollout-max-response-len"] == 16
    variant = resolve(recipe, "logprob_diff", "bf16-rollout")
    assert variant.args["rollout-dtype"] == "bfloat16"
    with pytest.raises(KeyError, match="no-such"):
        resolve(recipe, "logprob_diff", "no-such")
