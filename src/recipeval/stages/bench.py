"""bench: run the bench overlay until every watched metric's steady state is known precisely
enough, then report it.

While the run goes, after each metric line the step table is handed to the stopping rule
(analysis.steady_state: warm-up found from the data, odd steps dropped, 10 % trimmed mean
with its 95 % interval, by default widened to cover the level at every step of the window);
the run is stopped as soon as every watched metric has `min_steps` steady steps and an
interval no wider than `rel_ci` of its value, or at `max_steps`. The verdict judges the steps
up to that decision, not the ones logged while the trainer was being stopped. The
verdict per metric: precise enough (else fail or warn, as `on_max_steps` says, with the width
reached), and within `tolerance` of the recipe's `expect.bench` value (slower fails; faster by
more than the tolerance is flagged as a warning, as Megatron's perf tests flag it: either the
expectation is stale or the run did less work). `--from-log` judges a finished log the same
way, without stopping anything.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from recipeval.analysis.steady_state import (
    SteadyEstimate,
    StopDecision,
    StoppingRule,
    decide,
    is_precise,
    steady_state,
)
from recipeval.engines.miles.logparse import CYCLE_TIME, ROLLOUT_ID
from recipeval.recipe.schema import BenchStage
from recipeval.result import Check
from recipeval.stages.common import (
    Judgement,
    StageRequest,
    StageRun,
    execute,
    resolve_and_render,
    run_failure,
    run_summary,
)
from recipeval.stages.driver import Stage, Verdict
from recipeval.stages.progress import Precision

STAGE = "bench"
TOKENS_PER_GPU = "perf/tokens_per_gpu_per_sec"
# Throughput-like metrics: a larger value is better (everything else is a time).
_HIGHER_IS_BETTER = ("per_sec", "per_s", "tflops", "throughput")


def stopping_rule(options: BenchStage) -> StoppingRule:
    return StoppingRule(
        rel_ci=options.rel_ci,
        min_steps=options.min_steps,
        max_steps=options.max_steps,
        interval=options.interval,
    )


def _steady(values: np.ndarray, metric: str, rule: StoppingRule) -> SteadyEstimate:
    return steady_state(values, metric, rule.confidence, kind=rule.interval)


def complete_rows(steps: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """The step table without a trailing row that is still being logged (a watched metric
    other than cycle_time, which is known from the row's first line, still missing)."""
    if steps.empty:
        return steps
    needed = [m for m in metrics if m != CYCLE_TIME and m in steps.columns]
    if needed and steps[needed].iloc[-1].isna().any():
        return steps.iloc[:-1]
    return steps


def watched_series(steps: pd.DataFrame, metrics: list[str]) -> dict[str, np.ndarray]:
    """metric -> its values over the complete rows, NaN where not logged (an absent column is
    all NaN, so the rule can never call it precise)."""
    return _series(complete_rows(steps, metrics), metrics)


def _series(rows: pd.DataFrame, metrics: list[str]) -> dict[str, np.ndarray]:
    return {
        m: rows[m].to_numpy(float) if m in rows.columns else np.full(len(rows), math.nan)
        for m in metrics
    }


@dataclass
class BenchWatcher:
    """The runner's on_steps hook: apply the stopping rule to the table so far."""

    metrics: list[str]
    rule: StoppingRule
    decision: StopDecision | None = None
    calls: int = 0
    seconds: float = 0.0  # time spent deciding, to show the hook costs nothing

    def __call__(self, steps: pd.DataFrame) -> bool:
        if self.decision is not None and self.decision.stop:
            # Lines keep coming while the runner stops the job (a Ray job takes seconds): the
            # decision that stopped it stands, or the summary would call the stop "continue".
            return True
        start = time.perf_counter()
        self.decision = decide(watched_series(steps, self.metrics), self.rule)
        self.calls += 1
        self.seconds += time.perf_counter() - start
        return self.decision.stop

    def precision(self) -> Precision | None:
        """The widest watched interval so far, for the progress line (None: no decision yet)."""
        if self.decision is None:
            return None
        estimates = [self.decision.estimates.get(m) for m in self.metrics]
        widths = [e.interval.rel_width if e is not None else math.inf for e in estimates]
        used = [e.used if e is not None else 0 for e in estimates]
        return Precision(
            rel_width=max(widths, default=math.inf),
            rel_ci=self.rule.rel_ci,
            steady_steps=min(used, default=0),
            min_steps=self.rule.min_steps,
            max_steps=self.rule.max_steps,
        )


def higher_is_better(metric: str) -> bool:
    return any(word in metric for word in _HIGHER_IS_BETTER)


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def precision_check(est: SteadyEstimate, rule: StoppingRule, on_max_steps: str) -> Check:
    iv = est.interval
    ok = is_precise(est, rule)
    odd = f", {len(est.odd)} odd step(s) left out" if est.odd else ""
    where = (
        f"{_fmt(iv.estimate)} [{_fmt(iv.low)}, {_fmt(iv.high)}] over {est.used} steady "
        f"steps after {est.warmup} warm-up{odd}"
    )
    if ok:
        message = f"{where}: interval {iv.rel_width:.2%} of the value (limit {rule.rel_ci:.2%})"
    elif est.trending:
        message = f"{where}: {est.not_steady}"
    elif est.used < rule.min_steps:
        message = f"{where}: fewer than min_steps {rule.min_steps} steady steps"
    else:
        message = (
            f"{where}: interval still {iv.rel_width:.2%} of the value, wider than "
            f"rel_ci {rule.rel_ci:.2%}"
        )
    return Check(
        id=f"precision:{est.metric}",
        ok=ok,
        severity="error" if on_max_steps == "fail" else "warning",
        value=None if math.isinf(iv.rel_width) else iv.rel_width,
        threshold=rule.rel_ci,
        key="stages.bench.rel_ci",
        message=message,
    )


def expect_check(est: SteadyEstimate, key: str, expected: float, tolerance: float) -> Check:
    value = est.interval.estimate
    ratio = value / expected if expected else math.inf
    better = ratio > 1 if higher_is_better(est.metric) else ratio < 1
    off = abs(ratio - 1)
    ok = off <= tolerance
    if ok:
        how = f"within {tolerance:.0%} of expected {_fmt(expected)}"
        severity = "error"
    elif better:
        how = (
            f"{off:.1%} better than expected {_fmt(expected)} (tolerance {tolerance:.0%}): "
            f"update expect.bench.{key} if this is real, or check the run did the same work"
        )
        severity = "warning"
    else:
        how = f"{off:.1%} worse than expected {_fmt(expected)} (tolerance {tolerance:.0%})"
        severity = "error"
    return Check(
        id=f"expect:{est.metric}",
        ok=ok,
        severity=severity,
        value=value,
        threshold=expected,
        key=f"expect.bench.{key}",
        message=f"{est.metric} = {_fmt(value)}: {how}",
    )


def _metric_for(key: str, columns: list[str]) -> str | None:
    """An expect key names a metric fully (perf/rollout_time) or by its last part."""
    if key in columns:
        return key
    matches = [c for c in columns if c.split("/")[-1] == key]
    return matches[0] if len(matches) == 1 else None


def judge(
    outcome: StageRun, options: BenchStage, expect: dict[str, float], watcher: BenchWatcher | None
) -> tuple[Judgement, dict[str, SteadyEstimate]]:
    rule = stopping_rule(options)
    steps = outcome.steps
    rows = complete_rows(steps, options.metrics)
    stop = _stop_reason(outcome, watcher)
    late = 0
    if watcher is not None and watcher.decision is not None and stop == "precise":
        # Judged on the steps the rule stopped on: a step that finished while the job was being
        # stopped could widen an interval and fail the precision the run was stopped for.
        late = max(len(rows) - watcher.decision.steps, 0)
        rows = rows.iloc[: watcher.decision.steps]
    series = _series(rows, options.metrics)
    estimates = {m: _steady(v, m, rule) for m, v in series.items()}
    summary: dict[str, Any] = {
        "rel_ci": rule.rel_ci,
        "min_steps": rule.min_steps,
        "max_steps": rule.max_steps,
        "interval": rule.interval,
        "steps": len(rows),
        "steps_after_stop": late,
        "stop": stop,
        "metrics": {m: e.to_dict() for m, e in estimates.items()},
    }
    if watcher is not None:
        summary["stopping_rule_calls"] = watcher.calls
        summary["stopping_rule_ms_per_call"] = round(
            1e3 * watcher.seconds / max(watcher.calls, 1), 3
        )
    if TOKENS_PER_GPU in steps.columns:
        tokens = _steady(rows[TOKENS_PER_GPU].to_numpy(float), TOKENS_PER_GPU, rule)
        estimates[TOKENS_PER_GPU] = tokens
        summary["tokens_per_gpu_per_sec"] = tokens.to_dict()
    failure = run_failure(outcome)
    missing = [m for m, e in estimates.items() if m in options.metrics and e.steps == 0]
    if failure is None and missing:
        failure = (
            f"watched metric(s) never logged: {', '.join(missing)}; check "
            f"stages.bench.metrics against the log ({outcome.log_path})"
        )
    if failure is not None:
        return Judgement(checks=[], summary=summary, error=failure), estimates
    checks = [precision_check(estimates[m], rule, options.on_max_steps) for m in options.metrics]
    columns = [c for c in rows.columns if c not in (ROLLOUT_ID, "timestamp")]
    for key, expected in expect.items():
        metric = _metric_for(key, columns)
        if metric is None:
            checks.append(
                Check(
                    id=f"expect:{key}",
                    ok=False,
                    severity="warning",
                    key=f"expect.bench.{key}",
                    message=f"expect.bench.{key} names no logged metric",
                )
            )
            continue
        if metric not in estimates:
            estimates[metric] = _steady(rows[metric].to_numpy(float), metric, rule)
            summary["metrics"][metric] = estimates[metric].to_dict()
        checks.append(expect_check(estimates[metric], key, expected, options.tolerance))
    imprecise = [
        c.id.split(":", 1)[1] for c in checks if c.id.startswith("precision:") and not c.ok
    ]
    message = ""
    if imprecise:
        message = (
            f"{', '.join(imprecise)} not precise enough after {summary['steps']} steps "
            f"(rel_ci {rule.rel_ci:.1%}; on_max_steps: {options.on_max_steps})"
        )
    return Judgement(checks=checks, summary=summary, message=message), estimates


def _stop_reason(outcome: StageRun, watcher: BenchWatcher | None) -> str:
    if outcome.run is None:
        return "judged from a log"
    if outcome.run.stopped and watcher is not None and watcher.decision is not None:
        return watcher.decision.reason
    return "the run ended by itself"


def _plot(
    request: StageRequest,
    steps: pd.DataFrame,
    metrics: list[str],
    estimates: dict[str, SteadyEstimate],
) -> dict[str, str]:
    from recipeval.analysis.plots import step_time_plot

    rows = complete_rows(steps, metrics)
    series = {}
    for metric in [*metrics, TOKENS_PER_GPU]:
        if metric not in rows.columns or metric not in estimates:
            continue
        values = rows[metric].to_numpy(float)
        finite = np.isfinite(values)
        series[metric] = (rows[ROLLOUT_ID].to_numpy()[finite], values[finite])
    if not series:
        return {}
    return {"plot": str(step_time_plot(series, estimates, request.artifact(".steps.png")))}


def execute_bench(request: StageRequest) -> Verdict:
    """Run the bench overlay with the stopping rule watching (not when judging a log)."""
    resolved, launch = resolve_and_render(request)
    options = request.loaded.recipe.stages.bench
    watcher = (
        None if request.from_log else BenchWatcher(list(options.metrics), stopping_rule(options))
    )
    outcome = execute(
        request,
        resolved,
        launch,
        request.artifact(".log"),
        watcher,
        watcher.precision if watcher is not None else None,
    )
    expect = dict(request.loaded.recipe.expect.get("bench", {}))
    judgement, estimates = judge(outcome, options, expect, watcher)
    artifacts = _plot(request, outcome.steps, list(options.metrics), estimates)
    return Verdict(judgement, outcome.steps, artifacts, run_summary(outcome), outcome.gpu)


BENCH = Stage(
    name=STAGE,
    execute=execute_bench,
)


__all__ = ["BENCH", "STAGE", "BenchWatcher", "judge", "watched_series"]
