"""`recipeval validate` and `schema` through the CLI, on real and broken recipe files."""

from __future__ import annotations

import json

import pytest
from conftest import PR_RECIPE, RECIPES, REPO, clean_env

BAD = REPO / "tests" / "recipes" / "bad"

# file -> (dotted key expected in the message, or None for file-level problems; text expected)
BAD_CASES = {
    "syntax-error.yaml": (None, "YAML syntax error"),
    "unknown-key.yaml": ("parallel.pipline", "unknown key"),
    "wrong-type.yaml": ("model.layers", "valid integer"),
    "missing-parent.yaml": ("extends", "not found"),
    "cycle-a.yaml": ("extends", "cycle"),
    "not-a-mapping.yaml": (None, "expected a mapping"),
    "empty.yaml": (None, "empty file"),
    "binary.yaml": (None, "binary file"),
    "impossible-value.yaml": ("cluster.nodes", "greater than 0"),
    "env-bool.yaml": ("env.SOME_SWITCH", "quote"),
    "bool-key.yaml": ("args", "key 'on' reads as true in YAML; quote it"),
    "bench-no-metrics.yaml": ("stages.bench.metrics", "at least 1 item"),
    "derived-flag.yaml": ("args.tensor-model-parallel-size", "parallel.tp"),
    "bad-arg-value.yaml": ("args.eps-clip", "expected a string, number"),
    # The value would reach the trainer as a flag of its own ("-1" stays a value).
    "flag-as-value.yaml": ("args.lr", "it starts with '-': the trainer would read it as a flag"),
}


def test_every_shipped_recipe_validates(cli):
    recipes = sorted(p for p in RECIPES.glob("*/*.yaml") if p.parent.name != "base")
    assert len(recipes) >= 4
    proc = cli("validate", *map(str, recipes))
    assert proc.returncode == 0, proc.stderr
    assert sum(line.startswith("ok ") for line in proc.stdout.splitlines()) == len(recipes)


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_recipe_gives_one_line_error_and_exit_2(cli, name):
    key, text = BAD_CASES[name]
    proc = cli("validate", str(BAD / name))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert "Traceback" not in proc.stderr
    assert f"tests/recipes/bad/{name}" in line or name.startswith("cycle")
    assert name.split("-")[0] in line
    if key:
        assert f" {key}:" in line, line
    assert text in line, line


