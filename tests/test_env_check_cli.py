"""`recipeval env-check` as users and Snakemake run it: exit codes, one-line errors on bad input,
result files. Uses the CPU recipe and a broken variant of it (no megatron/SGLang import), and
one multi-recipe call that includes the PR's recipe."""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO, TINY_RECIPE, run_cli

from recipeval.result import read_result

BROKEN = REPO / "tests" / "recipes" / "broken"
PR_RECIPE = REPO / "recipes" / "amd" / "deepseek-v4-flash-4node-mi355x.yaml"
TINY_BROKEN = BROKEN / "tiny-sequence-parallel-without-tp.yaml"
GPU_RECIPE = REPO / "recipes" / "nvidia" / "deepseek-v4-flash-8node-h200.yaml"


def _one_line_error(proc) -> str:
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_static_pass_writes_stage_result(tmp_path):
    proc = run_cli("env-check", "--static", str(TINY_RECIPE), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = read_result(tmp_path / "env_check.json")
    assert result.status == "pass" and result.stage == "env_check" and result.summary["static"]
    assert result.provenance.recipe_sha256 and (tmp_path / "env_check.log").is_file()


def test_live_probe_passes_cpu_recipe(tmp_path):
    out = tmp_path / "tiny.json"
    proc = run_cli("env-check", "--recipe", str(TINY_RECIPE), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = read_result(out)
    assert {"probe.platform", "probe.packages", "probe.ray"} <= {c.id for c in result.checks}
    assert result.summary["probe"]["platform"] == "cpu"


def test_error_check_exits_1_and_exit_zero_exits_0(tmp_path):
    proc = run_cli("env-check", "--static", str(TINY_BROKEN))
    assert proc.returncode == 1
    assert (
        "layout.sequence-parallel" in proc.stdout
        and "tiny-sequence-parallel-without-tp.yaml:4" in proc.stdout
    )
    proc = run_cli(
        "env-check", "--static", str(TINY_BROKEN), "--out", str(tmp_path / "r.json"), "--exit-zero"
    )
    assert proc.returncode == 0
    assert read_result(tmp_path / "r.json").status == "fail"


def test_several_recipes_one_call(tmp_path):
    """The PR's recipe passes --static; results land in DIR/<recipe>/env_check.json."""
    proc = run_cli(
        "env-check",
        "--static",
        str(PR_RECIPE),
        str(TINY_BROKEN),
        "--out",
        str(tmp_path),
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    pr = read_result(tmp_path / "deepseek-v4-flash-4node-mi355x" / "env_check.json")
    assert pr.status == "pass" and pr.summary["errors"] == 0
    assert (
        read_result(tmp_path / "tiny-sequence-parallel-without-tp" / "env_check.json").status
        == "fail"
    )


def test_probe_only_prints_json():
    proc = run_cli("env-check", "--probe-only")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["platform"] == "cpu" and found["packages"]["torch"]


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    not_utf8 = tmp_path / "probe.json"
    not_utf8.write_bytes(b'{"platform": "cpu\xff"}')
    # the probe's parts the live checks read, with the wrong types: tracebacks before
    wrong_types = [
        ({"torch": "x"}, "torch: Input should be a valid dictionary"),
        ({"packages": [1]}, "packages: Input should be a valid dictionary"),
        ({"nvml": {"devices": "abc"}}, "nvml.devices: Input should be a valid list"),
    ]
    mistyped = []
    for n, (fields, reason) in enumerate(wrong_types):
        probe = tmp_path / f"probe-{n}.json"
        probe.write_text(json.dumps({"platform": "cpu", "packages": {}, **fields}))
        mistyped.append(
            (["env-check", str(TINY_RECIPE), "--probe-from", str(probe)], f"{probe}: {reason}")
        )
    cases = [
        (["env-check", "--static", str(tmp_path / "missing.yaml")], "missing.yaml"),
        (
            ["env-check", "--static", str(REPO / "tests/recipes/bad/unknown-key.yaml")],
            "unknown-key.yaml:",
        ),
        (["env-check", "--static", "--stage", "warmup", str(TINY_RECIPE)], "--stage 'warmup'"),
        (["env-check", "--static"], "name at least one recipe"),
        (["env-check", "--probe-only", str(TINY_RECIPE)], "--probe-only takes no recipe"),
        (
            [
                "env-check",
                "--static",
                str(TINY_RECIPE),
                str(TINY_BROKEN),
                "--out",
                str(tmp_path / "x.json"),
            ],
            "give a folder",
        ),
        (["env-check", str(TINY_RECIPE), "--probe-from", str(TINY_RECIPE)], "not JSON"),
        # /proc passes the permission check (always as root) and refuses the write itself
        (
            ["env-check", "--static", str(TINY_RECIPE), "--out", "/proc/env_check.json"],
            "cannot write /proc/env_check.",
        ),
        (
            ["env-check", str(TINY_RECIPE), "--probe-from", str(not_utf8)],
            f"--probe-from {not_utf8}: not UTF-8",
        ),
        *mistyped,
    ]
    for args, needle in cases:
        proc = run_cli(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert needle in _one_line_error(proc), (args, proc.stderr)


def _probe_with_devices(devices) -> str:
    return json.dumps({"platform": "cuda", "packages": {}, "torch": {"devices": devices}})


@pytest.mark.parametrize(
    ("content", "recipe", "reason"),
    [
        (_probe_with_devices(None), GPU_RECIPE, "torch.devices: Input should be a valid list"),
        (_probe_with_devices([{"name": 5}]), GPU_RECIPE, "torch.devices.0.name: Input should be"),
        (_probe_with_devices([{"name": ["a"]}]), GPU_RECIPE, "torch.devices.0.name: Input"),
        ("[" * 100000, TINY_RECIPE, "not JSON (recursion limit exceeded"),
        (
            None,
            TINY_RECIPE,
            "cannot read: not a regular file",
        ),  # a FIFO: nothing will ever write it
    ],
    ids=["devices-null", "name-int", "name-list", "deep", "fifo"],
)
def test_a_probe_the_checks_cannot_read_is_refused_before_anything_is_removed(
    tmp_path, content, recipe, reason
):
    """Each was a traceback inside the live checks (or a hang), after the previous result in
    --out had been removed."""
    probe = tmp_path / "probe.json"
    if content is None:
        os.mkfifo(probe)
    else:
        probe.write_text(content)
    out = tmp_path / "out"
    out.mkdir()
    (out / "env_check.json").write_text("previous")
    proc = run_cli(
        "env-check", str(recipe), "--probe-from", str(probe), "--out", str(out), timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _one_line_error(proc).startswith(f"recipeval: --probe-from {probe}: {reason}")
    assert (out / "env_check.json").read_text() == "previous"


def test_a_probe_written_by_probe_only_is_read_back(tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text(run_cli("env-check", "--probe-only").stdout)
    proc = run_cli("env-check", str(TINY_RECIPE), "--probe-from", str(probe))
    assert proc.returncode == 0, proc.stdout + proc.stderr
