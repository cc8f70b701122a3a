"""The smoke stage and the stage plumbing it shares with logprob_diff and bench: --from-log,
--require gates, --exit-zero, bad input, and real runs (crash, timeout, step-0 invariant,
secrets, on_steps stopping a run) through the local runner."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml
from conftest import (
    TINY_RECIPE,
    clean_env,
    files_of_at_most,
    interruptible_session,
    kill_session,
    run_cli,
)
from runner_jobs import miles_like_program, python_launch

from recipeval.recipe import load_recipe
from recipeval.result import read_result
from recipeval.runners.base import node_gpus
from recipeval.stages import driver
from recipeval.stages.common import StageRequest, execute, resolve_and_render
from recipeval.stages.driver import finish
from recipeval.stages.smoke import SMOKE, judge

LOGS = Path(__file__).parent / "fixtures" / "logs"


def smoke_json(out: Path) -> dict:
    return json.loads((out / "smoke.json").read_text())


def test_from_log_pass_writes_result_log_and_steps(cli, tmp_path):
    proc = cli(
        "smoke",
        str(TINY_RECIPE),
        "--out",
        str(tmp_path),
        "--from-log",
        str(LOGS / "miles_clean.log"),
    )
    assert proc.returncode == 0, proc.stderr
    result = smoke_json(tmp_path)
    assert result["status"] == "pass"
    assert {c["id"] for c in result["checks"]} >= {
        "rollouts_logged",
        "loss_finite",
        "grad_norm_finite",
        "step0_ppo_kl",
        "step0_pg_clipfrac",
        "logprob_abs_diff_finite",
    }
    steps = pd.read_parquet(tmp_path / "smoke.steps.parquet")
    assert list(steps["rollout_id"]) == [0, 1, 2]
    assert (tmp_path / "smoke.log").read_text() == (LOGS / "miles_clean.log").read_text()
    assert result["summary"]["runner"] == "from-log"


def test_from_log_of_crashed_run_is_error_with_last_lines(cli, tmp_path):
    proc = cli(
        "smoke",
        "--recipe",
        str(TINY_RECIPE),
        "--out",
        str(tmp_path),
        "--from-log",
        str(LOGS / "miles_ray_irregular.log"),
    )
    assert proc.returncode == 3
    result = smoke_json(tmp_path)
    assert result["status"] == "error"
    assert "RuntimeError: NCCL error" in result["message"]
    assert result["summary"]["malformed_lines"] == 2
    again = cli(
        "smoke",
        str(TINY_RECIPE),
        "--out",
        str(tmp_path),
        "--exit-zero",
        "--from-log",
        str(tmp_path / "smoke.log"),
    )  # the stage's own log, judged in place
    assert again.returncode == 0 and smoke_json(tmp_path)["status"] == "error"


def test_require_gate_not_pass_writes_skipped(cli, tmp_path):
    gate = tmp_path / "gate"
    assert (
        cli(
            "smoke",
            str(TINY_RECIPE),
            "--out",
            str(gate),
            "--exit-zero",
            "--from-log",
            str(LOGS / "miles_ray_irregular.log"),
        ).returncode
        == 0
    )
    out = tmp_path / "out"
    proc = cli("smoke", str(TINY_RECIPE), "--out", str(out), "--require", str(gate / "smoke.json"))
    assert proc.returncode == 3
    result = smoke_json(out)
    assert result["status"] == "skipped"
    assert "gate smoke" in result["message"] and "is error" in result["message"]
    assert not (out / "smoke.log").exists()
    assert (
        cli(
            "smoke",
            str(TINY_RECIPE),
            "--out",
            str(out),
            "--exit-zero",
            "--require",
            str(gate / "smoke.json"),
        ).returncode
        == 0
    )


def test_bad_input_exits_2_with_one_line(cli, tmp_path):
    missing_gate = cli(
        "smoke", str(TINY_RECIPE), "--out", str(tmp_path), "--require", str(tmp_path / "no.json")
    )
    assert missing_gate.returncode == 2 and "run that stage first" in missing_gate.stderr
    both = cli("smoke", str(TINY_RECIPE), "--recipe", str(TINY_RECIPE), "--out", str(tmp_path))
    assert both.returncode == 2 and "give the recipe once" in both.stderr
    raw = yaml.safe_load(TINY_RECIPE.read_text())
    raw["args"].pop("num-rollout")
    raw["stages"]["smoke"]["args"].pop("num-rollout")
    recipe = tmp_path / "no-rollouts.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    proc = cli(
        "smoke", str(recipe), "--out", str(tmp_path), "--from-log", str(LOGS / "miles_clean.log")
    )
    assert proc.returncode == 2
    assert "stages.smoke.args.num-rollout" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "smoke.json").exists()
    for bad in ("0", "-5", "nan", "31d", "soon"):
        proc = cli("smoke", str(TINY_RECIPE), "--out", str(tmp_path), "--timeout", bad)
        assert proc.returncode == 2 and "Invalid value for '--timeout'" in proc.stderr, bad
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "smoke.json").exists()


@pytest.mark.parametrize("occupied", ["smoke.json", "smoke.steps.parquet", "smoke.log"])
def test_a_folder_where_the_stage_writes_is_refused_before_anything_runs(cli, tmp_path, occupied):
    """It ended in IsADirectoryError (exit 1, read as a failed check): after the run, for the
    step table and the log, so the run's result was lost."""
    out = tmp_path / "out"
    (out / occupied / "kept").mkdir(parents=True)
    proc = cli(
        "smoke", str(TINY_RECIPE), "--out", str(out), "--from-log", str(LOGS / "miles_clean.log")
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"recipeval: {out / occupied}: exists and is not a regular file")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [occupied]
    assert (out / occupied / "kept").is_dir()


