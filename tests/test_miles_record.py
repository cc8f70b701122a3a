"""The recorder on a small stand-in for a miles checkout (written here, not miles' code), so CI
without miles still runs it: the script's own command building runs, nothing starts, a node
probe's value is recorded as probed, a missing package is stood in for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, clean_env

from recipeval.engines.miles.record import MILES_PLACEHOLDER, RecordError, Recording, record_launch

COMMAND_UTILS = """
import json, os, shlex, subprocess
import package_nobody_installed  # imported for its presence only
from package_nobody_installed.sub import Thing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

def exec_command_cpu(cmd, capture_output=False):
    return subprocess.run(["bash", "-c", cmd], check=True, capture_output=capture_output).stdout

exec_command_gpu = exec_command_cpu

def execute_train(train_args, megatron_model_type, extra_env_vars):
    exec_command_cpu("touch {marker}")
    links = int(exec_command_gpu("count-links", capture_output=True))
    env = {{"PYTHONUNBUFFERED": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "no_proxy": "127.0.0.1,127.0.0.1",
           "MASTER_ADDR": "127.0.0.1", "FAST_LINKS": str(int(links > 0)), **extra_env_vars,
           "PYTHONPATH": ROOT + ":/opt/megatron"}}
    exec_command_cpu(
        f"export no_proxy=127.0.0.1 && source {{ROOT}}/scripts/models/{{megatron_model_type}}.sh && "
        "ray job submit "
        f"--runtime-env-json={{shlex.quote(json.dumps({{'env_vars': env}}))}} -- python3 {{ROOT}}/train.py "
        f"${{{{MODEL_ARGS[@]}}}} {{train_args}}"
    )
"""

SCRIPT = """
import subprocess
import typer
import miles.utils.external_utils.command_utils as U

app = typer.Typer()

@app.command()
def train(nodes: int = 1, lr: str = "1e-6"):
    subprocess.run(["touch", "{marker}"])
    U.execute_train(
        f"--actor-num-nodes {{nodes}} --actor-num-gpus-per-node 8 --num-gpus-per-node 8 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --context-parallel-size 1 "
        "--expert-model-parallel-size 1 --expert-tensor-parallel-size 1 "
        f"--lr {{lr}} --colocate --prompt-data '/data/a b.jsonl'",
        "tiny", {{"MY_SWITCH": "on"}},
    )

@app.command()
def other():
    pass
