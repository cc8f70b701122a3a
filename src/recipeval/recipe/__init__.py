"""Recipe files: schema, loading with `extends`, stage overlays, identity."""

from recipeval.recipe.load import InvalidRecipe, LoadedRecipe, load_recipe, recipe_sha256
from recipeval.recipe.resolve import Resolved, resolve
from recipeval.recipe.schema import STAGE_GATES, STAGES, Recipe

__all__ = [
    "STAGES",
    "STAGE_GATES",
    "InvalidRecipe",
    "LoadedRecipe",
    "Recipe",
    "Resolved",
    "load_recipe",
    "recipe_sha256",
    "resolve",
]
