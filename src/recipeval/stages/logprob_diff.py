"""logprob_diff: is the recipe numerically sound? Per variant (stages.logprob_diff.variants;
none given: the recipe as is), a short run with the logprob_diff overlay, then train-vs-rollout
logprob statistics (analysis.logprob): from the engine's per-token dump where it makes one
(the reference engine, through --dump-logprobs), else from the logged scalars.

Verdicts per variant, against the anchors' limits (overridable in stages.logprob_diff
.thresholds; any statistic may be given a limit there, `abs_diff_cutoff` sets the |d| cutoff
of frac_above_cutoff):
- worst_rollout_abs_mean_diff <= 0.03 (miles --ci-test, which checks every rollout) and
  first_rollout_abs_mean_diff <= 0.03 (the same limit at rollout 0, same weights on both sides,
  so any gap is numerics);
- token_mult_prob_error <= 1.05 and prob_abs_diff_mean <= 0.01 at the worst rollout (NeMo-RL
  and verl watch these at every step);
- rollout_growth: no rollout's mean |d| may exceed rollout 0's by more than miles' own history
  band (+50 %, absolute floor 0.02). The two sides share weights through the weight sync; a
  sync that is skipped or broken shows as a diff that grows with every update.
Variant vs reference (`baseline`, else the first variant): the shift in per-sample mean |d|
with its 95 % Welch interval and a Mann-Whitney p-value, so a backend change reads as a signed
difference with its uncertainty; and the two rollout paths compared directly on identical
tokens, free of sampling noise. Where the engine can re-score a dump (the reference engine,
through --score-tokens), each variant's rollout path scores every token the reference variant
sampled at the first rollout, where both sides hold the very same weights (later rollouts
follow a trainer that on a GPU does not repeat itself bit for bit: on an H200 a run's own
re-score matched its sampled logprobs bitwise at rollout 0 and not at rollout 1). Otherwise,
where both variants dumped tokens, the comparison falls back to the tokens both sampled at the
first rollout (same weights, same seed: the shared prefix of each response).

Files: DIR/logprob_diff.json, .log (the variants' logs, each after a marker line),
.steps.parquet, .tokens.parquet and .rescored.parquet (with a `variant` column), .hist.png,
.position.png. `--from-log` re-judges such a log (and the token tables beside it, when there
are some).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recipeval.analysis import logprob as lp
from recipeval.analysis import logprob_compare as lc
from recipeval.atomic import atomic_write_text
from recipeval.engines import engine_for, render
from recipeval.engines.miles.logparse import write_steps
from recipeval.errors import RecipeError
from recipeval.recipe import resolve
from recipeval.recipe.schema import ABS_DIFF_CUTOFF
from recipeval.result import Check
from recipeval.runners import default_runner_name
from recipeval.stages.common import (
    Judgement,
    StageRequest,
    StageRun,
    execute,
    run_failure,
    with_log_tail,
)
from recipeval.stages.driver import Stage, Verdict

STAGE = "logprob_diff"
REFERENCE_NAME = "baseline"
MARKER = re.compile(r"^=== recipeval logprob_diff variant (?P<name>.+) ===$")
# Args that must match for one variant to re-score another's tokens (same prompts, same shape).
SAME_PROMPTS = ("seed", "rollout-batch-size", "n-samples-per-prompt", "rollout-max-response-len")
# The re-scoring runs' logs follow this marker; judging a log leaves them out.
RESCORE_MARKER = re.compile(r"^=== recipeval logprob_diff rescoring .+ ===$")
WORST_ROLLOUT_CHECKS = ("token_mult_prob_error", "prob_abs_diff_mean")


def marker(name: str) -> str:
    return f"=== recipeval logprob_diff variant {name} ==="


def rescore_marker(name: str, reference: str) -> str:
    return f"=== recipeval logprob_diff rescoring {reference} tokens under {name} ==="


def file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


@dataclass
class VariantRun:
    """One variant's data, however it was obtained."""

    name: str
    steps: pd.DataFrame
    tokens: pd.DataFrame | None
    log_lines: list[str]
    failure: str | None = None
    # This variant's rollout logprobs of the reference variant's sampled tokens.
    rescored: pd.DataFrame | None = None
    rescore_log: list[str] = dataclasses.field(default_factory=list)
    gpu: str | None = None  # StageRun.gpu


