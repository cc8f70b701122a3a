"""Secrets a recipe carries itself, beyond a secret-named env var or flag's one word: several
words or a `--`-looking word given to a secret flag never reach `render --redact`."""

from __future__ import annotations

from conftest import TINY_RECIPE, run_cli

from recipeval.secrets import redact_argv, secret_values

LIST_KEYS = ("firstsecret111", "secondsecret222")
DASH_KEY = "--looksflag-secret333"
CORPUS = (*LIST_KEYS, DASH_KEY)


def _leaks(*texts: str) -> list[str]:
    return [secret for secret in CORPUS for text in texts if secret in text]


# --- every word of a secret flag is its value ---------------------------------------------


def test_render_redact_hides_every_word_of_a_secret_flag(tmp_path):
    recipe = tmp_path / "words.yaml"
    recipe.write_text(
        f"extends: {TINY_RECIPE}\nname: words\n"
        f"args:\n  hf-token: [{', '.join(LIST_KEYS)}]\n  wandb-key: '{DASH_KEY}'\n"
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
