"""Logprob statistics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from recipeval.analysis.logprob import (
    DEFAULT_THRESHOLDS,
    TokenTableError,
    by_position,
    diff_stats,
    judge,
    rescored_pairs,
    scalar_stats,
    shared_prefix_pairs,
    thresholds_with,
)


def tokens(
    d_per_sample: list[list[float]],
    rollout_id: int = 0,
    train: float = -1.0,
    mask: list[list[int]] | None = None,
) -> pd.DataFrame:
    """A token table with logp_train = train and logp_rollout = train + d."""
    rows = []
    for s, ds in enumerate(d_per_sample):
        for p, d in enumerate(ds):
            rows.append(
                {
                    "rollout_id": rollout_id,
                    "sample": s,
                    "position": p,
                    "token_id": 100 + p,
                    "logp_rollout": train + d,
                    "logp_train": train,
                    "loss_mask": 1 if mask is None else mask[s][p],
                }
            )
    return pd.DataFrame(rows)


def test_identical_paths_give_zero_error() -> None:
    st = diff_stats(tokens([[0.0] * 5, [0.0] * 3]))
    assert st.mean_abs_diff == 0 and st.max_abs_diff == 0 and st.k3_kl == 0
    assert st.token_mult_prob_error == 1.0 and st.frac_above_cutoff == 0
    assert (st.tokens, st.samples) == (8, 2)


def test_constant_offset() -> None:
    c = 0.1
    st = diff_stats(tokens([[c] * 4, [c] * 6]))
    assert st.mean_abs_diff == pytest.approx(c)
    assert st.p50_abs_diff == pytest.approx(c) and st.p99_abs_diff == pytest.approx(c)
    assert st.mean_diff == pytest.approx(c)  # rollout above train: positive
    # miles' KL(rollout || train): exp(x) - 1 - x at x = train - rollout = -c
    assert st.k3_kl == pytest.approx(math.exp(-c) + c - 1)
    assert st.token_mult_prob_error == pytest.approx(math.exp(c))
    assert st.prob_abs_diff_mean == pytest.approx(math.exp(-1 + c) - math.exp(-1))
    assert st.frac_above_cutoff == 1.0
    assert st.first_rollout_abs_mean_diff == pytest.approx(c)


def test_per_sample_mean_differs_from_token_mean() -> None:
    # sample 0: one token |d| = 0.4; sample 1: three tokens |d| = 0.0
    st = diff_stats(tokens([[0.4], [0.0, 0.0, 0.0]]))
    assert st.mean_abs_diff == pytest.approx(0.2)  # (0.4 + 0.0) / 2 samples (miles)
    assert st.token_mean_abs_diff == pytest.approx(0.1)  # 0.4 / 4 tokens


def test_signs_cancel_in_the_mean_not_in_abs() -> None:
    st = diff_stats(tokens([[0.2, -0.2]]))
    assert st.mean_diff == pytest.approx(0.0)
    assert st.first_rollout_abs_mean_diff == pytest.approx(0.0)
    assert st.mean_abs_diff == pytest.approx(0.2)


def test_loss_mask_excludes_tokens() -> None:
    st = diff_stats(tokens([[0.01, 5.0, 0.01]], mask=[[1, 0, 1]]))
    assert st.tokens == 2 and st.max_abs_diff == pytest.approx(0.01)


def test_k3_is_clamped_per_token_as_miles_does() -> None:
    st = diff_stats(tokens([[20.0, 0.0]]))
    assert st.k3_kl == pytest.approx((10.0 + 0.0) / 2)


def test_first_rollout_only_counts_rollout_zero() -> None:
    table = pd.concat([tokens([[0.01, 0.01]], rollout_id=0), tokens([[0.5, 0.5]], rollout_id=1)])
    st = diff_stats(table)
    assert st.first_rollout_abs_mean_diff == pytest.approx(0.01)
    assert st.samples == 2


def test_error_growing_along_the_context_shows_by_position() -> None:
    n = 5000
    pos = np.arange(n)
    table = pd.DataFrame(
        {
            "rollout_id": 0,
            "sample": 0,
            "position": pos,
            "token_id": 1,
            "logp_train": -1.0,
            "logp_rollout": -1.0 + 1e-5 * pos,
            "loss_mask": 1,
        }
    )
    buckets = by_position(table)
    assert list(buckets["start"]) == [0, 16, 64, 256, 1024, 2048, 4096]
    assert buckets["mean_abs_diff"].is_monotonic_increasing
    assert buckets["tokens"].sum() == n
    assert diff_stats(table).position_spearman == pytest.approx(1.0)


def test_rescored_pairs_measure_b_minus_a_on_identical_tokens() -> None:
    a = tokens([[0.0, 0.0, 0.0]], train=-2.0)
    b = a.copy()
    b["logp_rollout"] = a["logp_rollout"] + 0.05
    st = diff_stats(rescored_pairs(a, b))
    assert st.mean_diff == pytest.approx(0.05)
    assert st.mean_abs_diff == pytest.approx(0.05)


def test_rescored_pairs_refuse_other_tokens() -> None:
    a = tokens([[0.0, 0.0]])
    b = a.copy()
    b.loc[1, "token_id"] = 999
    with pytest.raises(TokenTableError, match="other tokens"):
        rescored_pairs(a, b)
    with pytest.raises(TokenTableError, match="lacks 1"):
        rescored_pairs(a, a.iloc[:1])


def test_missing_column_is_named() -> None:
    with pytest.raises(TokenTableError, match="logp_train"):
        diff_stats(tokens([[0.0]]).drop(columns=["logp_train"]))


def test_scalar_stats_from_a_step_table() -> None:
    steps = pd.DataFrame(
        {
            "train/train_rollout_logprob_abs_diff": [0.04, 0.06, float("nan")],
            "train/train_rollout_kl": [0.001, 0.003, 0.002],
            "rollout/log_probs": [-0.50, -0.40, -0.30],
            "rollout/rollout_log_probs": [-0.52, -0.45, -0.31],
        }
    )
    st = scalar_stats(steps)
    assert st.mean_abs_diff == pytest.approx(0.05) and st.max_abs_diff == pytest.approx(0.06)
    assert st.k3_kl == pytest.approx(0.002)
    assert st.first_rollout_abs_mean_diff == pytest.approx(0.02)
    assert st.worst_rollout_abs_mean_diff == pytest.approx(0.05)
    assert math.isnan(scalar_stats(pd.DataFrame({"x": [1.0]})).mean_abs_diff)


def test_judge_with_defaults_and_overrides() -> None:
    assert set(DEFAULT_THRESHOLDS) >= {"first_rollout_abs_mean_diff", "token_mult_prob_error"}
    values = {
        "first_rollout_abs_mean_diff": 0.05,
        "token_mult_prob_error": 1.01,
        "mean_abs_diff": 0.07,
        "prob_abs_diff_mean": float("nan"),
    }
    by_check = {v.check: v for v in judge(values, DEFAULT_THRESHOLDS)}
    assert not by_check["first_rollout_abs_mean_diff"].ok
    assert by_check["token_mult_prob_error"].ok
    assert not by_check["prob_abs_diff_mean"].ok  # unmeasured is not a pass
    assert "mean_abs_diff" not in by_check
    relaxed = thresholds_with({"first_rollout_abs_mean_diff": 0.08, "mean_abs_diff": 0.08})
    by_check = {v.check: v for v in judge(values, relaxed)}
    assert by_check["first_rollout_abs_mean_diff"].ok and by_check["mean_abs_diff"].ok
    assert by_check["mean_abs_diff"].source == "recipe"


def test_shared_prefix_pairs_keep_only_tokens_both_sampled_at_the_first_rollout() -> None:
    a = pd.concat(
        [tokens([[0.0] * 4, [0.0] * 3], rollout_id=0), tokens([[0.0] * 4], rollout_id=1)],
        ignore_index=True,
    )
    b = a.copy()
    b["logp_rollout"] = b["logp_rollout"] + 0.02  # variant B's rollout path scores 0.02 higher
    # sample 0 diverges at position 2; position 3 happens to agree again but its context differs
    b.loc[(b["rollout_id"] == 0) & (b["sample"] == 0) & (b["position"] == 2), "token_id"] = 7
    pairs = shared_prefix_pairs(a, b)
    assert list(zip(pairs["sample"], pairs["position"])) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert (pairs["rollout_id"] == 0).all() and (pairs["train_gap"] == 0).all()
    st = diff_stats(pairs.drop(columns="train_gap"))
    assert st.mean_diff == pytest.approx(0.02) and st.tokens == 5


def test_shared_prefix_pairs_respect_both_masks() -> None:
    a = tokens([[0.0, 0.0, 0.0]], mask=[[1, 1, 0]])
    b = tokens([[0.0, 0.0, 0.0]], mask=[[0, 1, 1]])
    assert list(shared_prefix_pairs(a, b)["position"]) == [1]


def test_compare_samples_and_rollout_growth_return_typed_results() -> None:
    from recipeval.analysis.logprob_compare import compare_samples, rollout_growth

    rng = np.random.default_rng(5)
    reference = 0.02 + 0.002 * rng.standard_normal(64)
    shifted = compare_samples(reference + 0.01, reference)
    assert shifted.tested and shifted.clear and shifted.low < 0.01 < shifted.high
    assert shifted.p_value < 1e-6 and abs(shifted.relative - 0.5) < 0.1
    same = compare_samples(reference, reference)
    assert same.tested and not same.clear and same.low < 0 < same.high
    few = compare_samples(reference[:1], reference)
    assert not few.tested and not few.clear and few.message == "too few samples to compare"
    assert rollout_growth(pd.Series([0.02])) is None
    steady = rollout_growth(pd.Series([0.02, 0.021, 0.019]))
    assert steady.ok and steady.worst_at == 1 and steady.limit == pytest.approx(0.04)
    growing = rollout_growth(pd.Series([0.02, 0.03, 0.05, 0.08]))
    assert not growing.ok and growing.worst == 0.08 and growing.worst_at == 3
