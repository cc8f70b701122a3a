"""Recipe files: schema, loading with `extends`, stage overlays, identity."""

from recipeval.recipe.load import LoadedRecipe, RecipeErrors, load_recipe, recipe_sha256
from recipeval.recipe.resolve import Resolved, resolve
from recipeval.recipe.schema import STAGES, Recipe

__all__ = [
    "STAGES",
    "LoadedRecipe",
    "Recipe",
    "RecipeErrors",
    "Resolved",
    "load_recipe",
    "recipe_sha256",
    "resolve",
]
