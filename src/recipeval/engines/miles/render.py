"""Render a recipe into the launch miles' own launch script builds for the same settings:
`ray job submit --runtime-env-json=... -- python3 <miles>/train.py <model args> <train args>`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from recipeval.engines.launch import (
    Launch,
    Resources,
    cluster_flags,
    flag_words,
    model_flags,
    parallel_flags,
)
from recipeval.errors import SettingError
from recipeval.recipe.load import recipe_sha256
from recipeval.recipe.resolve import Resolved

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"


def _checkout(resolved: Resolved, environ: Mapping[str, str], var: str, key: str) -> str:
    path = environ.get(var) or getattr(resolved.recipe.paths, key)
    if not path:
        raise SettingError(
            f"paths.{key}",
            f"where the {key} checkout lives is unknown: set it in the recipe or {var} in the environment",
        )
    return path.rstrip("/")


def runtime_env_vars(resolved: Resolved, environ: Mapping[str, str]) -> dict[str, str]:
    """The Ray runtime env miles' launcher submits: its fixed variables, then the recipe's."""
    miles = _checkout(resolved, environ, "MILES_DIR", "miles")
    megatron = _checkout(resolved, environ, "MEGATRON_PATH", "megatron")
    master_addr = environ.get("MASTER_ADDR", "127.0.0.1")
    env = {
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        **{
            k: environ[k]
            for k in ("NCCL_NVLS_ENABLE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG")
            if k in environ
        },
        "no_proxy": f"127.0.0.1,{master_addr}",
        "MASTER_ADDR": master_addr,
        **resolved.env,
    }
    pythonpath = [miles, megatron] + [p for p in resolved.env.get("PYTHONPATH", "").split(":") if p]
    env["PYTHONPATH"] = ":".join(dict.fromkeys(pythonpath))
    return env


def render(resolved: Resolved, environ: Mapping[str, str] | None = None) -> Launch:
    environ = os.environ if environ is None else environ
    miles = _checkout(resolved, environ, "MILES_DIR", "miles")
    entrypoint = [
        "python3",
        f"{miles}/train.py",
        *model_flags(resolved, positions=False),
        *parallel_flags(resolved),
        *cluster_flags(resolved),
        *flag_words(resolved.args),
    ]
    runtime_env = {"env_vars": runtime_env_vars(resolved, environ)}
    submit = ["ray", "job", "submit"]
    if "RAY_ADDRESS" not in environ:
        submit.append(f"--address={DEFAULT_DASHBOARD}")
    submit.append(f"--runtime-env-json={json.dumps(runtime_env, separators=(',', ':'))}")
    recipe = resolved.recipe
    return Launch(
        argv=[*submit, "--", *entrypoint],
        env=dict(resolved.env),
        entrypoint=entrypoint,
        runtime_env=runtime_env,
        resources=Resources(recipe.cluster.nodes, recipe.cluster.gpus_per_node),
        recipe_sha256=recipe_sha256(recipe),
        engine="miles",
        stage=resolved.stage,
        variant=resolved.variant,
    )
