"""What every run stage (smoke, logprob_diff, bench) shares:

    gates (--require) -> resolve -> render -> run with a runner (or read --from-log)
    -> stream the log to DIR/<stage>.log (secrets scrubbed) and into the parser
    -> judge -> DIR/<stage>.json (StageResult) + DIR/<stage>.steps.parquet

A stage supplies only its judge (and optionally `on_steps`, which sees the step table while
the run goes and can stop it, as the bench does once it has enough steps).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from recipeval.engines import render
from recipeval.engines.launch import Launch
from recipeval.engines.miles.logparse import MilesLogParser, ParsedLog, write_steps
from recipeval.errors import RecipeError, SettingError, UsageError
from recipeval.recipe import LoadedRecipe, Resolved, resolve
from recipeval.result import (
    Check,
    StageResult,
    Status,
    now_iso,
    provenance,
    read_result,
    scrub,
    secret_values,
    write_result,
)
from recipeval.runners import RunnerError, RunResult, default_runner_name, make_runner
from recipeval.runners.base import stop_job_on_termination

TAIL_LINES = 30
EXIT_CODES: dict[Status, int] = {"pass": 0, "fail": 1, "error": 3, "skipped": 3}

# Called with the step table so far after each metric line; True asks the runner to stop.
OnSteps = Callable[[pd.DataFrame], bool]


@dataclass
class StageRequest:
    """One stage invocation, as the CLI parsed it."""

    stage: str  # env_check | smoke | logprob_diff | bench
    loaded: LoadedRecipe
    out: Path
    runner: str | None = None  # None: default_runner_name()
    from_log: Path | None = None
    require: list[Path] = field(default_factory=list)
    exit_zero: bool = False
    timeout: float | None = None  # None: the stage overlay's `timeout`

    def artifact(self, suffix: str) -> Path:
        return self.out / f"{self.stage}{suffix}"


@dataclass
class RunOutcome:
    """What a judge sees: the resolved recipe, how the run ended (None when judged from an
    existing log) and the parsed log."""

    resolved: Resolved
    launch: Launch
    run: RunResult | None
    parsed: ParsedLog
    log_path: Path
    tail: list[str]
    runner: str | None
    failure: str | None = None  # the runner or a callback broke: the stage could not judge
    runner_info: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> pd.DataFrame:
        return self.parsed.steps

    def tail_text(self, lines: int = 15) -> str:
        return "\n".join(self.tail[-lines:])


@dataclass
class Judgement:
    checks: list[Check]
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # set: status error with this message (the stage could not judge)
    message: str = ""


Judge = Callable[[RunOutcome], Judgement]


class LogSink:
    """Writes each line (secrets scrubbed) to the stage log, feeds the parser, keeps the last
    lines for error messages, and calls on_steps when the step table changed."""

    def __init__(self, path: Path, secrets: list[str], on_steps: OnSteps | None,
                 stop: threading.Event) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.secrets = secrets
        self.parser = MilesLogParser()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.on_steps = on_steps
        self.stop = stop
        self.callback_error: str | None = None

    def __call__(self, line: str) -> None:
        line = scrub(line, self.secrets)
        self.file.write(line + "\n")
        self.file.flush()
        self.tail.append(line)
        if self.parser.feed(line) is None or self.on_steps is None or self.callback_error:
            return
        try:
            if self.on_steps(self.parser.table()):
                self.stop.set()
        except Exception as err:  # noqa: BLE001 - a broken callback must not wedge the run
            self.callback_error = f"on_steps failed: {type(err).__name__}: {err}"
            self.stop.set()

    def parsed(self) -> ParsedLog:
        return ParsedLog(self.parser.table(), self.parser.lines, self.parser.malformed)

    def close(self) -> None:
        self.file.close()


def gate_block(request: StageRequest) -> tuple[str, StageResult] | None:
    """The first --require gate that is not `pass`, with its result; bad gate files are bad
    input (exit 2)."""
    for gate in request.require:
        try:
            result = read_result(gate)
        except OSError as err:
            raise UsageError(f"--require {gate}: cannot read it ({err.strerror}); run that stage first") from None
        except ValueError:
            raise UsageError(f"--require {gate}: not a recipeval stage result (JSON)") from None
        if result.status != "pass":
            return str(gate), result
    return None


def resolve_and_render(request: StageRequest, variant: str | None = None) -> tuple[Resolved, Launch]:
    """Raises RecipeError (exit 2) naming the recipe file, line and key."""
    recipe = request.loaded.recipe
    try:
        resolved = resolve(recipe, request.stage, variant)
        return resolved, render(resolved)
    except KeyError as err:
        raise RecipeError(request.loaded.path, str(err.args[0])) from None
    except SettingError as err:
        raise request.loaded.error(err.key, err.message) from None


def execute(
    request: StageRequest,
    resolved: Resolved,
    launch: Launch,
    log_path: Path,
    on_steps: OnSteps | None = None,
) -> RunOutcome:
    """Run the launch (or read request.from_log), streaming into log_path and the parser."""
    secrets = secret_values({**os.environ, **launch.env}, launch.argv)
    stop = threading.Event()
    if request.from_log is not None:
        return _from_log(request, resolved, launch, log_path, secrets)
    sink = LogSink(log_path, secrets, on_steps, stop)
    runner_name = request.runner or default_runner_name()
    timeout = request.timeout or (resolved.options.timeout if resolved.options else None)
    run: RunResult | None = None
    failure = None
    info: dict[str, Any] = {}
    try:
        with stop_job_on_termination(), make_runner(runner_name, launch) as runner:
            info = runner.describe()
            run = runner.run(launch, sink, timeout=timeout, stop=stop)
    except RunnerError as err:
        failure = f"runner {runner_name}: {err}"
    except Exception as err:  # noqa: BLE001 - the stage writes an error result, not a traceback
        failure = f"runner {runner_name} failed: {type(err).__name__}: {err}"
    finally:
        sink.close()
    failure = failure or sink.callback_error
    return RunOutcome(resolved, launch, run, sink.parsed(), log_path, list(sink.tail),
                      runner_name, failure, info)


def _from_log(request: StageRequest, resolved: Resolved, launch: Launch, log_path: Path,
              secrets: list[str]) -> RunOutcome:
    source = request.from_log
    assert source is not None
    if not source.is_file():
        raise UsageError(f"--from-log {source}: no such file")
    sink = LogSink(log_path.with_name(f".{log_path.name}.{os.getpid()}.tmp"), secrets, None,
                   threading.Event())
    try:
        with open(source, encoding="utf-8", errors="replace", newline="") as fh:
            for line in fh:
                sink(line.rstrip("\r\n"))
    finally:
        sink.close()
    # Written aside, then moved: the given log may be the stage log itself.
    shutil.move(sink.file.name, log_path)
    return RunOutcome(resolved, launch, None, sink.parsed(), log_path, list(sink.tail), None)


def finish(
    request: StageRequest,
    judgement: Judgement,
    started: str,
    steps: pd.DataFrame | None,
    extra_artifacts: dict[str, str] | None = None,
) -> StageResult:
    """Write the step table and the StageResult; return the result."""
    artifacts: dict[str, str] = {}
    if request.artifact(".log").exists():
        artifacts["log"] = str(request.artifact(".log"))
    if steps is not None:
        artifacts["steps"] = str(write_steps(steps, request.artifact(".steps.parquet")))
    artifacts |= extra_artifacts or {}
    if judgement.error is not None:
        status: Status = "error"
        message = judgement.error
    else:
        status = _status(judgement.checks)
        message = judgement.message or _fail_message(judgement.checks)
    loaded = request.loaded
    prov = provenance(loaded.recipe.name, loaded.sha256, request.stage, loaded.path, started)
    prov.finished = now_iso()
    result = StageResult(
        stage=request.stage,
        recipe=loaded.recipe.name,
        status=status,
        checks=judgement.checks,
        summary=judgement.summary,
        provenance=prov,
        artifacts=artifacts,
        message=message,
    )
    write_result(result, request.artifact(".json"))
    return result


def _status(checks: list[Check]) -> Status:
    return "fail" if any(not c.ok and c.severity == "error" for c in checks) else "pass"


def _fail_message(checks: list[Check]) -> str:
    failed = [c for c in checks if not c.ok and c.severity == "error"]
    return "; ".join(f"{c.id}: {c.message}" for c in failed)


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
    )
    write_result(result, request.artifact(".json"))
    return result


def exit_code(result: StageResult, exit_zero: bool) -> int:
    return 0 if exit_zero else EXIT_CODES[result.status]


def run_stage(request: StageRequest, judge: Judge, on_steps: OnSteps | None = None) -> StageResult:
    """The whole single-launch stage. Bad input raises RecipeError/UsageError (exit 2)
    before anything is written."""
    blocked = gate_block(request)
    if blocked is not None:
        return skipped(request, *blocked)
    resolved, launch = resolve_and_render(request)
    started = now_iso()
    clock = time.monotonic()
    outcome = execute(request, resolved, launch, request.artifact(".log"), on_steps)
    judgement = judge(outcome)
    judgement.summary = {**run_summary(outcome, time.monotonic() - clock), **judgement.summary}
    return finish(request, judgement, started, outcome.steps)


def run_summary(outcome: RunOutcome, stage_wall_s: float) -> dict[str, Any]:
    run = outcome.run
    return {
        "runner": outcome.runner or "from-log",
        "runner_info": outcome.runner_info,
        "exit_code": run.exit_code if run else None,
        "run_wall_s": round(run.wall_s, 3) if run else None,
        "stage_wall_s": round(stage_wall_s, 3),
        "rollouts_parsed": len(outcome.steps),
        "log_lines": outcome.parsed.lines,
        "malformed_lines": outcome.parsed.malformed_count,
    }


def run_failure(outcome: RunOutcome) -> str | None:
    """Why the run cannot be judged (crash, timeout, runner trouble), with the log's last
    lines; None when it ended cleanly or was stopped on request."""
    run = outcome.run
    if outcome.failure:
        why = outcome.failure
    elif run is None or run.stopped:
        return None
    elif run.timed_out:
        why = f"the run {run.detail}"
    elif run.exit_code != 0:
        why = f"the run crashed: {run.detail or f'exit status {run.exit_code}'}"
    else:
        return None
    tail = outcome.tail_text()
    return f"{why}; last log lines ({outcome.log_path}):\n{tail}" if tail else why
