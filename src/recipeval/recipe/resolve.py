"""Apply a stage's overlay (and optionally a logprob_diff variant) to a recipe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipeval.recipe.schema import ArgMap, Overlay, Recipe, StageOptions


@dataclass(frozen=True)
class Resolved:
    """What one launch runs: the recipe with a stage overlay (and variant) applied."""

    recipe: Recipe
    stage: str | None
    variant: str | None
    args: dict[str, Any]  # flags still present (false/null dropped)
    env: dict[str, str]
    options: StageOptions | None

    @property
    def name(self) -> str:
        return self.recipe.name

    def arg(self, flag: str, default: Any = None) -> Any:
        return self.args.get(flag, default)


def _apply(args: dict[str, Any], env: dict[str, str], overlay: Overlay) -> None:
    for flag, value in overlay.args.items():
        args[flag] = value
    for key, value in overlay.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value


def flag_present(value: Any) -> bool:
    """A flag set to false or null is not on the command line; anything else is."""
    return value is not None and value is not False


def active_args(args: ArgMap) -> dict[str, Any]:
    return {k: v for k, v in args.items() if flag_present(v)}


def resolve(recipe: Recipe, stage: str | None = None, variant: str | None = None) -> Resolved:
    """The recipe as `stage` runs it. Unknown stage or variant names raise KeyError."""
    args: dict[str, Any] = dict(recipe.args)
    env: dict[str, str] = dict(recipe.env)
    options: StageOptions | None = None
    if stage is not None:
        options = getattr(recipe.stages, stage, None)
        if options is None:
            raise KeyError(f"unknown stage {stage!r}")
        _apply(args, env, options)
    if variant is not None:
        if stage != "logprob_diff":
            # a variant over another stage's overlay is a launch no stage ever runs
            raise KeyError(f"variant {variant!r} is a logprob_diff variant; use stage logprob_diff")
        variants = recipe.stages.logprob_diff.variants
        if variant not in variants:
            raise KeyError(
                f"unknown variant {variant!r}; recipe has: {', '.join(variants) or 'none'}"
            )
        _apply(args, env, variants[variant])
    return Resolved(recipe, stage, variant, active_args(args), env, options)
