"""A recipe from a recorded miles launch: the flags `render` derives from structured keys go back
to cluster / model / parallel, every other flag to `args` (model-shape flags to `model.args`),
the job's own env vars to `env`, and where it came from to `source`."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recipeval.engines.launch import flag_words
from recipeval.engines.miles.flags import Difference, FlagValue, parse_flags, same_value
from recipeval.engines.miles.record import MILES_PLACEHOLDER, RecordError, Recording, record_launch
from recipeval.recipe.load import DERIVED_FLAGS

# Env vars miles' launcher sets itself (render sets the same ones); not recipe settings.
LAUNCHER_ENV = (
    "PYTHONUNBUFFERED",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "no_proxy",
    "MASTER_ADDR",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "PYTHONPATH",
)
_BOOL_KEYS = {"parallel.sequence_parallel"}
_INT = re.compile(r"^-?[0-9]+$")


SMOKE_ROLLOUTS = 2


class ImportProblem(Exception):
    """The launch cannot be written as a recipe (the message says why and what to do)."""


def recipe_from_recording(
    rec: Recording, name: str, platform: str, gpu: str | None = None
) -> dict[str, Any]:
    """The full recipe (as a YAML-ready mapping) that renders `rec`'s launch."""
    program, words = rec.entrypoint[:2], rec.entrypoint[2:]
    if program != ["python3", f"{MILES_PLACEHOLDER}/train.py"]:
        raise ImportProblem(
            f"the launch runs {' '.join(program)}; recipeval renders "
            "`python3 <miles>/train.py` only"
        )
    cut = len(words) - rec.train_words if rec.train_words is not None else 0
    model_section, train_section = parse_flags(words[:cut]), parse_flags(words[cut:])
    for flag in train_section:
        model_section.pop(flag, None)  # given twice: argparse keeps the later (training) one
    structured: dict[str, Any] = {}
    for section in (model_section, train_section):
        for flag in [f for f in section if f in DERIVED_FLAGS]:
            _set_structured(structured, flag, section.pop(flag))
    if "num-query-groups" in structured.get("_flags", {}):
        model_section.pop("group-query-attention", None)
        train_section.pop("group-query-attention", None)
    structured.pop("_flags", None)

    cluster = structured.get("cluster", {})
    model = structured.get("model", {})
    positions = _positions(model, model_section)
    hf = train_section.get("hf-checkpoint")
    recipe: dict[str, Any] = {
        "name": name,
        "engine": "miles",
        "platform": platform,
        "cluster": {**cluster, **({"gpu": gpu} if gpu else {})},
        "model": {
            # the checkpoint's folder names the model (miles writes a missing one as None)
            "name": Path(hf).name
            if isinstance(hf, str) and hf != "None"
            else rec.megatron_model_type or name,
            **({"megatron_model_type": rec.megatron_model_type} if rec.megatron_model_type else {}),
            **model,
            **({"max_position_embeddings": positions} if positions else {}),
            "args": {k: yaml_value(v) for k, v in model_section.items()},
        },
        "parallel": structured.get("parallel", {}),
        "paths": {"megatron": _megatron_path(rec)},
        "args": {k: yaml_value(v) for k, v in train_section.items()},
        "env": recipe_env(rec),
        # recipeval's own short run (not part of the launch): every recipe needs one to smoke.
        "stages": {"smoke": {"args": {"num-rollout": SMOKE_ROLLOUTS}}},
        "source": source_block(rec),
    }
    return recipe


def _set_structured(out: dict[str, Any], flag: str, value: FlagValue) -> None:
    key = DERIVED_FLAGS[flag]
    section, field_name = key.split(".")
    if key in _BOOL_KEYS:
        parsed: Any = value is True
    elif isinstance(value, str) and _INT.match(value):
        parsed = int(value)
    else:
        raise ImportProblem(f"--{flag} {value!r}: expected a whole number for {key}")
    previous = out.setdefault(section, {}).get(field_name)
    if previous is not None and previous != parsed:
        raise ImportProblem(
            f"--{flag} {value} disagrees with another flag that sets {key} "
            f"({previous}); a recipe has one {key}"
        )
    out[section][field_name] = parsed
    out.setdefault("_flags", {})[flag] = parsed