def _readme_yaml_example(section: str) -> str:
    """The first ```yaml block under the README heading `## section`."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return body.split("```yaml\n", 1)[1].split("\n```", 1)[0]


def test_readme_recipe_example_validates(cli, tmp_path):
    """The README's "Writing a recipe" example, placed as it says (recipes/amd/, so its
    `extends: ../base/...` finds the shipped base), validates as written."""
    (tmp_path / "base").symlink_to(RECIPES / "base")
    recipe = tmp_path / "amd" / "example.yaml"
    recipe.parent.mkdir()
    recipe.write_text(_readme_yaml_example("Writing a recipe"))
    proc = cli("validate", str(recipe))
    assert proc.returncode == 0, proc.stderr


def test_error_points_at_the_line_that_set_the_key(cli):
    proc = cli("validate", str(BAD / "unknown-key.yaml"))
    assert "unknown-key.yaml:4:" in proc.stderr


def test_error_in_parent_names_the_parent_file(cli, tmp_path):
    parent = tmp_path / "parent.yaml"
    parent.write_text(
        (RECIPES / "local" / "tiny-grpo-cpu.yaml")
        .read_text()
        .replace("hidden_size: 64", "hidden_size: -64")
    )
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\nname: child\n")
    proc = cli("validate", str(child))
    assert proc.returncode == 2
    assert "parent.yaml:" in proc.stderr and "model.hidden_size" in proc.stderr


def test_validate_reports_every_bad_file_and_still_checks_good_ones(cli):
    proc = cli("validate", str(PR_RECIPE), str(BAD / "empty.yaml"), str(BAD / "wrong-type.yaml"))
    assert proc.returncode == 2
    assert "ok " in proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 2


def test_unknown_stage_is_a_usage_error(cli):
    proc = cli("render", str(PR_RECIPE), "--stage", "smok")
    assert proc.returncode == 2
    assert "smok" in proc.stderr and "smoke" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_schema_is_json_schema_with_the_recipe_keys(cli):
    proc = cli("schema")
    assert proc.returncode == 0
    schema = json.loads(proc.stdout)
    assert set(schema["properties"]) >= {
        "name",
        "extends",
        "engine",
        "platform",
        "cluster",
        "model",
        "parallel",
        "args",
        "env",
        "stages",
        "expect",
    }
    assert schema["additionalProperties"] is False
    parallel = schema["$defs"]["Parallel"]["properties"]
    assert set(parallel) == {
        "tp",
        "sequence_parallel",
        "pp",
        "pp_first_stage_layers",
        "pp_last_stage_layers",
        "cp",
        "ep",
        "etp",
    }


# Rules between keys that a stage would refuse when it runs: `validate` reports each on the
# line that set the key. (child recipe body after its `extends` line, line, key, text expected)
CROSS_FIELD_CASES = {
    "bench-min-steps": (
        "stages:\n  bench:\n    min_steps: 2\n",
        4,
        "stages.bench.min_steps",
        "greater than or equal to 3",
    ),
    "bench-max-below-min": (
        "stages:\n  bench:\n    min_steps: 6\n    max_steps: 5\n",
        5,
        "stages.bench.max_steps",
        "at least min_steps (6)",
    ),
    "smoke-rollouts-dropped": (
        ("stages:\n  smoke:\n    args: {num-rollout: null}\nargs:\n  num-rollout: null\n"),
        4,
        "stages.smoke.args.num-rollout",
        "positive integer num-rollout",
    ),
    "smoke-rollouts-text": (
        "stages:\n  smoke:\n    args: {num-rollout: three}\n",
        4,
        "stages.smoke.args.num-rollout",
        "positive integer num-rollout",
    ),
    "threshold-name": (
        "stages:\n  logprob_diff:\n    thresholds:\n      mean_abs_dif: 0.1\n",
        5,
        "stages.logprob_diff.thresholds.mean_abs_dif",
        "no logprob statistic",
    ),
}


# Values no launch may carry, refused on the line that set them: a NUL byte (argv ends at it),
# an integer past 64 bits, and a shell metacharacter in the words miles pastes into a shell
# command unquoted (source.args). (child recipe body after its `extends` line, line, key, text)
REFUSED_VALUE_CASES = {
    "arg-nul": ('args: {device: "cpu\\0x"}\n', 2, "args.device", "cannot contain a NUL byte"),
    "arg-list-nul": (
        'stages:\n  bench:\n    args: {seed: [1, "a\\0"]}\n',
        4,
        "stages.bench.args.seed",
        "cannot contain a NUL byte",
    ),
    # 201 characters: publish could not use it as a folder name (the schema allowed any length)
    "name-too-long": (f"name: {'a' * 201}\n", 2, "name", "should match pattern"),
    "arg-huge-int": (f"args: {{num-rollout: {'9' * 100}}}\n", 2, "args.num-rollout", "64 bits"),
    "arg-int-past-64-bits": (f"args: {{seed: {2**63}}}\n", 2, "args.seed", "64 bits"),
    **{
        f"source-args-{name}": (
            f"source:\n  commit: abcdef1\n  script: run.py\n  args: [train, --lr, {word}]\n",
            5,
            "source.args[2]",
            f"holds {shown}: miles pastes",
        )
        for name, word, shown in [
            ("semicolon", "'1e-6; touch x'", "';'"),
            ("substitution", "'$(id)'", "'$'"),
            ("backtick", "'`id`'", "'`'"),
            ("pipe-and-redirect", "'a|b>c'", "'>' '|'"),
            ("background", "'a&'", "'&'"),
            ("newline", '"1e-6\\nid"', "'\\n'"),
            ("nul", '"1e-6\\0"', "'\\x00'"),
        ]
    },
}


@pytest.mark.parametrize("name", sorted(CROSS_FIELD_CASES | REFUSED_VALUE_CASES))
def test_validate_refuses_on_the_line_that_set_the_key(cli, tmp_path, name):
    body, line, key, text = (CROSS_FIELD_CASES | REFUSED_VALUE_CASES)[name]
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(f"extends: {RECIPES / 'local' / 'tiny-grpo-cpu.yaml'}\n{body}")
    proc = cli("validate", str(recipe))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"recipeval: {recipe}:{line}: {key}: "), errors[0]
    assert text in errors[0], errors[0]


def test_values_at_the_limits_are_kept(cli, tmp_path):
    recipe = tmp_path / "limits.yaml"
    recipe.write_text(
        f"extends: {RECIPES / 'local' / 'tiny-grpo-cpu.yaml'}\n"
        f"args: {{seed: {2**63 - 1}, offset: {-(2**63)}}}\n"
        "source: {commit: abcdef1, script: run.py, args: [train, --lr, 1e-6, --x, a=b/c:d,e]}\n"
    )
    proc = cli("validate", str(recipe))
    assert proc.returncode == 0, proc.stderr


def test_validate_reports_every_cross_field_problem_at_once(cli, tmp_path):
    recipe = tmp_path / "two.yaml"
    recipe.write_text(
        f"extends: {RECIPES / 'local' / 'tiny-grpo-cpu.yaml'}\n"
        "stages:\n  bench: {min_steps: 9, max_steps: 8}\n"
        "  logprob_diff: {thresholds: {kl: 0.1}}\n"
    )
    proc = cli("validate", str(recipe))
    assert proc.returncode == 2
    assert [line.split(": ")[2] for line in proc.stderr.strip().splitlines()] == [
        "stages.bench.max_steps",
        "stages.logprob_diff.thresholds.kl",
    ]


def test_threshold_names_are_the_statistics_analysis_computes():
    """The schema lists the statistics a recipe may limit; analysis.logprob computes them."""
    import dataclasses

    from recipeval.analysis import logprob as lp
    from recipeval.recipe.schema import ABS_DIFF_CUTOFF, LOGPROB_STATISTICS

    computed = {
        f.name for stats in (lp.DiffStats, lp.ScalarStats) for f in dataclasses.fields(stats)
    }
    counts = {"tokens", "samples", "steps", ABS_DIFF_CUTOFF}
    assert set(LOGPROB_STATISTICS) == (computed - counts) | {"rollout_growth"}


def test_the_pipeline_config_names_the_stages_of_the_recipe_schema():
    """config.schema.yaml is data Snakemake validates against; it must list the same stages,
    in the same order, as the one list in recipe/schema.py."""
    import yaml

    from recipeval.recipe import STAGES

    schema = yaml.safe_load((REPO / "config" / "config.schema.yaml").read_text())
    stages = schema["properties"]["stages"]
    assert tuple(stages["items"]["enum"]) == STAGES == tuple(stages["default"])


def test_symlink_loops_and_fifos_are_one_line_never_a_traceback_or_a_hang(cli, tmp_path):
    """A symlink loop as a recipe, a parent or an --out folder ended in a traceback; a FIFO as
    a stage result (publish, --require) or a recorded launch (drift) waited forever."""
    import os

    loop = tmp_path / "loop.yaml"
    loop.symlink_to(tmp_path / "loop.yaml")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    child = tmp_path / "child.yaml"
    child.write_text("extends: loop.yaml\n")
    fifo_child = tmp_path / "fifo-child.yaml"
    fifo_child.write_text("extends: fifo.json\n")
    out_loop = tmp_path / "out"
    out_loop.symlink_to(out_loop)
    tiny = RECIPES / "local" / "tiny-grpo-cpu.yaml"
    cases = [
        (["validate", str(loop)], "loop.yaml"),
        (["validate", str(child)], "parent recipe 'loop.yaml'"),
        (["validate", str(fifo_child)], "'fifo.json' is not a regular file"),
        (["smoke", str(tiny), "--out", str(out_loop)], "leads nowhere"),
        (["smoke", str(tiny), "--out", str(tmp_path / "r"), "--require", str(fifo)], "fifo.json"),
        (["publish", str(fifo), "--no-plots", "--history", str(tmp_path / "h")], "fifo.json"),
        (["drift", str(PR_RECIPE), "--against", str(fifo)], "fifo.json"),
    ]
    for argv, needle in cases:
        proc = cli(*argv, timeout=60)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        text = " ".join(proc.stderr.replace("│", " ").split())  # rich wraps option errors
        assert needle in text and "Traceback" not in proc.stderr, (argv, proc.stderr)


def test_a_newline_in_a_file_name_keeps_each_error_on_one_line(cli, tmp_path):
    """The name was printed raw: a recipe called 'a<newline>b.yaml' split its error in two, and
    the second half read as a line of its own."""
    odd = tmp_path / "a\nb.yaml"
    odd.write_text(f"extends: {RECIPES / 'local' / 'tiny-grpo-cpu.yaml'}\nargs: {{seed: [1, 2\n")
    for argv, line in [
        (["validate", odd.name], "recipeval: a\\nb.yaml:3: YAML syntax error"),
        (["parse-log", "a\nb.log", "--out", "x.csv"], "recipeval: a\\nb.log: no such file"),
    ]:
        proc = cli(*argv, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(line), proc.stderr


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["smoke", "--bogus"], "recipeval: smoke: No such option: --bogus"),
        (["nosuch"], "recipeval: No such command 'nosuch'"),
        (["publish", "--alpha", "x"], "recipeval: publish: Invalid value for '--alpha': "),
        (["smoke", "--timeout", "5x", "r.yaml"], "recipeval: smoke: Invalid value for '--timeout'"),
        (["import", "miles", "--bogus"], "recipeval: import miles: No such option: --bogus"),
        (["validate"], "recipeval: validate: Missing argument 'recipes'"),
        (
            ["render", "--format", "yaml", "r.yaml"],
            "recipeval: render: Invalid value for '--format': 'yaml' is not one of 'shell', 'json'",
        ),
    ],
)
def test_a_command_line_mistake_is_one_line_naming_the_command_and_its_help(cli, args, start):
    """typer's usage errors were a usage line, a hint and a boxed message: up to six lines of a
    Snakemake log for one mistyped option."""
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    command = start.removeprefix("recipeval: ").split(":")[0]
    # The help is named as the command was typed (the cli fixture runs `python -m recipeval`).
    help_of = "python -m recipeval" + ("" if command.startswith("No such") else f" {command}")
    assert line.startswith(start) and line.endswith(f"; see '{help_of} --help'"), line


def test_a_bare_command_shows_its_help(cli):
    proc = cli()
    assert proc.returncode == 2 and "Usage: python -m recipeval [OPTIONS] COMMAND" in proc.stdout
    assert cli("--help").returncode == 0


@pytest.mark.parametrize("group", [[], ["import"]])
def test_each_command_summary_in_the_help_is_one_paragraph(cli, group):
    """A docstring wrapped over lines was listed in --help with its line breaks kept: rows
    that begin with blanks under the command names. Wide enough, every row names a command."""
    proc = cli(*group, "--help", env=clean_env(COLUMNS="600"))
    assert proc.returncode == 0, proc.stderr
    panel = proc.stdout.split("─ Commands ")[1]
    rows = [line for line in panel.splitlines()[1:] if line.startswith("│ ")]
    assert rows and all(not row.startswith("│  ") for row in rows), panel
