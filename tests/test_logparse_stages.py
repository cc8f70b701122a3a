"""smoke and bench verdicts, through the CLI, on a miles PPO log with a critic, evals and 2
optimizer steps per rollout: `step N` counts optimizer steps, so a parser that took N for the
rollout id saw 12 rollouts in this 6-rollout run and half the true cycle time."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import TINY_RECIPE

PPO_LOG = Path(__file__).parent / "fixtures" / "logs" / "miles_ppo_critic_2steps.log"
CYCLE = 487.0  # the log's true cycle: end of one rollout to the end of the next


def ppo_recipe(tmp_path: Path, expect: dict[str, float] | None = None) -> Path:
    """The tiny recipe, its stages sized as the run in the log: 6 rollouts of 2 steps."""
    raw = yaml.safe_load(TINY_RECIPE.read_text())
    raw["stages"]["smoke"]["args"] = {"num-rollout": 6}
    raw["stages"]["bench"].update(
        args={"num-rollout": 6},
        min_steps=3,
        max_steps=6,
        rel_ci=0.05,
        metrics=["cycle_time", "perf/step_time"],
    )
    if expect is not None:
        raw["expect"] = {"bench": expect}
    path = tmp_path / f"ppo-{len(list(tmp_path.glob('ppo-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_smoke_counts_rollouts_not_optimizer_steps(cli, tmp_path):
    out = tmp_path / "smoke"
    proc = cli("smoke", str(ppo_recipe(tmp_path)), "--out", str(out), "--from-log", str(PPO_LOG))
    result = json.loads((out / "smoke.json").read_text())
    checks = {c["id"]: c for c in result["checks"]}
    assert checks["rollouts_logged"]["value"] == 6, checks["rollouts_logged"]["message"]
    assert "6 of 6 rollout ids" in checks["rollouts_logged"]["message"]
    # the first update of each rollout starts from the sampling policy: ppo_kl 0 at step 0
    assert checks["step0_ppo_kl"]["ok"] and checks["step0_pg_clipfrac"]["ok"]
    assert proc.returncode == 0 and result["status"] == "pass", result
    assert result["summary"]["mean cycle_time"] == pytest.approx(CYCLE)
    steps = pd.read_parquet(out / "smoke.steps.parquet")
    assert list(steps["rollout_id"]) == list(range(6))


def test_bench_measures_the_true_cycle_time(cli, tmp_path):
    met = tmp_path / "met"
    proc = cli(
        "bench",
        str(ppo_recipe(tmp_path, expect={"cycle_time": CYCLE})),
        "--out",
        str(met),
        "--from-log",
        str(PPO_LOG),
    )
    result = json.loads((met / "bench.json").read_text())
    assert proc.returncode == 0 and result["status"] == "pass", result
    assert result["summary"]["metrics"]["cycle_time"]["estimate"] == pytest.approx(CYCLE)
    # a recipe promising half the cycle (what reading step ids as rollouts measured) fails
    half = tmp_path / "half"
    proc = cli(
        "bench",
        str(ppo_recipe(tmp_path, expect={"cycle_time": CYCLE / 2})),
        "--out",
        str(half),
        "--from-log",
        str(PPO_LOG),
        "--exit-zero",
    )
    result = json.loads((half / "bench.json").read_text())
    assert result["status"] == "fail" and "worse than expected" in result["message"], result
