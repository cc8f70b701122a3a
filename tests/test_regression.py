"""Regression detection on synthetic histories (analysis.regression)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from publish_fixtures import AMD_RECIPE, night, write_run

from recipeval.analysis.regression import (
    RegressionSettingError,
    RegressionSettings,
    change_points,
    change_window,
    higher_is_better,
    judge,
    judge_many,
    max_statistic_levels,
    metric_correlation,
)
from recipeval.publish.compare import judge_run
from recipeval.publish.records import RunRecord, StageSummary

STEP = "bench.perf/step_time"
QUIET = ("bench.perf/rollout_time", "bench.perf/actor_train_time", "bench.cycle_time")


def _noisy(n: int, level: float, cv: float, seed: int, tails: str = "gauss") -> list[float]:
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(n) if tails == "gauss" else rng.standard_t(3, n) / np.sqrt(3.0)
    return list(level * (1 + cv * noise))


def _nights(history: list[float], new: list[float], metric: str = STEP) -> list:
    """The verdict of each new night, judged after everything before it."""
    return [judge(metric, history + new[:i], new[i]) for i in range(len(new))]


def test_six_percent_shift_is_caught_within_three_nights_at_its_night() -> None:
    history = _noisy(15, 474.0, 0.015, seed=1)
    shifted = [v * 1.06 for v in _noisy(8, 474.0, 0.015, seed=2)]
    verdicts = _nights(history, shifted)
    first = next(i for i, v in enumerate(verdicts) if v.kind == "regression")
    assert first <= 2
    # Once found, the shift stays reported on every later night, at the night it started.
    for v in verdicts[first:]:
        assert v.kind == "regression" and v.change_index == 15
        assert v.rel_change == pytest.approx(0.06, abs=0.025)  # median of the nights since
        assert v.p_value is not None and v.p_value < 0.01


def test_shift_is_never_absorbed_and_acknowledging_ends_it() -> None:
    before = _noisy(10, 100.0, 0.01, seed=4)
    after = _noisy(12, 107.0, 0.01, seed=5)
    assert change_points(before + after) == [10]
    verdict = judge(STEP, before + after, 107.2)
    assert verdict.kind == "regression" and verdict.change_index == 10 and verdict.baseline_n == 10
    assert "22 night(s) ago" not in verdict.reason and "13 night(s) ago" in verdict.reason
    # Acknowledged (publish starts the history at the change run): the new level is the norm.
    assert judge(STEP, after, 107.2).kind == "unchanged"


def test_noisy_history_without_shift_is_not_flagged() -> None:
    # 200 independent histories at 3 % noise, each judged on one more draw from the same level:
    # each direction is tested at alpha 1 %.
    kinds = []
    for seed in range(200):
        values = _noisy(16, 474.0, 0.03, seed=seed)
        kinds.append(judge(STEP, values[:-1], values[-1]).kind)
    assert kinds.count("regression") <= 2 and kinds.count("improvement") <= 2


def test_heavy_tailed_quiet_recipes_rarely_regress() -> None:
    # Four metrics a recipe, Student t (3 df) noise: false alarms are per recipe, not per metric.
    flagged = 0
    for seed in range(150):
        series = {
            m: _noisy(21, 100.0, 0.02, seed=1000 * seed + i, tails="t3")
            for i, m in enumerate((STEP, *QUIET))
        }
        verdicts = judge_many({m: (v[:-1], v[-1]) for m, v in series.items()})
        flagged += any(v.kind == "regression" for v in verdicts.values())
    assert flagged <= 3


def test_false_alarms_are_controlled_per_recipe_by_the_max_statistic() -> None:
    history = _noisy(20, 100.0, 0.01, seed=11)
    # The smallest three-night step that one metric judged alone calls a regression...
    value = next(
        v
        for v in np.arange(100.0, 120.0, 0.1)
        if judge(STEP, [*history, v, v], v).kind == "regression"
    )
    # ...is not one when the recipe has three more (quiet, independent) metrics: the maximum
    # over four independent tests needs about alpha / 4 each.
    others = {m: (_noisy(20, 50.0, 0.01, seed=20 + i), 50.0) for i, m in enumerate(QUIET)}
    together = judge_many({STEP: ([*history, value, value], value), **others})
    assert together[STEP].kind == "unchanged"
    assert all(v.kind == "unchanged" for v in together.values())


def test_correlated_metrics_cost_less_than_independent_ones() -> None:
    # A cycle time that is the sum of its parts, and tokens/s its inverse, are measured from
    # the recipe's own nights as correlated (signed so that worse is positive)...
    rng = np.random.default_rng(3)
    train, rollout = rng.standard_normal(20), rng.standard_normal(20)
    corr = metric_correlation([train, train + rollout, train + rollout])
    assert corr[1, 2] == pytest.approx(1.0, abs=1e-6)
    assert 0.4 < corr[0, 1] < 0.95 and np.allclose(corr, corr.T)
    # ...and nights that do not line up are taken as independent.
    assert np.array_equal(metric_correlation([train, rollout[:15]]), np.eye(2))
    # A p-value of 0.004 passes at 0.005 when the other three tests are copies of it, not when
    # they are independent (about 0.005 / 4 each); the smallest passes first (step-down).
    p_values = [0.004, 0.3, 0.0002, 0.6]
    independent = max_statistic_levels(p_values, np.eye(4), 0.005)
    assert independent[2] == pytest.approx(1 - (1 - 0.005) ** 0.25, rel=0.02)
    assert independent[0] == 0.0 and independent[1] == independent[3] == 0.0
    copies = max_statistic_levels(p_values, np.full((4, 4), 0.999) + 0.001 * np.eye(4), 0.005)
    assert copies[0] > 0.004 and copies[2] > 0.004 and copies[1] == 0.0


def test_small_but_clear_change_is_reported_as_such() -> None:
    history = [100.0 + 0.01 * (i % 3) for i in range(12)]
    verdict = judge(STEP, history, 103.0)  # very significant, but only 3 %
    assert verdict.kind == "regression" and verdict.small
    assert verdict.reason.startswith("small but clear") and "min_change 5%" in verdict.reason
    assert not judge(STEP, history, 106.0).small


def test_creeping_drift_is_caught_within_ten_nights() -> None:
    history = _noisy(15, 100.0, 0.01, seed=12)
    drift = [v * (1 + 0.005 * (i + 1)) for i, v in enumerate(_noisy(10, 100.0, 0.01, seed=13))]
    assert any(v.kind == "regression" for v in _nights(history, drift))


def test_improvement_is_reported_with_direction() -> None:
    history = _noisy(10, 100.0, 0.01, seed=3)
    assert judge(STEP, history + [90.0, 90.2], 89.9).kind == "improvement"
    tokens = "bench.perf/tokens_per_gpu_per_sec"
    assert judge(tokens, history + [90.0, 90.2], 89.9).kind == "regression"
    assert judge(tokens, history + [110.0, 110.2], 109.9).kind == "improvement"
    assert higher_is_better("bench.perf/actor_train_tflops") and not higher_is_better(
        "bench.cycle_time"
    )


def test_odd_night_inside_the_history_is_not_a_change() -> None:
    history = _noisy(20, 100.0, 0.01, seed=14)
    history[9] = 130.0
    assert change_points(history) == []
    assert judge(STEP, history, 100.5).kind == "unchanged"


def test_one_slow_night_is_not_a_shift_but_two_are() -> None:
    history = _noisy(15, 100.0, 0.01, seed=21)
    # A night 12 sigma slow (a slow node) is far out, yet one night: not a change on its own.
    assert judge(STEP, history, 112.0).kind == "unchanged"
    # ...nor when the next night is back at the level: one night moved, not most of them.
    assert judge(STEP, [*history, 112.0], 100.3).kind == "unchanged"
    assert judge(STEP, [*history, 112.0, 100.3], 99.8).kind == "unchanged"
    # Two nights at the new level are a shift, found at its first night.
    verdict = judge(STEP, [*history, 112.0], 111.5)
    assert verdict.kind == "regression" and verdict.change_index == 15
    # A gross jump (beyond the 20 % band) is a change on its first night.
    assert judge(STEP, history, 130.0).kind == "regression"


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
    history = _noisy(12, 100.0, 0.005, seed=6) + [104.1, 103.9]
    assert judge(STEP, history, 104.0).small
    verdict = judge(STEP, history, 104.0, RegressionSettings(min_change=0.03))
    assert verdict.kind == "regression" and not verdict.small


def _publish(tmp: Path, n: int, cycle: float, packages: dict | None = None) -> dict:
    results = tmp / f"night{n}"
    write_run(results, AMD_RECIPE, night(n), cycle=cycle, packages=packages)
    proc = _cli(
        "publish",
        str(results),
        "--history",
        str(tmp / "history"),
        "--tables",
        str(results / "tables"),
        "--junit",
        str(results / "junit.xml"),
        "--verdict",
        str(results / "regression.json"),
        "--no-plots",
    )
    assert proc.returncode == 0, proc.stderr
    (verdict,) = json.loads((results / "regression.json").read_text())["recipes"]
    verdict["html"] = (results / "tables" / "benchmarks.html").read_text()
    return verdict


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("recipeval")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, check=False)


def test_acknowledge_command_ends_a_reported_shift(tmp_path: Path) -> None:
    for n, wobble in enumerate([1.0, 1.01, 0.99, 1.0, 1.01, 0.995]):
        assert _publish(tmp_path, n, 474 * wobble)["status"] == "ok"
    bumped = {"sglang": "0.5.16", "torch": "2.9.2", "megatron-core": "0.16.0"}
    first = _publish(tmp_path, 6, 474 * 1.3, bumped)
    assert first["status"] == "regressed"
    # Reported again the next night, as a step at the same run; "what changed" is against the
    # run before the change point (the page says so), not last night's already shifted run.
    again = _publish(tmp_path, 7, 474 * 1.31, bumped)
    assert again["status"] == "regressed" and again["change_run"] == first["run_id"]
    assert [c["key"] for c in again["changes"]] == ["torch"]
    assert "the last run before the change point" in again["html"]
    assert "last good run" not in again["html"]
    history = str(tmp_path / "history")
    recipe = first["recipe"]
    for bad, says in (
        (["no-such-run"], "no run no-such-run of recipe"),
        (["../x"], "run id name '../x' cannot be a file name"),
        ([first["run_id"], "--metric", "bench.metrics.nope"], "has no metric 'bench.metrics.nope'"),
    ):
        proc = _cli("acknowledge", recipe, *bad, "--history", history)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
    afile = tmp_path / "afile"
    afile.write_text("")
    proc = _cli("acknowledge", recipe, first["run_id"], "--history", str(afile))
    assert proc.returncode == 2 and f"--history {afile}: not a folder" in proc.stderr
    assert not (tmp_path / "history" / "acknowledged.json").exists()
    proc = _cli(
        "acknowledge", recipe, first["run_id"], "--note", "torch 2.9.2", "--history", history
    )
    assert proc.returncode == 0, proc.stderr
    acks = json.loads((tmp_path / "history" / "acknowledged.json").read_text())
    assert acks == [
        {"recipe": recipe, "run_id": first["run_id"], "metric": None, "note": "torch 2.9.2"}
    ]
    assert _publish(tmp_path, 8, 474 * 1.3, bumped)["status"] == "ok"


def _record(night_index: int, train: float, rollout: float, torch: str) -> RunRecord:
    metrics = {
        "bench.metrics.actor_train_time": train,
        "bench.metrics.rollout_time": rollout,
        "bench.metrics.cycle_time": train + rollout,
    }
    return RunRecord(
        run_id=f"run{night_index:03d}",
        recipe="r",
        recipe_sha256="0" * 64,
        date=night(night_index).isoformat(),
        stages={"bench": StageSummary(status="pass")},
        metrics=metrics,
        intervals={m: (0.99 * v, 1.01 * v) for m, v in metrics.items()},
        packages={"torch": torch},
    )


def test_change_night_is_that_of_the_clearest_metric_not_the_earliest() -> None:
    # A slow rollout the night before a train-time shift pulls the cycle time's change point
    # one night early; the train time, which carries the whole shift, has it at its night.
    rng = np.random.default_rng(3)
    train = 474 * (1 + 0.005 * rng.standard_normal(18))
    rollout = 300 * (1 + 0.005 * rng.standard_normal(18))
    train[15:] *= 1.04
    rollout[14] *= 1.04
    runs = [
        _record(i, float(t), float(r), "2.9.2" if i >= 15 else "2.9.1")
        for i, (t, r) in enumerate(zip(train, rollout, strict=True))
    ]
    verdict = next(
        v
        for v in (judge_run(runs[i], runs[: i + 1], RegressionSettings()) for i in range(15, 18))
        if v.status == "regressed"
    )
    by_metric = {m.metric: m.change_index for m in verdict.regressions}
    assert by_metric["bench.metrics.cycle_time"] < by_metric["bench.metrics.actor_train_time"]
    assert verdict.change_run == "run015"
    assert {c.key: c.after for c in verdict.changes if c.kind == "package"} == {"torch": "2.9.2"}


def test_change_placed_a_night_late_still_names_its_cause() -> None:
    # +6 % at 2 % noise whose first night came out only +1 %: the change point lands on the
    # second shifted night, but its confidence set reaches back to the first, and "what
    # changed" is against the run before that, which still has the old torch.
    rng = np.random.default_rng(0)
    train = 474 * (1 + 0.02 * rng.standard_normal(19))
    rollout = 300 * (1 + 0.02 * rng.standard_normal(19))
    train[15:] *= 1.06
    train[15] = 474 * 1.01
    runs = [
        _record(i, float(t), float(r), "2.9.2" if i >= 15 else "2.9.1")
        for i, (t, r) in enumerate(zip(train, rollout, strict=True))
    ]
    verdict = judge_run(runs[18], runs, RegressionSettings())
    assert verdict.status == "regressed"
    assert verdict.change_run == "run016" and verdict.change_span == ("run015", "run016")
    assert verdict.last_good_run == "run014"
    assert [c.key for c in verdict.changes] == ["torch"]


def test_change_window_narrows_with_the_size_of_the_shift() -> None:
    noise = np.random.default_rng(5).standard_normal(30)
    after = np.arange(30) >= 20
    big = noise + 10.0 * after
    assert change_points(big) == [20] and change_window(big, [20], 20, 1.0) == (20, 20)
    small = noise + 2.0 * after  # two noise sds: not placed to the night
    first, last = change_window(small, [20], 20, 1.0)
    assert first <= 20 <= last and last > first


def test_a_split_left_among_quiet_nights_is_dropped() -> None:
    # Binary segmentation splits first at night 11, where three slowish nights and the shift
    # together make a change; once the shift at night 15 has its own split, the one at 11
    # separates quiet nights only and must not be reported as the change's night.
    history = [168.74, 166.88, 167.24, 167.65, 166.67, 166.99, 166.7, 167.01, 167.99, 166.93]
    history += [166.9, 169.78, 168.51, 169.52, 167.34, 175.6]
    assert change_points([*history, 175.29]) == [15]
    verdict = judge(STEP, history, 175.29)
    assert verdict.kind == "regression" and verdict.change_index == 15


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alpha", 1.0),
        ("alpha", float("nan")),
        ("min_change", 1.5),
        ("min_history", 1),
        ("short_history_band", -0.1),
        ("min_segment", 0),
    ],
)
def test_settings_out_of_range_are_refused_naming_the_field(field: str, value: float) -> None:
    """Every front end (publish's options, the benchmark's --alpha) relies on the settings
    type refusing what the detector cannot work with."""
    with pytest.raises(RegressionSettingError) as caught:
        RegressionSettings(**{field: value})
    assert caught.value.name == field
    assert str(caught.value).startswith(f"{field} {value:g}: must be ")
