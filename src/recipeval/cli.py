"""`recipeval`: the core launcher every Snakemake rule calls.

Exit codes: 0 ok/pass, 1 a check failed, 2 bad input (recipe or usage), 3 a stage could not judge.
Heavy packages (torch, megatron, sglang, ray) are imported inside the commands that need them.
"""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from recipeval.errors import RecipeError, SettingError, UsageError, os_error_line, say_error
from recipeval.exit_codes import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_FAIL, EXIT_OK
from recipeval.outpath import out_file, out_folder, out_json_or_folder

if TYPE_CHECKING:  # publish's modules load only when it runs
    from recipeval.publish.publisher import PublishOutputs
    from recipeval.recipe.load import LoadedRecipe

app = typer.Typer(
    name="recipeval",
    help="Validate RL training recipes: static checks, smoke run, logprob diff, benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


RecipeArg = Annotated[Path, typer.Argument(help="recipe YAML file", show_default=False)]
StageOpt = Annotated[
    str | None, typer.Option("--stage", help="apply this stage's overlay (smoke, bench, ...)")
]


class RenderFormat(str, Enum):
    shell = "shell"
    json = "json"


def _die(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    say_error(message)
    raise typer.Exit(code)


def load_or_exit(path: Path):  # -> LoadedRecipe
    """Load a recipe, or print its errors one per line and exit 2."""
    from recipeval.recipe import InvalidRecipe, load_recipe

    try:
        return load_recipe(path)
    except InvalidRecipe as errs:
        for err in errs.errors:
            say_error(err)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _check_stage(stage: str | None) -> None:
    from recipeval.recipe import STAGES

    if stage is not None and stage not in STAGES:
        _die(f"--stage {stage!r} is not a stage; choose one of: {', '.join(STAGES)}")


@app.command()
def validate(
    recipes: Annotated[list[Path], typer.Argument(help="recipe files", show_default=False)],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only errors")] = False,
) -> None:
    """Validate recipe files: exit 0 when all are valid, 2 otherwise."""
    from recipeval.recipe import InvalidRecipe, load_recipe

    bad = 0
    for path in recipes:
        try:
            loaded = load_recipe(path)
        except InvalidRecipe as errs:
            bad += 1
            for err in errs.errors:
                say_error(err)
            continue
        if not quiet:
            print(f"ok {path} {loaded.recipe.name} sha256={loaded.sha256[:12]}")
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def render(
    recipe: RecipeArg,
    stage: StageOpt = None,
    variant: Annotated[str | None, typer.Option(help="a logprob_diff variant overlay")] = None,
    fmt: Annotated[
        RenderFormat, typer.Option("--format", help="shell script or JSON")
    ] = RenderFormat.shell,
    redact: Annotated[
        bool, typer.Option("--redact", help="show secrets (by name or shape) as ***")
    ] = False,
) -> None:
    """Print the exact launch for a recipe (no shell ever interprets a recipe value)."""
    from recipeval.engines import render as render_launch
    from recipeval.recipe import resolve

    _check_stage(stage)
    loaded = load_or_exit(recipe)
    try:
        launch = render_launch(resolve(loaded.recipe, stage, variant))
    except KeyError as err:
        _die(f"{recipe}: {err.args[0]}")
    except SettingError as err:
        _die(str(loaded.error(err.key, err.message)))
    if redact:
        launch = launch.redacted()
    print(launch.to_json() if fmt is RenderFormat.json else launch.to_shell(), end="")
    if fmt is RenderFormat.json:
        print()


@app.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editors and Snakemake)."""
    from recipeval.recipe.schema import Recipe

    print(json.dumps(Recipe.model_json_schema(), indent=2))


# Options every run stage takes (smoke, logprob-diff, bench): the stage command contract.
StageRecipeArg = Annotated[Path | None, typer.Argument(help="recipe YAML file", show_default=False)]
RecipeOpt = Annotated[
    Path | None, typer.Option("--recipe", help="recipe YAML file (or positional)")
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        parser=out_folder,
        help="results folder for this recipe (default: results/<recipe name>)",
    ),
]
RunnerOpt = Annotated[
    str | None,
    typer.Option(
        "--runner",
        help="local | ray | slurm (default: slurm in an allocation, ray when RAY_ADDRESS is set, "
        "else local)",
    ),
]
FromLogOpt = Annotated[
    Path | None, typer.Option("--from-log", help="judge this existing log; launch nothing")
]
RequireOpt = Annotated[
    list[Path] | None, typer.Option("--require", help="gate StageResult JSON that must be pass")
]
ExitZeroOpt = Annotated[
    bool, typer.Option("--exit-zero", help="exit 0 whenever a result was written")
]


def duration_seconds(raw: str) -> float:
    """typer parser for --timeout: the recipe's duration syntax (90m, 2h, 45s, 600)."""
    from pydantic import TypeAdapter, ValidationError

    from recipeval.recipe.schema import MAX_TIMEOUT_S, Duration

    try:
        return TypeAdapter(Duration).validate_python(raw)
    except ValidationError:
        raise typer.BadParameter(
            f"{raw[:80]!r}: give a duration above 0 and at most {MAX_TIMEOUT_S // 86400} days, "
            "such as 90m, 2h, 45s or 600 (seconds)"
        ) from None


def snakemake_cores(raw: str) -> str:
    """typer parser for --cores: what snakemake takes (a count, or all), checked before
    snakemake starts, which reports a bad count as a workflow error, not as a usage error."""
    if raw == "all" or (raw.isascii() and raw.isdigit() and int(raw) > 0):
        return raw
    raise typer.BadParameter(f"{raw[:80]!r}: give a number of cores above 0, or all")


TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        parser=duration_seconds,
        metavar="DURATION",
        help="wall-clock limit of the run, e.g. 90m (default: the recipe's "
        "stages.<stage>.timeout, else none)",
        show_default=False,
    ),
]


