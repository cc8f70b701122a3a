"""Stage progress lines: one per finished rollout, with the bench's precision and ETA."""

from __future__ import annotations

import io
import math

import pandas as pd

from recipeval.stages.progress import Precision, StageProgress, finished_rollouts, steps_left


def table(rows: int, trained: int) -> pd.DataFrame:
    """`rows` rollouts logged, the first `trained` of them with training metrics."""
    return pd.DataFrame(
        {
            "rollout_id": range(rows),
            "perf/rollout_time": [1.0] * rows,
            "train/loss": [0.5] * trained + [math.nan] * (rows - trained),
        }
    )


def test_a_rollout_counts_once_its_training_metrics_are_logged():
    assert finished_rollouts(table(0, 0)) == 0
    assert finished_rollouts(table(3, 2)) == 2
    assert finished_rollouts(pd.DataFrame({"rollout_id": [0], "perf/rollout_time": [1.0]})) == 0


def test_plain_lines_count_rollouts_and_estimate_the_rest():
    out = io.StringIO()
    progress = StageProgress("smoke", "tiny", total=3, stream=out)
    assert progress.update(table(1, 0)) is None  # rollout 0 generated, not trained yet
    first = progress.update(table(1, 1))
    assert first is not None and first.startswith("smoke tiny: rollout 1/3, ")
    assert "ETA" in first
    assert progress.update(table(1, 1)) is None  # nothing new: no line
    last = progress.update(table(3, 3))
    assert last is not None and "rollout 3/3" in last and "ETA" not in last
    assert out.getvalue().count("\n") == 2


def test_bench_lines_show_the_interval_against_rel_ci():
    out = io.StringIO()
    progress = StageProgress("bench", "tiny", total=20, stream=out)
    precision = Precision(rel_width=0.2, rel_ci=0.1, steady_steps=4, min_steps=5, max_steps=20)
    line = progress.update(table(6, 6), precision)
    assert line is not None
    assert "interval 20.0% (rel_ci 10 %)" in line and "ETA" in line


def test_steps_left_follows_the_square_root_law_and_the_limits():
    # width 2x rel_ci after 4 steady steps: 4 * 2^2 = 16 steps in all, 12 more
    assert steps_left(Precision(0.2, 0.1, 4, 3, 40), done=6) == 12
    # capped by max_steps
    assert steps_left(Precision(0.2, 0.1, 4, 3, 10), done=6) == 4
    # precise already, min_steps reached: nothing left
    assert steps_left(Precision(0.05, 0.1, 5, 5, 20), done=7) == 0
    # no interval yet: at least the steps to min_steps
    assert steps_left(Precision(math.inf, 0.1, 0, 5, 20), done=2) == 5
