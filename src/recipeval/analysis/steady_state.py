"""Steady-state statistics of a step-time series: warm-up detection, a robust interval for the
steady level, and the adaptive stopping rule the bench stage applies after every step.

Pure functions over arrays; nothing here reads files or launches anything.

Choices, and why (figures from benchmarks/steady_state_coverage.py):

- Warm-up: a robust change-point test on the first steps. The steady level and spread are
  estimated from the later part of the series (median and 1.4826 x MAD, re-estimated once from
  the steps after the first cut); the warm-up ends at the first step that lies within
  `z` robust standard deviations of that level. Slow (or fast) early steps are what a warm-up
  is; a lone slow step later on cannot move the cut, because only the leading run counts.
  A gradual warm-up (exponential decay over 2-5 steps, a linear ramp) falls under that bound
  before it is over: the steps right after the cut stay warm-up while they are still
  WARMUP_TAIL_Z robust sd on the warm-up's side (found within one step in 93-97 % of such
  traces at 20 steps, where the single-step cut under-cut about half of them).
  MSER (minimise the squared standard error of the truncated mean) was measured too: its
  squared loss makes it chase the odd slow step and any boundary point 1.4 sigma off, and it
  found the true warm-up within one step in only 55-75 % of traces with outliers, against
  95-98 % for this test (10-40 steps).
- Odd steps: after the warm-up, a step far from the others (a checkpoint, a GC pause, a slow
  node) is dropped when its externally studentised residual (distance from the mean of the
  other steady steps, in units of their standard deviation, Student t on k - 2 degrees of
  freedom) has a two-sided p-value below that of a WARMUP_Z deviation (5e-4): the same
  "not steady" as the warm-up test, with the spread's uncertainty on few steps accounted for,
  so a clean series loses a step to it about once in 2000. The most extreme step is tested,
  dropped, and the test repeated, for at most one step in ten (rounded up): the odd step, not
  a second mode of the run (a slow step every third rollout is part of the steady state and
  widens the interval instead). The count is reported. Without it, one odd step among the
  first nine steady ones (nothing is trimmed there) kept the interval wide for several more
  steps: dropping it took the steps to a verdict at the precision of NeMo-RL's schedule from
  7.2 to 6.7-6.8 (10 fixed), and at Megatron's from 13.9 to 12.9-13.3 (20 fixed).
- Odd or recurring: a far step is only dropped once RECUR_WINDOW (10) steps have followed it
  without another like it, and when far steps recur on one side (at least two, RECUR_SHARE of
  the steps) none is odd and the level is their plain mean with the others: a slow step every
  5th step is the steady state. Before, the first slow step was dropped as odd at about step
  8 and the fast level was reported "precise" (issue 23). The price: an odd step keeps the
  interval wide for ten steps before it can be dropped.
- Correlated steps: a slow node or a shared file system stays slow for a few steps, and the
  i.i.d. interval covered 71-78 % under AR(1) phi 0.5. The variance is the AR(1) spectral
  variance at frequency zero (variance x (1 + r) / (1 - r), Student t on the effective step
  count), with r an upper bound (estimate + 1 sd) of the bias-corrected lag-1
  autocorrelation, from AUTOCORR_MIN_STEPS (10) steps on; hence min_steps 10.
- Trend: least-squares slope over the steady steps, its variance widened the same way; a
  slope with p < TREND_ALPHA that moved the level by at least TREND_MIN_MOVE is "not steady:
  trend +x % per step", and the rule does not stop "precise" on it.
- Window: a drift too small for the trend test to call still moves the level, so the
  interval the rule judges (`window_interval`, the default) is the hull of the level's
  interval and the intervals of the fitted level at the window's first and last step (the
  slope's standard error times the offset from the middle, combined with the level's, widened
  for autocorrelation). It covers the level at every step of the window: over 1000 traces of
  each issue-23 shape (AR(1), +2 % drift, gradual warm-ups, a slow step every 5th, heavy and
  skewed tails; rel_ci 5 %), 99.5-100 % at 20 steps and 99.1-100 % at the stop, where the
  level's interval alone covered the drifting start level in 82.4 % at the stop. It is two
  to three times as wide as the level's interval (median width at 20 steps 16.0 % of the
  value against 5.7 %, section 2), hence rel_ci 5 %.
- Interval: the 10 % trimmed mean with the Tukey-McLaughlin interval (Yuen's winsorised
  standard error, Student t on h - 1 degrees of freedom), not a bootstrap. The trimmed mean
  drops one odd slow step in every ten yet keeps about 97 % of the mean's efficiency under
  normal noise (the median keeps 64 %: about 1.5x the steps for the same width). Below ten
  steady steps nothing is trimmed; the odd-step test above covers that range. Measured over
  1000 traces with outliers (odd steps dropped first), it covers the true level in
  93.9-96.1 % of traces at 10-40 steps (nominal 95 %; two seeds), and in 88-95 % at the
  adaptive stop (stopping on the first narrow interval costs a little; a larger min_steps
  less). Bootstrap intervals (`scipy.stats.bootstrap`) at 20 steps: BCa of the same trimmed
  mean 89.6 %, percentile of the median 92.0 %; they also depend on a seed and cost
  milliseconds, where this interval is deterministic (the same log gives the same verdict) and
  cheap enough to run after every log line. A 20 % trim was tried: its variance estimate from
  a dozen values is so unsteady that the rule stops on lucky-narrow intervals (coverage at the
  stop 85 %).
- Precision: the width (high - low) of the judged interval (window or level) must be at most
  `rel_ci` times the estimate, i.e. the estimate is known to +/- rel_ci / 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import special

# A step beyond this many robust standard deviations from the steady level is not steady:
# under normal noise a steady step lands there with probability 5e-4.
WARMUP_Z = 3.5
# Lower bound of the robust spread, relative to the level, so timings logged with few digits
# (MAD = 0) do not turn every tiny wobble into a warm-up step.
MIN_REL_SPREAD = 0.005
TRIM = 0.1
MAD_TO_SIGMA = 1.4826
# Two-sided p-value below which a steady step is odd: that of a WARMUP_Z deviation.
ODD_STEP_ALPHA = float(2 * special.ndtr(-WARMUP_Z))
# A far step is only odd once this many steps have followed it without another like it: a slow
# step every k-th step (k <= RECUR_WINDOW) is then seen to recur before it could be dropped.
RECUR_WINDOW = 10
# Far steps on one side that make up at least this share of the steady steps recur: the level
# is their plain mean with the others (a trimmed mean would cut the recurring slow steps).
RECUR_SHARE = 0.15
# After a warm-up, the steps that follow are warm-up too while still this many robust sd on its
# side of the level: a gradual warm-up (exponential or linear) tails off under WARMUP_Z long
# before it is over, and an under-cut biases the level.
WARMUP_TAIL_Z = 1.5
# The trend test: a slope with a two-sided p-value under this is "not steady".
TREND_ALPHA = 0.01
# ...and it moved the level by at least this share over the steady steps (under any rel_ci a
# recipe would ask for: a slope that small is not worth a "not steady").
TREND_MIN_MOVE = 0.005
# The lag-1 autocorrelation used for the variance is capped here (the variance factor
# (1 + r) / (1 - r) is then 9), and only estimated from this many steps on: its bias
# correction multiplies the estimate's error by n / (n - 3), so on fewer steps it swings the
# interval from narrow to unbounded between one step and the next, and the stopping rule
# stops on the lucky-narrow ones. Below it the steps are taken as independent (min_steps
# should not be below it; see StoppingRule).
MAX_AUTOCORR = 0.8
AUTOCORR_MIN_STEPS = 10
AUTOCORR_UPPER_Z = 1.0

StopReason = Literal["precise", "max_steps", "continue"]
# What the interval covers: "window", the level at every step of the measured window with an
# allowance for a trend too small to call (window_interval); "level", the mean level, taking
# the steps as free of any trend (correlated_interval).
IntervalKind = Literal["window", "level"]


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def _level_and_spread(x: np.ndarray) -> tuple[float, float]:
    level = float(np.median(x))
    mad = float(np.median(np.abs(x - level)))
    spread = max(MAD_TO_SIGMA * mad, MIN_REL_SPREAD * abs(level), np.finfo(float).tiny)
    return level, spread


def _leading_outside(x: np.ndarray, level: float, spread: float, z: float) -> int:
    outside = np.abs(x - level) > z * spread
    return len(x) if outside.all() else int(np.argmin(outside))


def detect_warmup(values: Sequence[float] | np.ndarray, z: float = WARMUP_Z) -> int:
    """Number of leading steps that are warm-up (not yet steady).

    NaN/inf entries are ignored (the count is over finite values). At most half the series is
    ever called warm-up: the level is estimated from what follows, so a longer warm-up cannot
    be told from a level shift until more steps arrive.
    """
    x = _finite(values)
    n = len(x)
    if n < 3:
        return 0
    cap = n // 2
    warmup = min(_leading_outside(x, *_level_and_spread(x[n - cap :]), z), cap)
    # Second pass: the steps after the first cut are a larger, cleaner steady sample.
    level, spread = _level_and_spread(x[warmup:])
    warmup = min(_leading_outside(x, level, spread, z), cap)
    if warmup == 0:
        return 0
    # A gradual warm-up's tail: still on the warm-up's side of the level by WARMUP_TAIL_Z.
    side = math.copysign(1.0, x[warmup - 1] - level)
    while warmup < cap and side * (x[warmup] - level) > WARMUP_TAIL_Z * spread:
        warmup += 1
    return warmup


def odd_steps(
    values: Sequence[float] | np.ndarray,
    alpha: float = ODD_STEP_ALPHA,
    max_share: float = TRIM,
    recur_window: int = RECUR_WINDOW,
) -> np.ndarray:
    """Mask of the odd steps of a steady series (see the module docstring): repeatedly, the
    most extreme step is odd when its externally studentised residual has a two-sided p-value
    below `alpha` and at least `recur_window` steps have followed it; at most
    ceil(max_share * n) steps, each tested among at least four. None when far steps recur."""
    if recurring(values):
        return np.zeros(len(np.asarray(values).ravel()), dtype=bool)
    return _odd_mask(values, alpha, max_share, recur_window)


def recurring(values: Sequence[float] | np.ndarray, z: float = WARMUP_Z) -> bool:
    """Whether far steps (beyond `z` robust sd of the median) recur: at least two on one side,
    and at least RECUR_SHARE of the steps. A slow step every fifth rollout is part of the
    steady state, not a string of odd steps."""
    x = _finite(values)
    if len(x) < 4:
        return False
    level, spread = _level_and_spread(x)
    far = (x - level) / spread
    return any(
        int(n) >= 2 and n >= RECUR_SHARE * len(x) for n in ((far > z).sum(), (far < -z).sum())
    )


def _odd_mask(
    values: Sequence[float] | np.ndarray, alpha: float, max_share: float, recur_window: int
) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    odd = ~np.isfinite(x)
    steps_after = int((~odd).sum()) - np.cumsum(~odd)
    limit = math.ceil(max_share * int((~odd).sum()))
    for _ in range(limit):
        kept = np.flatnonzero(~odd)
        k = len(kept)
        if k < 4:
            break
        critical = float(special.stdtrit(k - 2, 1 - alpha / 2)) * math.sqrt(1 + 1 / (k - 1))
        worst, worst_t = -1, critical
        for candidate in (kept[np.argmin(x[kept])], kept[np.argmax(x[kept])]):
            others = x[kept[kept != candidate]]
            sd = float(np.std(others, ddof=1))
            residual = abs(x[candidate] - others.mean()) / sd if sd > 0 else 0.0
            if residual > worst_t:
                worst, worst_t = int(candidate), residual
        # Too recent to tell from a step that recurs: kept for now (it widens the interval).
        if worst < 0 or steps_after[worst] < recur_window:
            break
        odd[worst] = True
    return odd & np.isfinite(x)


@dataclass(frozen=True)
class Interval:
    """A steady-level estimate with its confidence interval, over `n` steps."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float

    @property
    def width(self) -> float:
        return self.high - self.low

    @property
    def rel_width(self) -> float:
        """Full width relative to the estimate (inf when it cannot be formed)."""
        if not (math.isfinite(self.width) and self.estimate):
            return math.inf
        return self.width / abs(self.estimate)

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high