def stage_request(
    stage: str,
    recipe: Path | None,
    recipe_opt: Path | None,
    out: Path | None,
    runner: str | None,
    from_log: Path | None,
    require: list[Path] | None,
    exit_zero: bool,
    timeout: float | None,
):  # -> StageRequest
    from recipeval.runners import RUNNERS
    from recipeval.stages.common import StageRequest

    if (recipe is None) == (recipe_opt is None):
        _die("give the recipe once: as an argument or with --recipe")
    if runner is not None and runner not in RUNNERS:
        _die(f"--runner {runner!r} is not a runner; choose one of: {', '.join(RUNNERS)}")
    loaded = load_or_exit(recipe or recipe_opt)
    out = out or Path("results") / loaded.recipe.name
    return StageRequest(
        stage=stage,
        loaded=loaded,
        out=out,
        runner=runner,
        from_log=from_log,
        require=list(require or []),
        exit_zero=exit_zero,
        timeout=timeout,
    )


@dataclass(frozen=True)
class StageCommand:
    stage: str
    module: str  # imported when the command runs: stage modules pull in pandas and scipy
    attribute: str  # the module's Stage
    help: str


# The run stages' commands, from one table. Each takes the same options (the stage command
# contract), runs through the stage driver and exits with the stage's code.
STAGE_COMMANDS = {
    "smoke": StageCommand(
        "smoke",
        "recipeval.stages.smoke",
        "SMOKE",
        "Short run with the smoke overlay: clean exit, every rollout logged, finite losses, "
        "step-0 invariants. Exit 0 pass, 1 fail, 3 error, 2 bad input.",
    ),
    "logprob-diff": StageCommand(
        "logprob_diff",
        "recipeval.stages.logprob_diff",
        "LOGPROB_DIFF",
        "Train-vs-rollout logprob statistics per variant, and variant vs variant on identical "
        "tokens. Exit 0 pass, 1 fail, 3 error, 2 bad input.",
    ),
    "bench": StageCommand(
        "bench",
        "recipeval.stages.bench",
        "BENCH",
        "Steady-state benchmark: stops the run once every watched metric's 95 % interval is "
        "within rel_ci (or at max_steps), compares with expect. Exit 0 pass, 1 fail, 3 error, "
        "2 bad input.",
    ),
}


