"""Ablation end to end: `recipeval ablate --emit` on a change of the tiny recipe, the real
Snakemake DAG running every variant, and publish's attribution table, whose single-key effect
is right in sign where the truth is known (a bf16 rollout against a float32 trainer raises the
train-vs-rollout logprob difference)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from publish_fixtures import night, stage_result

from recipeval.explore.ablate import emit, plan, static_judge
from recipeval.recipe import load_recipe
from recipeval.result import write_result

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes/local/tiny-grpo-cpu.yaml"
BIN = Path(sys.executable).parent


def _tiny_made_cheap() -> dict:
    """The tiny recipe with its logprob_diff and bench kept short: one logprob_diff variant
    (the recipe as it is, which is what attribution reads) and a bench of 16-token responses;
    the three changed keys are untouched."""
    data = yaml.safe_load(TINY.read_text())
    data["stages"]["logprob_diff"]["variants"] = {}
    data["stages"]["bench"] = {
        "args": {
            "num-rollout": 8,
            "rollout-max-response-len": 16,
            "rollout-batch-size": 1,
            "n-samples-per-prompt": 2,
        },
        "timeout": "5m",
        "min_steps": 3,
        "max_steps": 8,
        "rel_ci": 0.5,
    }
    return data


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nice", *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


# Five variants x (env_check, logprob_diff, bench): 5 min 11 s on the shared 2-core machine
# under a load of ~10, hence slow.
@pytest.mark.slow
def test_ablation_of_the_tiny_recipe_through_the_dag(tmp_path: Path) -> None:
    pair = tmp_path / "recipes/pair"
    pair.mkdir(parents=True)
    before = _tiny_made_cheap()
    after = _tiny_made_cheap()
    after["name"] = "tiny-grpo-cpu-after"
    after["args"] |= {"rollout-dtype": "bfloat16", "lr": 1e-3, "rollout-batch-size": 4}
    (pair / "before.yaml").write_text(yaml.safe_dump(before, sort_keys=False))
    (pair / "after.yaml").write_text(yaml.safe_dump(after, sort_keys=False))

    ablate = _run(
        [
            str(BIN / "recipeval"),
            "ablate",
            "recipes/pair/before.yaml",
            "recipes/pair/after.yaml",
            "--emit",
            "variants",
        ],
        tmp_path,
        timeout=300,
    )
    assert ablate.returncode == 0, ablate.stdout + ablate.stderr
    assert "3 changed key(s)" in ablate.stdout and "in 3 variant(s)" in ablate.stdout
    assert len(list((tmp_path / "variants").glob("*.yaml"))) == 5  # BEFORE, 3 keys, AFTER

    dag = _run(
        [
            str(BIN / "snakemake"),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--cores",
            "2",
            "--config",
            "runner=local",
            "recipes={globs: [], files: [], exclude: [], sweeps: [variants]}",
            # smoke gates only; the attribution reads logprob_diff and bench.
            "stages=[env_check,logprob_diff,bench]",
        ],
        tmp_path,
        timeout=1200,
    )
    assert dag.returncode == 0, dag.stdout[-3000:] + dag.stderr[-3000:]

    tables = tmp_path / "results/tables"
    frame = pd.read_csv(tables / "attribution.csv")
    print(frame.to_string())
    mean_abs = frame[frame["metric"] == "logprob mean |d|"].set_index("changes")
    bf16 = mean_abs.loc["args.rollout-dtype"]
    assert bf16["effect"] > 0 and bf16["low"] > 0, bf16
    assert bf16["distinguishable from noise"] == "yes"
    assert set(mean_abs.index) == {
        "args.rollout-dtype",
        "args.lr",
        "args.rollout-batch-size",
        "every change (AFTER)",
        "AFTER - sum of the single effects",
    }
    interaction = frame[frame["variant"] == "interaction"]
    assert {"logprob mean |d|", "cycle time (s)"} <= set(interaction["metric"])
    # Every bench metric of every variant has its interval (the bench ran on each).
    timing = frame[frame["metric"] == "cycle time (s)"]
    assert len(timing) == 5 and timing["low"].notna().all(), timing
    assert "| interaction |" in (tables / "attribution.md").read_text()
    assert "<table" in (tables / "attribution.html").read_text()


def _tokens(abs_diffs: list[float]) -> pd.DataFrame:
    """A token dump of the logprob_diff reference variant: one trained token per sample, its
    rollout logprob above the trainer's by the given amounts."""
    n = len(abs_diffs)
    return pd.DataFrame(
        {
            "rollout_id": [0] * n,
            "sample": list(range(n)),
            "position": [0] * n,
            "token_id": [1] * n,
            "logp_rollout": [-1.0 + d for d in abs_diffs],
            "logp_train": [-1.0] * n,
            "loss_mask": [1] * n,
            "variant": ["baseline"] * n,
        }
    )


