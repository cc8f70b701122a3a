"""A run against its history: a regression verdict per metric and, where something changed,
what differs between the last run before the change point and this run (recipe values,
packages, trainer revision, machine). Against the last good run instead, a shift not caught
on its first night was compared with a run already shifted, and the cause was never named.
The change point is a night's estimate; "before" is the run before the earliest night of its
confidence set (regression.change_window), so a shift placed a night late still names its
cause."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from recipeval.analysis.regression import MetricVerdict, RegressionSettings, judge_many
from recipeval.publish.records import PROVENANCE_FIELDS, RunRecord
from recipeval.recipe.facts import same_gpu

# Metrics worth a verdict: the bench's steady-state estimates (those with an interval) and
# these headline numbers. Judging every number in every summary would multiply the nightly
# false-alarm rate by the number of metrics (counts, per-variant detail, positions).
HEADLINES = (
    "train_rollout_logprob_abs_diff",
    "train_rollout_kl",
    "tokens_per_gpu_per_sec",
    "actor_train_tflops",
    "actor_train_tok_per_s",
)


@dataclass(frozen=True)
class Change:
    kind: str  # recipe | package | provenance
    key: str
    before: Any
    after: Any


@dataclass
class RecipeVerdict:
    recipe: str
    run_id: str
    status: str  # failed | regressed | improved | ok
    metrics: list[MetricVerdict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    last_good_run: str | None = None  # the run "what changed" compares with
    changes: list[Change] = field(default_factory=list)
    change_run: str | None = None  # first run at the new level, when a change point was found
    # The first and last run the change may have started on (the change night's confidence
    # set); "what changed" is against the run before the first.
    change_span: tuple[str, str] | None = None

    @property
    def regressions(self) -> list[MetricVerdict]:
        return [m for m in self.metrics if m.kind == "regression"]

    @property
    def improvements(self) -> list[MetricVerdict]:
        return [m for m in self.metrics if m.kind == "improvement"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "run_id": self.run_id,
            "status": self.status,
            "failures": self.failures,
            "last_good_run": self.last_good_run,
            "change_run": self.change_run,
            "change_span": list(self.change_span) if self.change_span else None,
            "metrics": [m.to_dict() for m in self.metrics],
            "changes": [vars(c) for c in self.changes],
        }


def tracked(metric: str, has_interval: bool) -> bool:
    return has_interval or metric.rsplit(".", 1)[-1].rsplit("/", 1)[-1] in HEADLINES


def what_changed(before: RunRecord, after: RunRecord) -> list[Change]:
    """Differences that can explain a change: recipe values, package versions, the upstream
    launch (its commit, and what the recipe no longer matches), provenance."""
    changes: list[Change] = []
    for kind, old, new in (
        ("recipe", before.recipe_values, after.recipe_values),
        ("package", before.packages, after.packages),
        ("upstream", before.upstream, after.upstream),
        (
            "provenance",
            {k: before.provenance.get(k) for k in PROVENANCE_FIELDS},
            {k: after.provenance.get(k) for k in PROVENANCE_FIELDS},
        ),
    ):
        for key in sorted(set(old) | set(new)):
            was, now = old.get(key), new.get(key)
            if was == now or (
                kind == "provenance" and key == "gpu" and was and now and same_gpu(was, now)
            ):
                continue
            changes.append(Change(kind, key, was, now))
    if before.recipe_sha256 != after.recipe_sha256 and not any(c.kind == "recipe" for c in changes):
        changes.append(
            Change("recipe", "sha256", before.recipe_sha256[:12], after.recipe_sha256[:12])
        )
    return changes


def _failures(record: RunRecord) -> list[str]:
    out = []
    for stage, outcome in record.stages.items():
        if outcome.status in ("fail", "error"):
            detail = outcome.message or "; ".join(outcome.failed_checks) or outcome.status
            out.append(f"{stage} {outcome.status}: {detail}")
    return out


@dataclass(frozen=True)
class Acknowledgement:
    """A change accepted as the new normal: from `run_id` on, the recipe's history (one metric's,
    when `metric` is set) starts afresh, so the change is no longer reported."""

    recipe: str
    run_id: str
    metric: str | None = None
    note: str = ""


def _history_start(
    recipe: str, metric: str, prior: list[RunRecord], acks: Sequence[Acknowledgement]
) -> int:
    """Index into `prior` of the first run judged for `metric`: the latest acknowledged one."""
    position = {r.run_id: i for i, r in enumerate(prior)}
    starts = [
        position[a.run_id]
        for a in acks
        if a.recipe == recipe and a.metric in (None, metric) and a.run_id in position
    ]
    return max(starts, default=0)


def judge_run(
    record: RunRecord,
    history: list[RunRecord],
    settings: RegressionSettings,
    acks: Sequence[Acknowledgement] = (),
) -> RecipeVerdict:
    """`history` may contain runs of any recipe and this run itself; only earlier runs of the
    same recipe count, of those only the values whose stage passed, and only from the latest
    acknowledgement on. The recipe's metrics are judged together (false alarms per recipe)."""
    prior = [
        r
        for r in history
        if r.recipe == record.recipe
        and r.run_id != record.run_id
        and (r.date or "") <= (record.date or "")
    ]
    series: dict[str, tuple[list[float], float]] = {}
    runs_of: dict[str, list[RunRecord]] = {}
    for metric, value in sorted(record.metrics.items()):
        stage = metric.split(".", 1)[0]
        if not tracked(metric, metric in record.intervals) or not record.stage_ok(stage):
            continue
        start = _history_start(record.recipe, metric, prior, acks)
        runs_of[metric] = [r for r in prior[start:] if metric in r.metrics and r.stage_ok(stage)]
        series[metric] = ([r.metrics[metric] for r in runs_of[metric]], value)
    verdicts = list(judge_many(series, settings).values())
    failures = _failures(record)
    verdict = RecipeVerdict(record.recipe, record.run_id, "ok", verdicts, failures)
    if failures:
        verdict.status = "failed"
    elif verdict.regressions:
        verdict.status = "regressed"
    elif verdict.improvements:
        verdict.status = "improved"
    if verdict.status == "ok":
        return verdict
    # The night is that of the metric whose change is largest against its noise: a change point
    # is located best there (the cycle time carries only the train time's share of a train-time
    # shift, so a slow night before the shift pulls its split earlier than the train time's).
    located = [
        (-abs(m.change_sd or 0.0), m.change_index, m.metric, m.change_window)
        for m in verdict.regressions or verdict.improvements
        if m.change_index
    ]
    if located and verdict.status != "failed":
        _, index, metric, window = min(located)
        runs = [*runs_of[metric], record]
        verdict.change_run = runs[index].run_id
        first, last = window or (index, index)
        verdict.change_span = (runs[first].run_id, runs[last].run_id)
        # Against the run before the earliest night the change may have started on: a shift
        # of a few noise sds placed a night late would otherwise miss its cause.
        before = runs[first - 1]
    else:
        good = [r for r in prior if not r.failed]
        if not good:
            return verdict
        before = good[-1]
    verdict.last_good_run = before.run_id
    verdict.changes = what_changed(before, record)
    return verdict
