"""The reference engine's two compute paths: rollout (static-cache decode) and trainer (one full
forward) give the same logprobs to float32 round-off when dtype and attention match, measurably
different ones when they do not, and a skipped weight sync shows up as a growing difference."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from recipeval.analysis.logprob import k3_per_token
from recipeval.reference.config import EngineConfig, parse_args
from recipeval.reference.grpo import k3_kl, sample_mean
from recipeval.reference.loop import run
from recipeval.reference.rollout import RolloutBatch, RolloutWorker
from recipeval.reference.trainer import Trainer
from recipeval.reference.warmstart import initial_state

pytestmark = pytest.mark.reference_engine

TINY = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--ffn-hidden-size",
    "256",
    "--num-attention-heads",
    "4",
    "--group-query-attention",
    "--num-query-groups",
    "2",
    "--vocab-size",
    "512",
    "--max-position-embeddings",
    "128",
    "--device",
    "cpu",
    "--rollout-batch-size",
    "4",
    "--n-samples-per-prompt",
    "4",
    "--rollout-max-response-len",
    "24",
    "--warm-start-steps",
    "60",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("reference-cache")


def config(cache_dir, *extra: str) -> EngineConfig:
    return parse_args([*TINY, "--cache-dir", str(cache_dir), *extra])


def abs_diff(batch: RolloutBatch, train_logprobs: torch.Tensor) -> float:
    """miles' train_rollout_logprob_abs_diff for one batch."""
    d = (train_logprobs - batch.rollout_logprobs).abs()
    return sample_mean(d, batch.response_mask).mean().item()


def rollout_and_recompute(cfg: EngineConfig) -> tuple[RolloutBatch, Trainer]:
    state = initial_state(cfg, torch.device("cpu"))
    batch = RolloutWorker(cfg, state).generate(0)
    return batch, Trainer(cfg, state)


def test_train_rollout_kl_is_miles_kl_of_rollout_against_train():
    # miles logs compute_approx_kl(rollout, train, "low_var_kl"): exp(x) - 1 - x at
    # x = train - rollout, x clamped to [-20, 20] and the estimate to [-10, 10]
    rollout = torch.tensor([-1.0, -0.5, -30.0, -2.0, -0.3])
    train = torch.tensor([-1.2, -0.5, -1.0, -40.0, -0.1])
    expected = [math.exp(-0.2) - 0.8, 0.0, 10.0, 10.0, math.exp(0.2) - 1.2]
    assert k3_kl(rollout, train).tolist() == pytest.approx(expected, rel=1e-5)
    # the analysis of a token dump reads the same per token (d = rollout - train)
    d = (rollout - train).numpy().astype(float)
    assert k3_per_token(d).tolist() == pytest.approx(expected, rel=1e-5)


def test_same_dtype_and_attention_agree_to_float32_roundoff(cache_dir):
    batch, trainer = rollout_and_recompute(config(cache_dir))
    train = trainer.recompute(batch)
    mask = batch.response_mask.bool()
    assert mask.sum() >= 16
    # A non-flat policy: otherwise every logprob check passes trivially.
    assert batch.rollout_logprobs[mask].mean().item() > -3.0
    max_diff = (train - batch.rollout_logprobs)[mask].abs().max().item()
    assert max_diff < 1e-4, max_diff
    assert abs_diff(batch, train) < 1e-5


def test_bfloat16_rollout_differs_measurably(cache_dir):
    same, trainer = rollout_and_recompute(config(cache_dir))
    fp32_diff = abs_diff(same, trainer.recompute(same))
    bf16, trainer = rollout_and_recompute(config(cache_dir, "--rollout-dtype", "bfloat16"))
    bf16_diff = abs_diff(bf16, trainer.recompute(bf16))
    assert bf16_diff > 1e-3, bf16_diff
    assert bf16_diff > 100 * fp32_diff


def test_other_attention_implementation_differs_measurably(cache_dir):
    """Same tokens rescored by eager and sdpa attention in bfloat16 (in float32 the two agree to
    round-off, as they should: same mathematics, different summation order)."""
    batch, sdpa = rollout_and_recompute(config(cache_dir, "--train-dtype", "bfloat16"))
    state = initial_state(sdpa.config, torch.device("cpu"))
    eager = Trainer(
        config(cache_dir, "--train-dtype", "bfloat16", "--train-attn-implementation", "eager"),
        state,
    )
    d = (eager.recompute(batch) - sdpa.recompute(batch)).abs()
    assert sample_mean(d, batch.response_mask).mean().item() > 1e-4


def test_skipped_weight_sync_grows_the_difference_and_sync_restores_it(cache_dir):
    logging.disable(logging.INFO)
    try:
        common = ("--num-rollout", "3", "--lr", "1e-2")
        synced = run(config(cache_dir, *common))
        stale = run(config(cache_dir, *common, "--skip-weight-sync"))
    finally:
        logging.disable(logging.NOTSET)
    key = "train/train_rollout_logprob_abs_diff"
    # Step 0 is before any update: both agree to round-off.
    assert synced[0][key] < 1e-5 and stale[0][key] < 1e-5
    # After updates, the stale rollout worker samples from old weights.
    assert stale[1][key] > 1e-3 and stale[2][key] > stale[1][key]
    assert synced[1][key] < 1e-5 and synced[2][key] < 1e-5
