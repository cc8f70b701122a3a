"""The attribution table (tables/attribution.{csv,md,html}): for each ablation that
`recipeval ablate --emit` wrote and the workflow ran, each variant's effect against BEFORE on
the logprob metrics and the bench's step times, with 95 % intervals; the whole change (AFTER)
against the sum of the single effects (the interaction); and whether each effect is
distinguishable from noise.

Variants are found by their `sweep` block as the stages recorded it (recipe_facts): kind
`ablation`, `base` (BEFORE's name), `after` (AFTER's name) and `keys`. BEFORE is the variant
that changes no key; AFTER the one that changes them all. Logprob samples are the per-sample
values of the logprob_diff stage's reference variant (its token dump; else the per-rollout
logged |d|); step times are the bench's steady-state estimates with their intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from recipeval.analysis.attribution import (
    NO_EFFECT,
    Effect,
    estimate_effect,
    interaction,
    per_sample_logprob,
    sample_effect,
)
from recipeval.analysis.logprob import SCALAR_ABS_DIFF
from recipeval.publish.page import table_page
from recipeval.publish.records import RunRecord
from recipeval.publish.tables import TIMING_COLUMNS, find_metric, to_markdown
from recipeval.result import StageResult

# Metric label -> per_sample_logprob's column; a recipe without a token dump has the logged
# per-rollout |d| only (SCALAR_ABS_DIFF), under the first label.
LOGPROB_METRICS = {
    "logprob mean |d|": "mean_abs_diff",
    "logprob mean d": "mean_diff",
    "logprob k3 KL": "k3_kl",
}
EVERY_CHANGE = "every change (AFTER)"
SUM_OF_PARTS = "AFTER - sum of the single effects"
INTERACTION = "interaction"
COLUMNS = [
    "ablation",
    "variant",
    "changes",
    "metric",
    "BEFORE",
    "effect",
    "low",
    "high",
    "distinguishable from noise",
]
FILES = ("attribution.csv", "attribution.md", "attribution.html")


@dataclass(frozen=True)
class Member:
    """One ablation variant as publish sees it."""

    record: RunRecord
    keys: frozenset[str]
    samples: dict[str, np.ndarray]  # logprob metric -> per-sample (or per-rollout) values


def _reference_rows(path: str | None, reference: object) -> pd.DataFrame | None:
    """A stage table artifact's rows of the logprob_diff reference variant."""
    if not path or not Path(path).is_file():
        return None
    frame = pd.read_parquet(path)
    if "variant" in frame.columns:
        frame = frame[frame["variant"] == reference]
    return frame if len(frame) else None


def logprob_samples(result: StageResult | None) -> dict[str, np.ndarray]:
    """Per-sample logprob metrics of a logprob_diff result's reference variant."""
    if result is None:
        return {}
    reference = result.summary.get("reference")
    tokens = _reference_rows(result.artifacts.get("tokens"), reference)
    if tokens is not None:
        per_sample = per_sample_logprob(tokens)
        return {label: per_sample[c].to_numpy(float) for label, c in LOGPROB_METRICS.items()}
    steps = _reference_rows(result.artifacts.get("steps"), reference)
    if steps is not None and SCALAR_ABS_DIFF in steps.columns:
        return {next(iter(LOGPROB_METRICS)): steps[SCALAR_ABS_DIFF].to_numpy(float)}
    return {}


def ablations(
    records: list[RunRecord], results: dict[str, list[StageResult]]
) -> dict[tuple[str, str], list[Member]]:
    """(BEFORE's name, AFTER's name) -> its variants among the published runs."""
    found: dict[tuple[str, str], list[Member]] = {}
    for record in records:
        values = record.recipe_values
        if values.get("sweep.kind") != "ablation" or not values.get("sweep.after"):
            continue
        logprob = next(
            (r for r in results.get(record.recipe, []) if r.stage == "logprob_diff"), None
        )
        found.setdefault((values["sweep.base"], values["sweep.after"]), []).append(
            Member(record, frozenset(values.get("sweep.keys") or ()), logprob_samples(logprob))
        )
    return found


def _timing(
    record: RunRecord, endings: tuple[str, ...]
) -> tuple[float, tuple[float, float] | None] | None:
    metric = find_metric(record, endings, "bench")
    if metric is None:
        return None
    return record.metrics[metric], record.intervals.get(metric)


