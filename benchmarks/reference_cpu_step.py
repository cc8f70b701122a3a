"""One GRPO step of a reference-engine recipe (default: the tiny CPU recipe's bench stage, 8192
response tokens), timed by phase in wall-clock and in this process's CPU seconds.

On a shared machine the wall time includes waiting for the cores; the CPU time is what the
step costs (the engine runs on one thread, so on an idle machine wall ~= CPU).

    python benchmarks/reference_cpu_step.py [--recipe recipes/local/tiny-grpo-cpu.yaml] [--stage bench]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch

from recipeval.engines import render
from recipeval.recipe import load_recipe, resolve
from recipeval.reference.config import parse_args
from recipeval.reference.loop import LocalWorkers
from recipeval.reference.modeling import resolve_device
from recipeval.reference.rollout import limit_cpu_threads
from recipeval.reference.warmstart import initial_state

REPO = Path(__file__).resolve().parents[1]


def timed(fn, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(REPO / "recipes/local/tiny-grpo-cpu.yaml"))
    p.add_argument("--stage", default="bench")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("extra", nargs="*", help="further engine flags, after --")
    args = p.parse_args()
    argv = render(resolve(load_recipe(args.recipe).recipe, args.stage)).argv[3:]
    config = parse_args([*argv, *args.extra])
    logging.disable(logging.INFO)
    limit_cpu_threads(config)
    state = initial_state(config, resolve_device(config))
    workers = LocalWorkers(config, state)
    for rollout_id in range(args.steps):
        load = os.getloadavg()[0]
        batch, rollout_wall, rollout_cpu = timed(workers.generate, rollout_id)
        _, train_wall, train_cpu = timed(workers.train, batch)
        _, sync_wall, sync_cpu = timed(workers.sync_weights)
        figures = {
            "rollout_id": rollout_id,
            "response_tokens": int(batch.response_mask.sum()),
            "samples": len(batch.response_mask),
            "rollout_wall_s": rollout_wall,
            "rollout_cpu_s": rollout_cpu,
            "train_wall_s": train_wall,
            "train_cpu_s": train_cpu,
            "sync_wall_s": sync_wall,
            "step_wall_s": rollout_wall + train_wall + sync_wall,
            "step_cpu_s": rollout_cpu + train_cpu + sync_cpu,
            "load_average_1m": load,
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
        }
        print(
            json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}),
            flush=True,
        )


if __name__ == "__main__":
    main()
