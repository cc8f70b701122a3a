"""Secrets a recipe carries itself, beyond a secret-named env var or flag: a key in
`source.args`, a key inside a JSON arg (train-env-vars), several words or a `--`-looking word
given to a secret flag. None of them reaches a result, the history, `drift`, `ablate` or
`render --redact`; the history, drift and ablate keep fingerprints instead."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import PR_RECIPE, TINY_RECIPE, run_cli
from publish_fixtures import night, stage_result
from test_miles_record import write_checkout

from recipeval.checks.drift import drift_check
from recipeval.publish import history
from recipeval.publish.records import RunRecord, StageSummary
from recipeval.recipe import load_recipe, resolve
from recipeval.result import Check, write_result
from recipeval.secrets import fingerprint, redact_argv, secret_values

GOLDEN = Path(__file__).parent / "golden" / "miles" / "deepseek-v4-flash-4node-mi355x.json"
SOURCE_KEY = "plainwandbkey0123456789"  # given to --wandb-key in source.args
JSON_KEY = "plainwandbkey9999999"  # inside the train-env-vars JSON string
ENV_KEY = "plainenvsecret4242"
FLAG_KEY = "anotherplainsecret42"
LIST_KEYS = ("firstsecret111", "secondsecret222")
DASH_KEY = "--looksflag-secret333"
CORPUS = (SOURCE_KEY, JSON_KEY, ENV_KEY, FLAG_KEY, *LIST_KEYS, DASH_KEY)


def _leaks(*texts: str) -> list[str]:
    return [secret for secret in CORPUS for text in texts if secret in text]


def _files_text(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def _carrier(folder: Path) -> Path:
    """A miles recipe with secrets where their names say so and where they do not (a key in
    source.args, one inside a JSON arg)."""
    path = folder / "carrier.yaml"
    path.write_text(
        f"extends: {PR_RECIPE}\nname: carrier\n"
        "source:\n  commit: 31f1ca961a94cb860cec3b2dea34ec332bfa8f76\n"
        "  script: scripts/amd/run_deepseek_v4.py\n"
        f"  args: [train, --wandb-key, {SOURCE_KEY}, --num-nodes, '4']\n"
        f'args:\n  train-env-vars: \'{{"WANDB_API_KEY": "{JSON_KEY}"}}\'\n'
        f"  wandb-key: {FLAG_KEY}\n"
        f"env: {{WANDB_API_KEY: {ENV_KEY}}}\n"
    )
    return path


# --- every word of a secret flag is its value ---------------------------------------------


def test_render_redact_hides_every_word_of_a_secret_flag(tmp_path):
    recipe = tmp_path / "words.yaml"
    recipe.write_text(
        f"extends: {TINY_RECIPE}\nname: words\n"
        f"args:\n  hf-token: [{', '.join(LIST_KEYS)}]\n  wandb-key: '{FLAG_KEY}'\n"
        "  db-password: 98765432\n"
    )
    for fmt in ("shell", "json"):
        proc = run_cli("render", str(recipe), "--redact", "--format", fmt)
        assert proc.returncode == 0, proc.stderr
        assert not _leaks(proc.stdout) and "98765432" not in proc.stdout
    assert "--hf-token '***' '***' \\\n  --wandb-key '***' \\\n  --db-password '***'" in (
        run_cli("render", str(recipe), "--redact").stdout
    )


def test_secret_flag_values_are_every_word_up_to_the_next_flag():
    argv = ["ray", "--hf-token", *LIST_KEYS, "--wandb-key", DASH_KEY, "--lr", "1e-6"]
    argv += ["--client-secret=attachedsecret", "--", "python3", "--label-key", "label"]
    assert redact_argv(argv) == [
        "ray",
        "--hf-token",
        "***",
        "***",
        "--wandb-key",
        "***",
        "--lr",
        "1e-6",
        "--client-secret=***",
        "--",
        "python3",
        "--label-key",
        "label",
    ]
    assert set(secret_values({}, argv)) == {*LIST_KEYS, DASH_KEY, "attachedsecret"}


# --- the recipe's own secrets in results and history ------------------------------------


def test_env_check_result_and_history_keep_no_recipe_secret(tmp_path):
    recipe = _carrier(tmp_path)
    results = tmp_path / "results" / "carrier"
    proc = run_cli("env-check", "--static", str(recipe), "--out", str(results))
    assert proc.returncode in (0, 1), proc.stderr
    assert not _leaks(_files_text(results), proc.stdout, proc.stderr)
    values = json.loads((results / "env_check.json").read_text())["recipe_facts"]["recipe_values"]
    assert values["args.train-env-vars"] == fingerprint(f'{{"WANDB_API_KEY": "{JSON_KEY}"}}')
    assert values["source.args"].startswith("sha256:")
    pub = tmp_path / "pub"
    publish = run_cli(
        "publish",
        str(tmp_path / "results"),
        *("--tables", str(pub / "tables"), "--history", str(pub / "history")),
        *("--junit", str(pub / "junit.xml"), "--verdict", str(pub / "regression.json")),
        "--no-plots",
    )
    assert publish.returncode == 0, publish.stderr
    assert any((pub / "history").glob("*/*.json"))
    assert not _leaks(_files_text(pub), publish.stdout)


def test_write_result_scrubs_recipe_secrets_wherever_they_show(tmp_path):
    """An engine or a check may echo the recipe's values; the written result never holds them."""
    echo = f"launched with --wandb-key {SOURCE_KEY} and {JSON_KEY}"
    result = stage_result(
        "smoke",
        _carrier(tmp_path),
        night(0),
        message=echo,
        summary={"command": echo},
        checks=[Check(id="echo", ok=False, message=echo, value=[FLAG_KEY, ENV_KEY])],
    )
    path = write_result(result, tmp_path / "smoke.json")
    assert not _leaks(path.read_text())
    assert "launched with --wandb-key ***" in path.read_text()


