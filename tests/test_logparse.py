"""miles log parsing on fixtures written from the documented format."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from recipeval.engines.miles.logparse import (
    MilesLogParser,
    parse_lines,
    parse_log,
    parse_metric_dict,
)

LOGS = Path(__file__).parent / "fixtures" / "logs"
RECIPEVAL = str(Path(sys.executable).parent / "recipeval")


def row(steps: pd.DataFrame, rollout_id: int) -> pd.Series:
    return steps.set_index("rollout_id").loc[rollout_id]


def test_clean_log_one_row_per_rollout_with_both_perf_lines_merged():
    parsed = parse_log(LOGS / "miles_clean.log")
    steps = parsed.steps
    assert list(steps["rollout_id"]) == [0, 1, 2]
    assert parsed.malformed_count == 0
    r1 = row(steps, 1)
    # rollout manager's perf line and the trainer's perf line for the same id, merged
    assert r1["perf/rollout_time"] == 151.0
    assert r1["perf/actor_train_time"] == 181.5
    assert r1["train/grad_norm"] == 0.794
    assert r1["rollout/rollout_log_probs"] == -0.4387
    assert r1["response_len/mean"] == 3990.0


def test_cycle_time_is_wall_time_between_consecutive_rollouts():
    steps = parse_log(LOGS / "miles_clean.log").steps
    assert math.isnan(steps["cycle_time"].iloc[0])
    # first records of rollouts 0, 1, 2: 10:02:30.5, 10:10:24.5, 10:18:18.0
    assert steps["cycle_time"].iloc[1] == pytest.approx(474.0)
    assert steps["cycle_time"].iloc[2] == pytest.approx(473.5)
    assert steps["timestamp"].iloc[0] == pd.Timestamp("2026-08-05 10:02:30.500")


def test_irregular_ray_log():
    """Actor prefixes, ANSI colours, interleaving, repeats (verbatim and Ray-folded),
    nan/inf, numpy scalar reprs, two records glued into one line, truncated last line."""
    parsed = parse_log(LOGS / "miles_ray_irregular.log")
    steps = parsed.steps
    assert list(steps["rollout_id"]) == [0, 1, 2]
    r0, r1, r2 = (row(steps, i) for i in (0, 1, 2))
    assert r0["perf/tokens_per_gpu_per_sec"] == 812.0  # np.float64(812.0)
    assert r0["perf/actor_train_time"] == 182.0  # repeated three times, read once
    assert math.isnan(r1["train/loss"])
    assert r1["train/train_rollout_logprob_abs_diff"] == math.inf
    assert r1["train/grad_norm"] == -math.inf
    # out-of-order trainer line: the rollout's timestamp is its earliest record
    assert r1["timestamp"] == pd.Timestamp("2026-08-05 10:10:24.500")
    assert r1["perf/actor_train_time"] == 181.5  # the complete record after the glued one
    assert "perf/longest_sample_tokens_per_sec" not in steps.columns
    assert r2["perf/rollout_time"] == 150.5
    assert math.isnan(r2["train/loss"])  # the truncated step 2 line was skipped
    assert parsed.malformed_count == 2
    assert [m.line_number for m in parsed.malformed] == [12, 18]
    assert parsed.lines == 18


def test_parse_metric_dict_never_evaluates_code(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ValueError):
        parse_metric_dict(f"{{'a': __import__('os').system('touch {marker}')}}")
    assert not marker.exists()
    assert parse_metric_dict(
        "{'a': float('nan'), 'b': -inf, 'c': [1, 2], 'd': 'x', 'e': True}"
    ) == {
        "a": pytest.approx(math.nan, nan_ok=True),
        "b": -math.inf,
        "e": 1.0,
    }


def test_incremental_feed_matches_whole_file():
    lines = (LOGS / "miles_clean.log").read_text().splitlines()
    parser = MilesLogParser()
    updated = [parser.feed(line) for line in lines]
    assert [u for u in updated if u is not None][:3] == [0, 0, 0]
    pd.testing.assert_frame_equal(parser.table(), parse_lines(lines).steps)


def test_empty_log_gives_empty_table_with_fixed_columns():
    steps = parse_lines(["no metrics here", ""]).steps
    assert list(steps.columns) == ["rollout_id", "timestamp", "cycle_time"]
    assert steps.empty


def test_parse_log_cli_writes_csv_and_parquet_and_reports_malformed(tmp_path):
    for name in ("steps.csv", "steps.parquet"):
        out = tmp_path / name
        proc = subprocess.run(
            [RECIPEVAL, "parse-log", str(LOGS / "miles_ray_irregular.log"), "--out", str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "3 rollouts" in proc.stdout and "2 malformed" in proc.stdout
        table = pd.read_csv(out) if name.endswith(".csv") else pd.read_parquet(out)
        assert list(table["rollout_id"]) == [0, 1, 2]
    bad = subprocess.run(
        [RECIPEVAL, "parse-log", str(tmp_path / "missing.log"), "--out", str(tmp_path / "x.csv")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (
        bad.returncode == 2 and "no such log file" in bad.stderr and "Traceback" not in bad.stderr
    )
