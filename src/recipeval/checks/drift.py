"""env_check's upstream-drift warning: when the recipe's engine can rebuild the upstream launch
the recipe names (miles: from a configured checkout, re-recording its `source` launch), warn on
every flag or env var the recipe's render no longer matches."""

from __future__ import annotations

import os
from collections.abc import Mapping

from recipeval.engines import engine_for
from recipeval.recipe.resolve import Resolved
from recipeval.result import Check
from recipeval.secrets import scrub, secret_values


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
    # The recipe's own secrets can show in the text (its `source.args`, a re-recording's
    # error); the differences' values already come as fingerprints.
    secrets = secret_values(recipe=resolved.recipe.model_dump(mode="json"))
    if found.error is not None:
        message = scrub(found.error, secrets)
        return Check(id=check_id, ok=False, severity="warning", key="source", message=message)
    return Check(
        id=check_id,
        ok=not found.drifted,
        severity="warning",
        key="source",
        message=scrub("\n".join(found.lines), secrets),
        value={"upstream_commit": found.upstream_commit, "differences": found.differences},
    )
