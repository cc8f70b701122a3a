"""Regression detection over a metric's nightly history: change points, not one night's outlier.

The judged series is the history since the last acknowledgement (oldest first) plus tonight's
value. It is split at its change points by binary segmentation, and a point with no
significant split left between its neighbours is dropped; the level before the first
change point is the baseline, the level after the last one is the current level, and a change
is reported, with the night where it started, on every night until someone acknowledges it
(publish.history: a shift is never absorbed into the baseline by waiting).

- Noise scale: robust, so neither a shift nor a heavy-tailed night inflates it. Residuals from
  the segments' medians; 1.4826 x MAD, then the winsorised (+/-2.5 MAD-sd) standard deviation
  rescaled to be unbiased under normal noise (about 90 % of the sd's efficiency, where the MAD
  alone has 37 %). The old design's segment sd grew about fourfold once shifted nights joined it.
- Split statistic: each side winsorised at its own median +/- 3 sigma, then
  z = (mean right - mean left) / (sigma sqrt(1/n_left + 1/n_right)). A side of one or two nights
  cannot be winsorised (its median is its own value), so those splits are judged against Student
  t with 3 degrees of freedom scaled to the same MAD. Larger sides use Student t on the residual
  degrees of freedom.
- One slow night is not a shift. The newest night alone is a change only when it is also more
  than `short_history_band` (20 %) off the level before it: a jump like miles #2040 (+370 %) is
  still caught on its first night, a single slow night of a few sigma waits for the next.
  The newest two or three nights are a change only when at least two of them lie beyond the
  earlier nights' upper (lower) quartile, in the direction of the change: a shift moves most of
  the nights after it (a 2-sigma shift puts each beyond the quartile with probability 0.91), one
  very slow night moves only itself, however far. Both cost nothing measurable on the tuned
  family and put the change at its night more often ("what changed" names the right cause).
- Multiplicity (weighted Bonferroni): the splits that leave only the newest one, two or three
  nights on the right (a shift that is starting) get 15, 15 and 50 % of alpha; all other splits
  (older shifts, drifts), which gain evidence every night, share the remaining 20 %. A
  right-hand side shorter than `min_segment` is only allowed at the newest nights, so an odd
  night inside the history is never a segment.
- False alarms per recipe and night, not per metric: `judge_many` makes one decision per
  recipe, direction and night. Each metric's one-sided "any change" p-value becomes a normal
  score, and the largest score is judged against the maximum of the recipe's scores under no
  change (step-down, as Westfall and Young's max-statistic: the next largest against the
  maximum of the rest), at alpha / 2 towards worse and alpha / 2 towards better, so a recipe's
  nightly false "regressed" and "improved" together stay at most alpha whatever the number of
  metrics. The scores' joint null is a normal with the correlation of the metrics' nightly
  residuals in the recipe's own history (Kendall's tau, mapped to a normal correlation): a
  recipe's metrics move together on a real cluster (the cycle time is rollout plus train,
  tokens/s its inverse), and a maximum over tests that move together costs less than Holm's
  alpha / m, which treats them as unrelated (four metrics that are two independent parts cost
  about 2.7 tests, not 4). Permuting nights instead (Westfall-Young's own null) cannot reach
  p-values of 1e-3 with 15-30 nights. Spending all of alpha on "regressed" (the gate fails on
  it alone) was tried before this design: on the tuned family it doubled false "regressed" to
  1.0-1.8 % of quiet recipe-nights, over the 1 % target.
- The noise scale is taken from the segments found at settings.alpha whatever level a metric is
  tested at, so its p-value is one function of the data: before, a metric that passed the recipe's
  test at alpha / 4 was segmented again at that level with the cruder scale of the nightly differences
  and could come out with no change point (a +30 % jump after six 1 %-noise nights was "ok").
- Practical significance: a change that is clear (significant) but under `min_change` is still
  reported, marked small ("small but clear"), instead of being hidden until it grows.

With fewer than `min_history` values the noise cannot be estimated; a change must then exceed
`short_history_band` (relative), which still catches step changes such as miles #2040
(train_rollout_logprob_abs_diff 0.045 -> 0.213) on the first night. Figures:
benchmarks/regression_false_alarms.py.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import special, stats

Kind = Literal["regression", "improvement", "unchanged", "no_history"]

# Logprob differences and KL near zero swing by large relative amounts without meaning (1e-7 to
# 3e-7 is +200 %): below this absolute change (nats) nothing is reported for them.
LOGPROB_ABS_FLOOR = 0.01
_LOGPROB = re.compile(r"(logprob|_kl\b|kl$)", re.IGNORECASE)

# Metric names where a larger value is better; everything else (times, logprob differences,
# KL, errors) is better when smaller.
_HIGHER_IS_BETTER = re.compile(
    r"(per_sec|per_s\b|tok_per_s|tokens_per|tflops|throughput|mfu)", re.IGNORECASE
)

MAD_TO_SIGMA = 1.4826
SCALE_WINSOR = 2.5  # residuals beyond this many MAD-sd are clipped for the noise scale
SIDE_WINSOR = 3.0  # values beyond this many sigma from their side's median are clipped
# Shares of alpha for the splits leaving the newest 1, 2, 3 nights on the right; the rest goes
# to the older splits (an established shift, a drift), which gain evidence every night. Most
# goes to three nights: one or two are judged against a heavy-tailed reference and catch only
# large jumps, which have p-values far below any share.
NEW_SHARES = (0.15, 0.15, 0.5)
SMALL_SIDE = 2  # sides this short cannot be winsorised: judged against a heavy-tailed reference
TAIL_DF = 3
# Timings are logged with a few significant digits: the noise scale never drops below this
# share of the level, so rounding alone is never a change.
MIN_REL_SIGMA = 1e-4
# E[min(Z^2, c^2)] for standard normal Z: rescales the winsorised variance to the normal one.
_WINSOR_VAR = float(
    (2 * special.ndtr(SCALE_WINSOR) - 1)
    - 2 * SCALE_WINSOR * stats.norm.pdf(SCALE_WINSOR)
    + 2 * SCALE_WINSOR**2 * special.ndtr(-SCALE_WINSOR)
)
# Median absolute value of Student t(TAIL_DF), to put the heavy-tailed reference on the MAD scale.
_TAIL_MAD = float(stats.t.ppf(0.75, TAIL_DF))
_NORMAL_MAD = float(stats.norm.ppf(0.75))
# The metrics' correlation is estimated from at least this many shared nights, else taken as
# none (independent tests: the max-statistic is then Sidak's, about Bonferroni's).
MIN_CORR_NIGHTS = 5
# Quasi-Monte Carlo points of the multivariate normal's probability, a fixed seed so that a
# verdict is one function of the data; the error (about 1e-4 at alpha / 2 = 0.005) is far
# under the level's own uncertainty. The ridge keeps metrics that mirror each other (cycle
# time and tokens/s) from making the matrix singular.
MVN_POINTS = 10_000
CORR_RIDGE = 1e-6


# The change night's confidence set: the splits whose two-level fit is worse than the best
# split's by at most -2 log(CHANGE_WINDOW_LEVEL / 2) in squared noise sds. Under a shift the
# log-likelihood's profile around the true night is close to a two-sided random walk with
# drift, whose excursion beyond u has probability about 2 exp(-u) (Hinkley 1970), so the set
# holds the true night in about 1 - CHANGE_WINDOW_LEVEL of shifts.
CHANGE_WINDOW_LEVEL = 0.05
_CHANGE_WINDOW_RSS = -2 * math.log(CHANGE_WINDOW_LEVEL / 2)


class RegressionSettingError(ValueError):
    """A regression setting out of range; `name` is the RegressionSettings field, so each
    front end (command line, config, benchmark) can name it in its own terms."""

    def __init__(self, name: str, value: float, expected: str) -> None:
        super().__init__(f"{name} {value:g}: must be {expected}")
        self.name = name
        self.value = value
        self.expected = expected


@dataclass(frozen=True)
class RegressionSettings:
    min_change: float = 0.05  # practical significance: clear changes under it are "small"
    alpha: float = 0.01  # false alarms per recipe and night (max-statistic over its metrics)
    min_history: int = 3
    short_history_band: float = 0.20
    min_segment: int = 2  # shortest segment inside the history (the newest nights may be fewer)

    def __post_init__(self) -> None:
        # Written so NaN fails every bound; alpha 2 would call every night a change.
        bounds = (
            ("min_change", 0 <= self.min_change <= 1, "between 0 and 1"),
            ("alpha", 0 < self.alpha < 1, "strictly between 0 and 1 (e.g. 0.01)"),
            ("min_history", self.min_history >= 2, "at least 2"),
            ("short_history_band", self.short_history_band >= 0, "0 or more"),
            ("min_segment", self.min_segment >= 1, "at least 1"),
        )
        for name, ok, expected in bounds:
            if not ok:
                raise RegressionSettingError(name, getattr(self, name), expected)


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    kind: Kind
    value: float
    baseline: float | None
    baseline_n: int
    baseline_start: int  # index into the history where the baseline segment begins
    rel_change: float | None
    p_value: float | None
    higher_is_better: bool
    reason: str
    # Index, in history + [value], of the first night at the new level (None: no change point).
    change_index: int | None = None
    small: bool = False  # significant but under min_change: "small but clear"
    # The change in noise sds (level after the last change point against the baseline): where
    # it is largest, the change point is located best.
    change_sd: float | None = None
    # First and last index (as change_index) of the nights the change may have started on, at
    # CHANGE_WINDOW_LEVEL: a shift of a few noise sds cannot be placed to the night.
    change_window: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def higher_is_better(metric: str) -> bool:
    return bool(_HIGHER_IS_BETTER.search(metric))


def abs_floor(metric: str) -> float:
    return LOGPROB_ABS_FLOOR if _LOGPROB.search(metric) else 0.0


def _rel(new: float, old: float) -> float | None:
    """(new - old) / |old|; None where it has no finite value (a baseline of 0), which the
    verdict JSON could not hold (JSON has no Infinity) and the tables show as n/a."""
    if old == 0:
        return None
    rel = (new - old) / abs(old)
    return rel if math.isfinite(rel) else None


def _pct(rel: float | None, sign: str = "+") -> str:
    """A relative change for a reason: +12.3%, +3.4e+09% past a million per cent (a
    hand-edited value: fixed notation would print hundreds of digits), or n/a (see _rel)."""
    if rel is None:
        return "n/a"
    return f"{rel:{sign}.1%}" if abs(rel) < 1e4 else f"{rel * 100:{sign}.2g}%"


def _kind(changed: bool, delta: float, better_up: bool) -> Kind:
    """By the sign of the change, which exists where its relative size does not (_rel)."""
    if not changed:
        return "unchanged"
    return "regression" if (delta < 0 if better_up else delta > 0) else "improvement"


def _segments(n: int, starts: Sequence[int]) -> list[tuple[int, int]]:
    bounds = [0, *sorted(starts), n]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def noise_scale(values: Sequence[float] | np.ndarray, starts: Sequence[int] | None = None) -> float:
    """Robust night-to-night noise sd of `values` split at `starts` (see the module docstring).
    Without `starts` (change points not yet known) it is taken from the nightly differences,
    divided by sqrt(2): a shift moves only one difference, where it would move every residual
    from a median."""
    x = np.asarray(values, dtype=float)
    if starts is None:
        resid = np.diff(x) / math.sqrt(2)
    else:
        # A one-night segment is its own median: its zero residual says nothing of the noise.
        parts = [x[a:b] - np.median(x[a:b]) for a, b in _segments(len(x), starts) if b - a > 1]
        resid = np.concatenate(parts) if parts else np.diff(x) / math.sqrt(2)
    floor = MIN_REL_SIGMA * float(np.median(np.abs(x))) if len(x) else 0.0
    mad_sd = MAD_TO_SIGMA * float(np.median(np.abs(resid - np.median(resid))))
    if mad_sd <= 0:
        return max(floor, np.finfo(float).tiny)
    clipped = np.clip(resid - np.median(resid), -SCALE_WINSOR * mad_sd, SCALE_WINSOR * mad_sd)
    return max(math.sqrt(float(np.mean(clipped**2)) / _WINSOR_VAR), floor)


def _winsorised_mean(x: np.ndarray, sigma: float) -> float:
    med = float(np.median(x))
    return float(np.clip(x, med - SIDE_WINSOR * sigma, med + SIDE_WINSOR * sigma).mean())


def _split_z(left: np.ndarray, right: np.ndarray, sigma: float) -> float:
    """Standardised level change between two sides, each winsorised at its own median."""
    diff = _winsorised_mean(right, sigma) - _winsorised_mean(left, sigma)
    return diff / (sigma * math.sqrt(1 / len(left) + 1 / len(right)))


def _all_split_z(seg: np.ndarray, sigma: float) -> np.ndarray:
    """_split_z at every split k = 1 .. len(seg) - 1 at once (row k-1 of a masked matrix)."""
    n = len(seg)
    k = np.arange(1, n)
    left_mask = np.arange(n)[None, :] < k[:, None]
    means = []
    for mask in (left_mask, ~left_mask):
        side = np.where(mask, seg[None, :], np.nan)
        med = np.nanmedian(side, axis=1, keepdims=True)
        means.append(
            np.nanmean(np.clip(side, med - SIDE_WINSOR * sigma, med + SIDE_WINSOR * sigma), axis=1)
        )
    return (means[1] - means[0]) / (sigma * np.sqrt(1 / k + 1 / (n - k)))


def _two_sided_p(z: np.ndarray, smaller_side: np.ndarray, df: float) -> np.ndarray:
    """Two-sided p-values of split statistics; sides of SMALL_SIDE nights or fewer against the
    heavy-tailed reference on the MAD scale (see the module docstring)."""
    heavy = 2 * special.stdtr(TAIL_DF, -np.abs(z) * _TAIL_MAD / _NORMAL_MAD)
    light = 2 * special.stdtr(df, -np.abs(z))
    return np.where(smaller_side <= SMALL_SIDE, heavy, light)


def _newest_night_p(left: np.ndarray, night: float, sigma: float, band: float) -> float:
    """Two-sided p-value of a change at the newest night alone: against the heavy-tailed
    reference, and only when the night is also more than `band` (relative) off the level
    before it (see the module docstring)."""
    level = _winsorised_mean(left, sigma)
    if abs(night - level) < band * abs(level):
        return 1.0
    z = abs(night - level) / (sigma * math.sqrt(1 + 1 / len(left)))
    return float(2 * special.stdtr(TAIL_DF, -z * _TAIL_MAD / _NORMAL_MAD))


def _most_moved(left: np.ndarray, newest: np.ndarray, rise: bool) -> bool:
    """Whether at least two of the newest nights lie beyond the left side's upper (lower)
    quartile, the direction of the change: a shift moves most of the nights after it, a slow
    night only itself (see the module docstring)."""
    if rise:
        return int(np.sum(newest > np.quantile(left, 0.75))) >= 2
    return int(np.sum(newest < np.quantile(left, 0.25))) >= 2


def _best_split(
    x: np.ndarray,
    a: int,
    b: int,
    n: int,
    sigma: float,
    df: float,
    settings: RegressionSettings,
) -> tuple[int, float, float]:
    """Most significant split of x[a:b], its multiplicity-adjusted two-sided p-value (weighted
    Bonferroni with the NEW_SHARES of alpha) and its statistic. (0, 1.0, 0.0) when none can be
    formed."""
    newest = list(range(max(a + settings.min_segment, b - len(NEW_SHARES)), b)) if b == n else []
    inner = [
        k for k in range(a + settings.min_segment, b - settings.min_segment + 1) if k not in newest
    ]
    ks = np.array(newest + inner, dtype=int)
    if len(ks) == 0:
        return 0, 1.0, 0.0
    z = _all_split_z(x[a:b], sigma)[ks - a - 1]
    p_raw = _two_sided_p(z, np.minimum(ks - a, b - ks), df)
    for i, k in enumerate(newest):
        if b - k > 1 and not _most_moved(x[a:k], x[k:b], z[i] > 0):
            p_raw[i] = 1.0
    if newest and newest[-1] == b - 1:
        p_raw[len(newest) - 1] = _newest_night_p(
            x[a : b - 1], x[b - 1], sigma, settings.short_history_band
        )
    # Each split's share of alpha: the newest by how many nights they leave on the right, the
    # older ones equally; renormalised over the splits this segment has.
    older = (1 - sum(NEW_SHARES)) / len(inner) if inner else 0.0
    share = np.array([NEW_SHARES[b - k - 1] for k in newest] + [older] * len(inner))
    p = np.minimum(1.0, p_raw * share.sum() / share)
    best = int(np.argmin(p))
    return int(ks[best]), float(p[best]), float(z[best])


def change_points(
    values: Sequence[float],
    settings: RegressionSettings = RegressionSettings(),
    alpha: float | None = None,
) -> list[int]:
    """Indices where a new level starts (binary segmentation at two-sided level `alpha`,
    default settings.alpha; see the module docstring)."""
    return _segmentation(
        np.asarray(values, dtype=float), settings, settings.alpha if alpha is None else alpha
    )[0]


def _segmentation(
    x: np.ndarray, settings: RegressionSettings, alpha: float
) -> tuple[list[int], float, float, float]:
    """(change points at two-sided level `alpha`, the first split's adjusted two-sided p-value
    and statistic, noise sd). The noise scale comes from the segments found at settings.alpha,
    whatever `alpha` is: the first split's p-value is then one function of the data and the
    settings, the same at every level the recipe's test tries it at."""
    sigma = noise_scale(x)
    rough, _, _ = _binary_segmentation(x, sigma, settings, settings.alpha, 0)
    if rough:
        sigma = noise_scale(x, _refine(x, sorted(rough)))
    found, first_p, first_z = _binary_segmentation(x, sigma, settings, alpha, len(rough))
    points = _prune(x, _refine(x, sorted(found)), sigma, settings, alpha, len(rough))
    return points, first_p, first_z, sigma