def test_a_full_disk_stops_the_run_and_ends_in_one_line_naming_the_file(tmp_path):
    """The log writer's OSError killed the runner's pump thread with a traceback and the run
    went on; the stage then ended in a second traceback."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "recipeval", "smoke", str(TINY_RECIPE), "--out", str(out)]
        + ["--runner", "local"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
        preexec_fn=files_of_at_most(4000),
        check=False,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr
    assert re.fullmatch(rf"recipeval: {re.escape(str(out))}/smoke\.\S+: .*File too large", last)
    # the run was stopped when its log could not be written, not left to run its 3 rollouts
    assert "rollout 3/3" not in proc.stderr, proc.stderr
    assert (out / "smoke.log").stat().st_size <= 4000
    assert not (out / "smoke.json").exists()


def test_timeout_option_overrides_the_recipe_and_ends_with_a_result(cli, tmp_path):
    """The workflow passes --timeout when a recipe sets none (config default_timeout_min)."""
    proc = cli("smoke", str(TINY_RECIPE), "--out", str(tmp_path), "--timeout", "1s")
    result = smoke_json(tmp_path)
    assert proc.returncode == 3, result["message"]
    assert result["status"] == "error" and "timed out after 1 s" in result["message"]


# --- real runs through the shared plumbing (execute -> judge -> finish) -----------------


def request_for(out: Path, runner: str = "local", timeout: float | None = 60) -> StageRequest:
    return StageRequest(
        stage="smoke", loaded=load_recipe(TINY_RECIPE), out=out, runner=runner, timeout=timeout
    )


def smoke_with(
    program: str,
    out: Path,
    runner: str = "local",
    timeout: float | None = 60,
    env: dict[str, str] | None = None,
):
    request = request_for(out, runner, timeout)
    resolved, _ = resolve_and_render(request)
    outcome = execute(request, resolved, python_launch(program, env=env), request.artifact(".log"))
    result = finish(request, judge(outcome, expected=3), "2026-01-01T00:00:00+00:00", outcome.steps)
    assert read_result(out / "smoke.json") == result
    return result, outcome


def test_clean_run_passes_with_a_progress_line_per_rollout(tmp_path, capsys):
    result, outcome = smoke_with(miles_like_program(3), tmp_path)
    assert result.status == "pass", result.message
    assert outcome.run.exit_code == 0 and len(outcome.steps) == 3
    lines = capsys.readouterr().err.splitlines()
    for i in (1, 2, 3):
        assert any(line.startswith(f"smoke tiny-grpo-cpu: rollout {i}/3, ") for line in lines)


def test_crash_mid_run_is_error_with_the_crash_lines(tmp_path):
    result, _ = smoke_with(miles_like_program(3, crash_after=1), tmp_path)
    assert result.status == "error"
    # The first line, the one a terminal shows, ends with the exception; the traceback follows.
    headline, *rest = result.message.splitlines()
    assert headline.startswith("the run crashed: exited with status 1; the log (")
    assert headline.endswith("ends: RuntimeError: NCCL error: planted crash at rollout 1")
    assert rest[0] == "last log lines:" and "Traceback (most recent call last):" in rest


def test_a_cache_folder_the_engine_cannot_make_is_named_on_the_stage_line(tmp_path):
    """RECIPEVAL_CACHE_DIR naming a file: the engine ran its warm start, then died on the save
    with a traceback, and the stage's line ended at "last log lines (...):"."""
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("")
    env = clean_env(RECIPEVAL_CACHE_DIR=str(not_a_folder))
    proc = run_cli("smoke", str(TINY_RECIPE), "--out", str(tmp_path / "out"), env=env)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("smoke error: tiny-grpo-cpu: the run crashed: exited with status 2; ")
    assert line.endswith(
        f"error: --cache-dir {not_a_folder}/reference: cannot make the warm-start cache folder "
        "(Not a directory); it defaults to $RECIPEVAL_CACHE_DIR/reference, else "
        "$XDG_CACHE_HOME/recipeval/reference: point it at a folder this user can write"
    )
    assert "Traceback" not in (tmp_path / "out/smoke.log").read_text()


