"""Engines turn a resolved recipe into a Launch (and, for miles' format, parse its log)."""

from __future__ import annotations

from collections.abc import Mapping

from recipeval.engines.launch import Launch
from recipeval.recipe.resolve import Resolved


def render(resolved: Resolved, environ: Mapping[str, str] | None = None) -> Launch:
    """Render with the recipe's engine; raises SettingError for an unusable setting."""
    if resolved.recipe.engine == "miles":
        from recipeval.engines.miles.render import render as render_miles

        return render_miles(resolved, environ)
    from recipeval.engines.reference import render as render_reference

    return render_reference(resolved, environ)
