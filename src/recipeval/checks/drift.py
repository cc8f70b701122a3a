"""env_check's upstream-drift warning: when the recipe's engine can rebuild the upstream launch
the recipe names (miles: from a configured checkout, re-recording its `source` launch), warn on
every flag or env var the recipe's render no longer matches."""

from __future__ import annotations

import os
from collections.abc import Mapping

from recipeval.engines import engine_for
from recipeval.recipe.resolve import Resolved
from recipeval.result import Check


def drift_check(resolved: Resolved, environ: Mapping[str, str] | None = None) -> Check | None:
    """None when the engine has no drift check or nothing to compare with here; else a warning
    Check, id `<engine>.drift`, that fails on drift (or when the launch cannot be rebuilt). Its
    value (the upstream commit and each difference) is what publish tracks night to night."""
    engine = engine_for(resolved.recipe.engine)
    if engine.drift is None:
        return None
    found = engine.drift(resolved, os.environ if environ is None else environ)
    if found is None:
        return None
    check_id = f"{engine.name}.drift"
    if found.error is not None:
        return Check(id=check_id, ok=False, severity="warning", key="source", message=found.error)
    return Check(
        id=check_id,
        ok=not found.drifted,
        severity="warning",
        key="source",
        message="\n".join(found.lines),
        value={"upstream_commit": found.upstream_commit, "differences": found.differences},
    )