def _positions(model: dict[str, Any], model_flags: dict[str, FlagValue]) -> int | None:
    """miles' launch leaves the position range to the checkpoint; YaRN's original positions x
    its factor is that range."""
    if model.pop("max_position_embeddings", None) is not None:
        return None
    original, factor = (
        model_flags.get("original-max-position-embeddings"),
        model_flags.get("rotary-scaling-factor"),
    )
    if isinstance(original, str) and isinstance(factor, str):
        try:
            return int(int(original) * float(factor))
        except ValueError:
            return None
    return None


def _megatron_path(rec: Recording) -> str | None:
    entries = rec.runtime_env.get("PYTHONPATH", "").split(":")
    return entries[1] if len(entries) > 1 and entries[0] == MILES_PLACEHOLDER else None


def recipe_env(rec: Recording) -> dict[str, str]:
    """The job's env vars less what the launcher sets itself and what a node probe decides."""
    env = {
        k: v for k, v in rec.runtime_env.items() if k not in LAUNCHER_ENV and k not in rec.probed
    }
    extra_path = rec.runtime_env.get("PYTHONPATH", "").split(":")[2:]
    if extra_path:
        env["PYTHONPATH"] = ":".join(extra_path)
    return env


def source_block(rec: Recording) -> dict[str, Any]:
    block: dict[str, Any] = {
        "repo": rec.repo,
        "commit": rec.commit,
        "script": rec.script,
        "args": list(rec.args),
    }
    if rec.probed:
        block["probed"] = dict(rec.probed)
    return block


def yaml_value(value: FlagValue) -> Any:
    """A launch word as the YAML value that renders back to the same word."""
    if isinstance(value, list):
        return [yaml_value(v) for v in value]
    if value is True:
        return True
    if _INT.match(value) and str(int(value)) == value:
        return int(value)
    try:
        number = float(value)
    except ValueError:
        return value
    return number if flag_words({"x": number})[1] == value else value


