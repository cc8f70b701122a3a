"""The bench stage: judged from logs with a known steady state, and a live run that the
stopping rule stops through the runner."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from conftest import TINY_RECIPE
from runner_jobs import python_launch

from recipeval.exit_codes import exit_code
from recipeval.recipe import load_recipe
from recipeval.stages import driver
from recipeval.stages.bench import BENCH, BenchWatcher, complete_rows, judge, stopping_rule
from recipeval.stages.common import ARTIFACT_SUFFIXES, StageRequest, execute, resolve_and_render

ROLLOUT, TRAIN = 150.0, 182.0


def bench_recipe(tmp_path: Path, expect: dict | None = None, **bench: object) -> Path:
    raw = yaml.safe_load(TINY_RECIPE.read_text())
    raw["stages"]["bench"].update(bench)
    if expect is not None:
        raw["expect"] = {"bench": expect}
    path = tmp_path / "bench-recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def miles_log(
    path: Path, n: int, warmup: int = 2, noise: float = 0.01, seed: int = 0, drift: float = 0.0
) -> Path:
    """A miles-format log: rollout and train times around ROLLOUT and TRAIN with `warmup`
    slow first steps, growing by `drift` (relative) a step; the cycle is their sum plus 10 s."""
    rng = np.random.default_rng(seed)
    t = datetime(2026, 8, 5, 10, 0, 0)
    lines = []
    for i in range(n):
        slow = (3.0 if i < warmup else 1.0) * (1 + drift * i)
        r = ROLLOUT * slow * (1 + noise * rng.standard_normal())
        a = TRAIN * slow * (1 + noise * rng.standard_normal())
        stamp = lambda dt, t=t: (t + timedelta(seconds=dt)).strftime("%Y-%m-%d %H:%M:%S.000")
        lines.append(
            f"[{stamp(0)} rollout_manager] rollout.py:1 - perf {i}: "
            f"{{'perf/rollout_time': {r:.3f}, 'perf/tokens_per_gpu_per_sec': {8192 / r:.3f}}}"
        )
        lines.append(
            f"[{stamp(r + a)} actor_cell0_rank0] actor.py:1 - perf {i}: "
            f"{{'perf/actor_train_time': {a:.3f}, 'perf/step_time': {a:.3f}}}"
        )
        t += timedelta(seconds=r + a + 10)
    path.write_text("\n".join(lines) + "\n")
    return path


def run(cli, recipe: Path, out: Path, log: Path, *extra: str):
    proc = cli("bench", str(recipe), "--out", str(out), "--from-log", str(log), *extra)
    result = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else None
    return proc, result


def judged(recipe: Path, out: Path, log: Path) -> tuple[int, dict]:
    """In process (the CLI costs seconds of imports per call): exit code and result."""
    request = StageRequest(stage="bench", loaded=load_recipe(recipe), out=out, from_log=log)
    result = driver.run(BENCH, request)
    return exit_code([result.status]), json.loads((out / "bench.json").read_text())


def test_from_log_finds_the_steady_state_and_meets_expect(cli, tmp_path):
    recipe = bench_recipe(
        tmp_path,
        expect={"rollout_time": 150, "actor_train_time": 182, "cycle_time": 342},
        rel_ci=0.03,
        max_steps=40,
    )
    proc, result = run(cli, recipe, tmp_path / "out", miles_log(tmp_path / "b.log", 20))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert result["status"] == "pass", result["message"]
    metrics = result["summary"]["metrics"]
    assert abs(metrics["perf/rollout_time"]["estimate"] / ROLLOUT - 1) < 0.01
    assert abs(metrics["perf/actor_train_time"]["estimate"] / TRAIN - 1) < 0.01
    assert abs(metrics["cycle_time"]["estimate"] / (ROLLOUT + TRAIN + 10) - 1) < 0.01
    assert metrics["perf/rollout_time"]["warmup"] == 2
    assert metrics["perf/rollout_time"]["low"] <= ROLLOUT <= metrics["perf/rollout_time"]["high"]
    assert result["summary"]["stop"] == "judged from a log"
    assert "tokens_per_gpu_per_sec" in result["summary"]
    ids = {c["id"] for c in result["checks"]}
    assert {"precision:perf/rollout_time", "expect:perf/rollout_time", "expect:cycle_time"} <= ids
    assert Path(result["artifacts"]["plot"]).stat().st_size > 10_000
    assert result["artifacts"]["plot"].endswith(ARTIFACT_SUFFIXES)
    assert (tmp_path / "out" / "bench.steps.parquet").exists()


def test_slower_than_expected_fails_faster_is_flagged(tmp_path):
    log = miles_log(tmp_path / "b.log", 20)
    slow = bench_recipe(tmp_path, expect={"rollout_time": 120})
    code, result = judged(slow, tmp_path / "slow", log)
    assert code == 1 and result["status"] == "fail"
    assert "worse than expected" in result["message"]
    fast = bench_recipe(tmp_path, expect={"perf/actor_train_time": 250})
    code, result = judged(fast, tmp_path / "fast", log)
    assert result["status"] == "pass"
    flagged = [c for c in result["checks"] if not c["ok"]]
    assert [c["id"] for c in flagged] == ["expect:perf/actor_train_time"]
    assert flagged[0]["severity"] == "warning" and "better than expected" in flagged[0]["message"]


def test_too_noisy_fails_or_warns_as_configured(cli, tmp_path):
    log = miles_log(tmp_path / "b.log", 12, noise=0.15)
    proc, result = run(
        cli, bench_recipe(tmp_path, on_max_steps="fail"), tmp_path / "f", log, "--exit-zero"
    )
    assert proc.returncode == 0 and result["status"] == "fail"
    assert "not precise enough" in result["message"]
    code, result = judged(bench_recipe(tmp_path, on_max_steps="warn"), tmp_path / "w", log)
    assert code == 0 and result["status"] == "pass"
    assert any(c["id"].startswith("precision:") and not c["ok"] for c in result["checks"])


def test_a_drifting_run_is_reported_not_steady(tmp_path):
    log = miles_log(tmp_path / "b.log", 30, noise=0.005, drift=0.003)
    _, result = judged(bench_recipe(tmp_path), tmp_path / "out", log)
    rollout = result["summary"]["metrics"]["perf/rollout_time"]
    assert rollout["not_steady"].startswith("not steady: trend +0.3")
    assert rollout["trend_p"] < 0.01


def test_the_recipe_chooses_what_the_interval_covers(tmp_path):
    log = miles_log(tmp_path / "b.log", 20)
    _, window = judged(bench_recipe(tmp_path), tmp_path / "window", log)
    _, level = judged(bench_recipe(tmp_path, interval="level"), tmp_path / "level", log)
    assert (window["summary"]["interval"], level["summary"]["interval"]) == ("window", "level")
    wide = window["summary"]["metrics"]["perf/rollout_time"]
    narrow = level["summary"]["metrics"]["perf/rollout_time"]
    assert (wide["interval"], narrow["interval"]) == ("window", "level")
    assert wide["low"] < narrow["low"] < narrow["high"] < wide["high"]
    assert wide["estimate"] == narrow["estimate"]


def test_unlogged_metric_is_an_error_naming_it(tmp_path):
    recipe = bench_recipe(tmp_path, metrics=["perf/rollout_time", "perf/no_such_time"])
    code, result = judged(recipe, tmp_path / "out", miles_log(tmp_path / "b.log", 10))
    assert code == 3 and result["status"] == "error"
    assert "perf/no_such_time" in result["message"]


STEADY_PROGRAM = """
import random, sys, time
random.seed(1)
t0 = 1_785_000_000.0
for i in range(400):
    slow = 3.0 if i < 2 else 1.0
    r, a = 150 * slow * random.gauss(1, 0.005), 182 * slow * random.gauss(1, 0.005)
    stamp = time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0)) + '.000'
    print(f"[{stamp} x] rollout.py:1 - perf {i}: {{'perf/rollout_time': {r}}}", flush=True)
    print(f"[{stamp} x] actor.py:1 - perf {i}: {{'perf/actor_train_time': {a}}}", flush=True)
    t0 += r + a + 10
    time.sleep(0.05)
