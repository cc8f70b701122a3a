"""A layouts sweep through the workflow: `recipeval layouts --emit` writes the variants, the
`recipes.sweeps` config runs them through the real Snakemake DAG, and publish ranks them in
tables/layouts.{md,csv,html}; and the ranking rules on records alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from recipeval.publish.layout_table import table
from recipeval.publish.records import RunRecord, StageSummary

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = REPO / "recipes/local/tiny-grpo-cpu.yaml"
# The tiny recipe's bench shortened for a test: 64-token responses, at most 8 steps (the
# shipped 8192 tokens take ~12-25 s a step here); everything else as shipped.
SHORT_BENCH = {
    "name: tiny-grpo-cpu": "name: tiny-sweep",
    "args: {num-rollout: 20, rollout-max-response-len: 8192,": "args: {num-rollout: 8, "
    "rollout-max-response-len: 64,",
    "max_steps: 20": "max_steps: 8",
}


def _short_tiny(path: Path) -> Path:
    text = TINY.read_text()
    for old, new in SHORT_BENCH.items():
        assert old in text, f"{TINY} no longer holds {old!r}: update SHORT_BENCH"
        text = text.replace(old, new)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_speed_knob_sweep_runs_through_the_dag_and_publishes_its_ranking(cli, tmp_path):
    work = tmp_path
    base = _short_tiny(work / "recipes/local/tiny-sweep.yaml")
    emitted = cli("layouts", str(base), "--emit", str(work / "sweep"), "--top", "2", cwd=work)
    assert emitted.returncode == 0, emitted.stdout + emitted.stderr
    variants = sorted(p.stem for p in (work / "sweep").glob("*.yaml"))
    assert variants == ["tiny-sweep--recompute-activations-on", "tiny-sweep--train-dtype-bfloat16"]

    # The base (recipes/local, the default glob) and its two variants (the sweep folder), each
    # through env_check and bench (smoke and logprob_diff judge nothing a ranking needs).
    argv = [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory"]
    argv += [str(work), "--cores", "2", "--config", "runner=local"]
    argv += ["stages=[env_check,bench]", "recipes={sweeps: [sweep]}"]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    tables = work / "results/tables"
    ranked = pd.read_csv(tables / "layouts.csv", keep_default_na=False)
    assert list(ranked["recipe"].sort_values()) == ["tiny-sweep", *variants]
    assert (ranked["sweep of"] == "tiny-sweep").all() and (ranked["bench"] == "pass").all()
    # Ranked by the measured step time (its estimate leads the cell), fastest first.
    step = ranked["step time (s)"].str.split(" ").str[0].astype(float)
    assert list(ranked["rank (measured)"]) == [1, 2, 3] and step.is_monotonic_increasing
    assert (ranked["step time (s)"].str.contains(r"\[")).all()  # with its interval
    changes = dict(zip(ranked["recipe"], ranked["changes"], strict=True))
    assert changes == {
        "tiny-sweep": "(base recipe)",
        "tiny-sweep--recompute-activations-on": "recompute-activations=true",
        "tiny-sweep--train-dtype-bfloat16": "train-dtype=bfloat16",
    }
    # Knob variants carry no prediction: the explorer predicts layouts only.
    assert (ranked["predicted train (s)"] == "").all()
    markdown = (tables / "layouts.md").read_text()
    assert len([line for line in markdown.splitlines() if line.startswith("| tiny-sweep |")]) == 3
    assert "<table" in (tables / "layouts.html").read_text()


def _record(name: str, step: float | None = None, **sweep: object) -> RunRecord:
    values = {f"sweep.{k}": v for k, v in sweep.items()}
    metrics = {"bench.metrics.cycle_time": step} if step is not None else {}
    status = "pass" if step is not None else "skipped"
    return RunRecord(
        run_id=name,
        recipe=name,
        recipe_sha256="0" * 64,
        layout="TP4 PP4",
        stages={"bench": StageSummary(status=status, message="gate env_check failed")},
        metrics=metrics,
        recipe_values=values,
    )


def test_measured_runs_rank_first_then_the_rest_by_predicted_rank():
    records = [
        _record("other-recipe", 1.0),  # not from a sweep: not in the table
        _record("a--tp8", None, kind="layouts", base="a", rank=1, predicted_s=9.5, keys=["parallel"]),
        _record("a--tp4", 30.0, kind="layouts", base="a", rank=2, predicted_s=10.0, keys=["parallel"]),
        _record("a--tp2", None, kind="layouts", base="a", rank=3, predicted_s=11.0, keys=["parallel"]),
        _record("a--tp1", 20.0, kind="layouts", base="a", rank=4, predicted_s=12.0, keys=["parallel"]),
        _record("b--x", 5.0, kind="ablation", base="b", keys=["args.x"]),  # an ablation: not here
    ]  # fmt: skip
    frame = table(records)
    assert list(frame["recipe"]) == ["a--tp1", "a--tp4", "a--tp8", "a--tp2"]
    assert list(frame["rank (measured)"]) == [1, 2, "", ""]
    assert list(frame["predicted train (s)"]) == ["12", "10", "9.5", "11"]
    assert list(frame["changes"]) == ["TP4 PP4"] * 4
    assert frame["bench"].iloc[-1].startswith("skipped: gate env_check failed")
    assert table([_record("plain", 1.0)]).empty
