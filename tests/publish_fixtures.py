"""Small StageResult files for the publish and regression tests (written to tmp dirs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from recipeval.recipe import load_recipe, resolve
from recipeval.recipe.facts import recipe_facts
from recipeval.result import Check, Provenance, StageResult, write_result

REPO = Path(__file__).resolve().parents[1]
AMD_RECIPE = REPO / "recipes/amd/deepseek-v4-flash-4node-mi355x.yaml"
START = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)


def night(n: int) -> datetime:
    return START + timedelta(days=n)


def stage_result(
    stage: str,
    recipe_path: Path,
    when: datetime,
    *,
    status: str = "pass",
    summary: dict | None = None,
    packages: dict | None = None,
    message: str = "",
    checks: list[Check] | None = None,
) -> StageResult:
    loaded = load_recipe(recipe_path)
    return StageResult(
        stage=stage,
        recipe=loaded.recipe.name,
        status=status,
        checks=checks or [],
        summary=summary or {},
        message=message,
        recipe_facts=recipe_facts(resolve(loaded.recipe, stage)),
        provenance=Provenance(
            recipe=loaded.recipe.name,
            recipe_path=str(recipe_path),
            recipe_sha256=loaded.sha256,
            stage=stage,
            host="node01",
            started=when.isoformat(timespec="seconds"),
            finished=(when + timedelta(minutes=30)).isoformat(timespec="seconds"),
            packages=packages or {"sglang": "0.5.16", "torch": "2.9.1", "megatron-core": "0.16.0"},
            gpu="MI355X",
        ),
    )


def write_run(
    folder: Path,
    recipe_path: Path,
    when: datetime,
    *,
    logprob: float = 0.045,
    cycle: float = 474.0,
    packages: dict | None = None,
    smoke_status: str = "pass",
    smoke_message: str = "",
    env_checks: list[Check] | None = None,
) -> Path:
    """One recipe's four stage results as one night's run; returns the results folder."""
    name = load_recipe(recipe_path).recipe.name
    out = folder / name
    gate_ok = smoke_status == "pass"
    results = [
        stage_result("env_check", recipe_path, when, packages=packages, checks=env_checks),
        stage_result(
            "smoke",
            recipe_path,
            when,
            status=smoke_status,
            message=smoke_message,
            packages=packages,
            checks=[Check(id="finite_loss", ok=gate_ok, message=smoke_message)],
        ),
        stage_result(
            "logprob_diff",
            recipe_path,
            when,
            packages=packages,
            status="pass" if gate_ok else "skipped",
            message="" if gate_ok else f"gate smoke is {smoke_status}: {smoke_message}",
            # The stage's shape: per-variant statistics plus the headline under miles' name.
            summary={
                "reference": "baseline",
                "train_rollout_logprob_abs_diff": logprob,
                "variants": {"baseline": {"mean_abs_diff": logprob, "tokens": 242, "samples": 64}},
            }
            if gate_ok
            else {},
        ),
        stage_result(
            "bench",
            recipe_path,
            when,
            packages=packages,
            status="pass" if gate_ok else "skipped",
            message="" if gate_ok else f"gate smoke is {smoke_status}: {smoke_message}",
            summary={
                "steps": 14,
                "metrics": {
                    "perf/rollout_time": {
                        "estimate": 150.0,
                        "low": 147.0,
                        "high": 153.0,
                        "steps": 12,
                    },
                    "perf/actor_train_time": {"estimate": 182.0, "low": 179.0, "high": 185.0},
                    "cycle_time": {"estimate": cycle, "low": cycle * 0.98, "high": cycle * 1.02},
                },
            }
            if gate_ok
            else {},
            checks=[Check(id="expect.cycle_time", ok=True)] if gate_ok else [],
        ),
    ]
    for res in results:
        write_result(res, out / f"{res.stage}.json")
    return folder