@dataclass
class VariantVerdict:
    name: str
    summary: dict[str, Any]
    checks: list[Check]
    per_sample_abs_diff: np.ndarray
    abs_diffs: np.ndarray | None
    buckets: pd.DataFrame | None
    tokens: pd.DataFrame | None
    rescored: pd.DataFrame | None


def variant_names(request: StageRequest) -> tuple[list[str | None], str | None]:
    """The variants to run (None: the recipe as is) and the reference among them."""
    variants = list(request.loaded.recipe.stages.logprob_diff.variants)
    if not variants:
        return [None], None
    return variants, REFERENCE_NAME if REFERENCE_NAME in variants else variants[0]


def thresholds(request: StageRequest) -> tuple[dict[str, tuple[float, str]], float]:
    """Defaults with the recipe's overrides (the schema has checked their names)."""
    given = dict(request.loaded.recipe.stages.logprob_diff.thresholds)
    cutoff = float(given.pop(ABS_DIFF_CUTOFF, lp.DEFAULT_ABS_DIFF_CUTOFF))
    return lp.thresholds_with(given), cutoff


# --- getting the data ---------------------------------------------------------------


def run_variant(
    request: StageRequest, name: str | None, score_tokens: Path | None = None
) -> VariantRun:
    """One short run of a variant; with `score_tokens` (reference engine) one rollout in which
    its rollout path scores that dump's responses instead of sampling its own."""
    label = name or REFERENCE_NAME
    try:
        resolved = resolve(request.loaded.recipe, STAGE, name)
    except KeyError as err:
        raise RecipeError(request.loaded.path, str(err.args[0])) from None
    kind = "rescored" if score_tokens else "tokens"
    dump = request.out / f".{STAGE}.{file_safe(label)}.{kind}.parquet"
    engine = engine_for(resolved.recipe.engine)
    if engine.dump_args is not None:
        extra = engine.dump_args(dump)
        if score_tokens and engine.rescore_args is not None:
            extra |= engine.rescore_args(score_tokens)
        resolved = dataclasses.replace(resolved, args={**resolved.args, **extra})
    dump.unlink(missing_ok=True)
    log_path = request.out / f".{STAGE}.{file_safe(label)}.{kind}.log"
    outcome = execute(
        request,
        resolved,
        render(resolved, out=request.out),
        log_path,
        label=f"{STAGE} {label}{' re-score' if score_tokens else ''}",
    )
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    log_path.unlink(missing_ok=True)
    tokens = None
    if dump.is_file():
        tokens = pd.read_parquet(dump)
        dump.unlink()
    # the variant's own log is gone: its lines are in the stage's log, after its marker
    return VariantRun(
        label,
        outcome.steps,
        tokens,
        lines,
        _failure(outcome, request.artifact(".log")),
        gpu=outcome.gpu,
    )


def rescore(request: StageRequest, runs: list[VariantRun], reference: str | None) -> None:
    """Each other variant's rollout path on the reference variant's first-rollout tokens, where
    the engine can score a dump (the reference engine); sets `rescored` on each such run."""
    ref = next((r for r in runs if r.name == reference), None)
    if not engine_for(request.loaded.recipe.engine).rescoring or ref is None or ref.tokens is None:
        return
    recipe = request.loaded.recipe
    prompts = {key: resolve(recipe, STAGE, ref.name).args.get(key) for key in SAME_PROMPTS}
    source = request.out / f".{STAGE}.{file_safe(ref.name)}.sampled.parquet"
    ref.tokens[ref.tokens["rollout_id"] == ref.tokens["rollout_id"].min()].to_parquet(source)
    try:
        for run in runs:
            same = all(
                resolve(recipe, STAGE, run.name).args.get(k) == v for k, v in prompts.items()
            )
            if run is ref or run.failure or not same:
                continue  # other prompts or batch shape: compared on the shared prefix only
            scored = run_variant(request, run.name, score_tokens=source)
            run.rescore_log = [rescore_marker(run.name, ref.name), *scored.log_lines]
            if scored.failure or scored.tokens is None:
                run.failure = (
                    f"re-scoring {ref.name}'s tokens failed: {scored.failure or 'no dump'}"
                )
            else:
                run.rescored = scored.tokens
    finally:
        source.unlink(missing_ok=True)