"""


def write_checkout(root: Path, script: str, marker: Path) -> Path:
    """A stand-in miles checkout at `root` whose scripts/run_tiny.py is `script`; the recorder
    must never create `marker`."""
    utils = root / "miles" / "utils" / "external_utils"
    utils.mkdir(parents=True)
    for package in (root / "miles", root / "miles" / "utils", utils):
        (package / "__init__.py").write_text("")
    (utils / "command_utils.py").write_text(COMMAND_UTILS.format(marker=marker))
    (root / "scripts" / "models").mkdir(parents=True)
    # As older miles commands do, the model's flags come from sourcing its script.
    (root / "scripts" / "models" / "tiny.sh").write_text(
        "MODEL_ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4)\n"
    )
    (root / "scripts" / "run_tiny.py").write_text(script)
    return root


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "started"
    return write_checkout(tmp_path / "miles", SCRIPT.format(marker=marker), marker), marker


def test_the_script_builds_its_launch_and_nothing_starts(checkout):
    root, marker = checkout
    rec = record_launch(root, "scripts/run_tiny.py", ["train", "--nodes", "2"], commit="abc1234")
    assert not marker.exists()
    assert rec.entrypoint == [
        "python3",
        f"{MILES_PLACEHOLDER}/train.py",
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--actor-num-nodes",
        "2",
        "--actor-num-gpus-per-node",
        "8",
        "--num-gpus-per-node",
        "8",
        "--tensor-model-parallel-size",
        "2",
        "--pipeline-model-parallel-size",
        "1",
        "--context-parallel-size",
        "1",
        "--expert-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "1",
        "--lr",
        "1e-6",
        "--colocate",
        "--prompt-data",
        "/data/a b.jsonl",
    ]
    assert rec.runtime_env == {
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "no_proxy": "127.0.0.1,127.0.0.1",
        "MASTER_ADDR": "127.0.0.1",
        "FAST_LINKS": "0",
        "MY_SWITCH": "on",
        "PYTHONPATH": f"{MILES_PLACEHOLDER}:/opt/megatron",
    }
    assert rec.probed == {"FAST_LINKS": f"touch {marker}; count-links"}
    assert rec.client_env == {"no_proxy": "127.0.0.1"}
    assert rec.commands == [f"touch {marker}"]
    assert rec.stand_ins == ["package_nobody_installed"]
    assert (rec.megatron_model_type, rec.commit) == ("tiny", "abc1234")


def test_a_failing_script_is_a_clear_error(checkout):
    root, _ = checkout
    with pytest.raises(RecordError, match="no such launch script"):
        record_launch(root, "scripts/missing.py", [], commit="abc1234")
    with pytest.raises(RecordError, match="expected one `ray job submit`"):
        record_launch(root, "scripts/run_tiny.py", ["other"], commit="abc1234")
    # The exception the script's (rich, boxed) traceback ends with, in one line: it was the
    # box's last eight lines folded into one.
    for args, error in (
        (["--bogus"], "NoSuchOption: No such option: --bogus"),
        (["--nodes", "x"], "BadParameter: Input should be a valid integer, unable to parse string"),
    ):
        with pytest.raises(RecordError) as raised:
            record_launch(root, "scripts/run_tiny.py", ["train", *args], commit="abc1234")
        message = str(raised.value)
        assert message.startswith(f"scripts/run_tiny.py train {' '.join(args)} failed while ")
        assert f"building its launch: {error}" in message and "\n" not in message, message
        assert not set("│╭╰") & set(message), message
    # A checkout without miles' exec_command helper is one line, not the driver's traceback.
    (root / "miles" / "utils" / "external_utils" / "command_utils.py").write_text("")
    with pytest.raises(RecordError) as raised:
        record_launch(root, "scripts/run_tiny.py", ["train"], commit="abc1234")
    assert "no exec_command helper found" in str(raised.value)
    assert "\n" not in str(raised.value) and "Traceback" not in str(raised.value)


def _commit(root: Path) -> str:
    """Make the stand-in checkout a git repository (import records its commit)."""
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "tiny"], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_import_cli_writes_a_recipe_that_renders_the_launch(cli, checkout, tmp_path):
    root, marker = checkout
    commit = _commit(root)
    out = tmp_path / "tiny.yaml"
    base = tmp_path / "base.yaml"
    base.write_text(
        "model: {name: tiny, layers: 2, hidden_size: 64, attention_heads: 4, "
        "max_position_embeddings: 128}\nargs: {lr: 1e-6, seed: 3}\n"
        "env: {OLD_SWITCH: '1'}\n"
    )
    proc = cli(
        "import",
        "miles",
        str(root / "scripts" / "run_tiny.py"),
        "--extends",
        str(base),
        "--out",
        str(out),
        "--",
        "train",
        "--nodes",
        "2",
        "--lr",
        "3e-6",
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr, proc.stderr
    assert not marker.exists()
    recipe = yaml.safe_load(out.read_text())
    assert recipe["extends"] == "base.yaml"
    assert recipe["args"] == {
        "lr": "3e-6",
        "colocate": True,
        "prompt-data": "/data/a b.jsonl",
        "seed": None,
    }
    assert recipe["cluster"] == {"nodes": 2, "gpus_per_node": 8}
    assert recipe["parallel"]["tp"] == 2
    assert recipe["model"] == {"megatron_model_type": "tiny"}  # the rest is the base's
    assert recipe["env"] == {"MY_SWITCH": "on", "OLD_SWITCH": None}  # null: removed
    assert recipe["source"] == {
        "repo": "radixark/miles",
        "commit": commit,
        "script": "scripts/run_tiny.py",
        "args": ["train", "--nodes", "2", "--lr", "3e-6"],
        "probed": {"FAST_LINKS": f"touch {marker}; count-links"},
    }
    drift = cli("drift", str(out), "--miles", str(root))
    assert drift.returncode == 0, drift.stdout + drift.stderr


def test_import_without_a_checkout_is_bad_input(cli, tmp_path):
    script = tmp_path / "run.py"
    script.write_text("")
    proc = cli("import", "miles", str(script), "--", "train")
    assert proc.returncode == 2 and "--miles" in proc.stderr and "Traceback" not in proc.stderr


def test_env_check_warns_on_drift_when_a_checkout_is_configured(cli, checkout, tmp_path):
    from recipeval.checks.drift import drift_check
    from recipeval.recipe import load_recipe, resolve

    root, _ = checkout
    subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "tiny",
            "--allow-empty",
        ],
        check=True,
    )
    out = tmp_path / "tiny.yaml"
    unsized = cli("import", "miles", "scripts/run_tiny.py", "--miles", str(root), "--", "train")
    assert unsized.returncode == 2 and "--extends BASE with model.max_position_embeddings" in (
        unsized.stderr
    )
    base = tmp_path / "base.yaml"
    base.write_text(
        "model: {name: tiny, layers: 2, hidden_size: 64, attention_heads: 4, "
        "max_position_embeddings: 128}\n"
    )
    proc = cli(
        "import",
        "miles",
        "scripts/run_tiny.py",
        "--miles",
        str(root),
        "--name",
        "tiny",
        "--extends",
        str(base),
        "--out",
        str(out),
        "--",
        "train",
    )
    assert proc.returncode == 0, proc.stderr
    changed = tmp_path / "changed.yaml"
    changed.write_text("extends: tiny.yaml\nname: changed\nargs: {lr: 2e-6}\n")
    resolved = resolve(load_recipe(changed).recipe, None, None)
    check = drift_check(resolved, {"MILES_DIR": str(root)})
    assert check is not None and (check.ok, check.severity) == (False, "warning")
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert check.value["upstream_commit"] == head
    assert [d["name"] for d in check.value["differences"]] == ["lr"]
    assert "flag --lr: upstream '1e-6', ours '2e-6'" in check.message
    same = drift_check(resolve(load_recipe(out).recipe, None, None), {"MILES_DIR": str(root)})
    assert same is not None and same.ok
    assert drift_check(resolved, {}) is None  # paths.miles is unset here: no checkout, no check


def test_the_golden_script_records_each_recipe_at_its_source_commit(checkout, tmp_path):
    """scripts/record_miles_goldens.py: a recipe at an older commit is recorded from that
    commit's tree, the checkout itself untouched."""
    root, _ = checkout
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "old"], check=True)
    old = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    script = root / "scripts" / "run_tiny.py"
    script.write_text(script.read_text().replace('"MY_SWITCH": "on"', '"MY_SWITCH": "off"'))
    subprocess.run([*git, "commit", "-qam", "new"], check=True)
    recipes, out = tmp_path / "recipes", tmp_path / "goldens"
    recipes.mkdir()
    for name, commit in (("at-old", old[:12]), ("at-head", "HEAD")):
        head = subprocess.run(
            [*git, "rev-parse", commit], check=True, capture_output=True, text=True
        ).stdout.strip()
        (recipes / f"{name}.yaml").write_text(
            f"name: {name}\nengine: miles\nplatform: cuda\n"
            "model: {name: tiny, layers: 2, hidden_size: 64, attention_heads: 4, "
            "max_position_embeddings: 128}\n"
            "stages: {smoke: {args: {num-rollout: 2}}}\n"
            f"source: {{commit: '{commit if commit != 'HEAD' else head}', "
            "script: scripts/run_tiny.py, args: [train]}\n"
        )
    (recipes / "partial.yaml").write_text("args: {lr: 1}\n")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "record_miles_goldens.py"),
            "--miles",
            str(root),
            "--recipes",
            str(recipes),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["at-head.json", "at-old.json"]
    at_old, at_head = (Recording.load(out / f"at-{n}.json") for n in ("old", "head"))
    assert (at_old.commit, at_old.runtime_env["MY_SWITCH"]) == (old, "on")
    assert at_head.runtime_env["MY_SWITCH"] == "off" and at_head.commit != old
    assert (
        subprocess.run(
            [*git, "status", "--porcelain"], capture_output=True, text=True, check=True
        ).stdout
        == ""
    )


