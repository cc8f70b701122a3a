"""Render a recipe for the built-in reference engine: the same flag families as miles,
run by this package's own interpreter (the engine ships with the launcher)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recipeval.engines.base import Engine
from recipeval.engines.launch import Launch, Resources, cluster_flags, flag_words, model_flags
from recipeval.engines.miles import log_parser
from recipeval.recipe.load import recipe_sha256
from recipeval.recipe.resolve import Resolved

MODULE = "recipeval.reference"
# Its layout is fixed (one device, or one for the trainer and one for the rollout worker when
# non-colocated): what changes its speed, which `recipeval layouts` sweeps instead.
# flag -> values, the trainer's default first.
SPEED_KNOBS: dict[str, tuple[object, ...]] = {
    "micro-batch-size": (0, 8),
    "recompute-activations": (False, True),
    "train-dtype": ("float32", "bfloat16"),
}


def render(
    resolved: Resolved, environ: Mapping[str, str] | None = None, out: Path | None = None
) -> Launch:
    """A subprocess of this Python; it reads no file of its own, so `environ` and `out` go
    unused."""
    recipe = resolved.recipe
    argv = [
        sys.executable,
        "-m",
        MODULE,
        *model_flags(resolved),
        *cluster_flags(resolved),
        *flag_words(resolved.args),
    ]
    env = {"PYTHONUNBUFFERED": "1", **resolved.env}
    return Launch(
        argv=argv,
        env=env,
        entrypoint=argv,
        runtime_env={"env_vars": env},
        resources=Resources(recipe.cluster.nodes, recipe.cluster.gpus_per_node),
        recipe_sha256=recipe_sha256(recipe),
        engine="reference",
        stage=resolved.stage,
        variant=resolved.variant,
    )


def dump_args(path: Path) -> dict[str, Any]:
    return {"dump-logprobs": str(path)}


def rescore_args(source: Path) -> dict[str, Any]:
    # One rollout is enough: it scores the dump's responses under the weights both share.
    return {"score-tokens": str(source), "num-rollout": 1}


ENGINE = Engine(
    name="reference",
    render=render,
    parser=log_parser,
    dump_args=dump_args,
    rescore_args=rescore_args,
    packages=("torch", "transformers"),
    speed_knobs=SPEED_KNOBS,
)
