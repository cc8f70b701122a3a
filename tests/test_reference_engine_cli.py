"""The reference engine as the runners launch it: `python -m recipeval.reference`.
Its log lines are miles' format (checked with a strict regex and with the project's parser),
the per-token dump is complete, bad flags fail with one line, SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

from recipeval.engines.miles.logparse import parse_lines

pytestmark = pytest.mark.reference_engine

TINY = [
    "--group-query-attention",
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--ffn-hidden-size",
    "256",
    "--num-attention-heads",
    "4",
    "--num-query-groups",
    "2",
    "--vocab-size",
    "512",
    "--max-position-embeddings",
    "128",
    "--actor-num-nodes",
    "1",
    "--actor-num-gpus-per-node",
    "0",
    "--num-gpus-per-node",
    "0",
    "--rollout-batch-size",
    "2",
    "--n-samples-per-prompt",
    "4",
    "--rollout-max-response-len",
    "16",
    "--eps-clip",
    "0.2",
    "--eps-clip-high",
    "0.28",
    "--lr",
    "3e-4",
    "--seed",
    "7",
    "--device",
    "cpu",
    "--warm-start-steps",
    "20",
]
LINE = re.compile(
    r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} (?P<name>[\w.]+)\] (?P<file>[\w.]+\.py):\d+"
    r" - (?P<kind>perf|rollout|step) (?P<id>\d+): (?P<body>\{.*\})$"
)
ROLLOUT_PERF = {"perf/rollout_time", "perf/tokens_per_gpu_per_sec"}
TRAIN_PERF = {
    "perf/actor_train_time",
    "perf/step_time",
    "perf/update_weights_time",
    "perf/train_wait_time",
    "perf/train_time",
}
ROLLOUT_KEYS = {
    "rollout/log_probs",
    "rollout/rollout_log_probs",
    "rollout/raw_reward",
    "rollout/response_lengths",
}
STEP_KEYS = {
    "train/loss",
    "train/pg_loss",
    "train/pg_clipfrac",
    "train/ppo_kl",
    "train/train_rollout_logprob_abs_diff",
    "train/train_rollout_kl",
    "train/grad_norm",
    "train/lr-pg_0",  # miles: one learning rate per param group; the rollup keeps the last
}


def engine(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recipeval.reference", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        **kwargs,
    )


def test_log_lines_are_miles_format_and_dump_is_complete(tmp_path):
    dump = tmp_path / "tokens.parquet"
    done = engine(
        *TINY,
        "--num-rollout",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--dump-logprobs",
        str(dump),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [m for m in map(LINE.match, done.stdout.splitlines()) if m]
    assert Counter((m["kind"], m["id"]) for m in lines) == {
        ("perf", "0"): 2,
        ("rollout", "0"): 1,
        ("step", "0"): 1,
        ("perf", "1"): 2,
        ("rollout", "1"): 1,
        ("step", "1"): 1,
    }
    # The process names miles' loggers carry (miles/utils/audit_utils/process_identity.py).
    assert {(m["name"], m["kind"]) for m in lines} == {
        ("rollout_manager", "perf"),
        ("actor_cell0_rank0", "perf"),
        ("actor_cell0_rank0", "rollout"),
        ("actor_cell0_rank0", "step"),
    }
    parsed = parse_lines(done.stdout.splitlines())
    assert parsed.malformed_count == 0
    steps = parsed.steps
    assert list(steps["rollout_id"]) == [0, 1]
    assert ROLLOUT_PERF | TRAIN_PERF | ROLLOUT_KEYS | STEP_KEYS <= set(steps.columns)
    assert (steps["train/ppo_kl"].abs() < 1e-6).all()  # one step per rollout: ratio is 1
    assert (steps["perf/step_time"] >= steps["perf/train_time"]).all()

    tokens = pd.read_parquet(dump)
    assert list(tokens.columns) == [
        "rollout_id",
        "sample",
        "position",
        "token_id",
        "logp_rollout",
        "logp_train",
        "loss_mask",
    ]
    assert sorted(tokens["rollout_id"].unique()) == [0, 1]
    assert tokens["sample"].nunique() == 8
    masked = tokens[tokens["loss_mask"] == 1]
    lengths = masked.groupby(["rollout_id", "sample"]).size().groupby("rollout_id").mean()
    assert lengths.tolist() == pytest.approx(steps["rollout/response_lengths"].tolist())
    assert (masked["logp_rollout"] - masked["logp_train"]).abs().max() < 1e-4


def test_score_tokens_rescores_a_dump_exactly_and_under_another_dtype(tmp_path):
    """The run's own rollout path scores its own tokens to the same logprobs it sampled them
    with; a bfloat16 rollout path scores the very same tokens differently."""
    cache = ("--cache-dir", str(tmp_path / "cache"), "--num-rollout", "2")
    sampled = tmp_path / "sampled.parquet"
    assert engine(*TINY, *cache, "--dump-logprobs", str(sampled)).returncode == 0
    for dtype in ("float32", "bfloat16"):
        done = engine(
            *TINY,
            *cache,
            "--rollout-dtype",
            dtype,
            "--score-tokens",
            str(sampled),
            "--dump-logprobs",
            str(tmp_path / f"{dtype}.parquet"),
        )
        assert done.returncode == 0, done.stderr[-2000:]
    a = pd.read_parquet(sampled)
    same, bf16 = (pd.read_parquet(tmp_path / f"{d}.parquet") for d in ("float32", "bfloat16"))
    for other in (same, bf16):
        assert other[["rollout_id", "sample", "position", "token_id", "loss_mask"]].equals(
            a[["rollout_id", "sample", "position", "token_id", "loss_mask"]]
        )
    assert (same["logp_rollout"] == a["logp_rollout"]).all()
    # Same tokens, same weights: the trainer side follows the sampled run's trajectory.
    assert (bf16["logp_train"] == a["logp_train"]).all()
    mask = a["loss_mask"] == 1
    gap = (bf16["logp_rollout"] - a["logp_rollout"])[mask].abs()
    assert 1e-4 < gap.mean() < 0.1


def test_score_tokens_from_another_batch_shape_is_one_clear_line(tmp_path):
    sampled = tmp_path / "sampled.parquet"
    assert (
        engine(
            *TINY, "--cache-dir", str(tmp_path / "cache"), "--dump-logprobs", str(sampled)
        ).returncode
        == 0
    )
    done = engine(
        *TINY,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--n-samples-per-prompt",
        "2",
        "--score-tokens",
        str(sampled),
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"--score-tokens {sampled}" in line and "n-samples-per-prompt" in line
    done = engine(
        *TINY,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--num-rollout",
        "3",
        "--score-tokens",
        str(sampled),
    )
    assert done.returncode == 2 and "set --num-rollout" in done.stderr


def test_unknown_flag_is_one_clear_line(tmp_path):
    done = engine(*TINY, "--rollout-max-respones-len", "8")
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("unrecognized arguments: --rollout-max-respones-len 8")
    )
    assert "Traceback" not in done.stderr


def test_response_longer_than_positions_is_rejected(tmp_path):
    done = engine(*TINY, "--rollout-max-response-len", "8192")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "--rollout-max-response-len 8192" in line and "max_position_embeddings" in line


def test_sigterm_closes_the_partial_dump_and_exits_nonzero(tmp_path):
    dump = tmp_path / "tokens.parquet"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recipeval.reference",
            *TINY,
            "--num-rollout",
            "100000",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--dump-logprobs",
            str(dump),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            if re.search(r"\] trainer\.py:\d+ - perf 1: ", line) or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM" in err
    tokens = pd.read_parquet(dump)
    assert {0, 1} <= set(tokens["rollout_id"])
    assert not Path(str(dump) + ".partial").exists()


@pytest.mark.slow
def test_ray_actors_log_the_same_format(tmp_path):
    """`--ray on`: rollout worker and trainer run as Ray actors (an embedded Ray instance the
    engine starts and stops); their lines carry Ray's actor prefix and still parse."""
    pytest.importorskip("ray")
    ray_tmp = tempfile.mkdtemp(prefix="rv-ref-")  # Ray's socket paths must stay under 108 bytes
    try:
        done = engine(
            *TINY,
            "--num-rollout",
            "2",
            "--ray",
            "on",
            "--cache-dir",
            str(tmp_path / "cache"),
            env={**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0"},
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(RolloutWorker pid=" in done.stdout and "(Trainer pid=" in done.stdout
    parsed = parse_lines(done.stdout.splitlines())
    assert list(parsed.steps["rollout_id"]) == [0, 1]
    assert STEP_KEYS | ROLLOUT_KEYS <= set(parsed.steps.columns)


@pytest.mark.parametrize(
    "flags", [["--rollout-cuda-graph"], ["--rollout-attention-backend", "triton"]]
)
def test_cuda_only_rollout_flags_on_a_cpu_are_one_clear_line(flags):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = engine(*TINY, "--device", "cpu", *flags, env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert f"{flags[0]}" in line and "needs a CUDA device" in line and "cpu" in line