def _stage_command(name: str, command: StageCommand) -> None:

    def run_stage_command(
        recipe: StageRecipeArg = None,
        recipe_opt: RecipeOpt = None,
        out: OutOpt = None,
        runner: RunnerOpt = None,
        from_log: FromLogOpt = None,
        require: RequireOpt = None,
        exit_zero: ExitZeroOpt = False,
        timeout: TimeoutOpt = None,
    ) -> None:
        import importlib

        from recipeval.exit_codes import exit_code
        from recipeval.stages.driver import run

        request = stage_request(
            command.stage, recipe, recipe_opt, out, runner, from_log, require, exit_zero, timeout
        )
        result = run(getattr(importlib.import_module(command.module), command.attribute), request)
        first_line = result.message.splitlines()[0] if result.message else ""
        print(
            f"{result.stage} {result.status}: {result.recipe}"
            + (f": {first_line}" if first_line else "")
        )
        raise typer.Exit(exit_code([result.status], exit_zero))

    app.command(name, help=command.help)(run_stage_command)


for _name, _command in STAGE_COMMANDS.items():
    _stage_command(_name, _command)


@app.command("env-check")
def env_check(
    recipes: Annotated[
        list[Path] | None, typer.Argument(help="recipe files", show_default=False)
    ] = None,
    recipe_opt: Annotated[
        list[Path] | None, typer.Option("--recipe", help="recipe file (repeatable; or positional)")
    ] = None,
    static: Annotated[bool, typer.Option("--static", help="no live probe of this machine")] = False,
    stage: StageOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            parser=out_json_or_folder,
            help="FILE.json (one recipe); or a folder: DIR/env_check.json for one recipe, "
            "DIR/<recipe-name>/env_check.json for several (each with an env_check.log beside it)",
        ),
    ] = None,
    exit_zero: ExitZeroOpt = False,
    probe_only: Annotated[
        bool,
        typer.Option("--probe-only", help="print this machine's live probe as JSON; no recipe"),
    ] = False,
    probe_from: Annotated[
        Path | None,
        typer.Option(
            "--probe-from",
            help="compare with a probe JSON taken elsewhere (--probe-only > FILE on a node)",
        ),
    ] = None,
) -> None:
    """Static checks (megatron-core layout, SGLang flags, rule base, memory, context/batch) and,
    without --static, a live probe of this machine. Exit 0 no error, 1 an error-severity check
    failed, 2 bad input, 3 a validator could not run."""
    from recipeval.checks.command import env_check_command

    raise typer.Exit(
        env_check_command(
            [*(recipes or []), *(recipe_opt or [])],
            static,
            stage,
            out,
            exit_zero,
            probe_only,
            probe_from,
        )
    )


@app.command("parse-log")
def parse_log(
    log: Annotated[Path, typer.Argument(help="training log", show_default=False)],
    out: Annotated[
        Path,
        typer.Option("--out", parser=out_file, help="step table: FILE.csv or FILE.parquet"),
    ],
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="log format: miles (also the reference engine's); default: the recipe's, or miles",
        ),
    ] = None,
    recipe: Annotated[
        Path | None,
        typer.Option(
            "--recipe",
            help="the recipe that wrote the log: its steps per rollout and dynamic batch size "
            "decide which optimizer steps belong to a rollout, as in the stages",
        ),
    ] = None,
    stage: StageOpt = None,
) -> None:
    """Read a training log into a step table (one row per rollout id)."""
    from recipeval.engines import ENGINES
    from recipeval.engines.miles.logparse import write_steps
    from recipeval.readfile import regular_file_problem
    from recipeval.recipe import resolve
    from recipeval.stages.common import read_log

    _check_stage(stage)
    if stage is not None and recipe is None:
        _die("--stage names the recipe stage that wrote the log; give the recipe with --recipe")
    resolved = None
    if recipe is not None:
        loaded = load_or_exit(recipe)
        try:
            resolved = resolve(loaded.recipe, stage)
        except KeyError as err:
            _die(f"{recipe}: {err.args[0]}")
    engine = engine or (resolved.recipe.engine if resolved else "miles")
    if engine not in ENGINES:
        _die(f"--engine {engine!r} is not an engine; choose one of: {', '.join(ENGINES)}")
    if out.suffix not in (".csv", ".parquet"):
        _die(f"--out {out}: name a .csv or .parquet file")
    problem = regular_file_problem(log, "log file")
    if problem:
        _die(f"{log}: {problem}")
    parsed = read_log(ENGINES[engine].parser(resolved), log)
    write_steps(parsed.steps, out)
    print(
        f"{out}: {len(parsed.steps)} rollouts, {len(parsed.steps.columns)} columns, "
        f"{parsed.lines} lines read, {parsed.malformed_count} malformed metric lines skipped"
    )
    for bad in parsed.malformed[:5]:
        print(f"  skipped {log}:{bad.line_number}: {bad.text[:120]}", file=sys.stderr)
    if parsed.steps.empty and not parsed.malformed:
        say_error(
            f"warning: {log}: not one {engine} metric line (rollout, step, perf) in {parsed.lines} "
            "lines: a run that died before its first rollout, or not a training log"
        )


