"""Regression detection on synthetic histories (analysis.regression)."""

from __future__ import annotations

import numpy as np
import pytest

from recipeval.analysis.regression import RegressionSettings, change_points, higher_is_better, judge

STEP = "bench.perf/step_time"


def _noisy(n: int, level: float, cv: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(level * (1 + cv * rng.standard_normal(n)))


def test_six_percent_step_time_shift_is_flagged() -> None:
    history = _noisy(15, 474.0, 0.015, seed=1)
    verdict = judge(STEP, history, 474.0 * 1.06)
    assert verdict.kind == "regression"
    assert verdict.rel_change == pytest.approx(0.06, abs=0.01)
    assert verdict.p_value is not None and verdict.p_value < 0.01


def test_noisy_history_without_shift_is_not_flagged() -> None:
    # 200 independent histories at 3 % noise, each judged on one more draw from the same level.
    flagged = 0
    for seed in range(200):
        values = _noisy(16, 474.0, 0.03, seed=seed)
        flagged += judge(STEP, values[:-1], values[-1]).kind != "unchanged"
    assert flagged <= 2


def test_small_but_significant_change_is_below_min_change() -> None:
    history = [100.0 + 0.01 * (i % 3) for i in range(12)]
    verdict = judge(STEP, history, 103.0)  # very significant, but only 3 %
    assert verdict.kind == "unchanged" and verdict.p_value < 1e-6


def test_improvement_is_reported_with_direction() -> None:
    history = _noisy(10, 100.0, 0.01, seed=3)
    assert judge(STEP, history, 90.0).kind == "improvement"
    assert judge("bench.perf/tokens_per_gpu_per_sec", history, 90.0).kind == "regression"
    assert judge("bench.perf/tokens_per_gpu_per_sec", history, 110.0).kind == "improvement"
    assert higher_is_better("bench.perf/actor_train_tflops") and not higher_is_better(
        "bench.cycle_time"
    )


def test_absorbed_shift_is_not_reported_again() -> None:
    before = _noisy(10, 100.0, 0.01, seed=4)
    after = _noisy(4, 107.0, 0.01, seed=5)
    assert change_points(before + after) == [10]
    verdict = judge(STEP, before + after, 107.2)
    assert verdict.kind == "unchanged" and verdict.baseline_start == 10 and verdict.baseline_n == 4


def test_new_shift_is_reported_until_established() -> None:
    before = _noisy(10, 100.0, 0.01, seed=8)
    # Two nights at the new level are not yet a stable segment: the third is still judged
    # against the old level (and so would a first night that noise kept under 5 %).
    assert judge(STEP, before + [107.0, 106.8], 107.1).kind == "regression"
    assert judge(STEP, before + [107.0, 106.8, 107.2], 107.1).kind == "unchanged"


def test_logprob_jump_on_short_history_uses_the_band() -> None:
    # miles #2040: one earlier night is enough to flag 0.045 -> 0.213.
    verdict = judge("logprob_diff.train_rollout_logprob_abs_diff", [0.045], 0.213)
    assert verdict.kind == "regression" and verdict.p_value is None and verdict.baseline_n == 1
    # ...but a 10 % wobble on a 2-run history is within the short-history band.
    assert judge(STEP, [100.0, 101.0], 110.0).kind == "unchanged"


def test_logprob_metrics_have_an_absolute_floor() -> None:
    tiny = [1.8e-7, 1.9e-7, 1.7e-7, 1.8e-7]
    verdict = judge("logprob_diff.train_rollout_logprob_abs_diff", tiny, 5e-7)
    assert verdict.kind == "unchanged" and "absolute floor" in verdict.reason
    assert judge("logprob_diff.train_rollout_logprob_abs_diff", tiny, 0.05).kind == "regression"


def test_first_run_and_non_finite() -> None:
    assert judge(STEP, [], 1.0).kind == "no_history"
    assert judge(STEP, [1.0, 1.0, 1.0], float("nan")).kind == "regression"
    assert judge(STEP, [1.0, float("nan"), 1.0, 1.0], 1.0).kind == "unchanged"


def test_settings_are_honoured() -> None:
    history = _noisy(12, 100.0, 0.005, seed=6)
    assert judge(STEP, history, 104.0).kind == "unchanged"
    assert judge(STEP, history, 104.0, RegressionSettings(min_change=0.03)).kind == "regression"
