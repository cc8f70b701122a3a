"""Time `recipeval layouts` for the 43-layer DeepSeek-V4-Flash recipe on 32 GPUs (target: < 10 s).

    python benchmarks/layouts_timing.py [--gpus 32] [--repeat 3] [--recipe FILE]

Runs the command as a user types it (a fresh process each time: interpreter start, recipe
loading, megatron-core's import, every candidate through the real checks, the ranked table)
and prints the wall time and the CPU time of the process (user + system): on a shared, loaded
machine the wall time mostly measures waiting for a core, the CPU time what the command costs.
The command's own line reports the exploration alone (after start-up) in brackets.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DSV4 = REPO / "recipes/amd/deepseek-v4-flash-4node-mi355x.yaml"
TARGET_S = 10.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(recipe: Path, gpus: int) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds and the table's first line of one `recipeval layouts`."""
    argv = [sys.executable, "-m", "recipeval", "layouts", str(recipe), "--gpus", str(gpus)]
    started, cpu_before = time.perf_counter(), _children_cpu()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    elapsed, cpu = time.perf_counter() - started, _children_cpu() - cpu_before
    if proc.returncode not in (0, 1):  # 1: it ran and found no fitting layout
        sys.exit(f"recipeval layouts failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return elapsed, cpu, proc.stdout.splitlines()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=DSV4)
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    times, cpus, header = [], [], ""
    for _ in range(args.repeat):
        elapsed, cpu, header = run_once(args.recipe, args.gpus)
        times.append(elapsed)
        cpus.append(cpu)
    inner = re.search(r"\(([\d.]+ s)\)$", header)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    median = statistics.median(times)
    print(header)
    print(
        f"recipeval layouts {args.recipe.name} --gpus {args.gpus}: wall median {median:.2f} s "
        f"(runs: {', '.join(f'{t:.2f}' for t in times)}; exploration alone "
        f"{inner[1] if inner else '?'} in the last); CPU median {statistics.median(cpus):.2f} s; "
        f"load average {load} on {os.cpu_count()} cores; target < {TARGET_S:g} s: "
        f"{'met' if median < TARGET_S else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
