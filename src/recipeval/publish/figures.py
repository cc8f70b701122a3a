"""The figures publish shows: the cross-recipe overview, each recipe's history of its headline
metrics, and the plots the stages drew. The HTML page embeds them; a folder of PNGs
(`<group>/<name>.png`) makes them `snakemake --report` items."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from recipeval.atomic import atomic_write, atomic_write_text
from recipeval.errors import say_error
from recipeval.publish import plots
from recipeval.publish.compare import RecipeVerdict
from recipeval.publish.records import RunRecord
from recipeval.publish.tables import LOGPROB_COLUMN, TIMING_COLUMNS, find_metric
from recipeval.readfile import read_regular
from recipeval.result import StageResult

# Recipe names start with a letter or digit, so this group never collides with a recipe.
OVERVIEW = "_overview"
# What the last publish wrote into the plot folder: only those PNGs are ever removed.
FIGURE_MANIFEST = ".recipeval-figures"
MANIFEST_LIMIT = 1024 * 1024


@dataclass(frozen=True)
class Figure:
    group: str  # a recipe name, or OVERVIEW
    name: str  # file stem, unique within the group
    title: str
    png: bytes


def _drawn(group: str, name: str, title: str, draw: Callable[[], bytes]) -> list[Figure]:
    """The figure `draw` makes, or none, with one line, when matplotlib cannot lay out its
    values (a hand-edited estimate near the largest float overflows the axis): the history
    already holds the run, and the tables and verdict must still be written."""
    try:
        with np.errstate(all="ignore"):  # the overflow is reported once, below
            return [Figure(group, name, title, draw())]
    except (OverflowError, ValueError) as err:
        say_error(f"figure {title!r}: cannot draw it ({err}); left out of the page and plots")
        return []


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
    return _drawn(
        OVERVIEW, "steady-state-times", "steady-state times", lambda: plots.stage_time_plot(bars)
    )


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
                figures += _drawn(
                    rec.recipe,
                    _file_stem(f"history-{metric}"),
                    f"{rec.recipe} {metric}",
                    partial(plots.history_plot, frame, rec.recipe, metric, verdict),
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
    """`folder/<group>/<name>.png` for each figure, each written atomically. The PNGs an
    earlier publish wrote there (its manifest) that this one did not draw are removed, so the
    folder shows this run only; nothing publish did not write is touched (--plot-dir may name
    a folder of the user's own pictures)."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {f"{f.group}/{f.name}.png" for f in figures}
    for stale in sorted(_earlier_figures(folder) - wanted):
        (folder / stale).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # a group folder with other files in it stays
            (folder / stale).parent.rmdir()
    for figure in figures:
        png = figure.png
        atomic_write(
            folder / figure.group / f"{figure.name}.png", lambda tmp, png=png: tmp.write_bytes(png)
        )
    atomic_write_text(folder / FIGURE_MANIFEST, "".join(f"{name}\n" for name in sorted(wanted)))


def _earlier_figures(folder: Path) -> set[str]:
    """The `<group>/<name>.png` paths the manifest of the last publish into `folder` lists;
    a line of any other shape (an edit, `../x.png`) names nothing to remove."""
    try:
        text = read_regular(folder / FIGURE_MANIFEST, limit=MANIFEST_LIMIT).decode(errors="replace")
    except OSError:
        return set()
    return {
        line
        for line in text.splitlines()
        if len(parts := line.split("/")) == 2
        and all(part not in ("", ".", "..") for part in parts)
        and line.endswith(".png")
    }
