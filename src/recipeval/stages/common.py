"""What the stages share below the driver (stages.driver): the request, and one launch:

    resolve -> render -> run with a runner (or read --from-log)
    -> stream the log to DIR/<stage>.log (secrets scrubbed) and into the engine's parser
    -> a StageRun for the stage's judge

`on_steps` sees the step table while the run goes and can stop it, as the bench does once it
has enough steps.
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

from recipeval.engines import engine_for, render
from recipeval.engines.base import LogParser
from recipeval.engines.launch import Launch
from recipeval.engines.miles.logparse import ParsedLog
from recipeval.errors import RecipeError, SettingError
from recipeval.recipe import LoadedRecipe, Resolved, resolve
from recipeval.result import Check, Status, scrub, secret_values, status_from_checks
from recipeval.runners import RunnerError, RunResult, default_runner_name, make_runner
from recipeval.runners.base import stop_job_on_termination
from recipeval.stages.progress import Precision, StageProgress

TAIL_LINES = 30
# The log's last line as a failure's headline is cut here (a JSON dump can be one long line).
LAST_LINE_CHARS = 500

# Called with the step table so far after each metric line; True asks the runner to stop.
OnSteps = Callable[[pd.DataFrame], bool]


# The least a launch is given once the stage's timeout is spent (it is stopped at once).
MIN_LAUNCH_TIMEOUT_S = 1.0


# The tables and plots a stage writes beside its result (OUT/<stage><suffix>), its log aside.
ARTIFACT_SUFFIXES = (
    ".steps.parquet",
    ".tokens.parquet",
    ".rescored.parquet",
    ".steps.png",
    ".hist.png",
    ".position.png",
)


@dataclass
class StageRequest:
    """One stage invocation, as the CLI parsed it."""

    stage: str  # one of recipe.STAGES
    loaded: LoadedRecipe
    out: Path | None  # None: judge and report, write nothing (env-check without --out)
    runner: str | None = None  # None: default_runner_name()
    from_log: Path | None = None
    require: list[Path] = field(default_factory=list)
    exit_zero: bool = False
    timeout: float | None = None  # None: the stage overlay's `timeout`
    result_file: Path | None = None  # None: OUT/<stage>.json
    # time.monotonic() when the stage began: its launches (logprob_diff's variants and
    # re-scores) share one timeout, the limit the Slurm job's time is sized by
    began: float | None = None

    @property
    def result_path(self) -> Path | None:
        if self.result_file is not None:
            return self.result_file
        return None if self.out is None else self.out / f"{self.stage}.json"

    def artifact(self, suffix: str) -> Path:
        """A file beside the result: OUT/<stage><suffix> (or FILE<suffix> for --out FILE.json)."""
        path = self.result_path
        if path is None:
            raise ValueError(f"{self.stage}: no --out, so no {suffix} file is written")
        return path.with_name(path.stem + suffix)


@dataclass
class StageRun:
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

    @property
    def gpu(self) -> str | None:
        """The card the run used, where its runner knows (Runner.describe)."""
        return self.runner_info.get("gpu")

    def tail_text(self, lines: int = 15) -> str:
        return "\n".join(self.tail[-lines:])


@dataclass
class Judgement:
    checks: list[Check]
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # set: status error with this message (the stage could not judge)
    message: str = ""

    @property
    def status(self) -> Status:
        return "error" if self.error is not None else status_from_checks(self.checks)

    @property
    def verdict(self) -> str:
        """The result's message: why it could not judge, else the stage's words, else the
        failed checks."""
        if self.error is not None:
            return self.error
        failed = [c for c in self.checks if not c.ok and c.severity == "error"]
        return self.message or "; ".join(f"{c.id}: {c.message}" for c in failed)


Judge = Callable[[StageRun], Judgement]


class LogSink:
    """Writes each line (secrets scrubbed) to the stage log, feeds the parser, keeps the last
    lines for error messages, and calls on_steps when the step table changed. A log that cannot
    be written (a full disk) or a callback that breaks stops the run and becomes `error`."""

    def __init__(
        self,
        path: Path,
        secrets: list[str],
        parser: LogParser,
        on_steps: OnSteps | None,
        stop: threading.Event,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.secrets = secrets
        self.parser = parser
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.on_steps = on_steps
        self.stop = stop
        self.error: str | None = None
        self.writing = True  # until a write fails; a broken callback keeps the log going

    def __call__(self, line: str) -> None:
        line = scrub(line, self.secrets)
        if self.writing:
            try:
                self.file.write(line + "\n")
                self.file.flush()
            except OSError as err:
                self.writing = False
                self._fail(f"cannot write the stage log {self.path}: {err.strerror or err}")
        self.tail.append(line)
        if self.parser.feed(line) is None or self.on_steps is None or self.error:
            return
        try:
            if self.on_steps(self.parser.table()):
                self.stop.set()
        except Exception as err:  # noqa: BLE001 - a broken callback must not wedge the run
            self._fail(f"on_steps failed: {type(err).__name__}: {err}")

    def _fail(self, message: str) -> None:
        self.error = self.error or message
        self.stop.set()

    def parsed(self) -> ParsedLog:
        return parsed_log(self.parser)

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as err:  # the last buffered bytes did not fit either
            self._fail(f"cannot write the stage log {self.path}: {err.strerror or err}")


def parsed_log(parser: LogParser) -> ParsedLog:
    """The parse so far: the rollout table, the optimizer-step table and the per-kind counts."""
    return ParsedLog.of(parser)


def read_log(parser: LogParser, path: Path) -> ParsedLog:
    """Feed a whole log file to `parser`; undecodable bytes are replaced, never fatal."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        for line in fh:
            parser.feed(line)
    return parsed_log(parser)


