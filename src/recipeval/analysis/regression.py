"""Regression detection: is a new run's value a real change against the history's own noise?

The history of one metric is split at its change points (binary segmentation: the split with
the largest Welch t statistic, kept when significant after a Bonferroni correction over the
candidate splits and larger than the minimum magnitude; then the right-hand part is searched
again). The new value is judged against the last stable segment only, so a shift that history
already absorbed is not reported again night after night, and old levels do not inflate the
noise. The test for one new value against a segment of n values is the Student-t prediction
interval: t = (x - mean) / (s * sqrt(1 + 1/n)), n - 1 degrees of freedom. A change is reported
only when it is both significant (p < alpha) and at least `min_change` relative.

With fewer than `min_history` values in the segment the noise cannot be estimated; a change
must then exceed `short_history_band` (relative), which still catches step changes such as
miles #2040 (train_rollout_logprob_abs_diff 0.045 -> 0.213) on the first night.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats

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


@dataclass(frozen=True)
class RegressionSettings:
    min_change: float = 0.05
    alpha: float = 0.01
    min_history: int = 3
    short_history_band: float = 0.20
    min_segment: int = 2


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    kind: Kind
    value: float
    baseline: float | None
    baseline_n: int
    baseline_start: int  # index into the history where the stable segment begins
    rel_change: float | None
    p_value: float | None
    higher_is_better: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def higher_is_better(metric: str) -> bool:
    return bool(_HIGHER_IS_BETTER.search(metric))


def abs_floor(metric: str) -> float:
    return LOGPROB_ABS_FLOOR if _LOGPROB.search(metric) else 0.0


def _rel(new: float, old: float) -> float:
    if old == 0:
        return 0.0 if new == 0 else math.copysign(math.inf, new)
    return (new - old) / abs(old)


def _best_split(x: np.ndarray, min_segment: int) -> tuple[int, float]:
    """Split index with the largest |Welch t| and its p-value (1.0 when none can be formed).
    All candidate splits at once from cumulative sums (the per-split scipy call was the cost)."""
    n = len(x)
    k = np.arange(min_segment, n - min_segment + 1)
    if len(k) == 0:
        return 0, 1.0
    c1, c2 = np.cumsum(x), np.cumsum(x * x)
    n1, n2 = k.astype(float), (n - k).astype(float)
    s1, q1 = c1[k - 1], c2[k - 1]
    s2, q2 = c1[-1] - s1, c2[-1] - q1
    m1, m2 = s1 / n1, s2 / n2
    v1 = np.maximum(q1 - n1 * m1 * m1, 0.0) / (n1 - 1)
    v2 = np.maximum(q2 - n2 * m2 * m2, 0.0) / (n2 - 1)
    se2 = v1 / n1 + v2 / n2
    diff = np.abs(m1 - m2)
    # Rounding leaves tiny variances on flat segments: treat them as exactly flat.
    flat = se2 <= (1e-12 * np.maximum(np.abs(m1), np.abs(m2))) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(flat, np.where(diff > 0, np.inf, 0.0), diff / np.sqrt(se2))
    best = int(np.argmax(t))
    if not np.isfinite(t[best]):
        return int(k[best]), 0.0
    if t[best] == 0:
        return 0, 1.0
    a, b = v1[best] / n1[best], v2[best] / n2[best]
    df = (a + b) ** 2 / (a * a / (n1[best] - 1) + b * b / (n2[best] - 1))
    return int(k[best]), float(2 * stats.t.sf(t[best], df))


def change_points(
    values: Sequence[float], settings: RegressionSettings = RegressionSettings()
) -> list[int]:
    """Indices where a new level starts, searching right of each accepted split."""
    x = np.asarray(values, dtype=float)
    found: list[int] = []
    start = 0
    while len(x) - start >= 2 * settings.min_segment:
        seg = x[start:]
        k, p = _best_split(seg, settings.min_segment)
        candidates = len(seg) - 2 * settings.min_segment + 1
        if k == 0 or p * candidates >= settings.alpha:
            break
        if abs(_rel(seg[k:].mean(), seg[:k].mean())) < settings.min_change:
            break
        found.append(start + k)
        start += k
    return found


def last_stable_segment(
    values: Sequence[float], settings: RegressionSettings = RegressionSettings()
) -> tuple[int, int]:
    """[start, end) of the newest segment with at least `min_history` runs. A newer, shorter
    segment is a shift not yet established: its runs are still judged against the level before
    it, so a shift missed on its first night (noise pulled it under `min_change`) is reported
    on the next ones, until it has lasted `min_history` runs."""
    starts = [0, *change_points(values, settings)]
    end = len(values)
    if len(starts) > 1 and end - starts[-1] < settings.min_history:
        return starts[-2], starts[-1]
    return starts[-1], end


def judge(
    metric: str,
    history: Sequence[float],
    value: float,
    settings: RegressionSettings = RegressionSettings(),
) -> MetricVerdict:
    """Judge `value` against `history` (oldest first, non-finite values ignored)."""
    better_up = higher_is_better(metric)
    hist = np.asarray([v for v in history if v is not None and math.isfinite(v)], dtype=float)
    if not math.isfinite(value):
        return MetricVerdict(
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
    if len(hist) == 0:
        return MetricVerdict(
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
    start, end = last_stable_segment(hist, settings)
    seg = hist[start:end]
    mean = float(seg.mean())
    rel = _rel(value, mean)
    worse = rel > 0 if not better_up else rel < 0
    if len(seg) < settings.min_history:
        band = max(settings.min_change, settings.short_history_band)
        changed = abs(rel) >= band
        p_value = None
        reason = f"{abs(rel):.1%} vs the mean of {len(seg)} run(s); short history: band {band:.0%}"
    else:
        sd = float(seg.std(ddof=1))
        n = len(seg)
        if sd == 0:
            p_value = 0.0 if value != mean else 1.0
        else:
            t = (value - mean) / (sd * math.sqrt(1 + 1 / n))
            p_value = float(2 * stats.t.sf(abs(t), df=n - 1))
        changed = p_value < settings.alpha and abs(rel) >= settings.min_change
        reason = (
            f"{rel:+.1%} vs {mean:.4g} (last stable {n} runs, sd {sd:.3g}); p={p_value:.2g}, "
            f"needs p<{settings.alpha:g} and |change|>={settings.min_change:.0%}"
        )
    floor = abs_floor(metric)
    if changed and abs(value - mean) < floor:
        changed = False
        reason += f"; |change| {abs(value - mean):.2g} under the absolute floor {floor:g}"
    kind: Kind = ("regression" if worse else "improvement") if changed else "unchanged"
    return MetricVerdict(
        metric, kind, float(value), mean, len(seg), start, rel, p_value, better_up, reason
    )