@pytest.mark.parametrize(
    "lr",
    [
        "1e-6; echo pwned > {out}",
        "1e-6 $(/usr/bin/touch {out})",
        "1e-6; exec /usr/bin/touch {out}",
    ],
)
def test_shell_text_in_the_script_arguments_starts_nothing(checkout, tmp_path, lr):
    """miles pastes `--lr` into its command unquoted: whatever that text says, reading the
    command runs no program and writes no file."""
    root, marker = checkout
    out = tmp_path / "pwned"
    rec = record_launch(
        root, "scripts/run_tiny.py", ["train", "--lr", lr.format(out=out)], commit="abc1234"
    )
    assert not out.exists() and not marker.exists()
    assert rec.entrypoint[rec.entrypoint.index("--lr") + 1] == "1e-6"


def test_shell_text_that_never_ends_is_stopped(checkout, monkeypatch):
    root, _ = checkout
    monkeypatch.setattr("recipeval.engines.miles.record._SHELL_TIMEOUT_S", 2)
    with pytest.raises(RecordError, match="did not"):
        record_launch(
            root,
            "scripts/run_tiny.py",
            ["train", "--lr", "$(while :; do :; done)"],
            commit="abc1234",
        )


def test_import_refuses_a_script_argument_a_recipe_would_refuse(cli, checkout, tmp_path):
    root, marker = checkout
    out = tmp_path / "tiny.yaml"
    proc = cli(
        "import",
        "miles",
        "scripts/run_tiny.py",
        "--miles",
        str(root),
        "--out",
        str(out),
        "--",
        "train",
        "--lr",
        "1e-6;x",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument 3 '1e-6;x' holds ';'" in proc.stderr
    assert not out.exists() and not marker.exists()


def test_import_with_a_name_no_recipe_may_have_names_the_recipe_file(cli, checkout, tmp_path):
    """The check ran on a temporary copy, and the error named that file, gone by then."""
    root, _ = checkout
    _commit(root)
    out, base = tmp_path / "tiny.yaml", tmp_path / "base.yaml"
    base.write_text(
        "model: {name: tiny, layers: 2, hidden_size: 64, attention_heads: 4, "
        "max_position_embeddings: 128}\n"
    )
    argv = ["import", "miles", "scripts/run_tiny.py", "--miles", str(root), "--out", str(out)]
    proc = cli(*argv, "--extends", str(base), "--name", "bad name;", "--", "train")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"recipeval: {out}:") and "name:" in proc.stderr
    assert "'bad name;'" in proc.stderr and proc.stderr.count("\n") == 1
    assert not out.exists() and not list(tmp_path.glob("tmp*.yaml"))


