"""Logprob statistics along a run and between variants, on token tables and per-sample
values (analysis.logprob's shapes): per-rollout statistics, growth of the diff along the run,
the shift between two variants (Welch interval, Mann-Whitney p-value), and both rollout paths
on identical tokens. Typed results; the logprob_diff stage turns them into checks."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from recipeval.analysis import logprob as lp

# miles' history band for train_rollout_logprob_abs_diff, applied along one run.
GROWTH_RELATIVE, GROWTH_FLOOR = 0.5, 0.02


def per_rollout(tokens: pd.DataFrame, cutoff: float) -> pd.DataFrame:
    """One row of diff statistics per rollout id."""
    rows = []
    for rollout_id, part in tokens.groupby("rollout_id", sort=True):
        st = lp.diff_stats(part, abs_diff_cutoff=cutoff)
        rows.append({"rollout_id": int(rollout_id), **st.to_dict()})
    return pd.DataFrame(rows)


def token_abs_diffs(tokens: pd.DataFrame) -> np.ndarray:
    """|logp_rollout - logp_train| of every trained (loss-masked) token."""
    masked = tokens[tokens["loss_mask"].astype(bool)]
    return (masked["logp_rollout"] - masked["logp_train"]).abs().to_numpy(float)


def per_sample_abs_diff(tokens: pd.DataFrame) -> np.ndarray:
    """Mean |d| of each sample (rollout id, sample) over its trained tokens."""
    masked = tokens[tokens["loss_mask"].astype(bool)]
    d = (masked["logp_rollout"] - masked["logp_train"]).abs()
    return d.groupby([masked["rollout_id"], masked["sample"]]).mean().to_numpy(float)


@dataclass(frozen=True)
class Growth:
    """The first rollout's mean |d| against the worst later one, and the band it must stay in."""

    first: float
    worst: float
    worst_at: int  # rollout id
    limit: float

    @property
    def ok(self) -> bool:
        return self.worst <= self.limit


def rollout_growth(by_rollout: pd.Series) -> Growth | None:
    """Mean |d| per rollout id -> its growth along the run; None with fewer than two rollouts
    (nothing to compare)."""
    series = by_rollout.dropna()
    if len(series) < 2:
        return None
    first = float(series.iloc[0])
    worst_at = int(series.iloc[1:].idxmax())
    return Growth(
        first=first,
        worst=float(series.loc[worst_at]),
        worst_at=worst_at,
        limit=max(first * (1 + GROWTH_RELATIVE), first + GROWTH_FLOOR),
    )


@dataclass(frozen=True)
class Shift:
    """Per-sample mean |d| of a variant minus a reference's. `low`/`high`: the 95 % Welch
    interval; clear when it excludes 0. `tested`: both sides had a spread, so the Welch and
    Mann-Whitney tests ran."""

    samples: tuple[int, int]
    shift: float
    clear: bool
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    relative: float | None = None
    message: str | None = None  # why there is no interval

    @property
    def tested(self) -> bool:
        return self.relative is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"samples": list(self.samples), "shift": self.shift}
        if self.message is not None:
            return {**out, "clear": self.clear, "message": self.message}
        out |= {"low": self.low, "high": self.high, "p_value": self.p_value}
        if self.relative is not None:
            out["relative"] = self.relative
        return {**out, "clear": self.clear}


def compare_samples(variant: np.ndarray, reference: np.ndarray) -> Shift:
    a, b = variant, reference
    samples = (len(a), len(b))
    if len(a) < 2 or len(b) < 2:
        return Shift(samples, math.nan, clear=False, message="too few samples to compare")
    shift = float(a.mean() - b.mean())
    if np.ptp(np.concatenate([a, b])) == 0:
        return Shift(samples, shift, clear=shift != 0, low=shift, high=shift, p_value=1.0)
    with warnings.catch_warnings():
        # Nearly equal per-rollout scalars trip scipy's precision warning; the interval is
        # still right (and tiny).
        warnings.simplefilter("ignore", RuntimeWarning)
        welch = stats.ttest_ind(a, b, equal_var=False)
        ci = welch.confidence_interval(0.95)
        p_value = float(stats.mannwhitneyu(a, b).pvalue)
    low, high = float(ci.low), float(ci.high)
    return Shift(
        samples,
        shift,
        clear=bool(low > 0 or high < 0),
        low=low,
        high=high,
        p_value=p_value,
        relative=shift / b.mean() if b.mean() else math.inf,
    )


@dataclass(frozen=True)
class IdenticalTokens:
    """Two rollout paths' logprobs of the very same tokens (variant - reference)."""

    method: str  # "re-scored" | "shared prefix"
    tokens: int
    mean_abs_diff: float | None = None
    mean_diff: float | None = None
    p99_abs_diff: float | None = None
    max_abs_diff: float | None = None
    token_mult_prob_error: float | None = None
    train_gap_max: float | None = None  # re-scored: how far the two trainers' logprobs differ

    def to_dict(self) -> dict[str, Any]:
        if not self.tokens:
            return {"method": self.method, "tokens": 0}
        out = {
            "method": self.method,
            "tokens": self.tokens,
            "mean_abs_diff": self.mean_abs_diff,
            "mean_diff": self.mean_diff,
            "p99_abs_diff": self.p99_abs_diff,
            "max_abs_diff": self.max_abs_diff,
            "token_mult_prob_error": self.token_mult_prob_error,
        }
        return out | (
            {"train_gap_max": self.train_gap_max} if self.train_gap_max is not None else {}
        )


def identical_tokens(
    reference: pd.DataFrame | None, variant: pd.DataFrame | None, rescored: pd.DataFrame | None
) -> IdenticalTokens | None:
    """Every token the reference sampled at the first rollout, re-scored by the variant
    (`rescored`: analysis.logprob.rescored_pairs), else the tokens both sampled at the first
    rollout (analysis.logprob.shared_prefix_pairs); None when neither table is there."""
    if reference is None:
        return None
    if rescored is not None:
        first = reference[reference["rollout_id"].isin(rescored["rollout_id"])]
        method, pairs = "re-scored", lp.rescored_pairs(first, rescored)
    elif variant is not None:
        method, pairs = "shared prefix", lp.shared_prefix_pairs(reference, variant)
    else:
        return None
    if pairs.empty:
        return IdenticalTokens(method, 0)
    st = lp.diff_stats(pairs)
    return IdenticalTokens(
        method,
        st.tokens,
        mean_abs_diff=st.token_mean_abs_diff,
        mean_diff=st.mean_diff,
        p99_abs_diff=st.p99_abs_diff,
        max_abs_diff=st.max_abs_diff,
        token_mult_prob_error=st.token_mult_prob_error,
        train_gap_max=float(pairs["train_gap"].max()) if "train_gap" in pairs else None,
    )
