"""Effects against a reference with intervals: Welch on samples, quadrature on estimates, and
the interaction of a whole change with its parts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from recipeval.analysis.attribution import (
    Effect,
    estimate_effect,
    interaction,
    per_sample_logprob,
    sample_effect,
)


def test_a_real_shift_is_distinguishable_and_noise_is_not():
    rng = np.random.default_rng(0)
    reference = rng.normal(0.04, 0.005, 64)
    shifted = sample_effect(rng.normal(0.06, 0.005, 64), reference)
    assert shifted.distinguishable and shifted.low < 0.02 < shifted.high
    same = sample_effect(rng.normal(0.04, 0.005, 64), reference)
    assert not same.distinguishable
    assert math.isnan(sample_effect([1.0], reference).estimate)


def test_estimates_combine_their_intervals_in_quadrature():
    effect = estimate_effect(110.0, (107.0, 113.0), 100.0, (96.0, 104.0))
    assert effect.estimate == 10.0
    assert effect.half_width == pytest.approx(5.0)  # hypot(3, 4)
    assert effect.distinguishable
    assert math.isnan(estimate_effect(110.0, None, 100.0, (96.0, 104.0)).low)


def test_interaction_is_the_whole_minus_the_parts():
    parts = [Effect(2.0, 1.0, 3.0), Effect(3.0, 2.0, 4.0)]
    additive = interaction(Effect(5.0, 4.0, 6.0), parts)
    assert additive.estimate == 0.0 and not additive.distinguishable
    synergy = interaction(Effect(9.0, 8.0, 10.0), parts)
    assert synergy.estimate == 4.0 and synergy.distinguishable


def test_per_sample_logprob_averages_each_samples_trained_tokens():
    tokens = pd.DataFrame(
        {
            "rollout_id": [0, 0, 0, 0, 1],
            "sample": [0, 0, 0, 1, 0],
            "logp_rollout": [-1.0, -2.0, -9.0, -0.5, -1.0],
            "logp_train": [-1.5, -1.0, -1.0, -0.5, -1.2],
            "loss_mask": [1, 1, 0, 1, 1],
        }
    )
    per_sample = per_sample_logprob(tokens)
    assert len(per_sample) == 3  # (0, 0), (0, 1), (1, 0); the masked token is left out
    assert per_sample["mean_abs_diff"].tolist() == pytest.approx([0.75, 0.0, 0.2])
    assert per_sample["mean_diff"].tolist() == pytest.approx([-0.25, 0.0, 0.2])
    d = np.array([0.5, -1.0])
    assert per_sample["k3_kl"][0] == pytest.approx(float(np.mean(np.exp(-d) + d - 1)))
