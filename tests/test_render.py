"""`recipeval render`: the exact miles launch, pinned by upstream's recorded launch
(tests/golden/miles/), and no shell ever interpreting a recipe value."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PR_RECIPE, REPO, clean_env, run_cli
from miles_goldens import GOLDENS, RENDER_ENV, allowed, differences_from_golden, label

from recipeval.engines.miles.record import Recording

GOLDEN = GOLDENS / "deepseek-v4-flash-4node-mi355x.json"
HOSTILE = ["; rm -rf / #", "$(reboot)", "`id`", "a'b\"c", "x\ny", "*", "$HOME"]
# Shown raw on a terminal, these redraw the line: a CR or an escape sequence could hide words.
HOSTILE += ["shown\rhidden", "\x1b[2Kcleared", "back\\slash'\t\x01"]


def _render(cli, recipe: Path, *extra: str, env: dict[str, str] | None = None) -> dict:
    proc = cli("render", str(recipe), "--format", "json", *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _flag(argv: list[str], flag: str) -> str | bool:
    if flag not in argv:
        raise AssertionError(f"{flag} missing from argv")
    i = argv.index(flag)
    nxt = argv[i + 1] if i + 1 < len(argv) else ""
    return True if nxt.startswith("--") or not nxt else nxt


def test_pr_recipe_renders_the_launch_of_pr_2139(cli):
    launch = _render(cli, PR_RECIPE)
    argv = launch["argv"]
    assert argv[:3] == ["ray", "job", "submit"]
    sep = argv.index("--")
    assert argv[sep + 1 : sep + 3] == ["python3", "/root/miles/train.py"]
    assert launch["entrypoint"] == argv[sep + 1 :]
    expected = {
        "--tensor-model-parallel-size": "4",
        "--sequence-parallel": True,
        "--pipeline-model-parallel-size": "4",
        "--decoder-first-pipeline-num-layers": "11",
        "--decoder-last-pipeline-num-layers": "10",
        "--context-parallel-size": "1",
        "--expert-model-parallel-size": "8",
        "--expert-tensor-parallel-size": "1",
        "--rollout-max-response-len": "8192",
        "--sglang-mem-fraction-static": "0.5",
        "--optimizer-offload-fraction": "0.75",
        "--actor-num-nodes": "4",
        "--actor-num-gpus-per-node": "8",
        "--colocate": True,
    }
    for flag, value in expected.items():
        assert _flag(argv, flag) == value, flag
    env = launch["runtime_env"]["env_vars"]
    pr_env = {
        "SGLANG_SKIP_CHECKPOINT_LOAD_CHECK": "1",
        "SGLANG_DSV4_FP4_EXPERTS": "0",
        "SGLANG_HACK_FLASHMLA_BACKEND": "unified_kv_triton",
        "SGLANG_OPT_USE_COMPRESSOR_V2": "true",
        "SGLANG_OPT_USE_TILELANG_INDEXER": "true",
        "SGLANG_OPT_USE_JIT_NORM": "true",
        "SGLANG_OPT_USE_FUSED_COMPRESS": "true",
        "SGLANG_HEALTH_CHECK_TIMEOUT": "120",
        "AITER_BF16_FP8_MOE_BOUND": "0",
    }
    assert {k: env[k] for k in pr_env} == pr_env
    assert {k: launch["env"][k] for k in pr_env} == pr_env
    assert launch["resources"] == {"nodes": 4, "gpus_per_node": 8}
    # The one difference from miles' launcher: the runtime env (secrets included) reaches Ray
    # through an owner-only file, never as --runtime-env-json in argv, where `ps` shows it.
    assert not any(a.startswith("--runtime-env-json") for a in argv)
    env_file = launch["extra"]["runtime_env_file"]
    assert f"--runtime-env={env_file}" in argv[:sep]
    assert env_file == "results/deepseek-v4-flash-4node-mi355x/launch.runtime_env.json"


def test_pr_recipe_matches_the_upstream_launch(cli):
    """The golden is miles' own launch at the recipe's source commit, recorded by
    scripts/record_miles_goldens.py; only allowed.yaml's differences remain."""
    launch = _render(cli, PR_RECIPE, env=clean_env(**RENDER_ENV))
    golden = Recording.load(GOLDEN)
    assert golden.commit == "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
    found = {label(d) for d in differences_from_golden(launch, golden)}
    assert found == set(allowed("deepseek-v4-flash-4node-mi355x")) == {"env NCCL_NVLS_ENABLE"}
    sep = golden.argv.index("--")
    assert launch["argv"][: sep - 1] == golden.argv[: sep - 1]  # ray job submit --address=...