def _prune(
    x: np.ndarray,
    points: list[int],
    sigma: float,
    settings: RegressionSettings,
    alpha: float,
    known: int,
) -> list[int]:
    """`points` less those with no significant split between their neighbours, the weakest
    first. Binary segmentation's first split can land among the nights before a shift while
    the shift's own nights make it significant; once the shift has its own point, the
    first one is left in quiet nights, and "what changed" would name its night."""
    n = len(x)
    df = max(1.0, 0.9 * (n - known - 1))
    out = list(points)
    while out:
        p = [
            _best_split(x, *_neighbours(out, i, n), n, sigma, df, settings)[1]
            for i in range(len(out))
        ]
        weakest = int(np.argmax(p))
        if p[weakest] < alpha:
            return out
        del out[weakest]
        out = _refine(x, out)
    return out


def _binary_segmentation(
    x: np.ndarray, sigma: float, settings: RegressionSettings, alpha: float, known: int
) -> tuple[list[int], float, float]:
    """Split points with adjusted p under `alpha`, and the top split's p and statistic; `known`
    change points are taken off the residual degrees of freedom."""
    n = len(x)
    df = max(1.0, 0.9 * (n - known - 1))
    found: list[int] = []
    pending = [(0, n)]
    first: tuple[float, float] | None = None
    while pending:
        a, b = pending.pop()
        k, p, z = _best_split(x, a, b, n, sigma, df, settings)
        if first is None:
            first = (p, z)
        if k and p < alpha:
            found.append(k)
            pending += [(a, k), (k, b)]
    p_first, z_first = first or (1.0, 0.0)
    return found, p_first, z_first


