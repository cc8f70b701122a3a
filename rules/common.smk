# The recipe table, input functions and resources shared by every rule.
import glob
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from snakemake.utils import validate

from recipeval.names import SAFE_NAME_PATTERN
from recipeval.recipe import STAGE_GATES, STAGES, InvalidRecipe, load_recipe

# Keys whose values are all numbers. `--config 'publish={alpha: 0.05}'` hands nested values
# over as strings (Snakemake reads them with YAML's base loader); the schema would refuse '0.05'.
NUMERIC_GROUPS = ("default_timeout_min", "publish")


def _as_number(text):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text  # the schema names it


for _group in NUMERIC_GROUPS:
    if isinstance(config.get(_group), dict):
        config[_group] = {
            key: _as_number(value) if isinstance(value, str) else value
            for key, value in config[_group].items()
        }


def _refuse(message):
    """Stop before any job is planned with `message` alone. A WorkflowError would add a stub of
    Snakemake's traceback (`File ".../common.smk", line N, in <module>`) that points into this
    file instead of at the user's config or recipe."""
    print(f"recipeval workflow: {message}", file=sys.stderr)
    sys.exit(1)


def _config_problem(config, schema_path):
    """The config's worst schema violation as one line, or None. (Snakemake's validate names it
    too, but then prints the whole schema and config, a hundred lines for one typo.)"""
    schema = yaml.safe_load(Path(schema_path).read_text())
    error = best_match(Draft202012Validator(schema).iter_errors(config))
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path)
    hint = "config/config.schema.yaml has each key's type and bounds"
    if error.validator == "additionalProperties":
        hint = f"the keys here: {', '.join(error.schema['properties'])}"
    key = f"config {where}" if where else "config"
    return f"{key}: {error.message}; {hint}"


_SCHEMA = workflow.source_path("../config/config.schema.yaml")
if _problem := _config_problem(config, _SCHEMA):
    _refuse(_problem)
validate(config, _SCHEMA)  # for the schema's defaults


