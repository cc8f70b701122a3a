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

try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # .venv-lowest (scripts/test-engine-lowest.sh) runs without pytest-xdist
    LoadScopeScheduling = None

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
# Fixtures of tests/slurm_cluster.py: each cluster lives in a fixed folder with fixed ports.
SLURM_FIXTURES = frozenset({"slurm_cluster", "two_node_slurm_cluster"})
# record_property name for a line the run ends with (pytest_terminal_summary below).
TERMINAL_SUMMARY = "terminal_summary"


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


def module_of(nodeid: str) -> str:
    """The test file of a node id."""
    return nodeid.split("::")[0]


def shares_the_slurm_worker(module: str) -> bool:
    """Modules named *slurm* run on one pytest-xdist worker: a test cluster is a fixed folder
    with fixed ports that only one worker may start and stop."""
    return "slurm" in Path(module).name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On pytest-xdist workers, the *slurm* modules first: their work unit, the longest, starts
    at once instead of holding one worker after the other has finished."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: not shares_the_slurm_worker(module_of(item.nodeid)))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that uses a Slurm cluster fails before its cluster starts unless it lives in a
    *slurm* module, where it cannot meet another worker's cluster."""
    module = module_of(item.nodeid)
    if SLURM_FIXTURES & set(item.fixturenames) and not shares_the_slurm_worker(module):
        pytest.fail(
            f"{module} uses a Slurm cluster fixture: move the test to a module whose "
            "name contains 'slurm' (those share one pytest-xdist worker)",
            pytrace=False,
        )


if LoadScopeScheduling is not None:

    class ModuleScheduling(LoadScopeScheduling):
        """pytest-xdist's loadfile, with every *slurm* module in one work unit. (Its loadgroup
        cannot do this under pytest 9.2: it renames items through `_nodeid`, which pytest no
        longer reads.)"""

        def _split_scope(self, nodeid: str) -> str:
            module = module_of(nodeid)
            return "slurm" if shares_the_slurm_worker(module) else module

    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> ModuleScheduling:
        """`pytest -n 2` (scripts/test.sh): a module's tests share one worker, so its module
        fixtures (a Ray head, a warm-start cache) start once."""
        return ModuleScheduling(config, log)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The lines tests recorded as TERMINAL_SUMMARY. They travel in the test reports (each
    test's teardown report holds all of its lines), so lines recorded on a pytest-xdist worker,
    which has no terminal of its own, reach this one."""
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "teardown"
        for name, value in report.user_properties
        if name == TERMINAL_SUMMARY
    ]
    if lines:
        terminalreporter.write_sep("-", "summaries the tests recorded")
        for line in lines:
            terminalreporter.write_line(str(line))