def _between_levels(seg: np.ndarray) -> np.ndarray:
    """Between-levels sum of squares of the two-level fit at every split k = 1 .. len(seg) - 1
    (entry k - 1): the total sum of squares less the fit's RSS, so its largest entry is the
    least-squares split."""
    k = np.arange(1, len(seg))
    left = np.cumsum(seg)[:-1] / k
    right = (seg.sum() - left * k) / (len(seg) - k)
    return (right - left) ** 2 * k * (len(seg) - k) / len(seg)


def _neighbours(points: Sequence[int], i: int, n: int) -> tuple[int, int]:
    """The segment of x (length n) that change point points[i] splits: from the previous
    change point to the next (points sorted)."""
    return (points[i - 1] if i else 0), (points[i + 1] if i + 1 < len(points) else n)


def change_window(
    x: np.ndarray, points: Sequence[int], index: int, sigma: float
) -> tuple[int, int]:
    """The nights change point `index` (one of the sorted `points`, in x) may have started on:
    the run of splits between its neighbouring change points whose two-level fit is within
    _CHANGE_WINDOW_RSS squared noise sds of the best one (see CHANGE_WINDOW_LEVEL)."""
    lo, hi = _neighbours(points, list(points).index(index), len(x))
    between = _between_levels(x[lo:hi])
    inside = (between[index - lo - 1] - between) / sigma**2 <= _CHANGE_WINDOW_RSS
    start = end = index - lo - 1
    while start > 0 and inside[start - 1]:
        start -= 1
    while end + 1 < len(inside) and inside[end + 1]:
        end += 1
    return lo + 1 + start, lo + 1 + end