def trimmed_mean_interval(
    values: Sequence[float] | np.ndarray, confidence: float = 0.95, trim: float = TRIM
) -> Interval:
    """Trimmed mean (floor(trim * n) values cut at each end, as `scipy.stats.trim_mean` cuts) and
    its Tukey-McLaughlin interval: Yuen's standard error from the winsorised variance,
    se^2 = (n - 1) s_w^2 / (h (h - 1)) with h values kept, and Student t on h - 1 degrees of
    freedom. See the module docstring for why this estimator."""
    x = np.sort(_finite(values))
    n = len(x)
    if n < 2:
        est = float(x[0]) if n else math.nan
        return Interval(est, math.nan, math.nan, n, confidence)
    cut = int(trim * n)
    kept = n - 2 * cut
    # Direct forms of scipy.stats.trim_mean and stats.t.ppf: those carry ~1-5 ms of
    # dispatch per call, which the bench pays after every log line.
    estimate = float(x[cut : n - cut].mean())
    if kept < 2:
        return Interval(estimate, math.nan, math.nan, n, confidence)
    winsorised = np.clip(x, x[cut], x[n - cut - 1])
    se = math.sqrt((n - 1) * float(np.var(winsorised, ddof=1)) / (kept * (kept - 1)))
    half = float(special.stdtrit(kept - 1, 0.5 + confidence / 2)) * se
    return Interval(estimate, estimate - half, estimate + half, n, confidence)


