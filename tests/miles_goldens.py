"""Golden launches recorded from miles (tests/golden/miles/) and the differences the tests
accept (allowed.yaml beside them)."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import RECIPES, REPO

from recipeval.engines.miles.flags import Difference, differences, launch_differences
from recipeval.engines.miles.record import MILES_PLACEHOLDER, Recording
from recipeval.recipe import InvalidRecipe, load_recipe

GOLDENS = REPO / "tests" / "golden" / "miles"
ALLOWED_FILE = GOLDENS / "allowed.yaml"
# Render with the checkout written as the recordings write it.
RENDER_ENV = {"MILES_DIR": MILES_PLACEHOLDER}


def miles_recipes() -> list[Path]:
    """Every complete recipe in recipes/ whose engine is miles (partial bases skipped)."""
    found = []
    for path in sorted(RECIPES.rglob("*.yaml")):
        try:
            if load_recipe(path).recipe.engine == "miles":
                found.append(path)
        except InvalidRecipe:
            continue
    return found


def allowed(recipe: str) -> dict[str, str]:
    """'env X' / 'flag --x' -> reason, for one recipe."""
    table = yaml.safe_load(ALLOWED_FILE.read_text())
    return {**table.get("*", {}), **table.get(recipe, {})}


def label(d: Difference) -> str:
    if d.kind == "flag":
        return f"flag --{d.name}"
    return f"client-env {d.name}" if d.kind == "client_env" else f"env {d.name}"


def differences_from_golden(launch: dict, golden: Recording) -> list[Difference]:
    """A `render --format json` launch against a golden, flag by flag and env var by env var,
    then the variables exported for the submit itself."""
    return [
        *launch_differences(
            golden.entrypoint,
            golden.runtime_env,
            launch["entrypoint"],
            launch["runtime_env"]["env_vars"],
        ),
        *differences("client_env", golden.client_env, launch["client_env"]),
    ]
