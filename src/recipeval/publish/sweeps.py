"""Tables over generated variants (recipes with a `sweep` block): layouts ranked by measured
time beside their predicted rank."""

from __future__ import annotations

import math

import pandas as pd

from recipeval.publish.records import RunRecord
from recipeval.publish.tables import find_metric

# What a layout is ranked by: the full step (rollout + train + sync) where bench measured it.
RANK_BY = ("cycle_time", "perf/step_time", "perf/actor_train_time")
TRAIN = ("perf/actor_train_time",)
LAYOUT_COLUMNS = [
    "base",
    "variant",
    "recipe",
    "predicted rank",
    "predicted train s",
    "measured train s",
    "measured step s",
    "step interval",
    "measured rank",
]


def variant_label(record: RunRecord) -> str:
    """What the variant changes: its layout, or the flags it sets."""
    values = record.recipe_values
    keys = values.get("sweep.keys") or []
    parts = []
    for key in keys:
        if key == "parallel":
            p = {
                k.removeprefix("parallel."): v
                for k, v in values.items()
                if k.startswith("parallel.")
            }
            split = (
                f" ({p.get('pp_first_stage_layers')}+..+{p.get('pp_last_stage_layers')})"
                if p.get("pp_first_stage_layers")
                else ""
            )
            sp = " SP" if p.get("sequence_parallel") else ""
            parts.append(
                f"TP{p.get('tp')}{sp} PP{p.get('pp')}{split} CP{p.get('cp')} "
                f"EP{p.get('ep')} ETP{p.get('etp')}"
            )
        elif key != "cluster":
            parts.append(f"{key.split('.', 1)[-1]}={values.get(key)}")
    return ", ".join(parts) or record.recipe


def _value(record: RunRecord, endings: tuple[str, ...]) -> tuple[float, tuple[float, float] | None]:
    metric = find_metric(record, endings, "bench")
    if metric is None:
        return math.nan, None
    return record.metrics[metric], record.intervals.get(metric)


def layout_table(records: list[RunRecord]) -> pd.DataFrame:
    """One row per layout variant, grouped by the recipe it came from, ranked by measured step
    time (variants without a bench last)."""
    rows = []
    for rec in records:
        values = rec.recipe_values
        if values.get("sweep.kind") != "layouts":
            continue
        step, interval = _value(rec, RANK_BY)
        train, _ = _value(rec, TRAIN)
        rows.append(
            {
                "base": values.get("sweep.base"),
                "variant": variant_label(rec),
                "recipe": rec.recipe,
                "predicted rank": values.get("sweep.rank"),
                "predicted train s": values.get("sweep.predicted_s"),
                "measured train s": train,
                "measured step s": step,
                "step interval": f"[{interval[0]:.4g}, {interval[1]:.4g}]" if interval else "",
            }
        )
    frame = pd.DataFrame(rows, columns=LAYOUT_COLUMNS[:-1])
    if frame.empty:
        return pd.DataFrame(columns=LAYOUT_COLUMNS)
    frame = frame.sort_values(["base", "measured step s"], na_position="last", kind="stable")
    frame["measured rank"] = frame.groupby("base")["measured step s"].rank(method="min")
    return frame.reset_index(drop=True)


__all__ = ["layout_table", "variant_label"]
