"""`recipeval nightly`: snakemake --forceall, then the published verdict as the exit status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = REPO / "recipes/local/tiny-grpo-cpu.yaml"


def nightly(workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    argv = [str(BIN / "recipeval"), "nightly", "--cores", "2", "--verdict", str(workdir / "results/regression.json"),
            "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *args]
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)


def test_nightly_without_a_fresh_verdict_is_an_error(tmp_path: Path) -> None:
    proc = nightly(tmp_path, "--config", "recipes={globs: [recipes/none/*.yaml]}")
    assert proc.returncode == 3
    assert "no fresh verdict" in proc.stderr


@pytest.mark.slow
def test_nightly_exit_status_follows_the_verdict(tmp_path: Path) -> None:
    (tmp_path / "recipes/local").mkdir(parents=True)
    shutil.copy(TINY, tmp_path / "recipes/local/tiny-grpo-cpu.yaml")
    config = ("--config", "stages=[env_check]")
    good = nightly(tmp_path, *config)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    assert "ok        tiny-grpo-cpu" in good.stdout
    # Same recipes, nothing edited: a nightly still reruns every stage (--forceall).
    again = nightly(tmp_path, *config)
    assert again.returncode == 0
    runs = list((tmp_path / "results/history/tiny-grpo-cpu").glob("*.json"))
    assert len(runs) == 2
    recipe = tmp_path / "recipes/local/tiny-grpo-cpu.yaml"
    recipe.write_text(recipe.read_text().replace("parallel: {tp: 1,", "parallel: {tp: 3,"))
    bad = nightly(tmp_path, *config)
    assert bad.returncode == 1, bad.stderr[-2000:]
    verdict = json.loads((tmp_path / "results/regression.json").read_text())
    assert verdict["ok"] is False and verdict["recipes"][0]["status"] == "failed"
