"""Effects of recipe changes against a reference run, with 95 % intervals: what an ablation
attributes to each key, and how far the whole change is from the sum of its parts.

Two kinds of evidence:
- samples (per-sample or per-rollout logprob differences of each run): Welch's interval on the
  difference of means;
- estimates with their own interval (the bench's steady-state times): the difference, with a
  half-width from the two half-widths in quadrature (independent runs).
An effect is distinguishable from noise when its interval excludes zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from recipeval.analysis.logprob import SAMPLE_KEYS, k3_per_token


@dataclass(frozen=True)
class Effect:
    estimate: float
    low: float
    high: float

    @property
    def distinguishable(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_dict(self) -> dict[str, float | bool]:
        return {
            "effect": self.estimate,
            "low": self.low,
            "high": self.high,
            "distinguishable": self.distinguishable,
        }


NO_EFFECT = Effect(math.nan, math.nan, math.nan)


def sample_effect(
    variant: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray
) -> Effect:
    """mean(variant) - mean(reference) with Welch's 95 % interval; NaN with fewer than two
    finite values on a side."""
    a = np.asarray(variant, dtype=float)
    b = np.asarray(reference, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 2 or len(b) < 2:
        return NO_EFFECT
    diff = float(a.mean() - b.mean())
    if np.ptp(np.concatenate([a, b])) == 0:
        return Effect(diff, diff, diff)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return Effect(diff, float(ci.low), float(ci.high))


def estimate_effect(
    variant: float,
    variant_interval: tuple[float, float] | None,
    reference: float,
    reference_interval: tuple[float, float] | None,
) -> Effect:
    """variant - reference for two estimates with 95 % intervals (independent runs); an
    estimate without an interval gives an effect without one."""
    diff = variant - reference
    if variant_interval is None or reference_interval is None or not math.isfinite(diff):
        return Effect(diff, math.nan, math.nan)
    half = math.hypot(
        (variant_interval[1] - variant_interval[0]) / 2,
        (reference_interval[1] - reference_interval[0]) / 2,
    )
    return Effect(diff, diff - half, diff + half)


def per_sample_logprob(tokens: pd.DataFrame) -> pd.DataFrame:
    """One row per sample (rollout id, sample) of a token dump: its mean |d|, mean signed d and
    mean k3 KL over its trained tokens (d = rollout - train logprob), the per-sample means
    analysis.logprob's statistics average; the samples an effect's interval is taken over."""
    masked = tokens[tokens["loss_mask"].astype(bool)]
    d = masked["logp_rollout"].to_numpy(float) - masked["logp_train"].to_numpy(float)
    per_token = pd.DataFrame(
        {
            "mean_abs_diff": np.abs(d),
            "mean_diff": d,
            "k3_kl": k3_per_token(d),
        },
        index=pd.MultiIndex.from_frame(masked[SAMPLE_KEYS]),
    )
    return per_token.groupby(level=SAMPLE_KEYS).mean().reset_index(drop=True)


def interaction(whole: Effect, parts: Sequence[Effect]) -> Effect:
    """The whole change's effect minus the sum of the single ones: zero when the keys act
    independently. Half-widths add in quadrature."""
    if not parts or not all(math.isfinite(p.estimate) for p in parts):
        return NO_EFFECT
    diff = whole.estimate - sum(p.estimate for p in parts)
    halves = [whole.half_width, *(p.half_width for p in parts)]
    if not all(math.isfinite(h) for h in halves):
        return Effect(diff, math.nan, math.nan)
    half = math.sqrt(sum(h * h for h in halves))
    return Effect(diff, diff - half, diff + half)


__all__ = [
    "NO_EFFECT",
    "Effect",
    "estimate_effect",
    "interaction",
    "per_sample_logprob",
    "sample_effect",
]
