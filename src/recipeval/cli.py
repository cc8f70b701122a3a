"""`recipeval`: the core launcher every Snakemake rule calls.

Exit codes: 0 ok/pass, 1 a check failed, 2 bad input (recipe or usage), 3 a stage could not judge.
Heavy packages (torch, megatron, sglang, ray) are imported inside the commands that need them.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from recipeval.errors import RecipeError, SettingError, UsageError

app = typer.Typer(
    name="recipeval",
    help="Validate RL training recipes: static checks, smoke run, logprob diff, benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_ERROR = 0, 1, 2, 3

RecipeArg = Annotated[Path, typer.Argument(help="recipe YAML file", show_default=False)]
StageOpt = Annotated[
    str | None, typer.Option("--stage", help="apply this stage's overlay (smoke, bench, ...)")
]


class RenderFormat(str, Enum):
    shell = "shell"
    json = "json"


def _die(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    print(f"recipeval: {message}", file=sys.stderr)
    raise typer.Exit(code)


def load_or_exit(path: Path):  # -> LoadedRecipe
    """Load a recipe, or print its errors one per line and exit 2."""
    from recipeval.recipe import RecipeErrors, load_recipe

    try:
        return load_recipe(path)
    except RecipeErrors as errs:
        for err in errs.errors:
            print(f"recipeval: {err}", file=sys.stderr)
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
    from recipeval.recipe import RecipeErrors, load_recipe

    bad = 0
    for path in recipes:
        try:
            loaded = load_recipe(path)
        except RecipeErrors as errs:
            bad += 1
            for err in errs.errors:
                print(f"recipeval: {err}", file=sys.stderr)
            continue
        if not quiet:
            print(f"ok {path} {loaded.recipe.name} sha256={loaded.sha256[:12]}")
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def render(
    recipe: RecipeArg,
    stage: StageOpt = None,
    variant: Annotated[
        str | None, typer.Option(help="a logprob_diff variant overlay")
    ] = None,
    fmt: Annotated[RenderFormat, typer.Option("--format", help="shell script or JSON")] = RenderFormat.shell,
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
    print(launch.to_json() if fmt is RenderFormat.json else launch.to_shell(), end="")
    if fmt is RenderFormat.json:
        print()


@app.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editors and Snakemake)."""
    from recipeval.recipe.schema import Recipe

    print(json.dumps(Recipe.model_json_schema(), indent=2))


def main() -> None:
    try:
        app()
    except (RecipeError, UsageError) as err:
        print(f"recipeval: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)