@app.command("ray-down")
def ray_down(
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="default: $RECIPEVAL_RAY_STATE_DIR")
    ] = None,
) -> None:
    """Stop the shared Ray head a pipeline run started (never any other Ray)."""
    import os

    from recipeval.runners.ray_head import STATE_DIR_ENV, HeadRecordError, shared_head_down

    folder = state_dir or (
        Path(os.environ[STATE_DIR_ENV]) if os.environ.get(STATE_DIR_ENV) else None
    )
    if folder is None:
        _die(f"name the head's folder: --state-dir or {STATE_DIR_ENV}")
    if folder.exists() and not folder.is_dir():
        _die(f"--state-dir {folder}: not a folder; name the folder the pipeline's head was in")
    try:
        outcome = shared_head_down(folder)
    except HeadRecordError as err:
        _die(f"{err}; nothing was stopped or removed")
    said = {
        "stopped": "stopped",
        "stale": "its record named a head no longer running; record removed",
        "none": "none running",
    }
    print(f"ray head in {folder}: {said[outcome]}")


def _check_publish_outputs(outputs: PublishOutputs, plots: bool, inputs: list[Path]) -> None:
    """Exit 2 naming the option when an output path cannot be written, is a stage result this
    publish reads, or is another output's file, before publish writes anything: the history it
    appends to first would otherwise be half updated."""
    from recipeval.outpath import output_file_problem, output_path_problem
    from recipeval.publish.records import result_files

    def where(path: Path) -> Path:
        try:
            return path.resolve()
        except (OSError, RuntimeError):  # a symlink loop: the checks below name it
            return path.absolute()

    read = {where(path) for path in result_files(inputs)}
    written: dict[Path, str] = {}
    files = [("--junit", outputs.junit), ("--verdict", outputs.verdict)]
    for option, path in [*files, *(("--tables", file) for file in outputs.table_files())]:
        real = where(path)
        if real in read:
            _die(f"{option} {path}: is a stage result this publish reads; name another file")
        if real in written:
            _die(f"{option} {path}: {written[real]} writes the same file; name another")
        written[real] = option

    paths = [
        ("--tables", outputs.tables, output_path_problem),
        ("--history", outputs.history, output_path_problem),
        ("--junit", outputs.junit, output_file_problem),
        ("--verdict", outputs.verdict, output_file_problem),
    ]
    if plots:
        paths.append(("--plot-dir", outputs.plots, output_path_problem))
    paths += [("--tables", file, output_file_problem) for file in outputs.table_files()]
    for option, path, problem_of in paths:
        problem = problem_of(str(path))
        if problem:
            _die(f"{option} {path}: {problem}")