def diff_against_base(recipe: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Only what `recipe` changes relative to `base` (a resolved recipe as a mapping); an arg
    or env var the base sets and the launch lacks is written null (removed)."""
    out: dict[str, Any] = {"name": recipe["name"]}
    for key, value in recipe.items():
        if key == "name":
            continue
        if key in ("args", "env"):
            changed = _changed_entries(value, base.get(key) or {})
        elif isinstance(value, dict) and key != "source":
            changed = _changed_section(value, base.get(key) or {})
        else:
            changed = value if value != base.get(key) else None
        if changed:
            out[key] = changed
    return out


def _changed_section(section: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in section.items():
        if key == "args":
            if changed := _changed_entries(value, base.get("args") or {}):
                out["args"] = changed
        elif value != base.get(key):
            out[key] = value
    return out


def _changed_entries(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in ours.items():
        if key not in base or not same_value(_words(base[key]), _words(value)):
            out[key] = value
    out |= {k: None for k in base if k not in ours and base[k] not in (None, False)}
    return out


def _words(value: Any) -> FlagValue:
    words = flag_words({"x": value})[1:]
    return True if not words else words[0] if len(words) == 1 else words


def relative_extends(base: Path, out: Path | None) -> str:
    start = (out.parent if out else Path.cwd()).resolve()
    return os.path.relpath(base.resolve(), start)


class _RecipeDumper(yaml.SafeDumper):
    """Mappings as blocks, lists of words on one line (as the hand-written recipes are)."""


_RecipeDumper.add_representer(
    list,
    lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True),
)


def recipe_yaml(recipe: dict[str, Any], rec: Recording, extends: str | None) -> str:
    data = {"name": recipe.pop("name"), **({"extends": extends} if extends else {}), **recipe}
    header = (
        f"# Imported by `recipeval import miles` from {rec.repo}@{rec.commit[:12]}:\n"
        f"#   {rec.script} {' '.join(rec.args)}\n"
    )
    probed = "".join(
        f"# {k} is decided on the node by a probe ({v}); not frozen here.\n"
        for k, v in rec.probed.items()
    )
    body = yaml.dump(data, Dumper=_RecipeDumper, sort_keys=False, width=100, allow_unicode=True)
    return header + probed + body


@dataclass(frozen=True)
class ImportRequest:
    checkout: Path
    script: str
    args: list[str]
    name: str | None = None
    platform: str | None = None
    gpu: str | None = None
    extends: Path | None = None
    out: Path | None = None


@dataclass
class ImportResult:
    recording: Recording
    text: str
    differences: list[Difference]


def import_recipe(request: ImportRequest) -> ImportResult:
    """Record the script's launch, write the recipe (to request.out, if given), load it back
    and compare its render with the recording: `differences` is empty when it round-trips."""
    from recipeval.engines.miles.drift import compare
    from recipeval.recipe import InvalidRecipe, load_recipe, resolve
    from recipeval.recipe.load import merged_mapping
    from recipeval.recipe.schema import source_word

    checkout = request.checkout.resolve()
    script = _script_in_checkout(request.script, checkout)
    # The arguments become the recipe's source.args: refused here as a recipe would refuse them.
    for i, word in enumerate(request.args):
        try:
            source_word(word)
        except ValueError as err:
            raise ImportProblem(f"{script}: argument {i + 1} {word!r} {err}") from None
    rec = record_launch(checkout, script, request.args)
    name = request.name or (request.out.stem if request.out else _default_name(rec))
    platform = request.platform or ("rocm" if "amd" in Path(script).parts else "cuda")
    if platform not in ("rocm", "cuda"):
        raise ImportProblem(f"--platform {platform!r}: a miles recipe runs on rocm or cuda")
    recipe = recipe_from_recording(rec, name, platform, request.gpu or _hardware(rec.args))
    if request.extends is None and "max_position_embeddings" not in recipe["model"]:
        raise ImportProblem(
            f"{script}: the launch does not say how many positions the model takes (miles reads "
            "it from the checkpoint); pass --extends BASE with model.max_position_embeddings"
        )
    extends = None
    if request.extends is not None:
        base = merged_mapping(request.extends)
        if (base.get("model") or {}).get("name") and recipe["model"]["name"] in (
            rec.megatron_model_type,
            name,
        ):
            recipe["model"].pop("name")  # only a fallback: the base's own name stands
        recipe = diff_against_base(recipe, base)
        extends = relative_extends(request.extends, request.out)
    text = recipe_yaml(recipe, rec, extends)
    folder = (request.out.parent if request.out else Path.cwd()).resolve()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=folder, delete=False) as tmp:
        tmp.write(text)
    try:
        loaded = load_recipe(Path(tmp.name))
    except InvalidRecipe as err:  # e.g. a --name no recipe may have; name the file it would be
        shown = str(request.out) if request.out else "the imported recipe"
        raise ImportProblem(str(err).replace(tmp.name, shown)) from None
    finally:
        Path(tmp.name).unlink()
    if request.out is not None:
        request.out.write_text(text)
    report = compare(resolve(loaded.recipe, None, None), rec)
    return ImportResult(rec, text, report.differences)


def _script_in_checkout(script: str, checkout: Path) -> str:
    path = Path(script)
    if path.is_absolute() or path.exists():
        try:
            return str(path.resolve().relative_to(checkout))
        except ValueError:
            raise RecordError(f"{script} is not inside the miles checkout {checkout}") from None
    return script


def _default_name(rec: Recording) -> str:
    nodes = parse_flags(rec.entrypoint).get("actor-num-nodes")
    return f"{Path(rec.script).stem.replace('_', '-').removeprefix('run-')}-{nodes}node"


def _hardware(args: list[str]) -> str | None:
    value = parse_flags(["-", *args]).get("hardware")
    return value if isinstance(value, str) and value != "auto" else None