def _refine(x: np.ndarray, points: list[int]) -> list[int]:
    """Move each change point to the least-squares split between its neighbours (largest
    between-levels sum of squares): the search weighs the newest splits by their
    reference distribution and winsorises each side, which can favour a right side of three
    nights (one of them clipped) over the two that really moved; "what changed" needs the
    right night."""
    out = list(points)
    for i in range(len(out)):
        lo, hi = _neighbours(out, i, len(x))
        out[i] = lo + 1 + int(np.argmax(_between_levels(x[lo:hi])))
    return out


@dataclass(frozen=True)
class _Candidate:
    metric: str
    history: np.ndarray
    value: float
    p_worse: float  # one-sided p-value of the top split, towards worse
    p_better: float  # ...and towards better
    # The history's residuals from its segments' medians, signed so that worse is positive.
    residuals: np.ndarray


def judge(
    metric: str,
    history: Sequence[float],
    value: float,
    settings: RegressionSettings = RegressionSettings(),
) -> MetricVerdict:
    """Judge `value` after `history` (oldest first, non-finite values ignored), one metric alone."""
    return judge_many({metric: (history, value)}, settings)[metric]


def _clean(history: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in history if v is not None and math.isfinite(v)], dtype=float)


def metric_correlation(residuals: Sequence[np.ndarray]) -> np.ndarray:
    """Correlation matrix of the metrics' nightly residuals (one row a metric, the same nights
    in each): Kendall's tau mapped to a normal correlation (sin(pi tau / 2), robust to heavy
    tails and odd nights), made positive semi-definite. The identity when the rows are not
    the same nights (unequal lengths) or too short to tell."""
    m = len(residuals)
    corr = np.eye(m)
    n = len(residuals[0]) if m else 0
    if m < 2 or n < MIN_CORR_NIGHTS or any(len(r) != n for r in residuals):
        return corr
    for i, j in itertools.combinations(range(m), 2):
        tau = stats.kendalltau(residuals[i], residuals[j]).statistic
        corr[i, j] = corr[j, i] = math.sin(math.pi / 2 * tau) if math.isfinite(tau) else 0.0
    # Pairwise estimates need not form a correlation matrix: clip the negative eigenvalues.
    eigval, eigvec = np.linalg.eigh(corr)
    corr = (eigvec * np.maximum(eigval, 0.0)) @ eigvec.T
    scale = np.sqrt(np.diag(corr))
    return corr / np.outer(scale, scale)