def _not_finite(node, where):
    """The first config key holding nan (every schema bound lets it through) or inf."""
    if isinstance(node, float) and not math.isfinite(node):
        return where
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node) if isinstance(node, list) else ()
    )
    for key, value in items:
        found = _not_finite(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


if _bad := _not_finite(config, ""):
    _refuse(f"config {_bad}: not a finite number; give a number")

RESULTS = config["results"]
# When this snakemake run began: the closing summary marks what an interrupted run left older.
RUN_STARTED = time.time()
SELECTED = [s for s in STAGES if s in config["stages"]]
LAUNCHER_ENV = "../envs/recipeval.yaml"
# `--config gpu_group=none` (or null, or empty) submits each GPU stage as its own job.
GPU_GROUP = (
    None
    if str(config["gpu_group"]).lower() in ("", "none", "null")
    else config["gpu_group"]
)


@dataclass(frozen=True)
class RecipeRow:
    """What the DAG needs to know about one recipe file."""

    name: str
    path: str
    sha256: str
    nodes: int
    gpus_per_node: int
    gpu: str | None
    timeout_s: dict


def _recipe_paths(selection):
    paths = {p for pattern in selection["globs"] for p in glob.glob(pattern)}
    paths |= set(selection["files"])
    for folder in selection["sweeps"]:
        if not os.path.isdir(folder):
            _refuse(
                f"config recipes.sweeps: {folder} is not a folder (write one with "
                "`recipeval layouts RECIPE --emit DIR` or `recipeval ablate A B --emit DIR`)"
            )
        paths |= set(glob.glob(os.path.join(folder, "*.yaml")))
    excluded = {p for pattern in selection["exclude"] for p in glob.glob(pattern)}
    return sorted(paths - excluded)


def _load_row(path):
    loaded = load_recipe(path)
    recipe = loaded.recipe
    timeouts = {s: getattr(recipe.stages, s).timeout for s in STAGES}
    return RecipeRow(
        name=recipe.name,
        path=path,
        sha256=loaded.sha256,
        nodes=recipe.cluster.nodes,
        gpus_per_node=recipe.cluster.gpus_per_node,
        gpu=recipe.cluster.gpu,
        timeout_s=timeouts,
    )


def recipe_table(selection):
    """name -> RecipeRow; a bad or duplicate recipe stops the workflow with one line each."""
    rows, problems = {}, []
    for path in _recipe_paths(selection):
        if not Path(path).is_file():
            problems.append(f"{path}: recipe file not found (config recipes.files)")
            continue
        try:
            row = _load_row(path)
        except InvalidRecipe as errs:
            problems.extend(str(e) for e in errs.errors)
            continue
        if row.name in rows:
            problems.append(
                f"{path}: name {row.name!r} is also used by {rows[row.name].path}; "
                "recipe names must be unique (they name the results folder)"
            )
            continue
        rows[row.name] = row
    if problems:
        _refuse("invalid recipes:\n" + "\n".join(problems))
    if not rows:
        _refuse(
            f"no recipe files selected: config recipes is {dict(selection)} "
            f"(relative to {os.getcwd()})"
        )
    return rows


RECIPES = recipe_table(config["recipes"])


wildcard_constraints:
    recipe=SAFE_NAME_PATTERN,


# ---- paths -------------------------------------------------------------------------------


def result_path(recipe, stage):
    return f"{RESULTS}/{recipe}/{stage}.json"


def all_results():
    return [result_path(r, s) for r in RECIPES for s in SELECTED]


# ---- input functions ------------------------------------------------------------------------


def recipe_file(wildcards):
    return RECIPES[wildcards.recipe].path


def recipe_sha256(wildcards):
    """A params value: editing a recipe (or a file it extends) reruns exactly its jobs."""
    return RECIPES[wildcards.recipe].sha256


def env_check_probe(wildcards, resources):
    """`--static` for a GPU recipe under a cluster profile (a Slurm partition is set):
    env_check is a local rule, so a live probe would describe the submit host, which has none
    of the GPUs that the recipe's stages get on the cluster."""
    gpus = RECIPES[wildcards.recipe].gpus_per_node
    return "--static" if gpus and "slurm_partition" in resources.keys() else ""


def gate_stages(stage):
    """The selected stages whose pass this stage requires."""
    wanted = list(STAGE_GATES[stage])
    if stage != "smoke" and "smoke" not in SELECTED:
        wanted = ["env_check"]
    return [s for s in wanted if s in SELECTED]


def before_stages(stage):
    """Gates plus ordering-only predecessors: bench waits for logprob_diff so the two never
    share a machine (timing), but a logprob_diff failure does not skip bench."""
    order = gate_stages(stage)
    if stage == "bench" and "logprob_diff" in SELECTED:
        order = order + ["logprob_diff"]
    return order


def stage_inputs(stage):
    def inputs(wildcards):
        return {
            "recipe": RECIPES[wildcards.recipe].path,
            "before": [result_path(wildcards.recipe, s) for s in before_stages(stage)],
        }

    return inputs


def run_stage_args(stage):
    """A run stage's options: --require for each gate, and --timeout with the config's default
    when the recipe sets none, so the stage's own limit ends it with a result (a local run has
    no scheduler to stop it)."""

    def args(wildcards):
        out = []
        for gate in gate_stages(stage):
            out += ["--require", result_path(wildcards.recipe, gate)]
        if not RECIPES[wildcards.recipe].timeout_s[stage]:
            out += ["--timeout", f"{stage_timeout_s(wildcards.recipe, stage):g}"]
        return out

    return args


# `--runner` for the GPU stages: the configured one, else the stage's default (slurm inside
# a Slurm allocation, ray when RAY_ADDRESS is set, local otherwise), so no profile has to set it.
RUNNER = f"--runner {config['runner']}" if config["runner"] else ""


# ---- resources ------------------------------------------------------------------------------


def stage_timeout_s(recipe, stage):
    """The stage's wall-clock limit: the recipe's, else the config's default."""
    own = RECIPES[recipe].timeout_s[stage]
    return own if own else config["default_timeout_min"][stage] * 60


def runtime_min(stage):
    """Scheduler time limit: the stage's own timeout fires first and still writes a result."""

    def runtime(wildcards):
        minutes = stage_timeout_s(wildcards.recipe, stage) / 60
        return math.ceil(
            minutes * config["runtime_factor"] + config["runtime_margin_min"]
        )

    return runtime


def nodes(wildcards):
    return RECIPES[wildcards.recipe].nodes


def gpu_gres(wildcards):
    """GPUs per node as a GRES string (per node, unlike --gpus, which counts the whole job);
    empty for CPU recipes. `tasks` is never set: with a GPU request the Slurm plugin turns
    it into --ntasks-per-gpu."""
    row = RECIPES[wildcards.recipe]
    if not row.gpus_per_node:
        return ""
    kind = config["gpu_gres_type"]
    if kind == "auto":
        kind = (row.gpu or "").lower()
    return f"gpu:{kind}:{row.gpus_per_node}" if kind else f"gpu:{row.gpus_per_node}"


# ---- shared Ray head -------------------------------------------------------------------------

# A local run's stages share one Ray head (the first stage that needs Ray starts it) instead of
# starting one each; it is stopped when the run ends, failed or not. Cluster jobs start their
# own Ray inside their allocation and never see this.
RAY_STATE_DIR = os.path.abspath(f"{RESULTS}/.ray")
if workflow.local_exec and not workflow.remote_exec:
    os.environ.setdefault("RECIPEVAL_RAY_STATE_DIR", RAY_STATE_DIR)


def stop_shared_ray(log):
    """onsuccess/onerror: stop this run's shared Ray head (none started: nothing to do)."""
    subprocess.run(
        [
            "recipeval",
            "ray-down",
            "--state-dir",
            os.environ.get("RECIPEVAL_RAY_STATE_DIR", RAY_STATE_DIR),
        ],
        check=False,
    )


def print_verdicts():
    """onsuccess/onerror: the last lines on the terminal say how every stage went and where
    the tables are."""
    from recipeval.publish.summary import verdict_lines

    print(
        "\n".join(
            ["", "recipeval:", *verdict_lines(Path(RESULTS), RECIPES, RUN_STARTED)]
        ),
        flush=True,
    )
