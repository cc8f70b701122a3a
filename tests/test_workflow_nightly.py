"""`recipeval nightly`: snakemake --forceall, then the published verdict as the exit status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import kill_session

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = REPO / "recipes/local/tiny-grpo-cpu.yaml"


def nightly(workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    argv = [
        str(BIN / "recipeval"),
        "nightly",
        "--cores",
        "2",
        "--verdict",
        str(workdir / "results/regression.json"),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        *args,
    ]
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def test_nightly_without_a_fresh_verdict_is_an_error(tmp_path: Path) -> None:
    proc = nightly(tmp_path, "--config", "recipes={globs: [recipes/none/*.yaml]}")
    assert proc.returncode == 3
    assert "no fresh verdict" in proc.stderr


@pytest.mark.parametrize("extra", [["--no-such-option"], ["--rerun-triggers", "nosuch"]])
def test_arguments_snakemake_refuses_are_bad_input_not_a_missing_verdict(
    tmp_path: Path, extra: list[str]
) -> None:
    """Snakemake's usage error (exit 2) was reported as exit 3, "no fresh verdict"."""
    proc = nightly(tmp_path, *extra, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.rstrip().endswith(
        "recipeval nightly: snakemake refused its command line (exit 2, the reason is above); "
        "nothing ran"
    ), proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("cores", ["abc", "0", "-1", "2.5"])
def test_a_core_count_snakemake_cannot_use_is_refused_before_anything_runs(
    tmp_path: Path, cores: str
) -> None:
    """Snakemake reported `--cores abc` as a workflow error, so nightly said exit 3."""
    proc = nightly(tmp_path, "--cores", cores, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"nightly: Invalid value for '--cores': {cores!r}: give a number of cores" in (
        proc.stderr
    )
    assert not (tmp_path / "results").exists()


def test_a_verdict_path_publish_cannot_write_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    """A folder given as --verdict ran the whole pipeline, then found no fresh verdict (3)."""
    proc = nightly(tmp_path, "--verdict", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "--verdict" in proc.stderr, proc.stderr
    assert not (tmp_path / "results").exists() and "Traceback" not in proc.stderr


@pytest.mark.parametrize("written", ['{"recipes": ', '{"recipes": [{"status": "ok"}]}', "[]"])
def test_a_verdict_that_cannot_be_read_is_an_error_not_a_regression(
    tmp_path: Path, written: str
) -> None:
    """Exit 3 (could not judge) with one line, not a traceback's exit 1 (regressed)."""
    (tmp_path / "Snakefile").write_text(
        f"rule all:\n    run:\n        open('results/regression.json', 'w').write({written!r})\n"
    )
    (tmp_path / "results").mkdir()
    proc = nightly(tmp_path, "--snakefile", str(tmp_path / "Snakefile"), timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "recipeval nightly: unusable verdict at " in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_default_verdict_path_works(tmp_path: Path) -> None:
    """`recipeval nightly` without --verdict (the README's command) died with a traceback:
    typer handed the default, a Path, to a parser that expected a string."""
    (tmp_path / "Snakefile").write_text(
        "rule all:\n    run:\n        open('results/regression.json', 'w').write("
        '\'{"recipes": [{"recipe": "r", "status": "ok"}]}\')\n'
    )
    (tmp_path / "results").mkdir()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        [str(BIN / "recipeval"), "nightly", "--cores", "1"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


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


def _long_rule_nightly(workdir: Path, token: str) -> list[str]:
    """argv of a nightly over a Snakefile whose one rule touches `started`, then sleeps as a
    process named `token`."""
    (workdir / "Snakefile").write_text(
        f'rule long:\n    output: "never.txt"\n    shell: "touch started; exec -a {token} sleep 600"\n'
    )
    return [
        str(BIN / "recipeval"),
        "nightly",
        "--cores",
        "1",
        "--verdict",
        str(workdir / "v.json"),
        "--snakefile",
        str(workdir / "Snakefile"),
        "--directory",
        str(workdir),
    ]


@pytest.mark.parametrize(
    ("signum", "inherited_sigint"),
    [
        # A cron line or a CI step run with `&` starts the nightly with SIGINT ignored, which its
        # snakemake would inherit: the SIGINT the nightly passes on must still cancel.
        (signal.SIGTERM, signal.SIG_IGN),
        # Ctrl-C reaches the nightly only (snakemake has a process group of its own).
        (signal.SIGINT, signal.SIG_DFL),
    ],
)
def test_a_stopped_nightly_stops_snakemake_and_its_local_jobs(
    tmp_path: Path, signum: signal.Signals, inherited_sigint: signal.Handlers
) -> None:
    token = f"recipeval-nightly-{os.getpid()}"
    argv = _long_rule_nightly(tmp_path, token)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited_sigint),  # noqa: PLW1509
        start_new_session=True,
    )  # so kill_session clears what it leaves
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "started").exists(), "the rule never started"
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
        # Before the cleanup below, which would kill a leftover job itself.
        left = [
            p
            for p in psutil.process_iter(["cmdline"])
            if token in " ".join(p.info["cmdline"] or [])
        ]
    finally:
        kill_session(proc)
    assert proc.returncode == 128 + signum, out[-2000:]
    assert f"stopped by {signum.name}" in out
    assert left == [], out[-2000:]


def test_a_killed_nightly_still_cancels_snakemake_and_its_jobs(tmp_path: Path) -> None:
    """kill -9 leaves the nightly no handler: snakemake, re-parented, went on to the next
    rules, and the next nightly met its lock."""
    token = f"recipeval-killed-nightly-{os.getpid()}"
    argv = _long_rule_nightly(tmp_path, token)
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )

    def left() -> list[psutil.Process]:
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if token in " ".join(p.info["cmdline"] or [])
            or (
                "snakemake" in " ".join(p.info["cmdline"] or [])
                and str(tmp_path) in " ".join(p.info["cmdline"] or [])
            )
        ]

    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "started").exists(), "the rule never started"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while left() and time.monotonic() < deadline:
            time.sleep(0.5)
        remaining = [p.info["cmdline"][:4] for p in left()]
    finally:
        for leftover in left():
            leftover.kill()
    assert remaining == []