def test_timeout_is_error_and_leaves_no_process(tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result, outcome = smoke_with(miles_like_program(3, hang_after=1), tmp_path, timeout=3)
    assert result.status == "error" and "timed out after 3 s" in result.message
    assert outcome.run.timed_out
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def test_launches_of_one_stage_share_its_timeout(tmp_path):
    """logprob_diff launches each variant and re-score: each got the whole timeout, so a
    stage of two variants could run twice its limit and outlive the Slurm job sized by it."""
    request = dataclasses.replace(request_for(tmp_path, timeout=60), began=time.monotonic() - 58)
    resolved, _ = resolve_and_render(request)
    launch = python_launch(miles_like_program(3, hang_after=0))
    outcome = execute(request, resolved, launch, request.artifact(".log"))
    given = float(re.search(r"timed out after ([0-9.]+) s", outcome.run.detail)[1])
    assert outcome.run.timed_out and 1 <= given <= 2  # what was left of the 60 s
    spent = dataclasses.replace(request, began=time.monotonic() - 600)
    outcome = execute(spent, resolved, launch, request.artifact(".log"))
    assert outcome.run.timed_out and "timed out after 1 s" in outcome.run.detail


def test_step0_invariant_violation_fails(tmp_path):
    result, _ = smoke_with(miles_like_program(3, ppo_kl0=0.25), tmp_path)
    assert result.status == "fail"
    bad = [c for c in result.checks if not c.ok]
    assert [c.id for c in bad] == ["step0_ppo_kl"] and bad[0].value == 0.25


def test_secrets_never_reach_the_log(tmp_path):
    secret = "hf_planted_secret_value_123"
    result, _ = smoke_with(
        miles_like_program(3, print_env="HF_TOKEN"), tmp_path, env={"HF_TOKEN": secret}
    )
    log = (tmp_path / "smoke.log").read_text()
    assert "env says ***" in log and secret not in log
    assert secret not in (tmp_path / "smoke.json").read_text()
    assert result.status == "pass"


def test_the_callers_secret_stays_scrubbed_when_the_recipe_sets_the_same_name(
    tmp_path, monkeypatch
):
    """The recipe's HF_TOKEN replaces the caller's in the job's env, not in what the log
    may hold (a log made by hand, a tool that read the caller's environment)."""
    callers = "callers-own-secret-4567"  # no token shape: only the name tells
    monkeypatch.setenv("HF_TOKEN", callers)
    program = f"print('caller had {callers}', flush=True)\n" + miles_like_program(3)
    smoke_with(program, tmp_path, env={"HF_TOKEN": "hf_the_recipes_token_789"})
    log = (tmp_path / "smoke.log").read_text()
    assert "caller had ***" in log and callers not in log


def test_on_steps_can_stop_the_run(tmp_path):
    program = miles_like_program(200).replace(
        "for i in range(200):\n", "for i in range(200):\n    time.sleep(0.1)\n"
    )
    request = request_for(tmp_path)
    resolved, _ = resolve_and_render(request)
    seen = threading.Event()

    def enough(steps: pd.DataFrame) -> bool:
        seen.set()
        return len(steps) >= 3

    outcome = execute(request, resolved, python_launch(program), request.artifact(".log"), enough)
    assert seen.is_set() and outcome.run.stopped and outcome.failure is None
    assert 3 <= len(outcome.steps) < 200


def test_a_broken_on_steps_stops_the_run_and_the_log_keeps_its_last_lines(tmp_path):
    program = miles_like_program(200).replace(
        "for i in range(200):\n", "for i in range(200):\n    time.sleep(0.1)\n"
    )
    request = request_for(tmp_path)
    resolved, _ = resolve_and_render(request)

    def broken(steps: pd.DataFrame) -> bool:
        raise KeyError("planted")

    log = request.artifact(".log")
    outcome = execute(request, resolved, python_launch(program), log, broken)
    assert outcome.run.stopped and "on_steps failed: KeyError" in (outcome.failure or "")
    # lines logged after the callback broke still reach the log
    assert outcome.tail[-1] in log.read_text().splitlines()
    assert len(log.read_text().splitlines()) == outcome.parsed.lines


@pytest.mark.slow
def test_ray_runner_pass_and_crash(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from recipeval.runners import ray_head

    state = tmp_path / "ray-state"
    monkeypatch.setenv(ray_head.STATE_DIR_ENV, str(state))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        ok, outcome = smoke_with(miles_like_program(3), tmp_path / "ok", runner="ray", timeout=180)
        assert ok.status == "pass", ok.message
        assert outcome.runner == "ray"
        crashed, _ = smoke_with(
            miles_like_program(3, crash_after=1), tmp_path / "crash", runner="ray", timeout=180
        )
        assert crashed.status == "error" and "planted crash at rollout 1" in crashed.message
    finally:
        ray_head.shared_head_down(state)
    shutil.rmtree(state, ignore_errors=True)


# --- the tiny reference recipe, end to end through the CLI --------------------------------


def _no_process_names(text: str) -> bool:
    return not [
        p for p in psutil.process_iter(["cmdline"]) if text in " ".join(p.info["cmdline"] or [])
    ]


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["local", "ray"])
def test_tiny_recipe_smoke_passes(cli, tmp_path, runner):
    proc = cli("smoke", str(TINY_RECIPE), "--out", str(tmp_path), "--runner", runner, timeout=900)
    result = smoke_json(tmp_path)
    assert proc.returncode == 0, result["message"]
    assert result["status"] == "pass"
    assert result["summary"]["runner"] == runner and result["summary"]["rollouts_parsed"] == 3
    # The card the run used (none on a CPU machine), not the one the recipe names.
    info = result["summary"]["runner_info"]
    assert info["gpu"] == result["provenance"]["gpu"] == node_gpus()
    if runner == "ray":
        assert info["head"] == "private"
        assert _no_process_names(info["ray_temp_dir"]), "the private head was stopped"


def test_the_result_names_the_card_the_run_used(tmp_path, monkeypatch):
    # As if this node's drivers listed an H200: the result says so, whatever the recipe names.
    monkeypatch.setattr("recipeval.runners.base.node_gpus", lambda: "NVIDIA H200")
    request = StageRequest(
        stage="smoke", loaded=load_recipe(TINY_RECIPE), out=tmp_path, runner="local", timeout=300
    )
    result = driver.run(SMOKE, request)
    assert result.status == "pass", result.message
    assert read_result(tmp_path / "smoke.json").provenance.gpu == "NVIDIA H200"


def hostile_recipe(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny recipe with values shaped like shell injections in args and env."""
    marker = tmp_path / "pwned"
    raw = yaml.safe_load(TINY_RECIPE.read_text())
    raw["args"]["rollout-dtype"] = f'"; touch {marker}1 #'
    raw["args"]["attn-implementation"] = f"$(touch {marker}2)"
    raw["env"] = {"RECIPEVAL_NOTE": f"`touch {marker}3`"}
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, marker


@pytest.mark.parametrize("runner", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_hostile_recipe_values_reach_the_engine_as_plain_words(cli, tmp_path, runner):
    recipe, marker = hostile_recipe(tmp_path)
    out = tmp_path / "out"
    proc = cli("smoke", str(recipe), "--out", str(out), "--runner", runner, timeout=600)
    assert proc.returncode == 3  # the engine rejects the value: a crash, judged as error
    log = (out / "smoke.log").read_text()
    # argparse quotes the value it got: the exact word, not something a shell made of it
    assert (
        f"invalid choice: '\"; touch {marker}1 #'" in log
        or f"invalid choice: '$(touch {marker}2)'" in log
    )
    assert not list(tmp_path.glob("pwned*"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_run_leaves_no_stale_verdict(tmp_path, signum):
    """A stage removes its previous result before it launches: a run killed half-way (SIGTERM,
    as Slurm or Snakemake cancel a job; Ctrl-C) leaves its partial log and no result, never
    the last run's `pass` beside the new log, and says it stopped (Ctrl-C said nothing)."""
    out = tmp_path / "out"
    old = run_cli(
        "smoke", str(TINY_RECIPE), "--out", str(out), "--from-log", str(LOGS / "miles_clean.log")
    )
    assert old.returncode == 0 and smoke_json(out)["status"] == "pass"
    assert (out / "smoke.steps.parquet").is_file()
    (out / "smoke.log").unlink()
    (out / "smoke.steps.png").write_bytes(b"an earlier run's plot")
    (out / "smoke.notes.txt").write_text("not ours")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recipeval",
            "smoke",
            str(TINY_RECIPE),
            "--out",
            str(out),
            "--runner",
            "local",
        ],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible_session,  # noqa: PLW1509
    )
    try:
        deadline = time.monotonic() + 60
        while (
            not (out / "smoke.log").exists() and proc.poll() is None and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)  # the run is under way
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        kill_session(proc)
    assert proc.returncode == 128 + signum, stderr
    said = {signal.SIGTERM: "got SIGTERM, stopping the job", signal.SIGINT: "got SIGINT, the job"}
    assert said[signum] in stderr and "Traceback" not in stderr, stderr
    assert (out / "smoke.log").exists()
    assert not (out / "smoke.json").exists()
    # nor the last run's step table or plot; a file the stage does not write is left alone
    assert sorted(p.name for p in out.iterdir()) == ["smoke.log", "smoke.notes.txt"]
