"""The transformers range pyproject declares is the range CI tests: its lower bound is the
version scripts/test-engine-lowest.sh installs, and its cap sits just above the version the main
environment is pinned to, so neither end can drift from the declaration unnoticed."""

from __future__ import annotations

import tomllib

from conftest import REPO
from packaging.requirements import Requirement
from packaging.version import Version


def pinned(name: str) -> Version:
    for line in (REPO / "envs" / name).read_text().splitlines():
        if line.startswith("transformers=="):
            return Version(line.split("==", 1)[1])
    raise AssertionError(f"envs/{name} pins no transformers")


def declared() -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    engine = [Requirement(r) for r in project["optional-dependencies"]["engine"]]
    return next(r for r in engine if r.name == "transformers")


def test_lowest_pin_is_the_declared_lower_bound():
    lower = [Version(s.version) for s in declared().specifier if s.operator == ">="]
    assert lower == [pinned("engine-lowest.txt")]


def test_newest_pin_is_allowed_and_the_cap_is_its_next_minor():
    requirement, newest = declared(), pinned("engine-newest.txt")
    assert newest in requirement.specifier
    caps = [Version(s.version) for s in requirement.specifier if s.operator == "<"]
    assert caps == [Version(f"{newest.major}.{newest.minor + 1}")]
