"""Render a recipe into the launch miles' own launch script builds for the same settings:
`ray job submit --runtime-env=FILE -- python3 <miles>/train.py <model args> <train args>`.

One difference from miles' launcher, on purpose: the runtime env (every env value, secrets
included) reaches Ray through a file readable by its owner only (written by the runner, or by
the rendered script under umask 077), not `--runtime-env-json=...`, which anyone on the node
can read in `ps`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from recipeval.engines.launch import (
    RUNTIME_ENV_FILE,
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
# What miles' launcher exports for `ray job submit` itself: the submit to the local dashboard
# must not go through a proxy the node has set.
SUBMIT_ENV = {"no_proxy": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
# Variables miles' launcher copies from the submitting environment into the job's.
PASSED_THROUGH = (
    "NCCL_NVLS_ENABLE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
)


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
    # miles leaves this out for FSDP, where it spoils the overlap of compute and communication
    fsdp = resolved.args.get("train-backend") == "fsdp"
    env = {
        "PYTHONUNBUFFERED": "1",
        **({} if fsdp else {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
        **{k: environ[k] for k in PASSED_THROUGH if k in environ},
        "no_proxy": f"127.0.0.1,{master_addr}",
        "MASTER_ADDR": master_addr,
        **resolved.env,
    }
    # miles' order: its checkout, Megatron, the job's own PYTHONPATH, then the submitter's
    pythonpath = [miles, megatron]
    for extra in (resolved.env.get("PYTHONPATH", ""), environ.get("PYTHONPATH", "")):
        pythonpath += [p for p in extra.split(":") if p]
    env["PYTHONPATH"] = ":".join(dict.fromkeys(pythonpath))
    return env


def runtime_env_path(resolved: Resolved, out: Path | None) -> Path:
    """The runtime env file, beside the stage's results (`out`, else results/<recipe>/, the
    stage commands' default --out), one file per stage and variant."""
    folder = out if out is not None else Path("results") / resolved.recipe.name
    name = "-".join(p for p in (resolved.stage or "launch", resolved.variant) if p)
    return folder / f"{name}.runtime_env.json"


def render(
    resolved: Resolved,
    environ: Mapping[str, str] | None = None,
    out: Path | None = None,
) -> Launch:
    environ = os.environ if environ is None else environ
    runtime_env_file = runtime_env_path(resolved, out)
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
    submit.append(f"--runtime-env={runtime_env_file}")
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
        extra={RUNTIME_ENV_FILE: str(runtime_env_file)},
        client_env=dict(SUBMIT_ENV),
    )