def test_checkout_paths_come_from_the_environment(cli):
    launch = _render(
        cli,
        PR_RECIPE,
        env=clean_env(
            MILES_DIR="/opt/miles", MEGATRON_PATH="/opt/mlm", RAY_ADDRESS="http://head:8265"
        ),
    )
    assert launch["entrypoint"][1] == "/opt/miles/train.py"
    assert launch["runtime_env"]["env_vars"]["PYTHONPATH"] == "/opt/miles:/opt/mlm"
    assert not any(a.startswith("--address") for a in launch["argv"])


def test_launcher_environment_follows_miles(cli, tmp_path):
    """What miles' execute_train adds around the recipe's env: the submitter's NCCL_DEBUG_FILE
    and PYTHONPATH (after the job's own), no CUDA_DEVICE_MAX_CONNECTIONS under FSDP, and
    no_proxy / PYTHONUNBUFFERED exported for `ray job submit` itself."""
    launch = _render(
        cli,
        PR_RECIPE,
        env=clean_env(
            MILES_DIR="/opt/miles",
            MEGATRON_PATH="/opt/mlm",
            NCCL_DEBUG_FILE="/tmp/nccl.%h.%p",
            PYTHONPATH="/site/extra",
        ),
    )
    env = launch["runtime_env"]["env_vars"]
    assert env["NCCL_DEBUG_FILE"] == "/tmp/nccl.%h.%p"
    assert env["PYTHONPATH"] == "/opt/miles:/opt/mlm:/site/extra"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert launch["client_env"] == {"no_proxy": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
    script = cli("render", str(PR_RECIPE)).stdout
    exports = script.index("export no_proxy=127.0.0.1")
    assert "export PYTHONUNBUFFERED=1" in script and exports < script.index("ray job submit")
    fsdp = tmp_path / "fsdp.yaml"
    fsdp.write_text(f"extends: {PR_RECIPE}\nargs: {{train-backend: fsdp}}\n")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in _render(cli, fsdp)["runtime_env"]["env_vars"]


def test_missing_checkout_path_is_a_clear_error(cli, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {PR_RECIPE}\npaths: {{miles: null}}\n")
    proc = cli("render", str(recipe))
    assert proc.returncode == 2
    assert "paths.miles" in proc.stderr and "MILES_DIR" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_stage_overlay_changes_the_launch(cli):
    smoke = _render(cli, PR_RECIPE, "--stage", "smoke")
    assert _flag(smoke["argv"], "--num-rollout") == "2"
    assert "--eval-interval" not in smoke["argv"]


@pytest.fixture
def hostile_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "hostile.yaml"
    args = {f"hostile-{i}": v for i, v in enumerate(HOSTILE)}
    env = {f"HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}
    recipe.write_text(f"extends: {PR_RECIPE}\nargs: {json.dumps(args)}\nenv: {json.dumps(env)}\n")
    return recipe


def test_hostile_values_are_literal_words_in_json(cli, hostile_recipe):
    launch = _render(cli, hostile_recipe)
    for i, value in enumerate(HOSTILE):
        assert _flag(launch["argv"], f"--hostile-{i}") == value
        assert launch["runtime_env"]["env_vars"][f"HOSTILE_{i}"] == value


def test_shell_form_passes_every_word_literally(cli, hostile_recipe, tmp_path):
    """Run the rendered script with a `ray` that records its argv: the shell must hand over
    exactly the JSON argv, and run nothing else."""
    launch = _render(cli, hostile_recipe)
    proc = cli("render", str(hostile_recipe), "--format", "shell")
    assert proc.returncode == 0, proc.stderr
    # Every control character is written as an escape: the script reads as it runs.
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", proc.stdout), proc.stdout
    assert "$'shown\\x0dhidden'" in proc.stdout
    script = tmp_path / "launch.sh"
    script.write_text(proc.stdout)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_ray = bindir / "ray"
    record = tmp_path / "argv.json"
    fake_ray.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
    )
    fake_ray.chmod(fake_ray.stat().st_mode | stat.S_IXUSR)
    env = clean_env(PATH=f"{bindir}:{os.environ['PATH']}", HOME=str(tmp_path))
    run = subprocess.run(
        ["bash", str(script)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(record.read_text()) == launch["argv"][1:]
    env_file = tmp_path / launch["extra"]["runtime_env_file"]
    assert json.loads(env_file.read_text()) == launch["runtime_env"]
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600


def test_a_stage_writes_the_runtime_env_file_into_its_out_folder(tmp_path):
    """`smoke --out DIR` from another working directory: the file with the job's env (secrets
    included) goes to DIR beside the stage's results, owner-only, never to ./results."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    seen = tmp_path / "seen.json"
    fake_ray = bindir / "ray"
    fake_ray.write_text(
        f"#!{sys.executable}\nimport json, os, stat, sys\n"
        "path = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--runtime-env='))\n"
        f"json.dump([path, stat.S_IMODE(os.stat(path).st_mode)], open({str(seen)!r}, 'w'))\n"
    )
    fake_ray.chmod(0o755)
    work, out = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    env = clean_env(
        PATH=f"{bindir}:{os.environ['PATH']}", MILES_DIR="/opt/miles", MEGATRON_PATH="/opt/mc"
    )
    proc = run_cli(
        "smoke", str(PR_RECIPE), "--runner", "local", "--out", str(out), env=env, cwd=work
    )
    assert seen.exists(), proc.stderr
    path, mode = json.loads(seen.read_text())
    assert Path(path) == out / "smoke.runtime_env.json" and mode == 0o600
    assert not Path(path).exists()  # removed once the job ended
    assert not (work / "results").exists()


def test_reference_recipe_shell_form_exports_env(cli, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"extends: {REPO / 'recipes/local/tiny-grpo-cpu.yaml'}\nenv: {{HOSTILE: '$(reboot)'}}\n"
    )
    proc = cli("render", str(recipe))
    assert proc.returncode == 0, proc.stderr
    assert "export HOSTILE='$(reboot)'" in proc.stdout


def test_every_recipe_engine_has_a_registered_engine():
    """The schema's engine names and the registry agree: a recipe can name no engine that
    recipeval cannot render, and an unknown name is a clear KeyError."""
    import typing

    import pytest

    from recipeval.engines import ENGINES, engine_for
    from recipeval.recipe.schema import Recipe

    assert set(typing.get_args(Recipe.model_fields["engine"].annotation)) == set(ENGINES)
    assert engine_for("reference").token_dumps and engine_for("reference").rescoring
    assert not engine_for("miles").token_dumps and engine_for("miles").trainer_stack_checks
    with pytest.raises(KeyError, match="choose one of"):
        engine_for("nemo")


def test_a_variant_renders_only_over_the_logprob_diff_stage(cli):
    """--stage smoke --variant bf16-rollout rendered a launch no stage ever runs."""
    tiny = REPO / "recipes/local/tiny-grpo-cpu.yaml"
    proc = cli("render", str(tiny), "--stage", "smoke", "--variant", "bf16-rollout")
    assert proc.returncode == 2 and "use stage logprob_diff" in proc.stderr, proc.stderr
    ok = cli("render", str(tiny), "--stage", "logprob_diff", "--variant", "bf16-rollout")
    assert ok.returncode == 0 and "--rollout-dtype bfloat16" in ok.stdout.replace(" \\\n  ", " ")
