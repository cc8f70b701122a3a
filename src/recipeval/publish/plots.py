"""Plots for the HTML page, as PNG bytes (embedded, so the page works opened from disk)."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # no display on cluster nodes or CI

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import pandas as pd

from recipeval.publish.compare import RecipeVerdict


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110)
    finally:  # a figure that cannot be laid out must not stay open in pyplot
        plt.close(fig)
    return buf.getvalue()


def history_plot(
    frame: pd.DataFrame, recipe: str, metric: str, verdict: RecipeVerdict | None
) -> bytes:
    """One metric of one recipe over its runs: value with interval, the last stable level, and
    the newest run marked by its verdict."""
    rows = frame[(frame["recipe"] == recipe) & (frame["metric"] == metric)].sort_values("date")
    fig, ax = plt.subplots(figsize=(5.2, 2.6), layout="constrained")
    ok = rows[rows["stage_status"] == "pass"]
    bad = rows[rows["stage_status"] != "pass"]
    x = ok["date"]
    ax.plot(x, ok["value"], marker="o", ms=3, lw=1, color="#3b6ea5", label="run")
    has_iv = ok["low"].notna() & ok["high"].notna()
    if has_iv.any():
        ax.fill_between(
            x[has_iv],
            ok["low"][has_iv],
            ok["high"][has_iv],
            color="#3b6ea5",
            alpha=0.15,
            lw=0,
            label="interval",
        )
    if len(bad):
        ax.scatter(bad["date"], bad["value"], marker="x", color="#999999", label="stage not passed")
    mv = next((m for m in verdict.metrics if m.metric == metric), None) if verdict else None
    if mv is not None and mv.baseline is not None:
        ax.axhline(mv.baseline, color="#555555", lw=0.8, ls="--", label="last stable level")
    if mv is not None and len(rows):
        colour = {"regression": "#c0392b", "improvement": "#1e8449"}.get(mv.kind, "#3b6ea5")
        last = rows.iloc[-1]
        ax.scatter(
            [last["date"]],
            [last["value"]],
            s=60,
            color=colour,
            zorder=5,
            label=f"latest: {mv.kind}",
        )
    ax.set_title(f"{recipe}\n{metric}", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.legend(fontsize=6, loc="best")
    ax.grid(alpha=0.3)
    return _png(fig)


def _error_bar(upper: float | None, lower: float | None) -> float:
    """One side of an error bar: `upper - lower`, 0 where it is unknown, negative (a
    hand-edited interval that leaves out its estimate) or not finite (a difference of huge
    values), so the bar is still drawn; the tables show the interval as it was recorded."""
    if upper is None or lower is None:
        return 0.0
    size = upper - lower
    return size if math.isfinite(size) and size > 0 else 0.0


def stage_time_plot(bars: dict[str, dict[str, tuple[float, float | None, float | None]]]) -> bytes:
    """Latest steady-state times per recipe (estimate with interval), one group per recipe."""
    recipes = list(bars)
    metrics = sorted({m for per in bars.values() for m in per})
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(recipes) + 2), 2.8), layout="constrained")
    width = 0.8 / max(len(metrics), 1)
    for i, metric in enumerate(metrics):
        xs, ys, errs = [], [], [[], []]
        for j, recipe in enumerate(recipes):
            if metric in bars[recipe]:
                est, low, high = bars[recipe][metric]
                xs.append(j + i * width)
                ys.append(est)
                errs[0].append(_error_bar(est, low))
                errs[1].append(_error_bar(high, est))
        ax.bar(xs, ys, width=width, yerr=errs, capsize=2, label=metric)
    ax.set_xticks([j + width * (len(metrics) - 1) / 2 for j in range(len(recipes))])
    ax.set_xticklabels(recipes, fontsize=7, rotation=15, ha="right")
    ax.set_ylabel("seconds", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("steady-state times (latest run)", fontsize=8)
    return _png(fig)
