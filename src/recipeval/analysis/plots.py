"""PNG plots of a stage's own data (matplotlib's object API on the Agg canvas: no display, no
global pyplot state). Each writes atomically and returns the path."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from recipeval.analysis.steady_state import SteadyEstimate
from recipeval.atomic import atomic_write


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    return atomic_write(
        path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    )


def abs_diff_histogram(
    abs_diffs: Mapping[str, np.ndarray], path: Path, cutoff: float | None = None
) -> Path:
    """Histogram of per-token |logp_rollout - logp_train| per variant, on log-spaced bins (the
    error spans orders of magnitude); exact zeros are counted in the first bin."""
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    positive = np.concatenate(
        [np.asarray(v, float)[np.asarray(v) > 0] for v in abs_diffs.values()] or [np.array([])]
    )
    low = max(float(positive.min()) if positive.size else 1e-8, 1e-10)
    high = max(float(positive.max()) if positive.size else 1.0, low * 10)
    bins = np.geomspace(low, high, 50)
    for name, values in abs_diffs.items():
        v = np.clip(np.asarray(values, float), low, None)
        ax.hist(v, bins=bins, histtype="step", linewidth=1.5, label=f"{name} ({len(v)} tokens)")
    if cutoff is not None:
        ax.axvline(cutoff, color="grey", linestyle="--", linewidth=1, label=f"cutoff {cutoff:.3g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|logp_rollout - logp_train| per token")
    ax.set_ylabel("tokens")
    ax.set_title("train vs rollout logprob difference")
    ax.legend(fontsize=8)
    return _save(fig, path)


def abs_diff_by_position(buckets: Mapping[str, pd.DataFrame], path: Path) -> Path:
    """Mean and p99 |d| per response-position bucket (analysis.logprob.by_position) per
    variant: does the error grow along the context?"""
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for name, table in buckets.items():
        if table.empty:
            continue
        x = table["start"].to_numpy(float) + 1  # log axis: bucket [0, 16) sits at 1
        (line,) = ax.plot(x, table["mean_abs_diff"], marker="o", label=f"{name} mean")
        ax.plot(
            x,
            table["p99_abs_diff"],
            marker=".",
            linestyle=":",
            color=line.get_color(),
            label=f"{name} p99",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("response position (bucket start + 1)")
    ax.set_ylabel("|logp_rollout - logp_train|")
    ax.set_title("logprob difference along the response")
    ax.legend(fontsize=8)
    return _save(fig, path)


def step_time_plot(
    series: Mapping[str, tuple[np.ndarray, np.ndarray]],
    estimates: Mapping[str, SteadyEstimate],
    path: Path,
) -> Path:
    """One panel per metric: its value per rollout id, the warm-up (shaded grey) and steady
    (shaded green) windows, the odd steps left out (red crosses), the steady estimate and its
    interval. `series` maps a metric to (rollout ids, values) of its finite values, in step
    order; the estimates' positions index those values."""
    fig = Figure(figsize=(8, 2.6 * max(len(series), 1)))
    axes = fig.subplots(max(len(series), 1), 1, squeeze=False)[:, 0]
    for ax, (metric, (ids, values)) in zip(axes, series.items()):
        ax.plot(ids, values, marker="o", markersize=3, linewidth=1, color="tab:blue")
        est = estimates.get(metric)
        if est is not None and len(ids):
            warm_end = ids[est.warmup] - 0.5 if est.warmup < len(ids) else ids[-1] + 0.5
            ax.axvspan(
                ids[0] - 0.5,
                warm_end,
                color="grey",
                alpha=0.2,
                label=f"warm-up ({est.warmup} steps)",
            )
            ax.axvspan(
                warm_end,
                ids[-1] + 0.5,
                color="tab:green",
                alpha=0.08,
                label=f"steady ({est.used} steps)",
            )
            if est.odd:
                odd = [i for i in est.odd if i < len(ids)]
                ax.plot(
                    ids[odd],
                    values[odd],
                    linestyle="none",
                    marker="x",
                    color="tab:red",
                    label=f"odd, left out ({len(est.odd)})",
                )
            iv = est.interval
            if np.isfinite(iv.estimate):
                ax.axhline(
                    iv.estimate,
                    color="tab:green",
                    linewidth=1.2,
                    label=f"estimate {iv.estimate:.4g}",
                )
            if np.isfinite(iv.low) and np.isfinite(iv.high):
                ax.axhspan(
                    iv.low,
                    iv.high,
                    color="tab:green",
                    alpha=0.25,
                    label=f"{iv.confidence:.0%} interval (+/-{iv.rel_width / 2:.1%})",
                )
        ax.set_title(metric, fontsize=10)
        ax.set_ylabel("s" if "time" in metric else "")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("rollout id")
    fig.tight_layout()
    return _save(fig, path)
