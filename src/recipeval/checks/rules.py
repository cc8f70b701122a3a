"""The rule base (rules.yaml) and how its conditions read a recipe. Environment values are
read the way the consuming program reads them (the `readers` of rules.yaml), never compared as
strings; flags by presence (a bare flag) or value."""

from __future__ import annotations

import fnmatch
import re
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from recipeval.checks.subject import Subject
from recipeval.recipe.resolve import flag_present
from recipeval.result import Check, Severity

RULES_FILE = Path(__file__).with_name("rules.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Reader(_Strict):
    truthy: list[str] = Field(default_factory=list)
    falsy: list[str] = Field(default_factory=list)
    integer: bool = Field(False, description="bool(int(value)), as Transformer Engine reads it")
    invalid: Literal["default", "false", "crash"]


class Variable(_Strict):
    reader: str
    default: str


class Condition(_Strict):
    equals: Any = None
    not_equals: Any = None
    in_: list[Any] | None = Field(None, alias="in")
    not_in: list[Any] | None = None
    matches: str | None = None
    not_matches: str | None = None
    is_: bool | None = Field(None, alias="is")
    set: bool | None = None
    gt: float | None = None
    lt: float | None = None
    equals_arg: str | None = None
    not_equals_arg: str | None = None


class When(_Strict):
    platform: list[Literal["rocm", "cuda", "cpu"]] | None = None
    engine: list[Literal["miles", "reference"]] | None = None
    env: dict[str, Condition] = Field(default_factory=dict)
    args: dict[str, Condition] = Field(default_factory=dict)


class Rule(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    severity: Severity
    when: When
    key: str = Field(pattern=r"^(env|args)\.")
    message: str
    fix: str
    reference: str


class RuleBase(_Strict):
    readers: dict[str, Reader]
    variables: dict[str, Variable]
    rules: list[Rule]

    @model_validator(mode="after")
    def _consistent(self) -> RuleBase:
        for name, var in self.variables.items():
            if var.reader not in self.readers:
                raise ValueError(f"variables.{name}: unknown reader {var.reader!r}")
        ids = [r.id for r in self.rules]
        if len(ids) != len(set(ids)):
            raise ValueError("rule ids must be unique")
        return self


class RuleFileError(Exception):
    """rules.yaml itself is broken (a packaging or editing error, not a recipe problem)."""


@cache
def rule_base(path: Path = RULES_FILE) -> RuleBase:
    try:
        return RuleBase.model_validate(yaml.safe_load(path.read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as err:
        raise RuleFileError(f"{path}: {' '.join(str(err).split())[:500]}") from None


class Unreadable(Exception):
    """The consuming program cannot read this value (it would crash on it)."""


def read_bool(base: RuleBase, name: str, value: str | None) -> bool | None:
    """`value` of variable `name` as its program reads it; None when no reader is known.
    Raises Unreadable where the program would crash."""
    var = base.variables.get(name)
    if var is None:
        return None
    reader = base.readers[var.reader]
    raw = var.default if value is None else value
    if reader.integer:
        try:
            return bool(int(raw))
        except ValueError:
            raise Unreadable(
                f"{name}={raw!r} is not an integer; the program calls int() on it"
            ) from None
    lowered = raw.lower()
    if lowered in reader.truthy:
        return True
    if lowered in reader.falsy:
        return False
    if reader.invalid == "false":
        return False
    return read_bool(base, name, None) if value is not None else False


def env_value_checks(subject: Subject, base: RuleBase) -> list[Check]:
    """Known variables whose value their program does not read as the recipe means it."""
    checks = []
    for name, value in subject.env.items():
        var = base.variables.get(name)
        if var is None:
            continue
        reader = base.readers[var.reader]
        key = subject.env_key(name)
        try:
            read = read_bool(base, name, value)
        except Unreadable as err:
            checks.append(
                subject.check(
                    "env.value-readable", False, f"{err}: the job would crash", key=key, value=value
                )
            )
            continue
        recognised = reader.integer or value.lower() in reader.truthy + reader.falsy
        if not recognised:
            fallback = "its default" if reader.invalid == "default" else "false"
            checks.append(
                subject.check(
                    "env.value-readable",
                    False,
                    f"{name}={value!r} is not a boolean {var.reader} reads ({'/'.join(reader.truthy)} or "
                    f"{'/'.join(reader.falsy)}); it falls back to {fallback} ({read})",
                    key=key,
                    severity="warning",
                    value=value,
                )
            )
    if not any(not c.ok for c in checks):
        checks.append(
            subject.check(
                "env.value-readable",
                True,
                "every known boolean variable has a value its program reads",
            )
        )
    return checks


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _holds(cond: Condition, value: Any, as_bool: bool | None, subject: Subject) -> bool:
    """All the condition's tests hold for `value` (None = unset)."""
    present = value is not None
    tests: list[bool] = []
    text = None if value is None else str(value)
    if cond.set is not None:
        tests.append(present == cond.set)
    if cond.is_ is not None:
        tests.append(as_bool is not None and as_bool == cond.is_)
    if cond.equals is not None:
        tests.append(text == str(cond.equals))
    if cond.not_equals is not None:
        tests.append(text != str(cond.not_equals))
    if cond.in_ is not None:
        tests.append(text in [str(v) for v in cond.in_])
    if cond.not_in is not None:
        tests.append(text not in [str(v) for v in cond.not_in])
    if cond.matches is not None:
        tests.append(text is not None and re.fullmatch(cond.matches, text) is not None)
    if cond.not_matches is not None:
        tests.append(text is None or re.fullmatch(cond.not_matches, text) is None)
    for bound, above in ((cond.gt, True), (cond.lt, False)):
        if bound is not None:
            number = _number(value)
            tests.append(number is not None and (number > bound if above else number < bound))
    if cond.equals_arg is not None:
        tests.append(present and text == str(subject.arg(cond.equals_arg)))
    if cond.not_equals_arg is not None:
        tests.append(present and text != str(subject.arg(cond.not_equals_arg)))
    return all(tests)


def _env_matches(
    rule_name: str, cond: Condition, subject: Subject, base: RuleBase
) -> list[str] | None:
    """Names (the matched ones for a glob) for which the condition holds; None if it does not."""
    names = (
        [n for n in subject.env if fnmatch.fnmatchcase(n, rule_name)]
        if any(c in rule_name for c in "*?[")
        else [rule_name]
    )
    if not names:
        return [] if cond.set is False else None
    hits = []
    for name in names:
        value = subject.env.get(name)
        try:
            as_bool = read_bool(base, name, value)
        except Unreadable:
            continue  # env.value-readable reports it; no rule can read it either
        if _holds(cond, value, as_bool, subject):
            hits.append(name)
    return hits or None


def evaluate(rule: Rule, subject: Subject, base: RuleBase) -> Check:
    when = rule.when
    recipe = subject.recipe
    applies = (when.platform is None or recipe.platform in when.platform) and (
        when.engine is None or recipe.engine in when.engine
    )
    matched_env: dict[str, list[str]] = {}
    if applies:
        for name, cond in when.env.items():
            hits = _env_matches(name, cond, subject, base)
            if hits is None:
                applies = False
                break
            matched_env[name] = hits
    if applies:
        for flag, cond in when.args.items():
            value = subject.arg(flag)
            as_bool = flag_present(value)
            if not _holds(cond, value, as_bool, subject):
                applies = False
                break
    section, name = rule.key.split(".", 1)
    if section == "env":
        names = matched_env.get(name) or [name]
        key = subject.env_key(names[0])
        value = (
            {n: subject.env.get(n) for n in names} if len(names) > 1 else subject.env.get(names[0])
        )
    else:
        key, value = subject.arg_key(name), subject.arg(name)
    if not applies:
        return subject.check(
            f"rule.{rule.id}",
            True,
            f"does not apply: {describe(when)}",
            key=key,
            severity=rule.severity,
        )
    return subject.check(
        f"rule.{rule.id}",
        False,
        f"{rule.message}. Fix: {rule.fix}. Ref: {rule.reference}",
        key=key,
        severity=rule.severity,
        value=value,
    )


def describe(when: When) -> str:
    parts = []
    if when.platform:
        parts.append(f"platform in {when.platform}")
    if when.engine:
        parts.append(f"engine in {when.engine}")
    for group in (when.env, when.args):
        for name, cond in group.items():
            tests = cond.model_dump(by_alias=True, exclude_none=True)
            parts.append(f"{name} " + " ".join(f"{op} {v}" for op, v in tests.items()))
    return " and ".join(parts)


def rule_checks(subject: Subject, base: RuleBase | None = None) -> list[Check]:
    base = base or rule_base()
    return env_value_checks(subject, base) + [evaluate(rule, subject, base) for rule in base.rules]