def lag1_autocorrelation(values: Sequence[float] | np.ndarray) -> float:
    """Lag-1 autocorrelation of a series in step order, corrected for its small-sample bias
    (E[r] ~ phi - (1 + 3 phi) / n for an AR(1) with unknown mean) and kept in
    [0, MAX_AUTOCORR]: negative estimates from a few steps are mostly noise, and would narrow
    the interval. 0 below AUTOCORR_MIN_STEPS steps."""
    x = _finite(values)
    n = len(x)
    if n < AUTOCORR_MIN_STEPS:
        return 0.0
    d = x - x.mean()
    den = float(d @ d)
    if den <= 0:
        return 0.0
    r = (n * float(d[1:] @ d[:-1]) / den + 1) / (n - 3)
    # An upper confidence bound rather than the estimate: on 10-20 steps the estimate's error
    # (sd about sqrt((1 - r^2) / n)) is as large as the correlation, and the stopping rule
    # would stop on the steps where it happens to be low.
    r += AUTOCORR_UPPER_Z * math.sqrt(max(1 - r * r, 0.0) / n)
    return min(max(r, 0.0), MAX_AUTOCORR)


def correlated_interval(
    values: Sequence[float] | np.ndarray, confidence: float = 0.95, trim: float = TRIM
) -> Interval:
    """trimmed_mean_interval with a variance that stays honest when steps are correlated (a
    slow node or a shared file system stays slow for a few steps): the spectral variance at
    frequency zero of an AR(1) fitted to the (winsorised) steps, i.e. the variance times
    (1 + r) / (1 - r) with r the bias-corrected lag-1 autocorrelation, and Student t on the
    effective number of steps less one. `values` must be in step order."""
    x = _finite(values)
    estimate, se, dof = _correlated_level(x, confidence, trim)
    if not math.isfinite(se):
        return trimmed_mean_interval(x, confidence, trim)
    return _centred(estimate, _t_quantile(dof, confidence) * se, len(x), confidence)