def resolve_and_render(
    request: StageRequest, variant: str | None = None
) -> tuple[Resolved, Launch]:
    """Raises RecipeError (exit 2) naming the recipe file, line and key."""
    recipe = request.loaded.recipe
    try:
        resolved = resolve(recipe, request.stage, variant)
        return resolved, render(resolved, out=request.out)
    except KeyError as err:
        raise RecipeError(request.loaded.path, str(err.args[0])) from None
    except SettingError as err:
        raise request.loaded.error(err.key, err.message) from None


def _with_progress(
    on_steps: OnSteps | None,
    progress: StageProgress,
    precision: Callable[[], Precision | None] | None,
) -> OnSteps:
    def hook(steps: pd.DataFrame) -> bool:
        stop = on_steps(steps) if on_steps is not None else False
        progress.update(steps, precision() if precision is not None else None)
        return stop

    return hook


def execute(
    request: StageRequest,
    resolved: Resolved,
    launch: Launch,
    log_path: Path,
    on_steps: OnSteps | None = None,
    precision: Callable[[], Precision | None] | None = None,
    label: str | None = None,
) -> StageRun:
    """Run the launch (or read request.from_log), streaming into log_path and the parser; one
    progress line per finished rollout goes to stderr (`precision`: the bench's intervals so
    far, for its line; `label`: what the line calls the run, default the stage)."""
    # the process's and the recipe's values both: a recipe's HF_TOKEN hides the caller's by name
    secrets = sorted(
        {*secret_values(os.environ), *secret_values(launch.env, launch.argv)}, key=len, reverse=True
    )
    stop = threading.Event()
    if request.from_log is not None:
        return _from_log(request, resolved, launch, log_path, secrets)
    total = resolved.args.get("num-rollout")
    progress = StageProgress(
        label or request.stage,
        resolved.recipe.name,
        int(total) if isinstance(total, int) else None,
    )
    sink = LogSink(
        log_path,
        secrets,
        engine_for(resolved.recipe.engine).parser(resolved),
        _with_progress(on_steps, progress, precision),
        stop,
    )
    runner_name = request.runner or default_runner_name()
    timeout = request.timeout or (resolved.options.timeout if resolved.options else None)
    if timeout is not None and request.began is not None:
        # a launch after the budget is spent still starts, and is stopped at once
        timeout = max(timeout - (time.monotonic() - request.began), MIN_LAUNCH_TIMEOUT_S)
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
        progress.close()
    failure = failure or sink.error
    return StageRun(
        resolved, launch, run, sink.parsed(), log_path, list(sink.tail), runner_name, failure, info
    )


def _from_log(
    request: StageRequest, resolved: Resolved, launch: Launch, log_path: Path, secrets: list[str]
) -> StageRun:
    source = request.from_log
    assert source is not None
    sink = LogSink(
        log_path.with_name(f".{log_path.name}.{os.getpid()}.tmp"),
        secrets,
        engine_for(resolved.recipe.engine).parser(resolved),
        None,
        threading.Event(),
    )
    try:
        with open(source, encoding="utf-8", errors="replace", newline="") as fh:
            for line in fh:
                sink(line.rstrip("\r\n"))
    finally:
        sink.close()
    if sink.error:  # the log already there stays as it was
        sink.path.unlink(missing_ok=True)
    else:  # written aside, then moved: the given log may be the stage log itself
        shutil.move(sink.path, log_path)
    return StageRun(
        resolved, launch, None, sink.parsed(), log_path, list(sink.tail), None, sink.error
    )


def run_summary(outcome: StageRun) -> dict[str, Any]:
    run = outcome.run
    return {
        "runner": outcome.runner or "from-log",
        "runner_info": outcome.runner_info,
        "exit_code": run.exit_code if run else None,
        "run_wall_s": round(run.wall_s, 3) if run else None,
        "rollouts_parsed": len(outcome.steps),
        "log_lines": outcome.parsed.lines,
        "malformed_lines": outcome.parsed.malformed_count,
        # Metric lines recognised and dropped, per kind: nothing vanishes silently.
        "metric_lines": outcome.parsed.counts,
        "steps_per_rollout": outcome.parsed.steps_per_rollout,
    }


def run_failure(outcome: StageRun, log: Path | None = None) -> str | None:
    """Why the run cannot be judged (crash, timeout, runner trouble), with the log's last
    lines (named as `log`, default the run's own); None when it ended cleanly or was stopped
    on request."""
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
    return with_log_tail(why, outcome, log)


def with_log_tail(why: str, outcome: StageRun, log: Path | None = None) -> str:
    """`why` and the log's last non-blank line on the first line (the one line a terminal or a
    Snakemake log shows: for a Python crash, the exception), the log's last lines below."""
    tail = outcome.tail_text()
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
    if not last:
        return why
    if len(last) > LAST_LINE_CHARS:
        last = last[: LAST_LINE_CHARS - 3] + "..."
    return f"{why}; the log ({log or outcome.log_path}) ends: {last}\nlast log lines:\n{tail}"