@app.command()
def publish(
    inputs: Annotated[
        list[Path],
        typer.Argument(help="stage result files, or results folders", show_default=False),
    ],
    tables: Annotated[Path, typer.Option(help="folder for benchmarks.{md,csv,html}")] = Path(
        "results/tables"
    ),
    history: Annotated[Path, typer.Option(help="append-only run history folder")] = Path(
        "results/history"
    ),
    junit: Annotated[Path, typer.Option(help="JUnit XML output")] = Path("results/junit.xml"),
    verdict: Annotated[Path, typer.Option(help="regression verdict JSON output")] = Path(
        "results/regression.json"
    ),
    min_change: Annotated[float, typer.Option(help="smallest relative change reported")] = 0.05,
    alpha: Annotated[float, typer.Option(help="significance level of the regression test")] = 0.01,
    min_history: Annotated[int, typer.Option(help="runs needed to estimate the noise")] = 3,
    short_history_band: Annotated[
        float, typer.Option(help="relative band below min-history runs")
    ] = 0.20,
    fail_on_regression: Annotated[
        bool, typer.Option(help="exit 1 when a recipe failed or regressed")
    ] = False,
    plots: Annotated[
        bool, typer.Option(help="draw plots (in the HTML page and --plot-dir)")
    ] = True,
    plot_dir: Annotated[
        Path | None, typer.Option(help="folder for the plots as PNGs (default: TABLES/plots)")
    ] = None,
) -> None:
    """Tables, plots, history, regression verdict and JUnit XML from stage results."""
    from recipeval.analysis.regression import RegressionSettingError, RegressionSettings
    from recipeval.publish.publisher import PublishError, PublishOutputs, summary_lines
    from recipeval.publish.publisher import publish as run_publish

    try:
        settings = RegressionSettings(min_change, alpha, min_history, short_history_band)
    except RegressionSettingError as err:
        # Before anything is written; the bounds are publish.* in config/config.schema.yaml.
        _die(f"--{err.name.replace('_', '-')} {err.value:g}: must be {err.expected}")
    outputs = PublishOutputs(tables, history, junit, verdict, plot_dir)
    _check_publish_outputs(outputs, plots, inputs)
    try:
        outcome = run_publish(inputs, outputs, settings, plots)
    except PublishError as err:
        _die(str(err))
    print("\n".join(summary_lines(outcome)))
    if fail_on_regression and not outcome.ok:
        raise typer.Exit(EXIT_FAIL)


@app.command()
def acknowledge(
    recipe: Annotated[str, typer.Argument(help="recipe name", show_default=False)],
    run_id: Annotated[
        str,
        typer.Argument(
            help="first run at the new level: its change_run in results/regression.json",
            show_default=False,
        ),
    ],
    metric: Annotated[
        str | None, typer.Option(help="accept the change for this metric only (default: all)")
    ] = None,
    note: Annotated[str, typer.Option(help="why the new level is the norm")] = "",
    history: Annotated[Path, typer.Option(help="the run history folder")] = Path("results/history"),
) -> None:
    """Accept a reported change as the new normal: from RUN_ID on, the recipe's history starts
    afresh (for one metric with --metric), so publish stops reporting it."""
    from recipeval.publish import history as run_history

    if not history.is_dir():
        _die(f"--history {history}: not a folder; name the run history publish writes")
    try:
        path = run_history.acknowledge(history, recipe, run_id, metric, note)
    except ValueError as err:
        _die(str(err))
    print(
        f"{recipe}: change from run {run_id} acknowledged{f' for {metric}' if metric else ''} in {path}"
    )


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def nightly(
    ctx: typer.Context,
    profile: Annotated[
        list[str] | None,
        typer.Option(help="Snakemake profile, e.g. slurm-amd (repeatable: later ones override)"),
    ] = None,
    cores: Annotated[
        str | None, typer.Option(parser=snakemake_cores, help="Snakemake --cores: N or all")
    ] = None,
    verdict: Annotated[
        Path, typer.Option(parser=out_file, help="the verdict publish writes")
    ] = Path("results/regression.json"),
) -> None:
    """Rerun every stage of every selected recipe (snakemake --forceall; further arguments go
    to snakemake), publish, and exit 1 when a recipe failed or regressed (3: no verdict; 2:
    snakemake refused its arguments).
    SIGTERM, SIGHUP or SIGINT cancels the jobs (passed to snakemake as SIGINT) and exits
    128 + the signal (143 for SIGTERM)."""
    from recipeval.publish.nightly import nightly as run_nightly

    raise typer.Exit(run_nightly(profile or [], cores, verdict, list(ctx.args)))


