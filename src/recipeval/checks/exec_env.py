"""Warn about every env name the recipe allowed that makes a program run code (BASH_ENV,
LD_PRELOAD, ...): allowed on purpose, but a reviewer should see it on every check."""

from __future__ import annotations

from recipeval.checks.subject import Subject
from recipeval.recipe.exec_env import exec_env_keys
from recipeval.result import Check


def exec_env_checks(subject: Subject) -> list[Check]:
    return [
        subject.check(
            "env.exec_allowed",
            False,
            f"{name} runs code chosen by its value in the engine's shells or processes "
            "(allowed by allow_exec_env)",
            key=key,
            severity="warning",
        )
        for key, name in exec_env_keys(subject.recipe)
    ]