def _failure(outcome: StageRun, log: Path) -> str | None:
    failure = run_failure(outcome, log)
    if failure is None and outcome.steps.empty:
        failure = with_log_tail("the run logged no rollout", outcome, log)
    return failure


def split_log(lines: list[str], names: list[str | None]) -> dict[str, list[str]]:
    """A combined stage log -> lines per variant; a log without markers is the reference's
    (or the only) variant."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in lines:
        match = MARKER.match(line.strip())
        if match:
            current = match.group("name")
            parts.setdefault(current, [])
        elif RESCORE_MARKER.match(line.strip()):
            current = None
        elif current is not None:
            parts[current].append(line)
    if not parts:
        first = names[0] or REFERENCE_NAME
        return {first: lines}
    return parts


def from_log(request: StageRequest, names: list[str | None]) -> list[VariantRun]:
    source = request.from_log
    assert source is not None
    lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    paths = {
        kind: source.with_name(f"{source.stem}.{kind}.parquet") for kind in ("tokens", "rescored")
    }
    tables = {kind: pd.read_parquet(path) for kind, path in paths.items() if path.is_file()}
    runs = []
    recipe = request.loaded.recipe
    engine = engine_for(recipe.engine)
    for name, part in split_log(lines, names).items():
        parser = engine.parser(
            resolve(recipe, STAGE, name if name in recipe.stages.logprob_diff.variants else None)
        )
        for line in part:
            parser.feed(line)
        steps = parser.table()
        mine = {kind: _variant_rows(table, name) for kind, table in tables.items()}
        failure = None if len(steps) else f"variant {name}: the log holds no rollout"
        runs.append(
            VariantRun(name, steps, mine.get("tokens"), part, failure, mine.get("rescored"))
        )
    return runs


def _variant_rows(table: pd.DataFrame, name: str) -> pd.DataFrame | None:
    if "variant" not in table.columns:
        return None
    mine = table[table["variant"] == name].drop(columns="variant")
    return mine if len(mine) else None


# --- judging --------------------------------------------------------------------------


def growth_check(name: str, by_rollout: pd.Series) -> Check:
    growth = lc.rollout_growth(by_rollout)
    if growth is None:
        return Check(
            id=f"{name}:rollout_growth",
            ok=True,
            severity="info",
            message="one rollout only: growth along the run not measurable",
        )
    return Check(
        id=f"{name}:rollout_growth",
        ok=growth.ok,
        value=growth.worst,
        threshold=growth.limit,
        message=f"mean |d| {growth.first:.4g} at the first rollout, worst later "
        f"{growth.worst:.4g} (rollout {growth.worst_at}); limit {growth.limit:.4g} (+50 %, "
        f"floor +0.02)"
        + (
            ""
            if growth.ok
            else ": the diff grows with training, as when the rollout side misses weight updates"
        ),
    )


def judge_variant(
    run: VariantRun, limits: dict[str, tuple[float, str]], cutoff: float
) -> VariantVerdict:
    checks: list[Check] = []
    if run.tokens is not None and len(run.tokens):
        lp.check_token_table(run.tokens)
        overall = lp.diff_stats(run.tokens, abs_diff_cutoff=cutoff)
        rollouts = lc.per_rollout(run.tokens, cutoff)
        values = overall.to_dict()
        for key in WORST_ROLLOUT_CHECKS:
            values[key] = float(rollouts[key].max())
        values["worst_rollout_abs_mean_diff"] = float(rollouts["mean_diff"].abs().max())
        summary: dict[str, Any] = {
            "source": "token dump",
            **overall.to_dict(),
            **{f"worst_rollout_{k}": values[k] for k in WORST_ROLLOUT_CHECKS},
            "worst_rollout_abs_mean_diff": values["worst_rollout_abs_mean_diff"],
        }
        growth = rollouts.set_index("rollout_id")["mean_abs_diff"]
        samples = lc.per_sample_abs_diff(run.tokens)
        abs_diffs = lc.token_abs_diffs(run.tokens)
        buckets = lp.by_position(run.tokens)
        summary["by_position"] = buckets.to_dict(orient="records")
    else:
        scalars = lp.scalar_stats(run.steps)
        values = scalars.to_dict()
        summary = {"source": "logged scalars", **values}
        column = run.steps.get(lp.SCALAR_ABS_DIFF)
        growth = (
            pd.Series(column.to_numpy(float), index=run.steps["rollout_id"])
            if column is not None
            else pd.Series(dtype=float)
        )
        samples = growth.dropna().to_numpy(float)
        abs_diffs, buckets = None, None
    for verdict in lp.judge(values, limits):
        shown = "not measured" if math.isnan(verdict.value) else f"{verdict.value:.4g}"
        checks.append(
            Check(
                id=f"{run.name}:{verdict.check}",
                ok=verdict.ok,
                value=verdict.value,
                threshold=verdict.limit,
                key=f"stages.logprob_diff.thresholds.{verdict.check}",
                message=f"{verdict.check} = {shown} ({'within' if verdict.ok else 'above'} "
                f"{verdict.limit:g}, {verdict.source})",
            )
        )
    checks.append(growth_check(run.name, growth))
    return VariantVerdict(
        run.name, summary, checks, samples, abs_diffs, buckets, run.tokens, run.rescored
    )


def compare(variant: VariantVerdict, reference: VariantVerdict) -> dict[str, Any]:
    """The pairwise summary entry: the shift of per-sample mean |d| (variant - reference) and,
    where the shift could be tested, both rollout paths on identical tokens."""
    shift = lc.compare_samples(variant.per_sample_abs_diff, reference.per_sample_abs_diff)
    pair = {"variant": variant.name, "reference": reference.name, **shift.to_dict()}
    same = (
        lc.identical_tokens(reference.tokens, variant.tokens, variant.rescored)
        if shift.tested
        else None
    )
    return pair | ({"identical_tokens": same.to_dict()} if same is not None else {})


def pair_message(pair: dict[str, Any]) -> str:
    if "low" in pair:
        sign = "higher" if pair["shift"] > 0 else "lower"
        text = (
            f"mean |d| {sign} than {pair['reference']} by {abs(pair['shift']):.4g} "
            f"(95 % interval [{pair['low']:.4g}, {pair['high']:.4g}], Mann-Whitney p = "
            f"{pair['p_value']:.2g})" + ("" if pair["clear"] else ": not a clear difference")
        )
    else:
        text = pair["message"]
    same = pair.get("identical_tokens")
    if same and same["tokens"]:
        where = (
            f"every token {pair['reference']} sampled at the first rollout, re-scored"
            if same["method"] == "re-scored"
            else "the tokens both sampled at the first rollout"
        )
        text += (
            f"; on {same['tokens']} identical tokens ({where}) its rollout logprobs "
            f"differ from {pair['reference']}'s by {same['mean_abs_diff']:.4g} on "
            f"average (mean signed {same['mean_diff']:+.4g}, max {same['max_abs_diff']:.4g})"
        )
    return text


def judge_all(
    runs: list[VariantRun],
    reference: str | None,
    limits: dict[str, tuple[float, str]],
    cutoff: float,
) -> tuple[Judgement, list[VariantVerdict]]:
    failures = [f"variant {r.name}: {r.failure}" for r in runs if r.failure]
    verdicts = [judge_variant(r, limits, cutoff) for r in runs if not r.failure]
    checks = [c for v in verdicts for c in v.checks]
    summary: dict[str, Any] = {
        "reference": reference or runs[0].name,
        "variants": {v.name: v.summary for v in verdicts},
    }
    ref = next((v for v in verdicts if v.name == summary["reference"]), None)
    if ref is not None:
        # The headline number under miles' own name (its per-sample-mean definition), for
        # tables and history: the recipe as it stands is the reference variant.
        summary["train_rollout_logprob_abs_diff"] = ref.summary.get("mean_abs_diff")
        pairs = [compare(v, ref) for v in verdicts if v is not ref]
        summary["pairwise"] = pairs
        checks += [
            Check(
                id=f"{pair['variant']}:vs_{pair['reference']}",
                ok=True,
                severity="info",
                value=pair.get("shift"),
                message=pair_message(pair),
            )
            for pair in pairs
        ]
    if failures:
        return Judgement(checks=checks, summary=summary, error="; ".join(failures)), verdicts
    failed = sorted({c.id.split(":")[0] for c in checks if not c.ok and c.severity == "error"})
    message = f"failing variant(s): {', '.join(failed)}" if failed else ""
    return Judgement(checks=checks, summary=summary, message=message), verdicts


# --- outputs --------------------------------------------------------------------------


def write_outputs(
    request: StageRequest, runs: list[VariantRun], verdicts: list[VariantVerdict], cutoff: float
) -> tuple[pd.DataFrame, dict[str, str]]:
    """The combined log (unless judging it in place), token table and plots; returns the
    combined step table and the artifacts."""
    log_path = request.artifact(".log")
    if request.from_log is None or request.from_log.resolve() != log_path.resolve():
        text = (
            "\n".join(line for r in runs for line in [marker(r.name), *r.log_lines, *r.rescore_log])
            + "\n"
        )
        atomic_write_text(log_path, text)
    steps = pd.concat([r.steps.assign(variant=r.name) for r in runs], ignore_index=True)
    artifacts: dict[str, str] = {}
    for kind in ("tokens", "rescored"):
        tables = [
            getattr(r, kind).assign(variant=r.name) for r in runs if getattr(r, kind) is not None
        ]
        if tables:
            artifacts[kind] = str(
                write_steps(
                    pd.concat(tables, ignore_index=True), request.artifact(f".{kind}.parquet")
                )
            )
    with_tokens = [v for v in verdicts if v.abs_diffs is not None]
    if with_tokens:
        from recipeval.analysis.plots import abs_diff_by_position, abs_diff_histogram

        artifacts["histogram"] = str(
            abs_diff_histogram(
                {v.name: v.abs_diffs for v in with_tokens}, request.artifact(".hist.png"), cutoff
            )
        )
        artifacts["by_position"] = str(
            abs_diff_by_position(
                {v.name: v.buckets for v in with_tokens}, request.artifact(".position.png")
            )
        )
    return steps, artifacts


def execute_logprob_diff(request: StageRequest) -> Verdict:
    """Each variant's run (or their parts of --from-log), the re-scoring runs, the verdicts."""
    limits, cutoff = thresholds(request)
    names, reference = variant_names(request)
    assert request.out is not None
    request.out.mkdir(parents=True, exist_ok=True)
    if request.from_log is not None:
        runs = from_log(request, names)
    else:
        runs = [run_variant(request, name) for name in names]
        rescore(request, runs, reference)
    judgement, verdicts = judge_all(runs, reference, limits, cutoff)
    steps, artifacts = write_outputs(request, runs, verdicts, cutoff)
    runner = "from-log" if request.from_log else request.runner or default_runner_name()
    gpu = next((run.gpu for run in runs if run.gpu), None)
    return Verdict(judgement, steps, artifacts, {"runner": runner}, gpu)


LOGPROB_DIFF = Stage(
    name=STAGE,
    execute=execute_logprob_diff,
)


__all__ = ["LOGPROB_DIFF", "STAGE", "compare", "judge_all", "judge_variant", "split_log"]
