"""The figures publish shows: the cross-recipe overview, each recipe's history of its headline
metrics, and the plots the stages drew. The HTML page embeds them; a folder of PNGs
(`<group>/<name>.png`) makes them `snakemake --report` items."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from recipeval.atomic import atomic_write
from recipeval.publish import plots
from recipeval.publish.compare import RecipeVerdict
from recipeval.publish.records import RunRecord
from recipeval.publish.tables import LOGPROB_COLUMN, TIMING_COLUMNS, find_metric
from recipeval.result import StageResult

# Recipe names start with a letter or digit, so this group never collides with a recipe.
OVERVIEW = "_overview"


@dataclass(frozen=True)
class Figure:
    group: str  # a recipe name, or OVERVIEW
    name: str  # file stem, unique within the group
    title: str
    png: bytes


def _file_stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def overview_figures(records: list[RunRecord]) -> list[Figure]:
    """Steady-state times of every recipe's latest run side by side."""
    bars: dict[str, dict[str, tuple[float, float | None, float | None]]] = {}
    for rec in records:
        for column, endings in TIMING_COLUMNS.items():
            metric = find_metric(rec, endings, "bench")
            if metric and column.endswith("(s)"):
                low, high = rec.intervals.get(metric, (None, None))
                bars.setdefault(rec.recipe, {})[column.removesuffix(" (s)")] = (
                    rec.metrics[metric],
                    low,
                    high,
                )
    if not bars:
        return []
    return [
        Figure(OVERVIEW, "steady-state-times", "steady-state times", plots.stage_time_plot(bars))
    ]


def history_figures(
    records: list[RunRecord], verdicts: dict[str, RecipeVerdict], frame: pd.DataFrame
) -> list[Figure]:
    """Per recipe: the metrics that moved, then the headline metrics, over the runs so far."""
    figures = []
    for rec in records:
        verdict = verdicts.get(rec.run_id)
        wanted = [m.metric for m in (verdict.regressions + verdict.improvements if verdict else [])]
        for endings in [*TIMING_COLUMNS.values(), LOGPROB_COLUMN]:
            metric = find_metric(rec, endings)
            if metric and metric not in wanted:
                wanted.append(metric)
        for metric in wanted:
            # A history plot needs a history: one point says nothing a table cell does not.
            if ((frame["recipe"] == rec.recipe) & (frame["metric"] == metric)).sum() >= 2:
                png = plots.history_plot(frame, rec.recipe, metric, verdict)
                figures.append(
                    Figure(
                        rec.recipe, _file_stem(f"history-{metric}"), f"{rec.recipe} {metric}", png
                    )
                )
    return figures


def stage_figures(results: Iterable[StageResult]) -> list[Figure]:
    """The PNGs the stages wrote (logprob histograms, step-time plots), as their results name
    them; one whose file is gone (a results folder copied without it) is left out."""
    figures = []
    for res in results:
        for key, value in sorted(res.artifacts.items()):
            path = Path(value)
            if path.suffix == ".png" and path.is_file():
                name = _file_stem(f"{res.stage}-{key}")
                figures.append(
                    Figure(res.recipe, name, f"{res.recipe} {res.stage} {key}", path.read_bytes())
                )
    return figures


def all_figures(
    records: list[RunRecord],
    verdicts: dict[str, RecipeVerdict],
    frame: pd.DataFrame,
    results: Iterable[StageResult],
) -> list[Figure]:
    return (
        overview_figures(records)
        + history_figures(records, verdicts, frame)
        + stage_figures(results)
    )


def write_figures(figures: list[Figure], folder: Path) -> None:
    """`folder/<group>/<name>.png` for each figure, each written atomically; PNGs of an earlier
    publish that this one did not draw are removed, so the folder shows this run only."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {folder / f.group / f"{f.name}.png" for f in figures}
    for old in folder.glob("*/*.png"):
        if old not in wanted:
            old.unlink()
    for group in folder.glob("*/"):
        if not any(group.iterdir()):
            group.rmdir()
    for figure in figures:
        png = figure.png
        atomic_write(
            folder / figure.group / f"{figure.name}.png", lambda tmp, png=png: tmp.write_bytes(png)
        )
