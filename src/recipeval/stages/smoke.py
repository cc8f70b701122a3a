"""smoke: a short run with the smoke overlay. Pass when the job exits cleanly, every expected
rollout id is logged, loss and grad norm are finite, the step-0 invariants miles' own CI
checks hold (ppo_kl and pg_clipfrac ~ 0: before the first update the policy is the one that
produced the old logprobs) and the train-rollout logprob diff is finite."""

from __future__ import annotations

import math

import pandas as pd

from recipeval.recipe import Resolved
from recipeval.result import Check
from recipeval.stages.common import Judgement, StageRequest, StageRun, run_failure, with_log_tail
from recipeval.stages.driver import Stage, launch_once

STAGE = "smoke"
# Step 0 is computed on the policy that sampled the rollout: the ratio is exactly 1 up to
# round-off (miles' CI asserts < 1e-8 for MLA models); 1e-6 leaves room for reduced precision.
STEP0_PPO_KL_MAX = 1e-6
STEP0_CLIPFRAC_MAX = 1e-6
PY_TRACEBACK = "Traceback (most recent call last):"


def expected_rollouts(resolved: Resolved) -> int:
    """The smoke overlay's num-rollout (the recipe schema holds it to a positive integer)."""
    return int(resolved.arg("num-rollout"))


def _column(steps: pd.DataFrame, name: str) -> pd.Series | None:
    return steps[name] if name in steps.columns else None


def trained_rollouts(steps: pd.DataFrame) -> list[int]:
    """Rollout ids whose training step was logged (any train/ metric, even a nan one that
    comes with others)."""
    train = [c for c in steps.columns if c.startswith("train/")]
    if steps.empty or not train:
        return []
    return [int(i) for i in steps.loc[steps[train].notna().any(axis=1), "rollout_id"]]


def finite_check(steps: pd.DataFrame, check_id: str, column: str) -> Check:
    values = _column(steps, column)
    if values is None or values.isna().all():
        return Check(id=check_id, ok=False, message=f"{column} was never logged")
    bad = steps.loc[~values.map(lambda v: isinstance(v, float) and math.isfinite(v)), "rollout_id"]
    worst = float(values.abs().max()) if bad.empty else None
    return Check(
        id=check_id,
        ok=bad.empty,
        value=worst if bad.empty else [int(i) for i in bad],
        message=f"{column} finite at every rollout"
        if bad.empty
        else f"{column} not finite (or missing) at rollout ids {', '.join(str(int(i)) for i in bad)}",
    )


def step0_check(steps: pd.DataFrame, check_id: str, column: str, limit: float) -> Check:
    values = _column(steps, column)
    if values is None or steps.empty or pd.isna(values.iloc[0]):
        return Check(
            id=check_id,
            ok=False,
            threshold=limit,
            message=f"{column} at the first step was not logged",
        )
    value = float(values.iloc[0])
    ok = math.isfinite(value) and abs(value) <= limit
    return Check(
        id=check_id,
        ok=ok,
        value=value,
        threshold=limit,
        message=f"{column} at step {int(steps['rollout_id'].iloc[0])} = {value:.3g} "
        f"({'within' if ok else 'above'} {limit:g}: the first update starts from the sampling policy)",
    )


def judge(outcome: StageRun, expected: int) -> Judgement:
    steps = outcome.steps
    failure = run_failure(outcome)
    trained = trained_rollouts(steps)
    if (
        failure is None
        and outcome.run is None
        and len(trained) < expected
        and any(PY_TRACEBACK in line for line in outcome.tail)
    ):
        failure = with_log_tail("the logged run crashed", outcome)
    checks: list[Check] = []
    if outcome.run is not None:
        checks.append(
            Check(
                id="exit_status",
                ok=outcome.run.exit_code == 0 and not outcome.run.timed_out,
                value=outcome.run.exit_code,
                threshold=0,
                message=outcome.run.detail or "exited with status 0",
            )
        )
    else:
        checks.append(
            Check(
                id="exit_status",
                ok=True,
                severity="info",
                message="judged from an existing log: exit status unknown",
            )
        )
    ids = trained
    checks.append(
        Check(
            id="rollouts_logged",
            ok=len(ids) == expected,
            value=len(ids),
            threshold=expected,
            message=f"{len(ids)} of {expected} rollout ids logged with training metrics"
            + (f" ({ids[0]}..{ids[-1]})" if ids else ""),
        )
    )
    checks += [
        finite_check(steps, "loss_finite", "train/loss"),
        finite_check(steps, "grad_norm_finite", "train/grad_norm"),
        step0_check(steps, "step0_ppo_kl", "train/ppo_kl", STEP0_PPO_KL_MAX),
        step0_check(steps, "step0_pg_clipfrac", "train/pg_clipfrac", STEP0_CLIPFRAC_MAX),
        finite_check(steps, "logprob_abs_diff_finite", "train/train_rollout_logprob_abs_diff"),
    ]
    if outcome.parsed.malformed_count:
        checks.append(
            Check(
                id="malformed_log_lines",
                ok=True,
                severity="warning",
                value=outcome.parsed.malformed_count,
                message=f"{outcome.parsed.malformed_count} metric line(s) could not be read and were "
                f"skipped (first at log line {outcome.parsed.malformed[0].line_number})",
            )
        )
    summary = {"expected_rollouts": expected}
    for column in (
        "train/loss",
        "train/grad_norm",
        "train/train_rollout_logprob_abs_diff",
        "perf/step_time",
        "cycle_time",
    ):
        values = _column(steps, column)
        finite = values[values.map(math.isfinite)] if values is not None else None
        if finite is not None and not finite.empty:
            summary[f"mean {column}"] = float(finite.mean())
    return Judgement(checks=checks, summary=summary, error=failure)


def _judge_run(request: StageRequest, outcome: StageRun) -> Judgement:
    return judge(outcome, expected_rollouts(outcome.resolved))


SMOKE = Stage(
    name=STAGE,
    execute=launch_once(_judge_run),
)


__all__ = ["SMOKE", "STAGE", "judge"]
