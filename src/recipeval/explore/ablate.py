"""`recipeval ablate BEFORE AFTER`: one variant of BEFORE per changed key (or group of keys),
so publish can say which key moved the logprob difference or the step time.

Keys that cannot change alone travel together: a variant is judged by env_check's static
checks (layout arithmetic, megatron-core, the rule base, memory, context and batch), and a
check that fails in the variant but in neither BEFORE nor AFTER binds its keys. A rule of the
rule base binds the variables and flags its condition names; any other check binds the group
with the first other group that makes the variant pass. Every binding is kept with the check
that made it, and no variant that env_check would reject is emitted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipeval.checks import rules
from recipeval.explore.emit import prepare_folder, write_variant
from recipeval.recipe import LoadedRecipe
from recipeval.recipe.schema import Recipe, Sweep
from recipeval.result import Check
from recipeval.secrets import fingerprint_secret

# Keys that say what a recipe is called or expects, not how it runs.
NOT_CAUSES = ("name", "extends", "description", "sweep", "source", "expect")
MISSING = object()

Judge = Callable[[Recipe], list[Check]]


def flat_values(recipe: Recipe) -> dict[str, Any]:
    """The resolved recipe as dotted leaf keys (lists are leaves), without the identity keys."""
    out: dict[str, Any] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        else:
            out[path] = node

    walk({k: v for k, v in recipe.model_dump(mode="json").items() if k not in NOT_CAUSES}, "")
    return {k: v for k, v in out.items() if v is not None and v != {}}


def changed_keys(before: Recipe, after: Recipe) -> dict[str, tuple[Any, Any]]:
    """key -> (value before, value after); MISSING where a side does not set it."""
    a, b = flat_values(before), flat_values(after)
    return {
        k: (a.get(k, MISSING), b.get(k, MISSING))
        for k in sorted(a.keys() | b.keys())
        if a.get(k, MISSING) != b.get(k, MISSING)
    }


def nest(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys -> nested mappings (a recipe overlay)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def apply_keys(changes: dict[str, tuple[Any, Any]], keys: list[str]) -> dict[str, Any]:
    """The overlay that moves BEFORE to AFTER on `keys` (null removes a key AFTER lacks)."""
    return nest({k: None if changes[k][1] is MISSING else changes[k][1] for k in keys})


@dataclass
class Group:
    keys: list[str]
    reasons: list[str] = field(default_factory=list)

    def label(self) -> str:
        return ", ".join(self.keys)


@dataclass
class Ablation:
    before: LoadedRecipe
    after: LoadedRecipe
    changes: dict[str, tuple[Any, Any]]
    groups: list[Group]


class AblationError(ValueError):
    """Recipes that cannot be ablated (no difference, another model)."""


def _bound_keys(check: Check, changed: set[str]) -> set[str]:
    """The changed keys a failing check names: a rule's condition, or the check's own key."""
    bound: set[str] = set()
    if check.id.startswith("rule."):
        rule = next((r for r in rules.rule_base().rules if f"rule.{r.id}" == check.id), None)
        if rule is not None:
            names = [f"env.{n}" for n in rule.when.env] + [f"args.{f}" for f in rule.when.args]
            for name in names:
                pattern = re.compile(re.escape(name).replace(r"\*", ".*") + "$")
                bound |= {k for k in changed if pattern.match(k)}
            if "*" not in rule.key:
                bound.add(rule.key)
    elif check.key:
        bound |= {k for k in changed if k == check.key or k.startswith(check.key + ".")}
    return bound & changed


def _new_failures(checks: list[Check], known: set[str]) -> list[Check]:
    return [c for c in checks if not c.ok and c.severity == "error" and c.id not in known]


def plan(
    before: LoadedRecipe, after: LoadedRecipe, judge: Judge, together: list[list[str]] | None = None
) -> Ablation:
    """The groups of changed keys, each a variant env_check accepts. `together`: key lists
    (exact keys or prefixes such as `parallel`) to keep in one group from the start."""
    changes = changed_keys(before.recipe, after.recipe)
    if not changes:
        raise AblationError(
            f"{before.path} and {after.path} resolve to the same recipe: nothing to ablate"
        )
    if before.recipe.model.name != after.recipe.model.name:
        raise AblationError(
            f"model {before.recipe.model.name!r} vs {after.recipe.model.name!r}: "
            "ablate compares two recipes of one model"
        )
    groups = [Group([k]) for k in changes]
    for wanted in together or []:
        members = [
            g
            for g in groups
            if any(k == w or k.startswith(w + ".") for k in g.keys for w in wanted)
        ]
        if not members:
            raise AblationError(f"--group {','.join(wanted)}: no changed key matches")
        _merge(groups, members, f"--group {','.join(wanted)}")
    known = {c.id for c in judge(before.recipe) + judge(after.recipe) if not c.ok}
    changed = set(changes)
    pending = True
    while pending:
        pending = False
        for group in list(groups):
            failures = _new_failures(judge(_variant(before, changes, group.keys)), known)
            if not failures:
                continue
            partners = _partners(groups, group, failures, changed, before, changes, judge, known)
            why = "; ".join(
                f"{c.id}: {c.message.split(' [')[0].split('. Fix:')[0]}" for c in failures
            )
            _merge(groups, [group, *partners], f"alone, env_check fails {why}")
            pending = True
            break
    return Ablation(before, after, changes, groups)


def _partners(
    groups: list[Group],
    group: Group,
    failures: list[Check],
    changed: set[str],
    before: LoadedRecipe,
    changes: dict[str, tuple[Any, Any]],
    judge: Judge,
    known: set[str],
) -> list[Group]:
    bound = set().union(*(_bound_keys(c, changed) for c in failures)) - set(group.keys)
    named = [g for g in groups if g is not group and bound & set(g.keys)]
    if named:
        return named
    for other in groups:
        if other is not group and not _new_failures(
            judge(_variant(before, changes, group.keys + other.keys)), known
        ):
            return [other]
    return [g for g in groups if g is not group]  # nothing smaller passes: the whole change


def _merge(groups: list[Group], members: list[Group], reason: str) -> None:
    first = members[0]
    for other in members[1:]:
        first.keys += other.keys
        first.reasons += other.reasons
        groups.remove(other)
    first.keys.sort()
    first.reasons.append(reason)


def _variant(before: LoadedRecipe, changes: dict[str, tuple[Any, Any]], keys: list[str]) -> Recipe:
    data = before.recipe.model_dump(mode="json", exclude={"extends"})
    for key in keys:
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        value = changes[key][1]
        if value is MISSING:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return Recipe.model_validate(data)


def _slug(group: Group) -> str:
    last = re.sub(r"[^a-z0-9]+", "-", group.keys[0].split(".")[-1].lower()).strip("-")
    return last + (f"-and-{len(group.keys) - 1}" if len(group.keys) > 1 else "")


def emit(ablation: Ablation, folder: Path) -> list[Path]:
    """BEFORE as is, one variant per group, and the whole change: each extends BEFORE."""
    prepare_folder(folder)
    base = ablation.before.recipe.name
    every = list(ablation.changes)
    plans = [("none", [], "BEFORE as it is: the reference every effect is measured against")]
    plans += [
        (f"{i:02d}-{_slug(g)}", g.keys, "; ".join(g.reasons) or "changes alone")
        for i, g in enumerate(ablation.groups, 1)
    ]
    plans.append(
        (
            "all",
            every,
            (
                f"every change: {ablation.after.path.name} (the interaction is "
                "this minus the sum of the single effects)"
            ),
        )
    )
    written = []
    for suffix, keys, why in plans:
        sweep = Sweep(kind="ablation", base=base, keys=keys, after=ablation.after.recipe.name)
        comment = (
            f"recipeval ablate {ablation.before.path.name} -> {ablation.after.path.name}: "
            f"{', '.join(keys) or 'no change'}\nwhy grouped: {why}"
        )
        written.append(
            write_variant(
                ablation.before.path,
                folder,
                f"{base}--ablate-{suffix}",
                apply_keys(ablation.changes, keys),
                sweep,
                comment,
            )
        )
    return written


def plan_lines(ablation: Ablation) -> list[str]:
    lines = [
        (
            f"{len(ablation.changes)} changed key(s) from {ablation.before.path} to "
            f"{ablation.after.path}, in {len(ablation.groups)} variant(s):"
        )
    ]
    for i, group in enumerate(ablation.groups, 1):
        shown = [
            f"{k}: {_show(k, ablation.changes[k][0])} -> {_show(k, ablation.changes[k][1])}"
            for k in group.keys
        ]
        lines.append(f"  {i:2}. {shown[0]}")
        lines += [f"      {s}" for s in shown[1:]]
        lines += [f"      kept together: {r}" for r in group.reasons]
    return lines


def _show(key: str, value: Any) -> str:
    # A secret (env.HF_TOKEN, args.wandb-key) shows as its fingerprint: changed, not its value.
    return "(unset)" if value is MISSING else repr(fingerprint_secret(key, value))


def static_judge() -> Judge:
    """env_check's static checks (megatron-core imported once; SGLang's parser left out: each
    value a variant sets was already in BEFORE or AFTER)."""
    from recipeval.checks import layout
    from recipeval.checks.env_check import _Validators, static_checks
    from recipeval.checks.subject import Subject
    from recipeval.recipe import resolve

    validators = _Validators(megatron=layout.load_megatron())

    def judge(recipe: Recipe) -> list[Check]:
        loaded = LoadedRecipe(recipe=recipe, path=Path(recipe.name), files=[], origins={})
        subject = Subject(loaded, resolve(recipe, None))
        return static_checks(subject, validators, None, 0)

    return judge


__all__ = [
    "Ablation",
    "AblationError",
    "Group",
    "changed_keys",
    "emit",
    "plan",
    "plan_lines",
    "static_judge",
]