def _centred(estimate: float, half: float, n: int, confidence: float) -> Interval:
    return Interval(estimate, estimate - half, estimate + half, n, confidence)


def _t_quantile(dof: float, confidence: float) -> float:
    return float(special.stdtrit(max(dof, 1.0), 0.5 + confidence / 2))


def _correlated_level(x: np.ndarray, confidence: float, trim: float) -> tuple[float, float, float]:
    """correlated_interval's estimate, standard error and degrees of freedom (se NaN when no
    interval can be formed)."""
    base = trimmed_mean_interval(x, confidence, trim)
    n = len(x)
    if not math.isfinite(base.low):
        return base.estimate, math.nan, 0.0
    cut = int(trim * n)
    kept = n - 2 * cut
    se = (base.high - base.estimate) / _t_quantile(kept - 1, confidence)
    if base.width == 0:
        return base.estimate, se, kept - 1
    ordered = np.sort(x)
    r = lag1_autocorrelation(np.clip(x, ordered[cut], ordered[n - cut - 1]))
    factor = (1 + r) / (1 - r)
    return base.estimate, se * math.sqrt(factor), (kept - 1) / factor


def window_interval(
    values: Sequence[float] | np.ndarray,
    positions: Sequence[int] | np.ndarray | None = None,
    confidence: float = 0.95,
    trim: float = TRIM,
) -> Interval:
    """An interval for the level at every step of the window, allowing for a linear trend too
    small to be told from noise: the hull of correlated_interval and of the intervals for the
    fitted level at the window's first and last step (the estimate moved by the least-squares
    slope, its variance that of the estimate plus the slope's times the squared distance, both
    widened for correlated steps; Student t on the fewer degrees of freedom). Under a drift
    the trend test cannot see on 20 steps, the mean sits half a window away from the level the
    run started at; this interval still covers it. About twice as wide as the mean's
    (asymptotically the end points' standard error is 2 sd / sqrt(n), the mean's sd / sqrt(n))."""
    x, t = _finite_with_positions(values, positions)
    return _window(x, t, _slope_fit(x, t), confidence, trim)


