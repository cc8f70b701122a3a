"""Recipes cannot drift from miles: every miles recipe renders its golden (upstream's recorded
launch) up to the listed allowed differences; import then render round-trips; drift names
exactly what changed. Tests that need a miles checkout skip only when there is none (MILES_DIR);
the rest run on the checked-in goldens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import RECIPES, clean_env
from miles_goldens import (
    ALLOWED_FILE,
    GOLDENS,
    RENDER_ENV,
    allowed,
    differences_from_golden,
    label,
    miles_recipes,
)

from recipeval.engines.miles.importer import recipe_from_recording, recipe_yaml
from recipeval.engines.miles.record import Recording
from recipeval.recipe import load_recipe

RECIPE_FILES = miles_recipes()
CHECKOUT = Path(os.environ["MILES_DIR"]) if os.environ.get("MILES_DIR") else None
needs_checkout = pytest.mark.skipif(
    CHECKOUT is None or not (CHECKOUT / "miles").is_dir(),
    reason="no miles checkout (set MILES_DIR to one); the goldens stand in for it",
)
DSV4_SCRIPTS = {
    "amd-4x8-mi355x": (
        "scripts/amd/run_deepseek_v4.py",
        [
            "train",
            "--model-name",
            "DeepSeek-V4-Flash-FP8",
            "--num-nodes",
            "4",
            "--num-gpus-per-node",
            "8",
            "--skip-saving",
        ],
    ),
    "nvidia-8x8-h200": (
        "scripts/run_deepseek_v4.py",
        ["train", "--num-nodes", "8", "--hardware", "H200", "--skip-saving"],
    ),
}


def _golden(recipe: Path) -> Recording:
    name = load_recipe(recipe).recipe.name
    return Recording.load(GOLDENS / f"{name}.json")


def _render(cli, recipe: Path) -> dict:
    proc = cli("render", str(recipe), "--format", "json", env=clean_env(**RENDER_ENV))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_miles_recipes_are_found():
    names = {p.name for p in RECIPE_FILES}
    assert {
        "deepseek-v4-flash-4node-mi355x.yaml",
        "deepseek-v4-flash-8node-h200.yaml",
        "deepseek-v4-flash-4node-mi355x-pr2139.yaml",
    } <= names


@pytest.mark.parametrize("recipe", RECIPE_FILES, ids=lambda p: p.stem)
def test_every_miles_recipe_names_its_source_and_has_its_golden(recipe):
    source = load_recipe(recipe).recipe.source
    assert source is not None, f"{recipe}: every miles recipe names the launch it describes"
    golden = _golden(recipe)
    assert golden.commit.startswith(source.commit)
    assert (golden.script, golden.args) == (source.script, source.args)


@pytest.mark.parametrize("recipe", RECIPE_FILES, ids=lambda p: p.stem)
def test_render_matches_the_golden_up_to_the_allowed_differences(cli, recipe):
    name = load_recipe(recipe).recipe.name
    found = {label(d): d for d in differences_from_golden(_render(cli, recipe), _golden(recipe))}
    accepted = allowed(name)
    unexpected = [d.line() for key, d in found.items() if key not in accepted]
    assert not unexpected, f"{recipe} renders a launch miles does not run:\n" + "\n".join(
        unexpected
    )
    stale = [key for key in accepted if key not in found]
    assert not stale, f"{ALLOWED_FILE}: {stale} no longer differ for {name}; remove them"


def test_every_allowed_difference_has_a_reason():
    table = yaml.safe_load(ALLOWED_FILE.read_text())
    for recipe, entries in table.items():
        for key, reason in entries.items():
            assert key.split(" ", 1)[0] in ("env", "flag", "client-env") and len(reason) > 20, (
                recipe,
                key,
            )


def test_the_amd_recipe_describes_the_pinned_commit_and_the_variant_pr_2139(cli):
    current = _render(cli, RECIPES / "amd" / "deepseek-v4-flash-4node-mi355x.yaml")
    variant = _render(cli, RECIPES / "amd" / "deepseek-v4-flash-4node-mi355x-pr2139.yaml")

    def scales(launch):
        return launch["entrypoint"][launch["entrypoint"].index("--train-env-vars") + 1]

    assert json.loads(scales(current)) == {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "0"}
    assert json.loads(scales(variant)) == {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1"}
    assert _golden(RECIPES / "amd" / "deepseek-v4-flash-4node-mi355x-pr2139.yaml").commit == (
        "3507ce1543120ca3a418c131894998a7d0fcabf7"
    )


@pytest.mark.parametrize("golden_file", sorted(GOLDENS.glob("*.json")), ids=lambda p: p.stem)
def test_a_recipe_built_from_a_golden_renders_it(cli, tmp_path, golden_file):
    """The importer's flag -> recipe mapping, on the recorded launch alone."""
    golden = Recording.load(golden_file)
    platform = "rocm" if "amd" in golden.script else "cuda"
    recipe = recipe_from_recording(golden, "round-trip", platform)
    path = tmp_path / "round-trip.yaml"
    path.write_text(recipe_yaml(recipe, golden, None))
    found = differences_from_golden(_render(cli, path), golden)
    assert {label(d) for d in found} <= set(allowed(golden_file.stem))
    assert {f"env {k}" for k in golden.probed} <= {label(d) for d in found}
    assert "NCCL_NVLS_ENABLE" not in recipe["env"]
    assert recipe["source"]["probed"] == golden.probed


