"""The one path every stage takes, env_check included:

    gates (--require) -> invalidate the previous result -> time -> execute -> summarise
    -> finish: DIR/<stage>.json (StageResult) + DIR/<stage>.steps.parquet

A stage is a `Stage`: its name and `execute`, which says what it launches and how it judges
(`launch_once` builds it for a stage of one launch). Rules between recipe keys live in the
recipe schema, so `recipeval validate` reports them; bad input raises RecipeError/UsageError
(exit 2) before anything is written or removed.
"""

from __future__ import annotations

import dataclasses
import glob
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from recipeval.engines.miles.logparse import write_steps
from recipeval.errors import UsageError
from recipeval.outpath import output_file_problem
from recipeval.readfile import regular_file_problem
from recipeval.recipe import resolve
from recipeval.recipe.facts import recipe_facts
from recipeval.result import StageResult, now_iso, provenance, read_result, write_result
from recipeval.stages.common import (
    ARTIFACT_SUFFIXES,
    Judgement,
    OnSteps,
    StageRequest,
    StageRun,
    execute,
    resolve_and_render,
    run_summary,
)


@dataclass
class Verdict:
    """What a stage's execute hands back to the driver."""

    judgement: Judgement
    steps: pd.DataFrame | None = None  # the step table to write (None: no run)
    artifacts: dict[str, str] = field(default_factory=dict)  # files it wrote beside the result
    run_facts: dict[str, object] = field(default_factory=dict)  # runner, exit code, ...
    # The GPU it saw, where it looked: env_check's live probe, or the node a run ran on.
    gpu: str | None = None


@dataclass(frozen=True)
class Stage:
    name: str
    execute: Callable[[StageRequest], Verdict]  # launch (or read --from-log) and judge


def launch_once(
    judge: Callable[[StageRequest, StageRun], Judgement],
    on_steps: Callable[[StageRequest], OnSteps | None] | None = None,
) -> Callable[[StageRequest], Verdict]:
    """`execute` for a stage of one launch of its overlay: run it (or read --from-log), then
    judge the run; `on_steps` builds the hook that may stop the run early."""

    def execute_once(request: StageRequest) -> Verdict:
        resolved, launch = resolve_and_render(request)
        hook = on_steps(request) if on_steps is not None else None
        outcome = execute(request, resolved, launch, request.artifact(".log"), hook)
        return Verdict(
            judge(request, outcome), outcome.steps, run_facts=run_summary(outcome), gpu=outcome.gpu
        )

    return execute_once


def run(stage: Stage, request: StageRequest) -> StageResult:
    """Run one stage for one recipe and write its result (unless request.out is None)."""
    if request.stage != stage.name:
        raise ValueError(f"stage {stage.name} got a {request.stage} request")
    problem = request.from_log and regular_file_problem(request.from_log, "log file")
    if problem:
        raise UsageError(f"--from-log {request.from_log}: {problem}")
    check_outputs(request)
    blocked = gate_block(request)
    if blocked is not None:
        return skipped(request, *blocked)
    invalidate(request)
    started = now_iso()
    clock = time.monotonic()
    verdict = stage.execute(dataclasses.replace(request, began=clock))
    summary = {
        **verdict.run_facts,
        "stage_wall_s": round(time.monotonic() - clock, 3),
        **verdict.judgement.summary,
    }
    judgement = dataclasses.replace(verdict.judgement, summary=summary)
    return finish(request, judgement, started, verdict.steps, verdict.artifacts, verdict.gpu)


def check_outputs(request: StageRequest) -> None:
    """A folder or device where the stage writes one of its files (DIR/<stage>.json, .log,
    .steps.parquet, ...) is bad input, found before the previous result is removed or a run
    starts; it would end the run in a traceback, with its result lost."""
    path = request.result_path
    if path is None:
        return
    stem = glob.escape(path.stem)
    for file in [path, *path.parent.glob(f"{stem}.*"), *path.parent.glob(f".{stem}.*")]:
        problem = output_file_problem(str(file))
        if problem:
            raise UsageError(
                f"{file}: {problem}; the {request.stage} stage writes it (or choose another --out)"
            )


def invalidate(request: StageRequest) -> None:
    """Remove the previous result and its tables and plots before anything runs: a run that is
    killed, or that dies before it writes, must not leave an old verdict, step table or plot
    beside its new, partial log. The log itself is rewritten by the run (or is --from-log)."""
    path = request.result_path
    if path is None:
        return
    path.unlink(missing_ok=True)
    for suffix in ARTIFACT_SUFFIXES:
        request.artifact(suffix).unlink(missing_ok=True)


def gate_block(request: StageRequest) -> tuple[str, StageResult] | None:
    """The first --require gate that is not `pass`, with its result; bad gate files are bad
    input (exit 2)."""
    for gate in request.require:
        try:
            result = read_result(gate)
        except OSError as err:
            raise UsageError(
                f"--require {gate}: cannot read it ({err.strerror}); run that stage first"
            ) from None
        except ValueError:
            raise UsageError(f"--require {gate}: not a recipeval stage result (JSON)") from None
        if result.status != "pass":
            return str(gate), result
    return None


def finish(
    request: StageRequest,
    judgement: Judgement,
    started: str,
    steps: pd.DataFrame | None,
    extra_artifacts: dict[str, str] | None = None,
    gpu: str | None = None,
) -> StageResult:
    """Build the StageResult (status from the judgement, the recipe facts publish needs) and
    write it with the step table; return it."""
    artifacts: dict[str, str] = {}
    if request.out is not None:
        if request.artifact(".log").exists():
            artifacts["log"] = str(request.artifact(".log"))
        if steps is not None:
            artifacts["steps"] = str(write_steps(steps, request.artifact(".steps.parquet")))
    artifacts |= extra_artifacts or {}
    loaded = request.loaded
    prov = provenance(loaded.recipe.name, loaded.sha256, request.stage, loaded.path, started)
    prov.finished = now_iso()
    prov.gpu = gpu
    result = StageResult(
        stage=request.stage,
        recipe=loaded.recipe.name,
        status=judgement.status,
        checks=judgement.checks,
        summary=judgement.summary,
        provenance=prov,
        artifacts=artifacts,
        message=judgement.verdict,
        recipe_facts=recipe_facts(resolve(loaded.recipe, request.stage)),
    )
    if request.result_path is not None:
        write_result(result, request.result_path)
    return result


def skipped(request: StageRequest, gate: str, gate_result: StageResult) -> StageResult:
    reason = gate_result.message or ", ".join(c.id for c in gate_result.failed_checks()) or "-"
    loaded = request.loaded
    prov = provenance(loaded.recipe.name, loaded.sha256, request.stage, loaded.path)
    prov.finished = prov.started
    result = StageResult(
        stage=request.stage,
        recipe=loaded.recipe.name,
        status="skipped",
        provenance=prov,
        message=f"skipped: gate {gate_result.stage} ({gate}) is {gate_result.status}: {reason}",
        recipe_facts=recipe_facts(resolve(loaded.recipe, request.stage)),
    )
    if request.result_path is not None:
        write_result(result, request.result_path)
    return result
