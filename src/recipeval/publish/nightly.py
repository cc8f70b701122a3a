"""`recipeval nightly`: rerun every selected recipe's DAG from scratch with the environment
of tonight, then turn the published verdict into an exit status."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_REGRESSED, EXIT_ERROR = 0, 1, 3


def snakemake_argv(profile: str | None, cores: str | None, extra: list[str]) -> list[str]:
    # --forceall: the recipes may be unchanged while the trainer stack moved (miles #2040),
    # so every stage runs again; the history is not a Snakemake output and is kept.
    argv = [sys.executable, "-m", "snakemake", "--forceall"]
    if profile:
        argv += ["--profile", profile]
    if cores:
        argv += ["--cores", cores]
    return argv + extra


def read_verdict(path: Path, not_before: float) -> dict | None:
    """The verdict publish wrote during this run, or None (publish did not run)."""
    if not path.is_file() or path.stat().st_mtime < not_before:
        return None
    return json.loads(path.read_text())


def nightly(profile: str | None, cores: str | None, verdict_path: Path, extra: list[str]) -> int:
    started = time.time()
    proc = subprocess.run(snakemake_argv(profile, cores, extra), check=False)
    verdict = read_verdict(verdict_path, started)
    if verdict is None:
        print(f"recipeval nightly: no fresh verdict at {verdict_path} (snakemake exit {proc.returncode})",
              file=sys.stderr)
        return EXIT_ERROR
    bad = [r for r in verdict["recipes"] if r["status"] in ("failed", "regressed")]
    for rec in verdict["recipes"]:
        print(f"{rec['status']:9} {rec['recipe']}")
    if proc.returncode != 0:
        print(f"recipeval nightly: snakemake exited {proc.returncode}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_REGRESSED if bad else EXIT_OK