def _changed(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "changed.yaml"
    path.write_text(
        f"extends: {RECIPES / 'nvidia' / 'deepseek-v4-flash-8node-h200.yaml'}\n"
        f"name: changed\n{text}"
    )
    return path


def test_drift_reports_exactly_the_changed_flag(cli, tmp_path):
    golden = GOLDENS / "deepseek-v4-flash-8node-h200.json"
    recipe = _changed(tmp_path, "args: {eps-clip-high: 0.3}\n")
    proc = cli("drift", str(recipe), "--against", str(golden), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    [report] = json.loads(proc.stdout)
    assert report["drifted"] is True
    assert (
        report["upstream_commit"]
        == report["source_commit"]
        == ("31f1ca961a94cb860cec3b2dea34ec332bfa8f76")
    )
    assert [
        (d["kind"], d["name"], d["change"], d["expected"], d["actual"])
        for d in report["differences"]
    ] == [("flag", "eps-clip-high", "changed", "0.28", "0.3")]
    text = cli("drift", str(recipe), "--against", str(golden))
    assert text.returncode == 1
    assert "flag --eps-clip-high: upstream '0.28', ours '0.3'" in text.stdout


def test_drift_names_added_and_removed_entries(cli, tmp_path):
    golden = GOLDENS / "deepseek-v4-flash-8node-h200.json"
    recipe = _changed(tmp_path, "args: {colocate: null}\nenv: {EXTRA_SWITCH: '1'}\n")
    proc = cli("drift", str(recipe), "--against", str(golden), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    changes = {
        (d["kind"], d["name"], d["change"]) for d in json.loads(proc.stdout)[0]["differences"]
    }
    assert changes == {("flag", "colocate", "removed"), ("env", "EXTRA_SWITCH", "added")}


def test_no_drift_exits_zero_and_probed_values_are_not_drift(cli):
    recipe = RECIPES / "nvidia" / "deepseek-v4-flash-8node-h200.yaml"
    proc = cli(
        "drift", str(recipe), "--against", str(GOLDENS / "deepseek-v4-flash-8node-h200.json")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no drift" in proc.stdout


def test_drift_of_several_recipes_is_one_report_each(cli, tmp_path):
    changed = _changed(tmp_path, "args: {eps-clip-high: 0.3}\n")
    recipe = RECIPES / "nvidia" / "deepseek-v4-flash-8node-h200.yaml"
    both = cli("drift", str(recipe), str(changed), "--against", str(tmp_path))
    assert both.returncode == 2 and "single recipe" in both.stderr
    bad = cli(
        "drift", str(recipe), str(RECIPES / "local" / "tiny-grpo-cpu.yaml"), "--format", "json"
    )
    assert bad.returncode == 2
    assert "no miles checkout" in bad.stderr and "miles recipes only" in bad.stderr


def test_a_recording_of_the_wrong_shape_is_bad_input_naming_it(cli, tmp_path):
    """A hand-edited recording: exit 2 naming the file and field (it crashed on a number for
    the commit, and a string for argv was compared word by word as made-up drift)."""
    golden = json.loads((GOLDENS / "deepseek-v4-flash-8node-h200.json").read_text())
    recipe = RECIPES / "nvidia" / "deepseek-v4-flash-8node-h200.yaml"
    for name, content, reason in [
        ("truncated", "{", "Invalid JSON"),
        ("commit", json.dumps({**golden, "commit": 5}), "commit: Input should be a valid string"),
        ("argv", json.dumps({**golden, "argv": "ray -- x"}), "argv: Input should be a valid"),
        ("no-separator", json.dumps({**golden, "argv": ["ray", "x"]}), "argv has no '--'"),
    ]:
        recording = tmp_path / f"{name}.json"
        recording.write_text(content)
        proc = cli("drift", str(recipe), "--against", str(recording))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"recorded launch {recording}: {reason}" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_drift_bad_input_exits_two(cli, tmp_path):
    no_checkout = cli("drift", str(RECIPES / "nvidia" / "deepseek-v4-flash-8node-h200.yaml"))
    assert no_checkout.returncode == 2
    assert "MILES_DIR" in no_checkout.stderr and "Traceback" not in no_checkout.stderr
    reference = cli("drift", str(RECIPES / "local" / "tiny-grpo-cpu.yaml"))
    assert reference.returncode == 2 and "miles recipes only" in reference.stderr
    not_a_checkout = cli(
        "drift",
        str(RECIPES / "nvidia" / "deepseek-v4-flash-8node-h200.yaml"),
        "--miles",
        str(tmp_path),
    )
    assert not_a_checkout.returncode == 2 and "not a miles checkout" in not_a_checkout.stderr


@needs_checkout
@pytest.mark.parametrize("which", sorted(DSV4_SCRIPTS))
def test_import_of_a_dsv4_script_reproduces_its_launch(cli, tmp_path, which):
    script, args = DSV4_SCRIPTS[which]
    out = tmp_path / f"{which}.yaml"
    proc = cli("import", "miles", script, "--miles", str(CHECKOUT), "--out", str(out), "--", *args)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr, proc.stderr
    recipe = yaml.safe_load(out.read_text())
    assert recipe["source"]["args"] == args
    drift = cli("drift", str(out), "--miles", str(CHECKOUT))
    assert drift.returncode == 0, drift.stdout + drift.stderr


@needs_checkout
def test_import_with_extends_writes_only_the_differences(cli, tmp_path):
    script, args = DSV4_SCRIPTS["nvidia-8x8-h200"]
    out = tmp_path / "h200.yaml"
    base = RECIPES / "base" / "deepseek-v4-flash.yaml"
    proc = cli(
        "import",
        "miles",
        script,
        "--miles",
        str(CHECKOUT),
        "--extends",
        str(base),
        "--out",
        str(out),
        "--",
        *args,
    )
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    recipe = yaml.safe_load(out.read_text())
    assert "model" not in recipe
    assert recipe["args"]["rollout-max-response-len"] == 4096
    assert recipe["args"]["train-env-vars"] is None
    assert "hf-checkpoint" not in recipe["args"]


@needs_checkout
@pytest.mark.parametrize("recipe", RECIPE_FILES, ids=lambda p: p.stem)
def test_goldens_are_what_the_checkout_records(recipe):
    """Re-record at the golden's commit: a golden is upstream's launch, never edited by hand."""
    from recipeval.engines.miles.record import record_at_commit

    golden = _golden(recipe)
    rec = record_at_commit(CHECKOUT, golden.commit, golden.script, golden.args, golden.repo)
    # stand_ins says which packages this python lacked: a fact about the recording machine.
    assert {**json.loads(rec.to_json()), "stand_ins": []} == {
        **json.loads(golden.to_json()),
        "stand_ins": [],
    }


def test_the_recorder_script_refuses_without_a_checkout(tmp_path):
    env = clean_env()
    env.pop("MILES_DIR", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(RECIPES.parent / "scripts" / "record_miles_goldens.py"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 2 and "--miles" in proc.stderr
