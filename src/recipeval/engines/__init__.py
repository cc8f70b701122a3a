"""Engines turn a resolved recipe into a Launch and read its log; the registry below is the one
place that maps a recipe's `engine` name to what that engine can do."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from recipeval.engines.base import Engine
from recipeval.engines.launch import Launch
from recipeval.engines.miles import ENGINE as MILES
from recipeval.engines.reference import ENGINE as REFERENCE
from recipeval.recipe.resolve import Resolved

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (MILES, REFERENCE)}


def engine_for(name: str) -> Engine:
    """The engine a recipe names; KeyError for a name no engine has."""
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; choose one of: {', '.join(ENGINES)}") from None


def render(
    resolved: Resolved, environ: Mapping[str, str] | None = None, out: Path | None = None
) -> Launch:
    """Render with the recipe's engine; files the launch reads go under `out`, the stage's
    results folder. Raises SettingError for an unusable setting."""
    return engine_for(resolved.recipe.engine).render(resolved, environ, out)


__all__ = ["ENGINES", "Engine", "engine_for", "render"]
