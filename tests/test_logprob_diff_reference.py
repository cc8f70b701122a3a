"""logprob_diff end to end with the reference engine on the tiny CPU recipe: real runs, real
per-token dumps. float32 vs bfloat16 rollout must show a clear, correctly signed difference;
a rollout side that never receives the trained weights must fail."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import TINY_RECIPE

from recipeval.recipe import load_recipe
from recipeval.stages import driver
from recipeval.stages.common import StageRequest
from recipeval.stages.logprob_diff import LOGPROB_DIFF

pytestmark = [
    pytest.mark.slow,
    pytest.mark.reference_engine,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]


def run(tmp_path: Path, variants: dict) -> object:
    raw = yaml.safe_load(TINY_RECIPE.read_text())
    raw["stages"]["logprob_diff"]["variants"] = variants
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    request = StageRequest(
        stage="logprob_diff",
        loaded=load_recipe(recipe),
        out=tmp_path / "out",
        runner="local",
        timeout=600,
    )
    return driver.run(LOGPROB_DIFF, request)


def test_bf16_rollout_is_measurably_worse_than_fp32(tmp_path):
    result = run(
        tmp_path, {"baseline": {}, "bf16-rollout": {"args": {"rollout-dtype": "bfloat16"}}}
    )
    assert result.status == "pass", result.message
    variants = result.summary["variants"]
    assert variants["baseline"]["source"] == "token dump"
    assert variants["bf16-rollout"]["mean_abs_diff"] > 3 * variants["baseline"]["mean_abs_diff"]
    (pair,) = result.summary["pairwise"]
    assert pair["clear"] and pair["shift"] > 0
    # bf16's rollout path re-scored every token baseline sampled at the first rollout.
    same = pair["identical_tokens"]
    tokens = pd.read_parquet(result.artifacts["tokens"])
    assert set(tokens["variant"]) == {"baseline", "bf16-rollout"}
    assert set(tokens["rollout_id"]) == {0, 1}
    sampled = tokens[
        (tokens["variant"] == "baseline") & (tokens["loss_mask"] == 1) & (tokens["rollout_id"] == 0)
    ]
    assert same["method"] == "re-scored" and same["tokens"] == len(sampled)
    assert same["mean_abs_diff"] > 0
    rescored = pd.read_parquet(result.artifacts["rescored"])
    assert set(rescored["variant"]) == {"bf16-rollout"} and set(rescored["rollout_id"]) == {0}
    message = next(c.message for c in result.checks if c.id == "bf16-rollout:vs_baseline")
    assert (
        f"on {len(sampled)} identical tokens (every token baseline sampled at the first "
        "rollout, re-scored)"
    ) in message
    # --from-log re-judges the written log and token tables the same way.
    again = driver.run(
        LOGPROB_DIFF,
        StageRequest(
            stage="logprob_diff",
            loaded=load_recipe(tmp_path / "recipe.yaml"),
            out=tmp_path / "again",
            from_log=Path(result.artifacts["log"]),
        ),
    )
    assert again.summary["pairwise"][0]["identical_tokens"] == same
    assert list(again.summary["variants"]) == ["baseline", "bf16-rollout"]
    assert Path(result.artifacts["histogram"]).is_file()


def test_skipped_weight_sync_fails(tmp_path):
    result = run(
        tmp_path,
        {
            "baseline": {"args": {"num-rollout": 4}},
            "no-sync": {"args": {"num-rollout": 4, "skip-weight-sync": True}},
        },
    )
    assert result.status == "fail"
    failed = {c.id for c in result.checks if not c.ok and c.severity == "error"}
    assert failed and all(i.startswith("no-sync:") for i in failed), failed
