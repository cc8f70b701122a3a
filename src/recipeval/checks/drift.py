"""env_check's upstream-drift warning: when a miles checkout is configured here (MILES_DIR or
the recipe's paths.miles) and the recipe names its `source` launch, re-record that launch and
warn on every flag or env var the recipe's render no longer matches."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict

from recipeval.engines.miles.drift import configured_checkout, drift
from recipeval.engines.miles.record import RecordError
from recipeval.recipe.resolve import Resolved
from recipeval.result import Check


def drift_check(resolved: Resolved, environ: Mapping[str, str] | None = None) -> Check | None:
    """None unless the recipe is a miles recipe with a `source` and a checkout is configured;
    else a warning Check that fails on drift (or when the launch cannot be re-recorded). Its
    value (the upstream commit and each difference) is what publish tracks night to night."""
    environ = os.environ if environ is None else environ
    if resolved.recipe.engine != "miles" or resolved.recipe.source is None:
        return None
    checkout = configured_checkout(resolved, environ)
    if checkout is None:
        return None
    try:
        report = drift(resolved, checkout)
    except RecordError as err:
        return Check(
            id="miles.drift",
            ok=False,
            severity="warning",
            key="source",
            message=f"could not re-record the upstream launch: {err}",
        )
    return Check(
        id="miles.drift",
        ok=not report.drifted,
        severity="warning",
        key="source",
        message="\n".join(report.lines()),
        value={
            "upstream_commit": report.upstream_commit,
            "differences": [asdict(d) for d in report.differences],
        },
    )