import_app = typer.Typer(
    help="Write a recipe from an upstream launch script.", no_args_is_help=True
)
app.add_typer(import_app, name="import")


@import_app.command("miles")
def import_miles(
    script: Annotated[
        str,
        typer.Argument(help="launch script, e.g. scripts/run_deepseek_v4.py", show_default=False),
    ],
    script_args: Annotated[
        list[str] | None,
        typer.Argument(help="after --: the script's own arguments", show_default=False),
    ] = None,
    miles: Annotated[
        Path | None,
        typer.Option(
            "--miles", help="miles checkout (default: MILES_DIR, or the one SCRIPT is in)"
        ),
    ] = None,
    extends: Annotated[
        Path | None, typer.Option("--extends", help="write only what differs from this recipe")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="recipe name (default: from --out or the script)")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", parser=out_file, help="recipe file to write (default: stdout)"),
    ] = None,
    platform: Annotated[
        str | None, typer.Option(help="rocm or cuda (default: rocm for a script under amd/)")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option(help="cluster.gpu (default: the script's --hardware)")
    ] = None,
) -> None:
    """Run a miles launch script's own command building (nothing starts) and write the recipe
    that renders the same launch: `recipeval import miles SCRIPT --out R.yaml -- train ...`."""
    import os

    from recipeval.engines.miles.importer import ImportProblem, ImportRequest, import_recipe
    from recipeval.engines.miles.record import RecordError, find_checkout
    from recipeval.recipe import InvalidRecipe

    checkout = miles or (Path(os.environ["MILES_DIR"]) if os.environ.get("MILES_DIR") else None)
    checkout = checkout or find_checkout(Path(script).resolve().parent)
    if checkout is None:
        _die(f"{script}: no miles checkout: pass --miles DIR or set MILES_DIR")
    request = ImportRequest(
        checkout, script, list(script_args or []), name, platform, gpu, extends, out
    )
    try:
        result = import_recipe(request)
    except (RecordError, ImportProblem, RecipeError, InvalidRecipe) as err:
        _die(str(err))
    if out is None:
        print(result.text, end="")
    else:
        print(
            f"wrote {out} ({result.recording.repo}@{result.recording.commit[:12]})", file=sys.stderr
        )
    for difference in result.differences:
        say_error(f"warning: the recipe does not render the recorded launch: {difference.line()}")


@app.command()
def drift(
    recipes: Annotated[list[Path], typer.Argument(help="miles recipe files", show_default=False)],
    miles: Annotated[
        Path | None,
        typer.Option("--miles", help="miles checkout (default: MILES_DIR, else paths.miles)"),
    ] = None,
    against: Annotated[
        Path | None,
        typer.Option(
            "--against",
            help="one recipe: compare with this recorded launch (JSON) instead of re-recording",
        ),
    ] = None,
    fmt: Annotated[
        RenderFormat,
        typer.Option("--format", help="text (shell) or JSON (a list, one report per recipe)"),
    ] = RenderFormat.shell,
) -> None:
    """Re-record each recipe's `source` launch from a miles checkout and list each flag and env
    var its render lacks, adds or changes: exit 0 none, 1 drift, 2 bad input."""
    import os

    from recipeval.engines.miles.drift import DriftInputError, drift_for_recipe
    from recipeval.recipe import InvalidRecipe, load_recipe

    if against is not None and len(recipes) != 1:
        _die("--against compares one recipe with one recorded launch; name a single recipe")
    reports, bad = [], 0
    for path in recipes:
        try:
            reports.append(drift_for_recipe(load_recipe(path), os.environ, miles, against))
        except InvalidRecipe as errs:
            bad += 1
            for error in errs.errors:
                say_error(error)
        except DriftInputError as err:
            bad += 1
            say_error(f"{path}: {err}")
    if fmt is RenderFormat.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        print("\n".join(line for r in reports for line in r.lines()))
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)
    raise typer.Exit(EXIT_FAIL if any(r.drifted for r in reports) else EXIT_OK)


