"""The stage plots render real PNGs, also from degenerate data (a run that logged one step)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from recipeval.analysis.logprob import by_position
from recipeval.analysis.plots import abs_diff_by_position, abs_diff_histogram, step_time_plot
from recipeval.analysis.steady_state import steady_state

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC


def test_step_time_plot_marks_windows_and_survives_sparse_metrics(tmp_path):
    values = np.r_[300.0, 200.0, 100 + np.random.default_rng(0).standard_normal(12)]
    ids = np.arange(len(values))
    series = {
        "perf/rollout_time": (ids, values),
        "cycle_time": (np.array([0]), np.array([5.0])),
        "perf/actor_train_time": (np.array([], int), np.array([])),
    }
    estimates = {m: steady_state(v, m) for m, (_, v) in series.items()}
    assert estimates["perf/rollout_time"].warmup == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = step_time_plot(series, estimates, tmp_path / "steps.png")
    assert is_png(path) and not list(tmp_path.glob(".*tmp*"))


def test_logprob_plots(tmp_path):
    rng = np.random.default_rng(1)
    table = pd.DataFrame(
        {
            "rollout_id": 0,
            "sample": 0,
            "position": np.arange(3000),
            "token_id": 1,
            "logp_train": -1.0,
            "loss_mask": 1,
        }
    )
    table["logp_rollout"] = -1.0 + 0.01 * rng.standard_normal(len(table))
    exact = table.assign(logp_rollout=table["logp_train"])  # all-zero |d| must still plot
    diffs = {
        "bf16": (table["logp_rollout"] - table["logp_train"]).abs().to_numpy(),
        "fp32": np.zeros(len(table)),
    }
    assert is_png(abs_diff_histogram(diffs, tmp_path / "hist.png", cutoff=0.05))
    buckets = {"bf16": by_position(table), "fp32": by_position(exact)}
    assert is_png(abs_diff_by_position(buckets, tmp_path / "pos.png"))
