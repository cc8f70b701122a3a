"""The reference engine non-colocated (`rollout-num-gpus` without `colocate`, as miles places
rollout engines on GPUs of their own): the rollout worker in a process of its own, the weights
broadcast over gloo after each step. A smoke stage passes through the CLI and the parser reads
perf/update_weights_time; after each broadcast the rollout worker's weights are the trainer's
bit for bit; a rollout process that dies fails the run at once with one line saying so."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest
import torch
from conftest import REPO, clean_env, run_cli
from test_reference_engine_cli import TINY, engine

from recipeval.reference.config import parse_args
from recipeval.reference.loop import LocalWorkers
from recipeval.reference.noncolocated import DistributedWorkers
from recipeval.reference.warmstart import initial_state

pytestmark = pytest.mark.reference_engine

NONCOLOCATED_RECIPE = REPO / "tests" / "recipes" / "tiny-grpo-cpu-noncolocated.yaml"
NONCOLOCATED = ("--rollout-num-gpus", "1")


def test_smoke_passes_and_update_weights_time_is_parsed(tmp_path):
    out = tmp_path / "out"
    proc = run_cli(
        "smoke",
        "--recipe",
        str(NONCOLOCATED_RECIPE),
        "--out",
        str(out),
        env=clean_env(RECIPEVAL_CACHE_DIR=str(tmp_path / "cache")),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "smoke.json").read_text())
    assert result["status"] == "pass"
    log = (out / "smoke.log").read_text()
    assert re.search(r"non-colocated: trainer on cpu, rollout worker \(pid \d+\) on cpu", log)
    steps = pd.read_parquet(out / "smoke.steps.parquet")
    assert list(steps["rollout_id"]) == [0, 1, 2]
    sync = steps["perf/update_weights_time"]
    assert sync.notna().all() and (sync > 0).all()


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert b[name].dtype == tensor.dtype and torch.equal(b[name], tensor), name


def test_rollouts_equal_the_colocated_ones_and_weights_equal_after_each_sync(tmp_path):
    """Same seed and CPU paths as the colocated workers: only the weights' route differs, so a
    weight the broadcast delivered wrong or late would change a later rollout. After each
    broadcast the rollout worker holds the trainer's weights bit for bit."""
    config = parse_args([*TINY, *NONCOLOCATED, "--cache-dir", str(tmp_path)])
    state = initial_state(config, torch.device("cpu"))
    colocated = LocalWorkers(config, state)
    workers = DistributedWorkers(config, state)
    try:
        for rollout_id in range(2):
            batch, expected = workers.generate(rollout_id), colocated.generate(rollout_id)
            for field in ("response_ids", "response_mask", "rollout_logprobs", "rewards"):
                assert torch.equal(getattr(batch, field), getattr(expected, field)), field
            trained = workers.train(batch)
            assert torch.equal(trained.train_logprobs, colocated.train(expected).train_logprobs)
            trainer_weights = {k: v.clone() for k, v in workers.trainer.weights().items()}
            stale = workers.rollout_weights()
            assert not all(torch.equal(stale[k], v) for k, v in trainer_weights.items())
            workers.sync_weights()
            colocated.sync_weights()
            _assert_same(trainer_weights, workers.rollout_weights())
    finally:
        workers.close()


def _rollout_process(engine_proc: subprocess.Popen) -> psutil.Process:
    for child in psutil.Process(engine_proc.pid).children():
        if "spawn_main" in " ".join(child.cmdline()):
            return child
    raise AssertionError("the engine started no rollout process")


def test_dead_rollout_process_fails_the_run_with_one_line(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recipeval.reference",
            *TINY,
            *NONCOLOCATED,
            "--num-rollout",
            "100000",
            "--warm-start-steps",
            "0",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        for line in proc.stdout:
            if re.search(r"\] trainer\.py:\d+ - perf 1: ", line):
                break
        rollout = _rollout_process(proc)
        rollout.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-2000:]
    assert took < 30
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("python -m recipeval.reference: error: rollout worker (pid ")
    assert f"(pid {rollout.pid}) was killed by SIGKILL during " in last


def test_more_than_one_rollout_device_is_one_clear_line():
    done = engine(*TINY, "--rollout-num-gpus", "2")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "--rollout-num-gpus 2" in line and "colocate: true" in line


@pytest.mark.parametrize(
    ("flags", "noncolocated"),
    [((), False), (NONCOLOCATED, True), (("--colocate", *NONCOLOCATED), False)],
)
def test_placement_follows_miles_colocate_rule(flags, noncolocated):
    assert parse_args([*TINY, *flags]).noncolocated is noncolocated