@app.command()
def layouts(
    recipe: RecipeArg,
    gpus: Annotated[int | None, typer.Option(help="GPUs in all (default: the recipe's)")] = None,
    nodes: Annotated[
        int | None, typer.Option(help="nodes (default: GPUs / the recipe's GPUs per node)")
    ] = None,
    top: Annotated[int | None, typer.Option(help="show (and emit) the best K only")] = None,
    emit: Annotated[
        Path | None,
        typer.Option(parser=out_folder, help="write one recipe per layout into this folder"),
    ] = None,
    history: Annotated[
        Path, typer.Option(help="run history to calibrate the cost model on")
    ] = Path("results/history"),
    arg: Annotated[
        list[str] | None,
        typer.Option(help="FLAG=VALUE: explore (and emit) with this flag set; repeatable"),
    ] = None,
) -> None:
    """Every parallel layout megatron-core and the rollout engine accept that fits memory,
    ranked by a stated cost model (calibrated on measured runs in the history); exit 1 when
    none fits (it says which memory knob would). For an engine whose layout is fixed, its speed
    knobs instead (ranked by measured time once run)."""
    from recipeval.engines import engine_for
    from recipeval.explore.emit import EmitError
    from recipeval.explore.layouts import (
        LayoutError,
        current_layout,
        emit_knobs,
        emit_layouts,
        explore,
        measurements,
        table_lines,
        with_args,
    )

    loaded = load_or_exit(recipe)
    changes = _flag_values(arg or [])
    if top is not None and top < 1:
        _die(f"--top {top}: give a positive count")
    engine = engine_for(loaded.recipe.engine)
    try:
        if engine.speed_knobs:
            if changes:
                _die(f"--arg: the {engine.name} engine's layout is fixed; set flags in the recipe")
            if gpus is not None or nodes is not None:
                _die(
                    f"--{'gpus' if gpus is not None else 'nodes'}: the {engine.name} engine's "
                    "layout is fixed; its speed knobs are explored on the recipe's own devices"
                )
            if emit is None:
                _die(
                    f"{recipe}: the {engine.name} engine's layout is fixed; --emit DIR writes its "
                    f"speed-knob variants ({', '.join(engine.speed_knobs)})"
                )
            written = emit_knobs(loaded, engine.speed_knobs, emit, top)
        else:
            from recipeval.publish import history as run_history

            if history.exists() and not history.is_dir():
                _die(f"--history {history}: not a folder; name the run history folder")
            runs = run_history.load(history) if history.is_dir() else []
            explored = with_args(loaded, changes)
            found = explore(
                explored,
                loaded.recipe.world_size if gpus is None else gpus,
                nodes,
                measurements(runs, loaded.recipe),
                lambda done, total, seconds: print(
                    f"layouts: {done} of {total} layouts judged ({seconds:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                ),
            )
            print("\n".join(table_lines(found, current_layout(loaded.recipe), top)))
            if not found.kept:
                raise typer.Exit(EXIT_FAIL)
            if emit is None:
                return
            written = emit_layouts(found, loaded, emit, top, changes)
    except (LayoutError, EmitError) as err:
        _die(str(err))
    _report_emitted(emit, written, [loaded])


def _report_emitted(folder: Path, written: list[Path], inputs: list[LoadedRecipe]) -> None:
    """Remove what an earlier --emit left there (the sweep would run it) but never the recipes
    this run read, nor their parents; say what is there."""
    from recipeval.explore.emit import remove_stale_variants

    read = [file for loaded in inputs for file in loaded.files]
    removed = remove_stale_variants(folder, written, read)
    print(
        f"wrote {len(written)} recipe(s) to {folder}"
        + (f" (removed {len(removed)} an earlier --emit left there)" if removed else "")
        + f"; run them with snakemake --config 'recipes={{globs: [], sweeps: [{folder}]}}'"
    )


def _flag_values(pairs: list[str]) -> dict[str, Any]:
    """--arg FLAG=VALUE pairs; VALUE read as YAML (1.0, true, null), as in a recipe."""
    import yaml

    values: dict[str, Any] = {}
    for pair in pairs:
        flag, sep, text = pair.partition("=")
        flag = flag.strip().removeprefix("--")
        if not sep or not flag:
            _die(f"--arg {pair!r}: write FLAG=VALUE, e.g. optimizer-offload-fraction=1.0")
        try:
            values[flag] = yaml.safe_load(text)
        except (yaml.YAMLError, ValueError):  # ValueError: 2001-02-30, a 5000-digit number
            _die(f"--arg {pair[:80]!r}: {text[:60]!r} is not a value")
    return values


@app.command()
def ablate(
    before: Annotated[
        Path, typer.Argument(help="the recipe before the change", show_default=False)
    ],
    after: Annotated[Path, typer.Argument(help="the recipe after it", show_default=False)],
    group: Annotated[
        list[str] | None,
        typer.Option(help="KEY,KEY: keep these keys (or key prefixes) in one variant; repeatable"),
    ] = None,
    emit: Annotated[
        Path | None,
        typer.Option(parser=out_folder, help="write the variants as recipes into this folder"),
    ] = None,
) -> None:
    """One variant of BEFORE per changed key (or group); keys env_check binds stay together,
    with the check that binds them. --emit writes them for the workflow (recipes.sweeps)."""
    from recipeval.explore.ablate import AblationError, plan, plan_lines, static_judge
    from recipeval.explore.ablate import emit as emit_variants
    from recipeval.explore.emit import EmitError

    loaded_before, loaded_after = load_or_exit(before), load_or_exit(after)
    together = [[k.strip() for k in g.split(",") if k.strip()] for g in group or []]
    for raw, keys in zip(group or [], together, strict=True):
        if not keys:
            _die(f"--group {raw[:80]!r}: names no key; give KEY,KEY (keys or key prefixes)")
    try:
        ablation = plan(loaded_before, loaded_after, static_judge(), together)
        print("\n".join(plan_lines(ablation)))
        if emit is not None:
            _report_emitted(emit, emit_variants(ablation, emit), [loaded_before, loaded_after])
    except (AblationError, EmitError) as err:
        _die(str(err))


# The exceptions of the click typer parses with (a copy of its own since typer 0.2x), found
# through the one typer exports.
_CLICK_ERRORS = sys.modules[typer.BadParameter.__module__]


def _usage_line(err: Exception) -> str:
    """A command-line mistake in one line, naming the command and where its help is (click's
    own form is a usage line, a hint and a boxed message: three to six lines in a log)."""
    failed = getattr(err, "ctx", None)  # the context of the command that refused the input
    help_of = failed.command_path if failed is not None else "recipeval"
    names = []  # its subcommands, without the program ("recipeval" or "python -m recipeval")
    ctx = failed
    while ctx is not None and ctx.parent is not None:
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    message = " ".join(err.format_message().split()).rstrip(".")
    # typer coerces through pydantic, whose message for a value a validator refused (a choice
    # not among an Enum's) starts "Value error, ".
    message = message.replace(": Value error, ", ": ")
    return f"{' '.join(names) + ': ' if names else ''}{message}; see '{help_of} --help'"


def _one_line_summaries(group: typer.Typer) -> None:
    """Each command's summary in its group's --help as one paragraph: in rich mode typer keeps
    a docstring's line breaks there, so a wrapped docstring printed as ragged lines."""
    for command in group.registered_commands:
        doc = command.help or (command.callback.__doc__ if command.callback else None)
        if command.short_help is None and doc:
            command.short_help = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


_one_line_summaries(app)
_one_line_summaries(import_app)


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except _CLICK_ERRORS.ClickException as err:
        if isinstance(err, getattr(_CLICK_ERRORS, "NoArgsIsHelpError", ())):
            err.show()  # a bare command: its help, as click shows it
        else:
            say_error(_usage_line(err))
        sys.exit(err.exit_code)
    except typer.Abort:
        say_error("aborted")
        sys.exit(EXIT_FAIL)
    except (RecipeError, UsageError) as err:
        say_error(err)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as err:
        # A folder that cannot be made, a full disk, a file gone mid-run: the system's reason and
        # the path it names, not a traceback.
        say_error(os_error_line(err))
        sys.exit(EXIT_ERROR)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
