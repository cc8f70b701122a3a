"""What the end of a run shows: the verdict of every stage of every recipe, and where to look.

tiny-grpo-cpu   env_check pass   smoke pass   logprob_diff pass   bench pass
verdict: ok (results/regression.json)
tables and plots: results/tables/benchmarks.html
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from recipeval.recipe import STAGES
from recipeval.result import read_result

EARLIER = " (earlier run)"


def _earlier(path: Path, since: float | None) -> str:
    """EARLIER when `path` was written before `since` (this run's start), else ""."""
    try:
        return EARLIER if since is not None and path.stat().st_mtime < since else ""
    except OSError:
        return ""


def stage_statuses(
    results: Path, recipes: Iterable[str] | None = None, since: float | None = None
) -> dict[str, dict[str, str]]:
    """recipe folder name -> stage -> status, for every stage result under `results` (only
    `recipes`' folders when given); an unreadable result reads as `unreadable`, one written
    before `since` (a time.time()) carries EARLIER."""
    table: dict[str, dict[str, str]] = {}
    folders = sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []
    wanted = None if recipes is None else set(recipes)
    for folder in folders:
        if wanted is not None and folder.name not in wanted:
            continue
        for stage in STAGES:
            path = folder / f"{stage}.json"
            if not path.is_file():
                continue
            try:
                status = read_result(path).status
            except (OSError, ValueError):
                status = "unreadable"
            table.setdefault(folder.name, {})[stage] = status + _earlier(path, since)
    return table


def verdict_lines(
    results: Path, recipes: Iterable[str] | None = None, since: float | None = None
) -> list[str]:
    """The lines to print; a results folder with no stage result says so. `since`: when this
    run started; a result or verdict an interrupted run did not replace is marked as earlier."""
    table = stage_statuses(results, recipes, since)
    if not table:
        return [f"no stage results under {results}"]
    width = max(len(name) for name in table)
    lines = [
        f"{name:{width}}  " + "   ".join(f"{stage} {status}" for stage, status in stages.items())
        for name, stages in table.items()
    ]
    verdict = results / "regression.json"
    if verdict.is_file():
        try:
            ok = json.loads(verdict.read_text()).get("ok")
            said = "ok" if ok else "FAILED or REGRESSED"
            lines.append(f"verdict: {said} ({verdict}){_earlier(verdict, since)}")
        except (OSError, ValueError):
            lines.append(f"verdict: unreadable ({verdict})")
    page = results / "tables" / "benchmarks.html"
    if page.is_file():
        lines.append(f"tables and plots: {page}")
    return lines


__all__ = ["stage_statuses", "verdict_lines"]
