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


# Flags under which each rollout has its own number of optimizer steps (a dynamic global
# batch size; miles turns it on itself for multi-LoRA, --multi-lora-n-adapters > 0).
VARIABLE_STEP_FLAGS = ("use-dynamic-global-batch-size", "allow-partial-train-step")


def variable_steps(resolved: Resolved) -> bool:
    """Whether the recipe's rollouts may differ in their number of optimizer steps."""
    adapters = resolved.arg("multi-lora-n-adapters", 0)
    many = isinstance(adapters, int) and not isinstance(adapters, bool) and adapters > 0
    return many or any(resolved.arg(f) not in (None, False) for f in VARIABLE_STEP_FLAGS)


def log_parser(resolved: Resolved | None) -> MilesLogParser:
    """miles' log format; the reference engine writes the same one. (Imported here: the
    parser needs pandas, which rendering does not.)"""
    from recipeval.engines.miles.logparse import MilesLogParser

    if resolved is None:
        return MilesLogParser()
    steps = resolved.arg("num-steps-per-rollout")
    given = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else None
    return MilesLogParser(steps_per_rollout=given, variable_steps=variable_steps(resolved))


ENGINE = Engine(
    name="miles",
    render=render,
    parser=log_parser,
    trainer_stack_checks=True,
    packages=("torch", "sglang", "megatron-core", "ray"),
    drift=upstream_drift,
)
