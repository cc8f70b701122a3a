"""Shared test helpers: run the real CLI in a subprocess, as users and Snakemake do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
PR_RECIPE = RECIPES / "amd" / "deepseek-v4-flash-4node-mi355x.yaml"
TINY_RECIPE = RECIPES / "local" / "tiny-grpo-cpu.yaml"

# Variables render reads from the environment; cleared so golden output does not depend on
# the machine the tests run on.
RENDER_ENV_VARS = ("MILES_DIR", "MEGATRON_PATH", "RAY_ADDRESS", "MASTER_ADDR", "NCCL_NVLS_ENABLE",
                   "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RENDER_ENV_VARS}
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recipeval", *args], check=False, capture_output=True, text=True,
        env=env if env is not None else clean_env(), cwd=cwd or REPO, timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli
