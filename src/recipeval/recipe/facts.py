"""The facts about a recipe that publish shows beside its results (platform, GPUs, layout,
response length, every value), taken when a stage runs, so publish never reads recipe files."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from recipeval.recipe.resolve import Resolved


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> {"a.b.c": leaf}; lists stay leaves."""
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def _letters_and_digits(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def gpu_model_matches(model: str, device_names: Iterable[str]) -> bool:
    """Whether every device is of the recipe's GPU model ("MI355X" is "AMD Instinct MI355X",
    "H100" is "NVIDIA H100 80GB HBM3"): letters and digits compared, case ignored."""
    return all(_letters_and_digits(model) in _letters_and_digits(name) for name in device_names)


def same_gpu(before: str, after: str) -> bool:
    """Whether two runs' recorded cards are one model named two ways: Ray's accelerator type
    on a cluster it detected ("H100", "AMD-Instinct-MI355X-OAM") and the driver's name on a
    head recipeval started ("NVIDIA H100 80GB HBM3", "AMD Instinct MI355X")."""
    short, long = sorted((_letters_and_digits(before), _letters_and_digits(after)), key=len)
    return bool(short) and short in long


def recipe_facts(resolved: Resolved) -> dict[str, Any]:
    """What publish's records keep of the recipe as this stage ran it."""
    recipe = resolved.recipe
    max_len = resolved.arg("rollout-max-response-len")
    values = recipe.model_dump(mode="json", exclude={"extends", "description"})
    return {
        "platform": recipe.platform,
        "gpu": recipe.cluster.gpu,
        "nodes": recipe.cluster.nodes,
        "gpus_per_node": recipe.cluster.gpus_per_node,
        "layout": recipe.parallel.layout,
        "max_response_len": int(max_len)
        if isinstance(max_len, int | float) and not isinstance(max_len, bool)
        else None,
        # Plain here: write_result keeps the secrets as fingerprints and scrubs them from
        # the rest of the result, which it can only do knowing them.
        "recipe_values": flatten(values),
    }
