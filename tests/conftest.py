"""Shared test helpers: run the real CLI in a subprocess, as users and Snakemake do."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
PR_RECIPE = RECIPES / "amd" / "deepseek-v4-flash-4node-mi355x.yaml"
TINY_RECIPE = RECIPES / "local" / "tiny-grpo-cpu.yaml"

# Variables render reads from the environment; cleared so golden output does not depend on
# the machine the tests run on.
RENDER_ENV_VARS = (
    "MILES_DIR",
    "MEGATRON_PATH",
    "RAY_ADDRESS",
    "MASTER_ADDR",
    "NCCL_NVLS_ENABLE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_DEBUG",
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RENDER_ENV_VARS}
    env.update(extra)
    return env


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recipeval", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=cwd or REPO,
        timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli


def files_of_at_most(limit: int) -> Callable[[], None]:
    """preexec_fn: the child can write no file past `limit` bytes, as on a full disk (Python
    ignores SIGXFSZ, so a write past it fails with EFBIG)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def interruptible_session() -> None:
    """preexec_fn for a child the test will stop with a signal: a session of its own (so
    kill_session can clear all of it) and SIGINT at its default, however pytest was started (a
    background job of a non-interactive shell inherits SIGINT ignored)."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_session(leader: subprocess.Popen) -> None:
    """SIGKILL every process of `leader`'s session (it, or what it orphaned, in any process
    group), then reap it."""
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(proc.pid) == leader.pid:
                proc.kill()
    leader.wait()