def test_history_scrubs_secrets_of_older_results(tmp_path):
    """A run record read from an older result still holds the recipe's values plain."""
    record = RunRecord(
        run_id="0" * 16,
        recipe="carrier",
        recipe_sha256="0" * 64,
        date="2026-11-01T00:00:00+00:00",
        stages={"smoke": StageSummary(status="fail", message=f"echo {SOURCE_KEY} {JSON_KEY}")},
        recipe_values={
            "source.args": ["train", "--wandb-key", SOURCE_KEY],
            "args.train-env-vars": json.dumps({"WANDB_API_KEY": JSON_KEY}),
        },
    )
    assert history.append(tmp_path, record)
    assert not _leaks(_files_text(tmp_path))


# --- drift, env_check's drift check and ablate show fingerprints -------------------------


def test_drift_shows_fingerprints_not_secrets(tmp_path):
    recipe = _carrier(tmp_path)
    shown = {}
    for fmt in ("shell", "json"):
        proc = run_cli("drift", str(recipe), "--against", str(GOLDEN), "--format", fmt)
        assert proc.returncode == 1, proc.stderr
        assert not _leaks(proc.stdout, proc.stderr)
        shown[fmt] = proc.stdout
    assert f"flag --wandb-key: only in ours ('{fingerprint(FLAG_KEY)}')" in shown["shell"]
    assert f"env WANDB_API_KEY: only in ours ('{fingerprint(ENV_KEY)}')" in shown["shell"]
    assert fingerprint(FLAG_KEY) in shown["json"]


