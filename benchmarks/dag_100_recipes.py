"""Time `snakemake -n` over 100 generated recipe files (target: under 10 s).

    python benchmarks/dag_100_recipes.py [--recipes 100] [--repeat 3]

Writes N copies of the tiny CPU recipe (each with its own name and seed, so each has its own
hash) into a temporary working directory and times a dry run of the full DAG (4 stages per
recipe + publish), as a user typing `snakemake -n` would see it, start-up included. Prints the
wall time and the CPU time of the snakemake process (user + system): on a shared, loaded
machine the wall time mostly measures waiting for a core, the CPU time what the run costs.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes/local/tiny-grpo-cpu.yaml"


def make_recipes(folder: Path, count: int) -> None:
    text = TINY.read_text()
    folder.mkdir(parents=True)
    for i in range(count):
        body = text.replace("name: tiny-grpo-cpu", f"name: tiny-{i:03d}").replace(
            "seed: 1234", f"seed: {i}"
        )
        (folder / f"tiny-{i:03d}.yaml").write_text(body)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def dry_run(workdir: Path) -> tuple[float, float, int]:
    argv = [
        str(Path(sys.executable).with_name("snakemake")),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "-n",
        "--quiet",
        "rules",
    ]
    started, cpu_before = time.perf_counter(), _children_cpu()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - started, _children_cpu() - cpu_before
    if proc.returncode != 0:
        sys.exit(f"snakemake -n failed:\n{proc.stderr[-2000:]}")
    total = re.search(r"^total\s+(\d+)$", proc.stdout + proc.stderr, re.MULTILINE)
    return elapsed, cpu, int(total.group(1)) if total else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_recipes(work / "recipes/local", args.recipes)
        times, cpus = [], []
        for _ in range(args.repeat):
            elapsed, cpu, jobs = dry_run(work)
            times.append(elapsed)
            cpus.append(cpu)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"snakemake -n over {args.recipes} recipes: {jobs} jobs planned; "
            f"wall median {statistics.median(times):.2f} s (runs: {', '.join(f'{t:.2f}' for t in times)}); "
            f"CPU median {statistics.median(cpus):.2f} s; load average {load} on {os.cpu_count()} cores; "
            "target < 10 s"
        )


if __name__ == "__main__":
    main()
