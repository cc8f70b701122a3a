"""Wall time of `recipeval env-check --static` in a cold process: the PR's recipe alone, and 20
recipes in one call (targets: under 8 s and under 15 s on a 2-core machine).

    python benchmarks/env_check_timing.py [--repeat 5]

Each run is a fresh `/usr/bin/time -f '%e %U %S' recipeval env-check --static ...` (so megatron-core
and SGLang import cold, as Snakemake runs them); prints wall / user / system seconds per run,
the median, and the load average around the runs (other work on the machine slows imports).
It also splits the CPU seconds between the main process (recipes, megatron-core, checks) and
SGLang's worker (which reports its own): the two run side by side, so on two otherwise idle
cores the wall time is about the larger of the two.
The 20 recipes are the repository's concrete recipes and the broken corpus (tests/recipes/broken).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PR_RECIPE = REPO / "recipes" / "amd" / "deepseek-v4-flash-4node-mi355x.yaml"


def twenty_recipes() -> list[Path]:
    concrete = [p for p in sorted((REPO / "recipes").rglob("*.yaml")) if "base" not in p.parts]
    broken = sorted((REPO / "tests" / "recipes" / "broken").glob("*.yaml"))
    return (concrete + broken)[:20]


def timed(recipes: list[Path]) -> tuple[float, float, float, int, float | None]:
    """(wall, user, system) seconds, the exit code, and SGLang's worker CPU seconds of one cold
    env-check."""
    recipeval = shutil.which("recipeval") or str(Path(sys.executable).with_name("recipeval"))
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [
                "/usr/bin/time",
                "-f",
                "%e %U %S",
                recipeval,
                "env-check",
                "--static",
                *map(str, recipes),
                "--out",
                out,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        wall, user, system = map(float, proc.stderr.strip().splitlines()[-1].split())
        worker = None
        for path in Path(out).rglob("env_check.json"):
            worker = json.loads(path.read_text())["summary"]["timings"].get("sglang_worker_cpu_s")
            break
    return wall, user, system, proc.returncode, worker


def series(label: str, recipes: list[Path], repeat: int, target: float) -> None:
    load_before = os.getloadavg()[0]
    runs = [timed(recipes) for _ in range(repeat)]
    load_after = os.getloadavg()[0]
    walls = [r[0] for r in runs]
    print(
        f"{label}: {len(recipes)} recipe(s), {repeat} cold runs, exit codes {sorted({r[3] for r in runs})}"
    )
    for i, (wall, user, system, _, worker) in enumerate(runs, 1):
        split = ""
        if worker is not None:
            split = f"  (CPU: main {user + system - worker:.2f} s, SGLang worker {worker:.2f} s)"
        print(f"  run {i}: wall {wall:.2f} s  user {user:.2f} s  sys {system:.2f} s{split}")
    median = statistics.median(walls)
    print(
        f"  median wall {median:.2f} s (min {min(walls):.2f}, max {max(walls):.2f}); "
        f"target < {target:g} s: {'met' if median < target else 'missed'}; "
        f"load average {load_before:.2f} before, {load_after:.2f} after"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs")
    series("PR recipe", [PR_RECIPE], args.repeat, 8)
    series("20 recipes", twenty_recipes(), args.repeat, 15)


if __name__ == "__main__":
    main()
