"""Time a newcomer's first `make run`: set-up, each stage, publish and the whole pipeline.

    python benchmarks/first_run.py [--reuse-venv] [--keep]

Clones this repository (its committed HEAD) into a temporary folder and runs the README's
`make run` there, as a newcomer would after `git clone`. Set-up (scripts/setup.sh) and the
pipeline are timed apart; per-stage times come from each rule's Snakemake `benchmark:` file.
`--reuse-venv` links this checkout's .venv instead of building a new one (set-up then costs
only its up-to-date check); the pipeline target is under 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 300.0


def stage_times(results: Path) -> dict[str, float]:
    """`<recipe>/<stage>` -> wall seconds, from the rules' benchmark files."""
    times: dict[str, float] = {}
    for tsv in sorted(results.rglob("*.benchmark.tsv")):
        with tsv.open() as fh:
            row = next(csv.DictReader(fh, delimiter="\t"))
        stage = tsv.name.removesuffix(".benchmark.tsv")
        where = tsv.parent.parent.name if tsv.parent.name == "snakemake" else tsv.parent.name
        times[f"{where}/{stage}"] = float(row["s"])
    return times


def timed(argv: list[str], cwd: Path, log: Path) -> tuple[float, int]:
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - start, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse-venv", action="store_true", help="link this checkout's .venv")
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="recipeval-first-run-"))
    clone = work / "recipeval"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    if args.reuse_venv:
        os.symlink(REPO / ".venv", clone / ".venv")
    env_path = f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
    setup_s, rc = timed(["scripts/setup.sh"], clone, work / "setup.log")
    if rc:
        print(f"set-up failed (exit {rc}); see {work / 'setup.log'}", file=sys.stderr)
        return 1
    os.environ["PATH"] = env_path
    # The pipeline half of `make run` (its set-up step is what was just timed).
    pipeline_s, rc = timed(
        [str(clone / ".venv/bin/snakemake"), "--cores", "all"], clone, work / "pipeline.log"
    )
    print(f"set-up          {setup_s:7.1f} s{' (reused .venv)' if args.reuse_venv else ''}")
    for name, seconds in stage_times(clone / "results").items():
        print(f"  {name:38} {seconds:7.1f} s")
    verdict = "within" if pipeline_s <= TARGET_S else "OVER"
    print(f"pipeline        {pipeline_s:7.1f} s ({verdict} the {TARGET_S:.0f} s target), exit {rc}")
    print(f"total           {setup_s + pipeline_s:7.1f} s")
    if args.keep or rc:
        print(f"clone and logs kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