# A checkout whose submit carries `--runtime-env-json` as given (its train() is SCRIPT's).
RUNTIME_ENV_UTILS = """
import shlex, subprocess

def exec_command_cpu(cmd, capture_output=False):
    return subprocess.run(["bash", "-c", cmd], check=True, capture_output=capture_output).stdout

def execute_train(train_args, megatron_model_type, extra_env_vars):
    exec_command_cpu(
        "ray job submit --runtime-env-json=" + shlex.quote({env_json!r}) + " -- python3 train.py "
        + train_args
    )
"""


@pytest.mark.parametrize(
    ("env_json", "reason"),
    [
        ("notjson", "Invalid JSON"),
        ("[1,2]", "Input should be an object"),
        ('{"env_vars": [1]}', "env_vars: Input should be an object"),
    ],
)
def test_import_refuses_a_runtime_env_that_is_no_object_of_env_vars(
    cli, checkout, tmp_path, env_json, reason
):
    """A --runtime-env-json that is not an object whose env_vars maps names to strings is one
    line and exit 2 (it was a JSONDecodeError or AttributeError traceback)."""
    root, _ = checkout
    utils = root / "miles" / "utils" / "external_utils" / "command_utils.py"
    utils.write_text(RUNTIME_ENV_UTILS.format(env_json=env_json))
    _commit(root)
    out = tmp_path / "tiny.yaml"
    argv = ["import", "miles", "scripts/run_tiny.py", "--miles", str(root), "--out", str(out)]
    proc = cli(*argv, "--", "train")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "--runtime-env-json" in proc.stderr and reason in proc.stderr
    assert not out.exists()
