"""Fuzz the recipe entry points (issue 15): hypothesis builds recipes from the schema's keys
with hostile values, and mutates recipe YAML text; `validate`, `render` and
`env-check --static` run in-process on each and must end with exit 0, 1 or 2, never a
traceback. Fixed seed (derandomize) and budget, so CI sees the same cases every run."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PR_RECIPE, TINY_RECIPE

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from recipeval.cli import app
from recipeval.errors import RecipeError, UsageError

COMMANDS = (
    ("validate",),
    ("render",),
    ("render", "--format", "json", "--redact"),
    ("env-check", "--static"),
)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
BASE: dict[str, Any] = yaml.safe_load(TINY_RECIPE.read_text())

# Values a hostile or clumsy recipe holds where any key is expected.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, -1, 2**31, 2**63, 10**4000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "90m", "1e20", "$(reboot)", "a\x00b", "../../x", "/dev/zero", "*", "~"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
# Keys as recipes spell them, plus names that are not POSIX or flag names.
names = st.one_of(
    st.sampled_from(
        [
            "HF_TOKEN",
            "BASH_ENV",
            "LD_PRELOAD",
            "A=B",
            "BAD$(x)",
            "A B",
            "",
            "-x",
            "num-layers",
            "rollout-max-response-len",
            "global-batch-size",
            "sglang-mem-fraction-static",
        ]
    ),
    st.text(max_size=16),
)


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of the base recipe (mappings only)."""
    out = []
    if isinstance(data, dict):
        for key, value in data.items():
            out.append((*prefix, key))
            out += _paths(value, (*prefix, key))
    return out


KEY_PATHS = _paths(BASE) + [
    ("env",),
    ("args",),
    ("stages", "smoke", "env"),
    ("stages", "bench"),
    ("allow_exec_env",),
    ("extends",),
]


def _set(data: dict, path: tuple, value: Any) -> None:
    node = data
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def schema_recipes(draw: st.DrawFn) -> dict[str, Any]:
    data = yaml.safe_load(TINY_RECIPE.read_text())
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(KEY_PATHS))
        if path[-1] in ("env", "args"):
            value = draw(st.dictionaries(names, scalars, max_size=3))
        else:
            value = draw(values)
        _set(data, path, value)
    return data


def _dump(data: dict[str, Any]) -> str:
    """YAML text of `data` (nan/inf as .nan/.inf, big ints as digits, as a recipe can hold)."""
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


# Mutations of the YAML text: what a hand edit, a bad merge or an attacker produce.
MUTATIONS = [
    lambda t, r: t[: r % max(len(t), 1)],  # truncated
    lambda t, r: t.replace("\n", "\n" + " " * (r % 5), 1 + r % 7),  # broken indentation
    lambda t, r: t + "\n" + t.splitlines()[r % len(t.splitlines())] + "\n",  # duplicate key
    lambda t, r: "x: &a [1, 2]\ny: [*a, *a, *a]\n" + t,  # aliases
    lambda t, r: "x: &a [*a]\n" + t,  # self reference
    lambda t, r: t + "extra: " + "[" * (r % 120) + "]" * (r % 120) + "\n",  # nesting
    lambda t, r: t + "m: &m {a: 1}\nn: {<<: [*m, *m]}\n",  # merge keys
    lambda t, r: t.replace(": ", ": !!python/object:os.system ", 1),  # unsafe tag
    lambda t, r: t.replace("layers: 2", "layers: " + "1" + "0" * (r % 5000)),  # huge number
    lambda t, r: t.replace("16", ".nan" if r % 2 else ".inf", 1),
    lambda t, r: "\t" + t,
    lambda t, r: t.replace("name:", "name: !!binary", 1),
    lambda t, r: t.encode("utf-16").decode("latin-1"),
    lambda t, r: t + "extends: " + ("../" * (r % 30)) + "x.yaml\n",
    lambda t, r: t + "--- \n" + t,  # two documents
    lambda t, r: t.replace("\n", "\r", r % 4),
]


@st.composite
def mutated_texts(draw: st.DrawFn) -> str:
    base = draw(st.sampled_from([TINY_RECIPE.read_text(), _dump(BASE)]))
    for _ in range(draw(st.integers(1, 3))):
        mutation = draw(st.sampled_from(MUTATIONS))
        base = mutation(base, draw(st.integers(0, 10**6)))
    if draw(st.booleans()):
        at = draw(st.integers(0, max(len(base) - 1, 0)))
        base = base[:at] + draw(st.text(max_size=8)) + base[at:]
    return base


def _exit_code(args: list[str]) -> int:
    """Run the CLI in-process as `recipeval` does (main() turns RecipeError/UsageError into
    exit 2); any other exception is a traceback a user would see."""
    result = CliRunner().invoke(app, args)
    exc = result.exception
    if isinstance(exc, RecipeError | UsageError):
        return 2
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        raise AssertionError(f"recipeval {' '.join(args)} raised:\n{tb}")
    return result.exit_code


def _check_all(path: Path) -> None:
    for command in COMMANDS:
        code = _exit_code([*command, str(path)])
        assert code in (0, 1, 2), (command, code, path.read_bytes()[:300])


@FUZZ
@given(recipe=schema_recipes())
def test_schema_fuzz_never_tracebacks(
    tmp_path_factory: pytest.TempPathFactory, recipe: dict
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "r.yaml"
    path.write_text(_dump(recipe))
    _check_all(path)


@FUZZ
@given(text=mutated_texts())
def test_yaml_mutation_fuzz_never_tracebacks(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "r.yaml"
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    _check_all(path)


FLAG_NUMBERS = st.dictionaries(
    st.sampled_from(
        [
            "rollout-max-response-len",
            "global-batch-size",
            "sglang-mem-fraction-static",
            "micro-batch-size",
            "num-steps-per-rollout",
            "rollout-batch-size",
        ]
    ),
    st.one_of(
        st.integers(-5, 10**12),
        st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30),
    ),
    min_size=1,
    max_size=3,
)


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(FLAG_NUMBERS, min_size=6, max_size=6))
def test_miles_numbers_fuzz(tmp_path_factory: pytest.TempPathFactory, batch: list[dict]) -> None:
    """The checks on a real miles recipe: any number in the flags they read gives a verdict.
    Six recipes per env-check call: its SGLang flag worker costs seconds per call."""
    folder = tmp_path_factory.mktemp("fuzz")
    paths = []
    for i, overrides in enumerate(batch):
        path = folder / f"m{i}.yaml"
        path.write_text(
            f"extends: {PR_RECIPE}\nname: m{i}\n"
            f"args: {yaml.safe_dump(overrides, default_flow_style=True)}"
        )
        paths.append(str(path))
    assert _exit_code(["validate", *paths]) in (0, 2)
    assert _exit_code(["env-check", "--static", *paths]) in (0, 1, 2)
