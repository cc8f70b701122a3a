"""Steady-state statistics on synthetic step-time traces with a known truth."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from recipeval.analysis.steady_state import (
    StoppingRule,
    decide,
    detect_warmup,
    odd_steps,
    run_until_stop,
    steady_state,
    trimmed_mean_interval,
    window_interval,
)


def trace(
    rng: np.random.Generator,
    n: int,
    warmup: int,
    mean: float = 100.0,
    noise: float = 0.03,
    outlier_rate: float = 0.05,
) -> np.ndarray:
    x = mean * (1 + noise * rng.standard_normal(n))
    x[:warmup] *= 1 + np.maximum(2.0 * 0.5 ** np.arange(warmup), 0.25)
    late = (rng.random(n) < outlier_rate) & (np.arange(n) >= warmup)
    x[late] *= 1.5
    return x


def test_warmup_of_a_plain_trace_is_found_exactly() -> None:
    x = [310.0, 190.0, 128.0, 100.4, 99.1, 101.2, 100.0, 98.7, 100.9, 99.5, 100.2, 101.0]
    assert detect_warmup(x) == 3


def test_a_lone_slow_step_later_is_not_warmup() -> None:
    x = [100.0, 99.0, 101.0, 100.5, 150.0, 99.5, 100.2, 100.8, 99.9, 100.1, 99.7, 100.3]
    assert detect_warmup(x) == 0


def test_no_warmup_short_or_constant_series() -> None:
    assert detect_warmup([5.0, 1.0]) == 0
    assert detect_warmup([7.0] * 12) == 0
    assert detect_warmup([]) == 0


def test_nan_steps_are_skipped_not_counted_as_warmup() -> None:
    x = [300.0, math.nan, 150.0, 100.0, 101.0, 99.0, 100.5, 99.5, 100.0, 100.2]
    assert detect_warmup(x) == 2


def test_warmup_within_one_step_on_random_traces() -> None:
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(200):
        w = int(rng.integers(0, 6))
        hits += abs(detect_warmup(trace(rng, 24, w)) - w) <= 1
    assert hits / 200 >= 0.95


def test_interval_matches_the_t_interval_when_nothing_is_trimmed() -> None:
    x = np.array([10.0, 10.4, 9.7, 10.1, 9.9, 10.3])  # n < 10: the 10 % trim cuts nothing
    iv = trimmed_mean_interval(x)
    low, high = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert iv.estimate == pytest.approx(x.mean())
    assert (iv.low, iv.high) == pytest.approx((low, high))


def test_interval_shrugs_off_a_wild_step() -> None:
    rng = np.random.default_rng(3)
    x = 100 * (1 + 0.02 * rng.standard_normal(20))
    x[7] = 1000.0
    iv = trimmed_mean_interval(x)
    assert iv.covers(100.0)
    assert abs(iv.estimate - 100.0) < 2.0
    assert iv.rel_width < 0.05


def test_interval_coverage_is_near_nominal() -> None:
    rng = np.random.default_rng(11)
    covered = [trimmed_mean_interval(50 + rng.standard_normal(15)).covers(50.0) for _ in range(600)]
    assert 0.92 <= np.mean(covered) <= 0.98


def test_degenerate_intervals() -> None:
    assert trimmed_mean_interval([4.0] * 5).width == 0.0
    one = trimmed_mean_interval([4.0])
    assert math.isnan(one.low) and math.isinf(one.rel_width)


def test_steady_state_reports_warmup_and_steps_used() -> None:
    x = [400.0, 200.0] + [100.0 + d for d in (0.5, -0.3, 0.2, -0.6, 0.1, 0.4, -0.2, 0.0)]
    est = steady_state(x, "perf/rollout_time")
    assert (est.warmup, est.used, est.steps) == (2, 8, 10)
    assert est.interval.covers(100.0)
    assert est.to_dict()["metric"] == "perf/rollout_time"


def test_stops_when_every_metric_is_precise() -> None:
    rng = np.random.default_rng(5)
    rule = StoppingRule(rel_ci=0.03, min_steps=5, max_steps=40)
    quiet = trace(rng, 40, 2, noise=0.005, outlier_rate=0)
    noisy = trace(rng, 40, 2, noise=0.08, outlier_rate=0)
    alone = run_until_stop({"a": quiet}, rule)
    assert alone.reason == "precise"
    assert alone.steps >= 2 + rule.min_steps
    assert alone.estimates["a"].interval.rel_width <= 0.03
    both = run_until_stop({"a": quiet, "b": noisy}, rule)
    assert both.steps > alone.steps
    assert both.precise("a", rule)


def test_never_stops_before_min_steady_steps() -> None:
    rule = StoppingRule(rel_ci=0.5, min_steps=6, max_steps=30)
    x = [300.0, 200.0] + [100.0] * 5
    assert decide({"t": x}, rule).stop is False
    assert decide({"t": x + [100.0]}, rule).reason == "precise"


def test_max_steps_reports_the_width_reached() -> None:
    rng = np.random.default_rng(2)
    rule = StoppingRule(rel_ci=0.01, min_steps=5, max_steps=12)
    decision = run_until_stop({"t": 100 * (1 + 0.2 * rng.standard_normal(30))}, rule)
    assert (decision.stop, decision.reason, decision.steps) == (True, "max_steps", 12)
    assert decision.estimates["t"].interval.rel_width > 0.01


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rel_ci": 0},
        {"rel_ci": 1.5},
        {"min_steps": 2},
        {"min_steps": 9, "max_steps": 8},
        {"confidence": 1.0},
    ],
)
def test_rule_rejects_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        StoppingRule(**kwargs)


def test_a_lone_odd_step_is_left_out_once_ten_steps_followed_it() -> None:
    x = [
        100.4,
        99.1,
        101.2,
        150.0,
        100.0,
        98.7,
        100.9,
        99.6,
        100.3,
        100.8,
        99.2,
        100.1,
        99.8,
        100.5,
    ]
    assert np.flatnonzero(odd_steps(x)).tolist() == [3]
    est = steady_state([310.0, 190.0, *x], "t")
    assert (est.warmup, est.odd, est.used) == (2, (5,), 13)
    assert est.interval.covers(100.0) and est.interval.rel_width < 0.03
    assert est.to_dict()["odd"] == 1
    # Too recent to tell from a step that recurs: kept, and the interval stays wide.
    assert not odd_steps(x[:9]).any()
    assert steady_state(x[:9]).interval.rel_width > 0.05


def test_clean_noise_almost_never_loses_a_step() -> None:
    rng = np.random.default_rng(13)
    dropped = sum(
        int(odd_steps(100 * (1 + 0.04 * rng.standard_normal(14))).sum()) for _ in range(2000)
    )
    assert dropped / (2000 * 14) < 0.002


def test_a_recurring_slow_step_is_part_of_the_steady_state() -> None:
    x = np.tile([100.0, 101.0, 99.5, 100.5, 130.0], 4)  # every fifth step slow: not odd
    assert not odd_steps(x).any()
    est = steady_state(x)
    assert est.recurring and est.interval.covers(x.mean())


def test_every_fifth_step_slow_never_reports_the_fast_level() -> None:
    # Issue 23: the first slow step was dropped as odd and the fast level reported "precise".
    rng = np.random.default_rng(17)
    rule = StoppingRule(rel_ci=0.03, min_steps=5, max_steps=40)
    for _ in range(50):
        x = 100 * (1 + 0.01 * rng.standard_normal(40))
        x[4::5] *= 1.3
        decision = run_until_stop({"t": x}, rule)
        assert decision.steps >= 10
        assert (
            decision.estimates["t"].interval.covers(100 * (1 + 0.3 / 5))
            or decision.reason != "precise"
        )


def _ar1(rng: np.random.Generator, n: int, phi: float, noise: float = 0.02) -> np.ndarray:
    e = rng.standard_normal(n) * math.sqrt(1 - phi * phi)
    z = np.empty(n)
    z[0] = rng.standard_normal()
    for i in range(1, n):
        z[i] = phi * z[i - 1] + e[i]
    return 100 * (1 + noise * z)


def test_correlated_steps_keep_the_interval_honest() -> None:
    rng = np.random.default_rng(19)
    traces = [_ar1(rng, 20, 0.5) for _ in range(400)]
    honest = np.mean([steady_state(x).interval.covers(100.0) for x in traces])
    naive = np.mean([trimmed_mean_interval(x).covers(100.0) for x in traces])
    assert honest >= 0.9 and naive < 0.85


def test_a_drift_is_not_steady() -> None:
    rng = np.random.default_rng(23)
    x = 100 * (1 + 0.002 * np.arange(30)) * (1 + 0.005 * rng.standard_normal(30))
    est = steady_state(x)
    assert est.trending and est.not_steady.startswith("not steady: trend +0.2")
    assert est.to_dict()["not_steady"] == est.not_steady
    rule = StoppingRule(rel_ci=0.05, min_steps=5, max_steps=40)
    assert decide({"t": x}, rule).stop is False  # narrow enough, but not steady


def test_a_drift_too_small_to_call_is_still_covered_at_20_steps() -> None:
    # +0.1 % a step at 2 % noise: on 20 steps the trend test rarely sees it, and the mean sits
    # half a window (+0.95 %) above the level the run started at.
    rng = np.random.default_rng(37)
    traces = [
        100 * (1 + 0.001 * np.arange(20)) * (1 + 0.02 * rng.standard_normal(20)) for _ in range(300)
    ]

    def honest(kind: str) -> float:
        estimates = [steady_state(x, kind=kind) for x in traces]  # type: ignore[arg-type]
        return float(np.mean([e.interval.covers(100.0) or e.trending for e in estimates]))

    assert honest("window") >= 0.92
    assert honest("level") < 0.85


def test_the_window_interval_holds_the_level_interval_at_about_twice_its_width() -> None:
    rng = np.random.default_rng(41)
    ratios = []
    for _ in range(200):
        x = 100 * (1 + 0.02 * rng.standard_normal(20))
        window, level = steady_state(x), steady_state(x, kind="level")
        assert (window.kind, level.kind) == ("window", "level")
        assert window.interval.low <= level.interval.low <= level.interval.high
        assert level.interval.high <= window.interval.high
        assert window.interval.estimate == level.interval.estimate
        ratios.append(window.interval.width / level.interval.width)
    assert 1.6 < float(np.median(ratios)) < 2.6
    assert steady_state([100.0] * 12).interval.width == 0.0


def test_the_window_interval_follows_the_fitted_ends_of_a_clear_trend() -> None:
    x = 100 + 0.5 * np.arange(12.0) + np.tile([0.1, -0.1], 6)
    iv = window_interval(x)
    first, last = 100.0, 105.5  # the trend's level at the first and last step
    assert iv.low < first and last < iv.high
    assert iv.estimate == pytest.approx(x.mean())


def test_steady_noise_rarely_shows_a_trend() -> None:
    rng = np.random.default_rng(29)
    trending = [steady_state(_ar1(rng, 20, phi)).trending for phi in (0.0, 0.5) for _ in range(300)]
    assert np.mean(trending) < 0.03


@pytest.mark.parametrize("shape", ["exponential", "linear"])
def test_gradual_warmups_are_found_within_a_step(shape: str) -> None:
    rng = np.random.default_rng(31)
    hits = 0
    for _ in range(200):
        w = int(rng.integers(2, 6))
        x = 100 * (1 + 0.02 * rng.standard_normal(24))
        i = np.arange(w)
        excess = 0.6 * 0.5**i if shape == "exponential" else 0.3 * (w - i) / w
        x[:w] *= 1 + excess
        hits += abs(detect_warmup(x) - w) <= 1
    assert hits / 200 >= 0.9