"""


def test_the_decision_that_stopped_the_run_stands_while_its_last_lines_arrive(tmp_path):
    """A Ray job takes seconds to stop, and its last steps came through the watcher again: a
    noisy one turned the summary's stop reason from "precise" into "continue"."""
    options = load_recipe(bench_recipe(tmp_path, rel_ci=0.05, min_steps=5)).recipe.stages.bench
    watcher = BenchWatcher(list(options.metrics), stopping_rule(options))
    rng = np.random.default_rng(3)
    steady = {m: 100 * (1 + 0.001 * rng.standard_normal(12)) for m in options.metrics}
    steps = pd.DataFrame({"rollout_id": range(12), **steady})
    assert watcher(steps) and watcher.decision.reason == "precise"
    late = pd.DataFrame({"rollout_id": [12], **{m: [400.0] for m in options.metrics}})
    assert watcher(pd.concat([steps, late], ignore_index=True))
    assert watcher.decision.reason == "precise" and watcher.calls == 1


def test_live_run_is_stopped_by_the_stopping_rule(tmp_path, capsys):
    recipe = load_recipe(bench_recipe(tmp_path, rel_ci=0.02, min_steps=5, max_steps=300))
    request = StageRequest(stage="bench", loaded=recipe, out=tmp_path, runner="local", timeout=60)
    resolved, _ = resolve_and_render(request)
    options = recipe.recipe.stages.bench
    watcher = BenchWatcher(list(options.metrics), stopping_rule(options))
    outcome = execute(
        request,
        resolved,
        python_launch(STEADY_PROGRAM),
        request.artifact(".log"),
        watcher,
        watcher.precision,
    )
    assert outcome.run.stopped and outcome.failure is None
    # One progress line per finished rollout, with the widest interval against rel_ci.
    progress = [line for line in capsys.readouterr().err.splitlines() if "rollout" in line]
    assert len(progress) == len(outcome.steps)
    assert "interval not formed yet (rel_ci 2 %)" in progress[0]
    assert re.search(r"interval \d+\.\d% \(rel_ci 2 %\)", progress[-1]), progress[-1]
    assert 2 + 5 <= len(outcome.steps) < 30
    judgement, estimates = judge(outcome, options, {}, watcher)
    # Judged on the steps the rule stopped on, not on those that finished while it stopped.
    assert judgement.error is None and all(c.ok for c in judgement.checks)
    assert judgement.summary["stop"] == "precise"
    summary = judgement.summary
    assert summary["steps"] == watcher.decision.steps
    assert summary["steps"] + summary["steps_after_stop"] == len(
        complete_rows(outcome.steps, options.metrics)
    )
    assert estimates["perf/rollout_time"].interval.covers(150.0)
    assert watcher.calls >= 2 * 7  # called after every metric line
