"""The logprob_diff stage on token tables and logs with a known truth; the live runs with the
reference engine are in test_logprob_diff_reference.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import TINY_RECIPE

from recipeval.recipe import load_recipe
from recipeval.stages.common import ARTIFACT_SUFFIXES, StageRequest
from recipeval.stages.driver import run
from recipeval.stages.logprob_diff import LOGPROB_DIFF, marker


def recipe_with(
    tmp_path: Path, variants: dict | None = None, thresholds: dict | None = None
) -> Path:
    raw = yaml.safe_load(TINY_RECIPE.read_text())
    if variants is not None:
        raw["stages"]["logprob_diff"]["variants"] = variants
    if thresholds is not None:
        raw["stages"]["logprob_diff"]["thresholds"] = thresholds
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def token_table(
    rng: np.random.Generator,
    noise: float,
    rollouts: int = 2,
    samples: int = 8,
    length: int = 64,
    drift: float = 0.0,
) -> pd.DataFrame:
    """logp_rollout = logp_train + N(0, noise), plus `drift` * rollout_id (a rollout side that
    misses weight updates falls further behind with each one)."""
    parts = []
    for r in range(rollouts):
        for s in range(samples):
            train = -rng.exponential(1.0, length)
            d = noise * rng.standard_normal(length) + drift * r * rng.choice([-1, 1], length)
            parts.append(
                pd.DataFrame(
                    {
                        "rollout_id": r,
                        "sample": s,
                        "position": np.arange(length),
                        "token_id": rng.integers(0, 500, length),
                        "logp_rollout": train + d,
                        "logp_train": train,
                        "loss_mask": 1,
                    }
                )
            )
    return pd.concat(parts, ignore_index=True)


def steps_log(values: list[tuple[float, float, float]]) -> list[str]:
    """miles-format lines: per rollout (train logp, rollout logp, abs diff)."""
    lines = []
    for i, (train, rollout, diff) in enumerate(values):
        stamp = f"2026-08-05 10:{i:02d}:00.000"
        lines.append(
            f"[{stamp} actor_cell0_rank0] actor.py:1 - rollout {i}: "
            f"{{'rollout/log_probs': {train}, 'rollout/rollout_log_probs': {rollout}}}"
        )
        lines.append(
            f"[{stamp} actor_cell0_rank0] actor.py:2 - step {i}: "
            f"{{'train/train_rollout_logprob_abs_diff': {diff}, 'train/train_rollout_kl': 0.001}}"
        )
    return lines


def judged(
    tmp_path: Path,
    recipe: Path,
    runs: dict[str, pd.DataFrame | None],
    logs: dict[str, list[str]] | None = None,
):
    """Write a stage log (+ token table) as a previous run would have, and re-judge it."""
    src = tmp_path / "prev"
    src.mkdir(exist_ok=True)
    lines = []
    for name in runs:
        lines += [marker(name), *(logs or {}).get(name, steps_log([(-0.5, -0.5, 0.01)] * 2))]
    (src / "logprob_diff.log").write_text("\n".join(lines) + "\n")
    tables = [t.assign(variant=n) for n, t in runs.items() if t is not None]
    if tables:
        pd.concat(tables).to_parquet(src / "logprob_diff.tokens.parquet")
    request = StageRequest(
        stage="logprob_diff",
        loaded=load_recipe(recipe),
        out=tmp_path / "out",
        from_log=src / "logprob_diff.log",
    )
    return run(LOGPROB_DIFF, request)


def checks_of(result) -> dict:
    return {c.id: c for c in result.checks}


def test_noisier_rollout_path_shows_a_clear_positive_shift(tmp_path):
    rng = np.random.default_rng(0)
    recipe = recipe_with(tmp_path)  # variants: baseline, bf16-rollout
    baseline = token_table(rng, 1e-4)
    bf16 = baseline.assign(
        logp_rollout=baseline["logp_train"] + 0.01 * rng.standard_normal(len(baseline))
    )  # same seed, same tokens
    result = judged(tmp_path, recipe, {"baseline": baseline, "bf16-rollout": bf16})
    assert result.status == "pass", result.message
    variants = result.summary["variants"]
    assert variants["baseline"]["mean_abs_diff"] < 2e-4
    assert result.summary["train_rollout_logprob_abs_diff"] == variants["baseline"]["mean_abs_diff"]
    assert 0.006 < variants["bf16-rollout"]["mean_abs_diff"] < 0.01  # E|N(0, s)| = 0.8 s
    (pair,) = result.summary["pairwise"]
    assert pair["variant"] == "bf16-rollout" and pair["reference"] == "baseline"
    assert pair["clear"] and pair["shift"] > 0 and pair["low"] > 0
    assert checks_of(result)["bf16-rollout:vs_baseline"].severity == "info"
    same = pair["identical_tokens"]
    assert same["tokens"] == (baseline["rollout_id"] == 0).sum() and same["train_gap_max"] == 0
    assert 0.006 < same["mean_abs_diff"] < 0.01
    for name in ("tokens", "histogram", "by_position", "log", "steps"):
        assert Path(result.artifacts[name]).stat().st_size > 0, name
    # the next run removes each of them before it starts (a killed run leaves none of these)
    for name, path in result.artifacts.items():
        assert name == "log" or path.endswith(ARTIFACT_SUFFIXES), (name, path)
    tokens = pd.read_parquet(result.artifacts["tokens"])
    assert set(tokens["variant"]) == {"baseline", "bf16-rollout"}
    assert variants["bf16-rollout"]["by_position"][0]["start"] == 0


def test_a_diff_that_grows_with_training_fails(tmp_path):
    rng = np.random.default_rng(1)
    recipe = recipe_with(
        tmp_path, variants={"baseline": {}, "no-sync": {"args": {"skip-weight-sync": True}}}
    )
    result = judged(
        tmp_path,
        recipe,
        {"baseline": token_table(rng, 1e-3), "no-sync": token_table(rng, 1e-3, drift=0.1)},
    )
    assert result.status == "fail"
    checks = checks_of(result)
    assert checks["baseline:rollout_growth"].ok
    assert not checks["no-sync:rollout_growth"].ok
    assert not checks["no-sync:token_mult_prob_error"].ok  # worst rollout: e^0.1 > 1.05
    assert checks["no-sync:first_rollout_abs_mean_diff"].ok  # rollout 0 shares the weights
    # miles' --ci-test holds every rollout's mean logprobs to 0.03; a gap of either sign per
    # token leaves the means level, so only the growth and per-token checks see it
    assert checks["no-sync:worst_rollout_abs_mean_diff"].ok
    assert "no-sync" in result.message


def test_logged_scalars_are_judged_when_there_is_no_dump(tmp_path):
    recipe = recipe_with(tmp_path)
    result = judged(
        tmp_path,
        recipe,
        {"baseline": None, "bf16-rollout": None},
        logs={
            "baseline": steps_log([(-0.45, -0.449, 0.02), (-0.44, -0.441, 0.021)]),
            "bf16-rollout": steps_log([(-0.45, -0.41, 0.06), (-0.44, -0.40, 0.061)]),
        },
    )
    assert result.status == "fail"
    checks = checks_of(result)
    assert checks["baseline:first_rollout_abs_mean_diff"].ok
    bad = checks["bf16-rollout:first_rollout_abs_mean_diff"]
    assert not bad.ok and bad.value == pytest.approx(0.04) and bad.threshold == 0.03
    assert checks["baseline:worst_rollout_abs_mean_diff"].ok
    assert checks["bf16-rollout:worst_rollout_abs_mean_diff"].value == pytest.approx(0.04)
    assert "token_mult_prob_error" not in json.dumps([c.id for c in result.checks])
    assert result.summary["variants"]["baseline"]["source"] == "logged scalars"


def test_recipe_thresholds_override_the_anchors(tmp_path):
    recipe = recipe_with(
        tmp_path, thresholds={"first_rollout_abs_mean_diff": 0.08, "mean_abs_diff": 0.05}
    )
    result = judged(
        tmp_path,
        recipe,
        {"baseline": None, "bf16-rollout": None},
        logs={
            "baseline": steps_log([(-0.45, -0.41, 0.06)] * 2),
            "bf16-rollout": steps_log([(-0.45, -0.44, 0.04)] * 2),
        },
    )
    checks = checks_of(result)
    assert checks["baseline:first_rollout_abs_mean_diff"].ok
    assert not checks["baseline:mean_abs_diff"].ok and checks["bf16-rollout:mean_abs_diff"].ok
    assert result.status == "fail"


def test_cli_contract_and_bad_threshold(cli, tmp_path):
    rng = np.random.default_rng(2)
    recipe = recipe_with(tmp_path)
    judged(
        tmp_path,
        recipe,
        {"baseline": token_table(rng, 1e-4), "bf16-rollout": token_table(rng, 0.01)},
    )
    out = tmp_path / "cli"
    proc = cli(
        "logprob-diff",
        str(recipe),
        "--out",
        str(out),
        "--from-log",
        str(tmp_path / "prev" / "logprob_diff.log"),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "logprob_diff.json").read_text())["status"] == "pass"
    assert {"logprob_diff.log", "logprob_diff.steps.parquet"} <= {p.name for p in out.iterdir()}
    bad = recipe_with(tmp_path, thresholds={"mean_abs_dif": 0.1})
    proc = cli(
        "logprob-diff",
        str(bad),
        "--out",
        str(tmp_path / "bad"),
        "--from-log",
        str(tmp_path / "prev" / "logprob_diff.log"),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "stages.logprob_diff.thresholds.mean_abs_dif: 'mean_abs_dif' is no logprob statistic"
        in proc.stderr
    )
    assert not (tmp_path / "bad" / "logprob_diff.json").exists()