def _effects(
    reference: Member, members: list[Member]
) -> dict[str, tuple[float, dict[str, Effect]]]:
    """metric -> (BEFORE's value, variant name -> effect) for every metric BEFORE has."""
    out: dict[str, tuple[float, dict[str, Effect]]] = {}
    for label, base in reference.samples.items():
        effects = {
            m.record.recipe: sample_effect(m.samples[label], base)
            if label in m.samples
            else NO_EFFECT
            for m in members
        }
        out[label] = (float(np.nanmean(base)) if len(base) else math.nan, effects)
    for label, endings in TIMING_COLUMNS.items():
        base_time = _timing(reference.record, endings)
        if base_time is None:
            continue
        effects = {}
        for m in members:
            timed = _timing(m.record, endings)
            effects[m.record.recipe] = (
                estimate_effect(timed[0], timed[1], *base_time) if timed else NO_EFFECT
            )
        out[label] = (base_time[0], effects)
    return out


def _row(ablation: str, variant: str, changes: str, metric: str, before: float, e: Effect) -> dict:
    known = math.isfinite(e.low) and math.isfinite(e.high)
    return {
        "ablation": ablation,
        "variant": variant,
        "changes": changes,
        "metric": metric,
        "BEFORE": before,
        "effect": e.estimate,
        "low": e.low,
        "high": e.high,
        "distinguishable from noise": ("yes" if e.distinguishable else "no") if known else "",
    }


def table(records: list[RunRecord], results: dict[str, list[StageResult]]) -> pd.DataFrame:
    """One row per ablation, variant and metric: the single variants, AFTER, then the
    interaction. Empty when no published run is an ablation variant with its BEFORE."""
    rows = []
    for (before, after), members in sorted(ablations(records, results).items()):
        reference = next((m for m in members if not m.keys), None)
        if reference is None:
            continue  # BEFORE did not run (or was not selected): nothing to measure against
        changed = frozenset().union(*(m.keys for m in members))
        whole = next((m for m in members if m.keys and m.keys == changed), None)
        singles = sorted(
            (m for m in members if m.keys and m is not whole), key=lambda m: sorted(m.keys)
        )
        measured = _effects(reference, singles + ([whole] if whole else []))
        name = f"{before} -> {after}"
        for m in singles:
            for label, (base, effects) in measured.items():
                keys = ", ".join(sorted(m.keys))
                rows.append(
                    _row(name, m.record.recipe, keys, label, base, effects[m.record.recipe])
                )
        if whole is None:
            continue
        for label, (base, effects) in measured.items():
            rows.append(
                _row(
                    name,
                    whole.record.recipe,
                    EVERY_CHANGE,
                    label,
                    base,
                    effects[whole.record.recipe],
                )
            )
        for label, (base, effects) in measured.items():
            parts = [effects[m.record.recipe] for m in singles]
            both = interaction(effects[whole.record.recipe], parts)
            rows.append(_row(name, INTERACTION, SUM_OF_PARTS, label, base, both))
    return pd.DataFrame(rows, columns=COLUMNS)


def _number(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:.4g}"


def display(frame: pd.DataFrame) -> pd.DataFrame:
    """The table for reading: each effect signed, with its interval in one cell."""
    shown = frame.drop(columns=["low", "high"]).astype({"effect": object, "BEFORE": object})
    shown["BEFORE"] = [_number(v) for v in frame["BEFORE"]]
    shown["effect"] = [
        f"{e:+.4g} [{_number(lo)}, {_number(hi)}]"
        if math.isfinite(lo) and math.isfinite(hi)
        else ("" if not math.isfinite(e) else f"{e:+.4g}")
        for e, lo, hi in zip(frame["effect"], frame["low"], frame["high"])
    ]
    return shown.rename(columns={"effect": "effect [95 % interval]"})


def outputs(records: list[RunRecord], results: dict[str, list[StageResult]]) -> dict[str, str]:
    """File name -> text of the attribution table in each format; none without an ablation."""
    frame = table(records, results)
    if frame.empty:
        return {}
    shown = display(frame)
    caption = (
        f"effects against BEFORE (variant - BEFORE), 95 % intervals; {INTERACTION}: {SUM_OF_PARTS}"
    )
    page = table_page("recipeval attribution", caption, shown)
    return dict(zip(FILES, (frame.to_csv(index=False), to_markdown(shown), page), strict=True))


__all__ = ["FILES", "ablations", "display", "logprob_samples", "outputs", "table"]