def _window(
    x: np.ndarray,
    t: np.ndarray,
    fit: tuple[float, float, float] | None,
    confidence: float,
    trim: float,
) -> Interval:
    """window_interval over finite values, with their slope fit already made."""
    estimate, se, dof = _correlated_level(x, confidence, trim)
    if not math.isfinite(se) or fit is None:
        return correlated_interval(x, confidence, trim)
    level = _centred(estimate, _t_quantile(dof, confidence) * se, len(x), confidence)
    slope, slope_se, slope_dof = fit
    q = _t_quantile(min(dof, slope_dof), confidence)
    low, high = level.low, level.high
    for offset in (t[0] - t.mean(), t[-1] - t.mean()):
        centre = estimate + slope * offset
        half = q * math.hypot(se, offset * slope_se)
        low, high = min(low, centre - half), max(high, centre + half)
    return Interval(estimate, low, high, len(x), confidence)


def _finite_with_positions(
    values: Sequence[float] | np.ndarray, positions: Sequence[int] | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """The finite values and their step positions (0, 1, ... when not given)."""
    x = np.asarray(values, dtype=float).ravel()
    t = np.arange(len(x), dtype=float) if positions is None else np.asarray(positions, float)
    ok = np.isfinite(x)
    return x[ok], t[ok]


def _slope_fit(y: np.ndarray, t: np.ndarray) -> tuple[float, float, float] | None:
    """Least-squares slope of y on t, its standard error widened for correlated residuals (as
    correlated_interval widens the mean's, from the residuals' autocorrelation so the trend
    itself is not taken for correlation), and its degrees of freedom; None below three
    points."""
    n = len(y)
    if n < 3:
        return None
    tc = t - t.mean()
    sxx = float(tc @ tc)
    slope = float(tc @ (y - y.mean())) / sxx
    resid = y - y.mean() - slope * tc
    rss = float(resid @ resid)
    factor = (1 + (r := lag1_autocorrelation(resid))) / (1 - r)
    return slope, math.sqrt(rss / (n - 2) / sxx * factor), (n - 2) / factor


def trend(
    values: Sequence[float] | np.ndarray, positions: Sequence[int] | np.ndarray | None = None
) -> tuple[float, float]:
    """Least-squares slope of the steps against their positions, relative to their mean (per
    step), and its two-sided p-value, with the slope's variance widened for correlated steps
    (_slope_fit). (0.0, 1.0) below six steps."""
    y, t = _finite_with_positions(values, positions)
    return _trend(y, _slope_fit(y, t))


def _trend(y: np.ndarray, fit: tuple[float, float, float] | None) -> tuple[float, float]:
    """trend over finite values, with their slope fit already made."""
    if len(y) < 6 or fit is None or not y.mean():
        return 0.0, 1.0
    slope, se, dof = fit
    relative = slope / abs(float(y.mean()))
    if se <= 0:
        return relative, 0.0 if slope else 1.0
    return relative, float(2 * special.stdtr(max(dof, 1.0), -abs(slope) / se))


@dataclass(frozen=True)
class SteadyEstimate:
    """Steady-state summary of one metric's series."""

    metric: str
    steps: int  # finite values seen
    warmup: int  # leading values dropped as warm-up
    interval: Interval  # over the steady values less the odd ones
    odd: tuple[int, ...] = ()  # positions (among the finite values) of odd steps dropped
    trend: float = 0.0  # least-squares slope over the steady steps, relative, per step
    trend_p: float = 1.0  # its two-sided p-value
    recurring: bool = False  # far steps recur (kept as part of the steady state)
    kind: IntervalKind = "window"  # what the interval covers

    @property
    def used(self) -> int:
        return self.interval.n

    @property
    def trending(self) -> bool:
        """A significant trend that moved the level by at least TREND_MIN_MOVE over the steady
        steps: there is no steady level to report."""
        moved = abs(self.trend) * max(self.used - 1, 0)
        return self.trend_p < TREND_ALPHA and moved >= TREND_MIN_MOVE

    @property
    def not_steady(self) -> str:
        """Why the series has no steady level ("" when it has one)."""
        if not self.trending:
            return ""
        return f"not steady: trend {self.trend:+.2%} per step (p={self.trend_p:.1g})"

    def to_dict(self) -> dict[str, float | int | str]:
        iv = self.interval
        return {
            "metric": self.metric,
            "estimate": iv.estimate,
            "low": iv.low,
            "high": iv.high,
            "rel_width": iv.rel_width,
            "confidence": iv.confidence,
            "interval": self.kind,
            "steps": self.steps,
            "warmup": self.warmup,
            "odd": len(self.odd),
            "used": iv.n,
            "trend_per_step": self.trend,
            "trend_p": self.trend_p,
            "recurring": self.recurring,
            "not_steady": self.not_steady,
        }


def steady_state(
    values: Sequence[float] | np.ndarray,
    metric: str = "",
    confidence: float = 0.95,
    z: float = WARMUP_Z,
    kind: IntervalKind = "window",
) -> SteadyEstimate:
    """Drop the detected warm-up and the odd steps, then estimate the steady level with its
    interval (`kind`: see IntervalKind)."""
    return _estimate(_finite(values), metric, confidence, z, min_steady=0, kind=kind)


def _estimate(
    x: np.ndarray,
    metric: str,
    confidence: float,
    z: float,
    min_steady: int,
    kind: IntervalKind,
) -> SteadyEstimate:
    """steady_state over finite values; with fewer than `min_steady` steady values the interval
    is left unformed (NaN), which keeps the stopping rule cheap on its early calls."""
    warmup = detect_warmup(x, z)
    steady = x[warmup:]
    if len(steady) < min_steady:
        unformed = Interval(math.nan, math.nan, math.nan, len(steady), confidence)
        return SteadyEstimate(metric, len(x), warmup, unformed, kind=kind)
    recurs = recurring(steady)
    odd = odd_steps(steady)
    kept = steady[~odd]
    positions = np.flatnonzero(~odd).astype(float)
    trim = 0.0 if recurs else TRIM
    # One slope fit serves the window interval and the trend test (run after every log line).
    fit = _slope_fit(kept, positions)
    if kind == "window":
        interval = _window(kept, positions, fit, confidence, trim)
    else:
        interval = correlated_interval(kept, confidence, trim)
    slope, p = _trend(kept, fit)
    return SteadyEstimate(
        metric,
        len(x),
        warmup,
        interval,
        tuple(int(i) + warmup for i in np.flatnonzero(odd)),
        slope,
        p,
        recurs,
        kind,
    )


@dataclass(frozen=True)
class StoppingRule:
    """When a bench run has measured enough.

    Stop as soon as every watched metric has at least `min_steps` steady steps (odd ones not
    counted) and a `confidence` interval no wider than `rel_ci` of its estimate; otherwise stop
    when `max_steps` steps (warm-up included) have run.
    """

    rel_ci: float = 0.05  # the window interval's; see the module docstring
    min_steps: int = AUTOCORR_MIN_STEPS  # fewer: stops before correlation can be checked
    max_steps: int = 40
    confidence: float = 0.95
    interval: IntervalKind = "window"

    def __post_init__(self) -> None:
        if not 0 < self.rel_ci < 1:
            raise ValueError(f"rel_ci must be in (0, 1), got {self.rel_ci}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.min_steps < 3 or self.max_steps < self.min_steps:
            raise ValueError(
                f"need 3 <= min_steps <= max_steps, got {self.min_steps} and {self.max_steps}"
            )


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: StopReason
    steps: int
    estimates: dict[str, SteadyEstimate] = field(default_factory=dict)

    def precise(self, metric: str, rule: StoppingRule) -> bool:
        est = self.estimates.get(metric)
        return est is not None and is_precise(est, rule)


def is_precise(est: SteadyEstimate, rule: StoppingRule) -> bool:
    """Enough steady steps, an interval narrow enough, and no trend."""
    return est.used >= rule.min_steps and est.interval.rel_width <= rule.rel_ci and not est.trending


def decide(series: Mapping[str, Sequence[float] | np.ndarray], rule: StoppingRule) -> StopDecision:
    """Apply the stopping rule to the series observed so far (metric -> values, step order).

    Cheap enough to call after every step: intervals are only formed once a metric has
    `min_steps` steady values (or the run is at `max_steps`, to report the width reached).
    """
    steps = max((len(np.asarray(v).ravel()) for v in series.values()), default=0)
    final = steps >= rule.max_steps
    estimates: dict[str, SteadyEstimate] = {}
    all_precise = bool(series)
    for metric, values in series.items():
        est = _estimate(
            _finite(values),
            metric,
            rule.confidence,
            WARMUP_Z,
            min_steady=0 if final else rule.min_steps,
            kind=rule.interval,
        )
        estimates[metric] = est
        all_precise = all_precise and is_precise(est, rule)
    if all_precise:
        return StopDecision(True, "precise", steps, estimates)
    if final:
        return StopDecision(True, "max_steps", steps, estimates)
    return StopDecision(False, "continue", steps, estimates)


def run_until_stop(
    series: Mapping[str, Sequence[float] | np.ndarray], rule: StoppingRule
) -> StopDecision:
    """Replay a finished series step by step and return the first stopping decision (what a
    live bench would have done); the full series' decision if it never stops."""
    n = max((len(np.asarray(v).ravel()) for v in series.values()), default=0)
    arrays = {k: np.asarray(v, dtype=float).ravel() for k, v in series.items()}
    for k in range(1, n + 1):
        decision = decide({m: a[:k] for m, a in arrays.items()}, rule)
        if decision.stop:
            return decision
    return decide(arrays, rule)
