"""The ranked layout table: the runs of one `recipeval layouts` sweep (the variants it emitted,
whose `sweep` block names their base, and the base recipe when it ran too), ranked by the step
time the bench measured, with the explorer's predicted training time beside it where it made
one. Markdown, CSV and a self-contained HTML page, as tables/layouts.{md,csv,html}."""

from __future__ import annotations

import math

import pandas as pd

from recipeval.publish.page import table_page
from recipeval.publish.records import RunRecord
from recipeval.publish.tables import find_metric, short, to_markdown, with_interval

SWEEP_KIND = "layouts"
# What a variant is ranked by: the bench's time per rollout, whole cycle first.
STEP_TIME = ("cycle_time", "perf/step_time")
# What the explorer predicts (training seconds per rollout): shown beside its prediction.
TRAIN_TIME = ("perf/actor_train_time",)


def _sweep_base(record: RunRecord) -> str | None:
    values = record.recipe_values
    return values.get("sweep.base") if values.get("sweep.kind") == SWEEP_KIND else None


def sweeps(records: list[RunRecord]) -> dict[str, list[RunRecord]]:
    """Base recipe name -> its sweep's runs (the base's own run first, when present)."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        base = _sweep_base(record)
        if base is not None:
            groups.setdefault(base, []).append(record)
    for base, group in groups.items():
        group[:0] = [r for r in records if r.recipe == base]
    return groups


def _changes(record: RunRecord, base: str) -> str:
    """What the variant sets, as `key=value`; the layout and GPUs for layout keys."""
    if record.recipe == base:
        return "(base recipe)"
    words = []
    for key in record.recipe_values.get("sweep.keys") or []:
        if key == "parallel":
            words.append(record.layout or "parallel")
        elif key == "cluster":
            words.append(f"{record.nodes} x {record.gpus_per_node} {record.gpu or ''}".strip())
        else:
            value = record.recipe_values.get(key)
            text = str(value).lower() if isinstance(value, bool) else value  # as YAML writes it
            words.append(f"{key.removeprefix('args.')}={text}")
    return ", ".join(words)


def _seconds(record: RunRecord, endings: tuple[str, ...]) -> tuple[float | None, str]:
    """A bench metric's estimate and its text with the 95 % interval."""
    name = find_metric(record, endings, "bench")
    if name is None or not math.isfinite(record.metrics[name]):
        return None, ""
    return record.metrics[name], with_interval(record, name)


def _bench_text(record: RunRecord) -> str:
    outcome = record.stages.get("bench")
    if outcome is None:
        return "not run"
    if outcome.status == "pass":
        return "pass"
    return short(f"{outcome.status}: {outcome.message}" if outcome.message else outcome.status)


def table(records: list[RunRecord]) -> pd.DataFrame:
    """One row per run of a layouts sweep: measured runs by step time (rank 1 the fastest),
    then the unmeasured ones by their predicted rank. Empty when no sweep ran."""
    rows = []
    for base, group in sorted(sweeps(records).items()):
        measured, unmeasured = [], []
        for record in group:
            step, step_text = _seconds(record, STEP_TIME)
            train = _seconds(record, TRAIN_TIME)[1]
            predicted = record.recipe_values.get("sweep.predicted_s")
            predicted_rank = record.recipe_values.get("sweep.rank")
            row = {
                "sweep of": base,
                "rank (measured)": "",
                "recipe": record.recipe,
                "changes": _changes(record, base),
                "step time (s)": step_text,
                "train time (s)": train,
                "predicted train (s)": "" if predicted is None else f"{predicted:.4g}",
                "rank (predicted)": "" if predicted_rank is None else predicted_rank,
                "bench": _bench_text(record),
            }
            if step is None:
                unmeasured.append((predicted_rank or math.inf, row))
            else:
                measured.append((step, row))
        measured.sort(key=lambda item: item[0])
        for rank, (_, row) in enumerate(measured, 1):
            row["rank (measured)"] = rank
        unmeasured.sort(key=lambda item: item[0])
        rows += [row for _, row in measured] + [row for _, row in unmeasured]
    return pd.DataFrame(rows)


CAPTION = (
    "Variants of one recipe emitted by `recipeval layouts --emit` (and the recipe itself), "
    "ranked by the bench's measured step time (95 % interval in brackets); the explorer's "
    "predicted training seconds per rollout beside it where it made one."
)


FILES = ("layouts.md", "layouts.csv", "layouts.html")


def outputs(records: list[RunRecord]) -> dict[str, str]:
    """File name -> text of the layout table in each format; none when no sweep ran."""
    frame = table(records)
    if frame.empty:
        return {}
    page = table_page("recipeval layouts", CAPTION, frame)
    return dict(zip(FILES, (to_markdown(frame), frame.to_csv(index=False), page), strict=True))


__all__ = ["FILES", "outputs", "sweeps", "table"]
