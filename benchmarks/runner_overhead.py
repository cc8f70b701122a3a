"""Wall time of the same smoke run through each runner: what the `ray` runner costs over
`local` (head start, job submission, log tail, head stop).

    python benchmarks/runner_overhead.py [--recipe recipes/local/tiny-grpo-cpu.yaml] [--repeat 1]

Prints one line per mode: the whole `recipeval smoke` command, the run itself as the runner
timed it, and the stage's verdict. Modes: local; ray with a private head (started and stopped
by the command); ray with a shared head that is already up (a pipeline's later stages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPEVAL = str(Path(sys.executable).parent / "recipeval")
WARM_SHARED_HEAD = (
    "import sys; from pathlib import Path; from recipeval.runners.ray_head import shared_head; "
    "shared_head(Path(sys.argv[1]))"
)


def smoke_once(recipe: Path, runner: str, env: dict[str, str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="rv-bench-") as out:
        start = time.perf_counter()
        proc = subprocess.run(
            [RECIPEVAL, "smoke", str(recipe), "--out", out, "--runner", runner, "--exit-zero"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        wall = time.perf_counter() - start
        result_path = Path(out) / "smoke.json"
        if not result_path.exists():
            sys.exit(
                f"{runner}: no result written (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
            )
        return wall, json.loads(result_path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes/local/tiny-grpo-cpu.yaml")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    base_env = {
        k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RECIPEVAL_RAY_STATE_DIR")
    }
    state_dir = Path(tempfile.mkdtemp(prefix="rv-bench-ray-"))
    shared_env = {**base_env, "RECIPEVAL_RAY_STATE_DIR": str(state_dir)}
    modes = [
        ("local", "local", base_env),
        ("ray, private head", "ray", base_env),
        ("ray, shared head up", "ray", shared_env),
    ]
    try:
        # Warm the shared head so its mode measures a later stage of a pipeline run.
        subprocess.run(
            [sys.executable, "-c", WARM_SHARED_HEAD, str(state_dir)],
            check=True,
            env=shared_env,
        )
        print(
            f"recipe {args.recipe}, {args.repeat} run(s) per mode, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        print(f"{'mode':<22} {'command wall s':>15} {'run wall s':>11}  status")
        for label, runner, env in modes:
            walls, runs, statuses, problems = [], [], [], []
            for _ in range(args.repeat):
                wall, result = smoke_once(args.recipe, runner, env)
                walls.append(wall)
                runs.append(result["summary"].get("run_wall_s") or float("nan"))
                statuses.append(result["status"])
                if result["status"] != "pass":
                    problems.append(result["message"].splitlines()[0] if result["message"] else "")
            print(
                f"{label:<22} {statistics.median(walls):>15.1f} {statistics.median(runs):>11.1f}"
                f"  {','.join(statuses)}"
            )
            for problem in problems:
                print(f"  {label}: {problem}")
    finally:
        subprocess.run(
            [RECIPEVAL, "ray-down", "--state-dir", str(state_dir)],
            check=False,
            env=shared_env,
            capture_output=True,
        )


if __name__ == "__main__":
    main()
