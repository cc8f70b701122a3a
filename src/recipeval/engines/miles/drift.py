"""Drift: the launch miles' own script builds today (re-recorded from a checkout, or a recorded
golden) against the launch a recipe renders, flag by flag and env var by env var."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recipeval.engines.base import UpstreamDrift
from recipeval.engines.miles.flags import Difference, launch_differences
from recipeval.engines.miles.record import (
    MILES_PLACEHOLDER,
    RecordError,
    Recording,
    is_checkout,
    record_launch,
)
from recipeval.engines.miles.render import render
from recipeval.errors import SettingError
from recipeval.recipe import LoadedRecipe, resolve
from recipeval.recipe.resolve import Resolved
from recipeval.secrets import redact_argv


@dataclass
class DriftReport:
    """What one recipe's render lacks, adds or changes against upstream at `upstream_commit`.
    `ignored`: names left out because miles decides them by probing the node."""

    recipe: str
    source_commit: str
    upstream_commit: str
    script: str
    args: list[str]
    differences: list[Difference] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def drifted(self) -> bool:
        return bool(self.differences)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the nightly's tables."""
        return {**asdict(self), "drifted": self.drifted}

    def lines(self) -> list[str]:
        head = (
            f"{self.recipe}: upstream {self.upstream_commit[:12]} vs source "
            f"{self.source_commit[:12]} ({self.script} {' '.join(self.args)})"
        )
        if not self.differences:
            return [f"{head}: no drift"]
        return [
            f"{head}: {len(self.differences)} difference(s)",
            *(f"  {d.line()}" for d in self.differences),
        ]


def rendered_for_comparison(resolved: Resolved) -> tuple[list[str], dict[str, str]]:
    """The recipe's entrypoint and job env, rendered with the checkout written as recordings
    write it and nothing taken from this machine's environment."""
    launch = render(resolved, {"MILES_DIR": MILES_PLACEHOLDER})
    return launch.entrypoint, dict(launch.runtime_env["env_vars"])


def compare(resolved: Resolved, upstream: Recording) -> DriftReport:
    """Differences between `upstream` and the recipe's render; names miles decides by a node
    probe (the recording's and the recipe's `source.probed`) are not compared."""
    source = resolved.recipe.source
    probed = {*upstream.probed, *(source.probed if source else {})}
    ours_entry, ours_env = rendered_for_comparison(resolved)
    found = launch_differences(upstream.entrypoint, upstream.runtime_env, ours_entry, ours_env)
    kept = [d for d in found if _label(d) not in probed and d.name not in probed]
    return DriftReport(
        recipe=resolved.recipe.name,
        source_commit=source.commit if source else "",
        upstream_commit=upstream.commit,
        script=upstream.script,
        # The script's arguments may hold a secret flag's value (`--wandb-key K`).
        args=redact_argv(list(upstream.args)),
        differences=kept,
        ignored=sorted(probed),
    )


def _label(d: Difference) -> str:
    return f"--{d.name}" if d.kind == "flag" else d.name


def configured_checkout(
    resolved: Resolved, environ: Mapping[str, str], explicit: Path | None = None
) -> Path | None:
    """The miles checkout to re-record from: `explicit`, else MILES_DIR, else the recipe's
    paths.miles, when that directory is a miles checkout here."""
    for candidate in (explicit, environ.get("MILES_DIR"), resolved.recipe.paths.miles):
        if candidate:
            path = Path(candidate)
            if is_checkout(path):
                return path
            if explicit is not None:
                raise RecordError(f"{path} is not a miles checkout (no miles/utils/external_utils)")
    return None


def drift(resolved: Resolved, checkout: Path) -> DriftReport:
    """Re-record the recipe's `source` launch from `checkout` and compare."""
    source = resolved.recipe.source
    if source is None:
        raise RecordError(
            f"recipe {resolved.recipe.name} has no `source:` block naming the "
            "miles launch it describes; add one (recipeval import miles writes it)"
        )
    return compare(resolved, record_launch(checkout, source.script, list(source.args)))


def upstream_drift(resolved: Resolved, environ: Mapping[str, str]) -> UpstreamDrift | None:
    """The miles engine's drift check for env_check: None unless the recipe names its `source`
    launch and a checkout is configured (MILES_DIR or paths.miles)."""
    if resolved.recipe.source is None:
        return None
    checkout = configured_checkout(resolved, environ)
    if checkout is None:
        return None
    try:
        report = drift(resolved, checkout)
    except RecordError as err:
        return UpstreamDrift(None, [], [], error=f"could not re-record the upstream launch: {err}")
    return UpstreamDrift(
        report.upstream_commit, [asdict(d) for d in report.differences], report.lines()
    )


class DriftInputError(Exception):
    """A recipe drift cannot judge: not a miles recipe, no source, no checkout, a launch that
    cannot be recorded or read, a setting render refuses."""


def drift_for_recipe(
    loaded: LoadedRecipe,
    environ: Mapping[str, str],
    miles: Path | None = None,
    against: Path | None = None,
) -> DriftReport:
    """Drift of one loaded recipe: against a recorded launch file, else re-recorded from the
    checkout (`miles`, else MILES_DIR, else paths.miles)."""
    resolved = resolve(loaded.recipe, None, None)
    if resolved.recipe.engine != "miles":
        raise DriftInputError(
            f"engine is {resolved.recipe.engine}; drift compares miles recipes only"
        )
    try:
        if against is not None:
            return compare(resolved, Recording.load(against))
        checkout = configured_checkout(resolved, environ, miles)
        if checkout is None:
            raise DriftInputError(
                f"no miles checkout here: pass --miles DIR or set MILES_DIR "
                f"(paths.miles is {resolved.recipe.paths.miles!r})"
            )
        return drift(resolved, checkout)
    except (RecordError, OSError, ValueError, TypeError, KeyError) as err:
        raise DriftInputError(str(err)) from err
    except SettingError as err:
        raise DriftInputError(str(loaded.error(err.key, err.message))) from err