def _max_p(z: float, corr: np.ndarray) -> float:
    """P(max of len(corr) standard normals with correlation `corr` > z)."""
    if len(corr) == 1:
        return float(special.ndtr(-z))
    inside = stats.multivariate_normal.cdf(
        np.full(len(corr), z),
        cov=corr + CORR_RIDGE * np.eye(len(corr)),
        maxpts=MVN_POINTS,
        abseps=1e-5,
        releps=0,
        rng=np.random.default_rng(0),
    )
    return float(min(1.0, max(0.0, 1.0 - inside)))


def max_statistic_levels(p_values: Sequence[float], corr: np.ndarray, alpha: float) -> list[float]:
    """One-sided p-values of correlated tests -> the level each passed at (0.0: not passed),
    keeping the chance of any false pass at `alpha`: the step-down max-statistic (Westfall and
    Young) with the tests' joint null a normal with correlation `corr`. The smallest p-value
    is judged by the maximum over all tests, the next over the rest, and so on. A passed
    test's level (its segmentation level) is Sidak's for the effective number of tests,
    log(1 - P(max > z)) / log(1 - P(Z > z)), taken at Bonferroni's point z (a single test at
    alpha / k): that number changes slowly with z, so this is close to the raw level at which
    the test would just have passed, without a root search over the multivariate normal, and
    it is taken where the normal's probability is accurate, not at a p-value of 1e-12."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    levels = [0.0] * len(p_values)
    for step, i in enumerate(order):
        p = p_values[i]
        if p >= alpha:  # the maximum's p-value is never below a single test's
            break
        rest = order[step:]
        sub = corr[np.ix_(rest, rest)]
        if _max_p(float(special.ndtri(1 - max(p, 1e-300))), sub) >= alpha:
            break
        bonferroni = alpha / len(rest)
        at_point = _max_p(float(special.ndtri(1 - bonferroni)), sub)
        tests = min(max(math.log1p(-at_point) / math.log1p(-bonferroni), 1.0), len(rest))
        levels[i] = max(-math.expm1(math.log1p(-alpha) / tests), p)
    return levels


def judge_many(
    series: Mapping[str, tuple[Sequence[float], float]],
    settings: RegressionSettings = RegressionSettings(),
) -> dict[str, MetricVerdict]:
    """Judge one recipe's metrics together (metric -> (history, tonight's value)): the
    recipe's nightly false-alarm rate is held at `alpha` by the step-down max-statistic over
    the metrics' "any change" p-values, their correlation taken from the recipe's own nights
    (metric_correlation; see the module docstring)."""
    out: dict[str, MetricVerdict] = {}
    candidates: list[_Candidate] = []
    for metric, (history, value) in series.items():
        hist = _clean(history)
        better_up = higher_is_better(metric)
        if not math.isfinite(value):
            out[metric] = MetricVerdict(
                metric,
                "regression",
                value,
                None,
                len(hist),
                0,
                None,
                None,
                better_up,
                "value is not finite",
            )
        elif len(hist) == 0:
            out[metric] = MetricVerdict(
                metric,
                "no_history",
                value,
                None,
                0,
                0,
                None,
                None,
                better_up,
                "first run of this metric",
            )
        elif len(hist) < settings.min_history:
            out[metric] = _short_history(metric, hist, value, settings)
        else:
            x = np.append(hist, value)
            points, p_two, z, _ = _segmentation(x, settings, settings.alpha)
            worse = (z > 0) != better_up
            toward, away = p_two / 2, min(1.0, 1 - p_two / 2)
            resid = np.concatenate(
                [x[a:b] - np.median(x[a:b]) for a, b in _segments(len(x), points)]
            )
            candidates.append(
                _Candidate(
                    metric,
                    hist,
                    float(value),
                    *((toward, away) if worse else (away, toward)),
                    resid[:-1] * (-1.0 if better_up else 1.0),
                )
            )
    # Once per direction at alpha / 2. A metric that passes is segmented at twice its level
    # two-sided (its level in that direction).
    corr = metric_correlation([c.residuals for c in candidates])
    levels: dict[str, float] = {}
    for key in ("p_worse", "p_better"):
        passed = max_statistic_levels(
            [getattr(c, key) for c in candidates], corr, settings.alpha / 2
        )
        for cand, level in zip(candidates, passed, strict=True):
            if level > 0:
                levels[cand.metric] = 2 * level
    for cand in candidates:
        out[cand.metric] = _verdict(cand, settings, levels.get(cand.metric, 0.0))
    return {m: out[m] for m in series}


def _short_history(
    metric: str, hist: np.ndarray, value: float, settings: RegressionSettings
) -> MetricVerdict:
    mean = float(hist.mean())
    rel = _rel(value, mean)
    band = max(settings.min_change, settings.short_history_band)
    # No relative change (a mean of 0): any change is beyond the band.
    changed = value != mean if rel is None else abs(rel) >= band
    reason = (
        f"{_pct(None if rel is None else abs(rel), '')} vs the mean of {len(hist)} run(s); short history: "
        f"band {band:.0%}"
    )
    changed, reason = _apply_floor(metric, changed, value - mean, reason)
    better_up = higher_is_better(metric)
    kind = _kind(changed, value - mean, better_up)
    return MetricVerdict(
        metric,
        kind,
        float(value),
        mean,
        len(hist),
        0,
        rel,
        None,
        better_up,
        reason,
        len(hist) if changed else None,
    )


def _apply_floor(metric: str, changed: bool, delta: float, reason: str) -> tuple[bool, str]:
    floor = abs_floor(metric)
    if changed and abs(delta) < floor:
        return False, reason + f"; |change| {abs(delta):.2g} under the absolute floor {floor:g}"
    return changed, reason


def _verdict(cand: _Candidate, settings: RegressionSettings, level: float) -> MetricVerdict:
    """The verdict of one metric whose "any change" test was run at `level` (0: failed the recipe's test)."""
    metric, value = cand.metric, cand.value
    better_up = higher_is_better(metric)
    x = np.append(cand.history, value)
    points, _, _, sigma = (
        _segmentation(x, settings, level) if level > 0 else ([], 1.0, 0.0, noise_scale(x, []))
    )
    first, last = (points[0], points[-1]) if points else (len(x), 0)
    base, current = x[:first], x[last:]
    baseline = float(np.median(base))
    if not points:
        rel = _rel(value, baseline)
        reason = (
            f"{_pct(rel)} vs {baseline:.4g} (median of {len(base)} runs, noise sd {sigma:.3g}); "
            f"no change point at alpha {settings.alpha:g} per recipe and night"
        )
        return MetricVerdict(
            metric,
            "unchanged",
            value,
            baseline,
            len(base),
            0,
            rel,
            min(cand.p_worse, cand.p_better),
            better_up,
            reason,
        )
    level_now = float(np.median(current))
    rel = _rel(level_now, baseline)
    df = max(1.0, 0.9 * (len(x) - len(points) - 1))
    p_net = float(
        _two_sided_p(
            np.array([_split_z(base, current, sigma)]), np.array([min(len(base), len(current))]), df
        )[0]
    )
    changed = p_net < settings.alpha  # one-sided at alpha / 2, in the direction it moved
    nights = len(x) - first
    reason = (
        f"{_pct(rel)}: level {level_now:.4g} over the last {len(current)} night(s) against "
        f"{baseline:.4g} before the change point {nights} night(s) ago (noise sd "
        f"{sigma:.3g}, p={p_net:.2g}, {len(points)} change point(s))"
    )
    changed, reason = _apply_floor(metric, changed, level_now - baseline, reason)
    small = changed and rel is not None and abs(rel) < settings.min_change
    if small:
        reason = f"small but clear: {reason}; under min_change {settings.min_change:.0%}"
    if not changed:
        reason += "; the level returned: no net change"
    kind = _kind(changed, level_now - baseline, better_up)
    return MetricVerdict(
        metric,
        kind,
        value,
        baseline,
        len(base),
        0,
        rel,
        p_net,
        better_up,
        reason,
        first if changed else None,
        small,
        (level_now - baseline) / sigma if changed else None,
        change_window(x, points, first, sigma) if changed else None,
    )
