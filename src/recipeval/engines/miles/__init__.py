"""miles (Megatron + SGLang + Ray): render its launch, parse its logs, compare a recipe with the
launch miles' own script builds (drift)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeval.engines.base import Engine
from recipeval.engines.miles.drift import upstream_drift
from recipeval.engines.miles.render import render
from recipeval.recipe.resolve import Resolved

if TYPE_CHECKING:
    from recipeval.engines.miles.logparse import MilesLogParser


def log_parser(resolved: Resolved | None) -> MilesLogParser:
    """miles' log format; the reference engine writes the same one. (Imported here: the
    parser needs pandas, which rendering does not.)"""
    from recipeval.engines.miles.logparse import MilesLogParser

    steps = resolved.arg("num-steps-per-rollout") if resolved is not None else None
    given = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else None
    return MilesLogParser(steps_per_rollout=given)


ENGINE = Engine(
    name="miles",
    render=render,
    parser=log_parser,
    trainer_stack_checks=True,
    packages=("torch", "sglang", "megatron-core", "ray"),
    drift=upstream_drift,
)