def test_publish_attributes_each_variant_and_the_interaction(tmp_path: Path) -> None:
    """Stage results of an emitted ablation with known numbers -> `recipeval publish` ->
    the attribution table's effects, intervals and interaction (no training run)."""
    before_data, after_data = _tiny_made_cheap(), _tiny_made_cheap()
    after_data["name"] = "tiny-after"
    after_data["args"] |= {"rollout-dtype": "bfloat16", "lr": 1e-3}
    for name, data in (("before", before_data), ("after", after_data)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    ablation = plan(
        load_recipe(tmp_path / "before.yaml"), load_recipe(tmp_path / "after.yaml"), static_judge()
    )
    paths = emit(ablation, tmp_path / "variants")
    # Per variant: |d| of its 8 samples (+ a spread) and its cycle time with interval.
    spread = [0.0, 0.001, -0.001, 0.002, -0.002, 0.0005, -0.0005, 0.0]
    truth = {"none": (0.01, 10.0), "lr": (0.011, 10.1), "dtype": (0.05, 12.0), "all": (0.07, 14.0)}
    results = tmp_path / "results"
    for path in paths:
        name = load_recipe(path).recipe.name
        abs_diff, cycle = next(v for k, v in truth.items() if name.endswith(k))
        folder = results / name
        folder.mkdir(parents=True)
        tokens = folder / "logprob_diff.tokens.parquet"
        _tokens([abs_diff + s for s in spread]).to_parquet(tokens)
        logprob = stage_result(
            "logprob_diff", path, night(0), summary={"reference": "baseline"}
        ).model_copy(update={"artifacts": {"tokens": str(tokens)}})
        bench = stage_result(
            "bench",
            path,
            night(0),
            summary={
                "metrics": {
                    "cycle_time": {"estimate": cycle, "low": cycle - 0.3, "high": cycle + 0.3}
                }
            },
        )
        write_result(logprob, folder / "logprob_diff.json")
        write_result(bench, folder / "bench.json")
    tables = tmp_path / "tables"
    proc = subprocess.run(
        [
            str(BIN / "recipeval"),
            "publish",
            str(results),
            "--tables",
            str(tables),
            "--history",
            str(tmp_path / "history"),
            "--junit",
            str(tmp_path / "junit.xml"),
            "--verdict",
            str(tmp_path / "verdict.json"),
            "--no-plots",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    frame = pd.read_csv(tables / "attribution.csv")
    assert set(frame["ablation"]) == {"tiny-grpo-cpu -> tiny-after"}
    cell = frame.set_index(["changes", "metric"])
    dtype = cell.loc[("args.rollout-dtype", "logprob mean |d|")]
    assert dtype["effect"] == pytest.approx(0.04) and dtype["low"] < 0.04 < dtype["high"]
    assert dtype["BEFORE"] == pytest.approx(0.01 + sum(spread) / 8)
    assert dtype["distinguishable from noise"] == "yes"
    assert cell.loc[("args.lr", "logprob mean |d|")]["effect"] == pytest.approx(0.001)
    # The lr effect on the step time (0.1 s) is inside its +/-0.42 s interval: noise.
    lr_time = cell.loc[("args.lr", "cycle time (s)")]
    assert lr_time["effect"] == pytest.approx(0.1) and lr_time["high"] - lr_time["effect"] == (
        pytest.approx(math.hypot(0.3, 0.3))
    )
    assert lr_time["distinguishable from noise"] == "no"
    whole = cell.loc[("every change (AFTER)", "logprob mean |d|")]
    assert whole["effect"] == pytest.approx(0.06)
    both = cell.loc[("AFTER - sum of the single effects", "logprob mean |d|")]
    assert both["effect"] == pytest.approx(0.06 - 0.04 - 0.001)
    assert cell.loc[("AFTER - sum of the single effects", "cycle time (s)")][
        "effect"
    ] == pytest.approx(4.0 - 2.0 - 0.1)
    shown = (tables / "attribution.md").read_text()
    assert "| interaction | AFTER - sum of the single effects | logprob mean" in shown