def test_a_refused_secret_value_is_named_by_its_fingerprint(tmp_path):
    """A recipe error quotes the value it refuses, except a secret's: a key that looks like a
    flag (refused, the trainer would read it as one) or a token under a harmless name."""
    _carrier(tmp_path)
    token = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4"
    cases = {
        f"args: {{wandb-key: '{DASH_KEY}'}}": ("args.wandb-key:", fingerprint(DASH_KEY)),
        f"args: {{note: '-{token}'}}": ("args.note:", fingerprint("-" + token)),
        f"args: {{hf-token: [ok, '{DASH_KEY}']}}": ("args.hf-token:", "word 2 of 2 starts"),
        f"args: {{hf-token: {{key: {FLAG_KEY}}}}}": ("args.hf-token:", "got dict a secret"),
        f"args: {{note: [[{token}]]}}": ("args.note:", "got list a secret"),
    }
    for body, (key, named) in cases.items():
        recipe = tmp_path / "dashed.yaml"
        recipe.write_text(f"extends: carrier.yaml\nname: dashed\n{body}\n")
        for command in (["drift", str(recipe), "--against", str(GOLDEN)], ["render", str(recipe)]):
            proc = run_cli(*command)
            assert proc.returncode == 2, proc.stderr
            assert key in proc.stderr and named in proc.stderr, proc.stderr
            assert token not in proc.stderr and not _leaks(proc.stderr, proc.stdout)


SCRIPT = """
import typer
import miles.utils.external_utils.command_utils as U

app = typer.Typer()

@app.command()
def train(wandb_key: str = ""):
    U.execute_train(f"--lr 1e-6 --wandb-key {wandb_key}", "tiny", {})

@app.command()
def other():
    pass
"""


def _checkout(root: Path) -> Path:
    """A stand-in miles checkout whose script passes its --wandb-key on to training."""
    write_checkout(root, SCRIPT, root / "started")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "tiny"], check=True)
    return root


def _source_recipe(folder: Path) -> Path:
    """The carrier recipe launched by the stand-in's script, a key given to --wandb-key."""
    recipe = folder / "tiny.yaml"
    recipe.write_text(
        f"extends: {_carrier(folder)}\nname: tiny\n"
        f"source: {{script: scripts/run_tiny.py, args: [train, --wandb-key, {SOURCE_KEY}]}}\n"
    )
    return recipe


def test_env_check_drift_check_keeps_no_secret(tmp_path):
    root, recipe = _checkout(tmp_path / "miles"), _source_recipe(tmp_path)
    check = drift_check(resolve(load_recipe(recipe).recipe, None, None), {"MILES_DIR": str(root)})
    assert check is not None and check.value is not None, check
    shown = check.message + json.dumps(check.value)
    assert not _leaks(shown)
    changed = next(d for d in check.value["differences"] if d["name"] == "wandb-key")
    assert (changed["expected"], changed["actual"]) == (
        fingerprint(SOURCE_KEY),
        fingerprint(FLAG_KEY),
    )


def test_ablate_shows_fingerprints_not_secrets(tmp_path):
    after = tmp_path / "after.yaml"
    after.write_text(
        f"extends: {TINY_RECIPE}\nname: after\n"
        f"env: {{WANDB_API_KEY: {ENV_KEY}}}\nargs: {{wandb-key: {FLAG_KEY}}}\n"
    )
    proc = run_cli("ablate", str(TINY_RECIPE), str(after))
    assert proc.returncode == 0, proc.stderr
    assert not _leaks(proc.stdout, proc.stderr)
    assert f"env.WANDB_API_KEY: (unset) -> '{fingerprint(ENV_KEY)}'" in proc.stdout


def test_drift_against_a_checkout_shows_no_secret_of_the_script_arguments(tmp_path):
    root, recipe = _checkout(tmp_path / "miles"), _source_recipe(tmp_path)
    for fmt in ("shell", "json"):
        proc = run_cli("drift", str(recipe), "--miles", str(root), "--format", fmt)
        assert proc.returncode == 1, proc.stderr
        assert "--wandb-key" in proc.stdout and not _leaks(proc.stdout, proc.stderr)
