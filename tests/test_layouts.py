"""The layout explorer: megatron-core and the memory model decide what is valid, the cost
model ranks, the emitted variants are recipes that change only the layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recipeval.engines import engine_for, render
from recipeval.explore import layouts as layouts_module
from recipeval.explore.cost import Cost, calibrate
from recipeval.explore.layouts import (
    Layout,
    current_layout,
    emit_knobs,
    emit_layouts,
    explore,
    pipeline_splits,
    table_lines,
)
from recipeval.recipe import load_recipe, resolve
from recipeval.result import read_result

REPO = Path(__file__).resolve().parents[1]
AMD = REPO / "recipes/amd/deepseek-v4-flash-4node-mi355x.yaml"
TINY = REPO / "recipes/local/tiny-grpo-cpu.yaml"
PR2139 = Layout(tp=4, pp=4, cp=1, ep=8, etp=1, first=11, last=10)
TP8 = Layout(tp=8, pp=4, cp=1, ep=8, etp=1, first=11, last=10)


@pytest.fixture(scope="module")
def amd_32():
    loaded = load_recipe(AMD)
    return loaded, explore(loaded, 32)


def _rank(found, layout: Layout) -> int:
    return next(i for i, r in enumerate(found.kept) if r.layout == layout)


def test_a_long_exploration_says_how_far_it_is(monkeypatch):
    """On thousands of GPUs the explorer judges 100,000s of layouts for minutes; it was silent."""
    monkeypatch.setattr(layouts_module, "PROGRESS_EVERY_S", 0.0)
    heard: list[tuple[int, int, float]] = []
    found = explore(load_recipe(AMD), 8, progress=lambda *args: heard.append(args))
    assert found.candidates > 10
    assert [done for done, _, _ in heard] == list(range(found.candidates))
    assert {total for _, total, _ in heard} == {found.candidates}
    seconds = [s for _, _, s in heard]
    assert seconds == sorted(seconds) and seconds[-1] <= found.seconds


def test_splits_are_even_or_within_one_layer_of_it():
    assert (11, 10) in pipeline_splits(43, 4) and (10, 11) in pipeline_splits(43, 4)
    assert (12, 9) not in pipeline_splits(43, 4)
    assert pipeline_splits(44, 4)[0] == (None, None)
    assert pipeline_splits(43, 1) == [(None, None)]


def test_pr2139_and_the_earlier_tp8_layout_are_valid_and_ranked_with_reasons(amd_32):
    loaded, found = amd_32
    assert current_layout(loaded.recipe) == PR2139
    pr, tp8 = found.kept[_rank(found, PR2139)], found.kept[_rank(found, TP8)]
    # Less TP traffic is why #2139's TP4 ranks ahead of TP8 (the rest is the same).
    assert _rank(found, PR2139) < _rank(found, TP8)
    assert pr.cost.parts["tp"] < tp8.cost.parts["tp"]
    # The last stage carries the output layer: 11+11+11+10 before 10+11+11+11.
    assert _rank(found, PR2139) < _rank(found, Layout(4, 4, 1, 8, 1, 10, 11))
    assert pr.headroom is not None and 0 < pr.headroom < 1
    # Every rejection names the check that made it, with counts.
    assert found.rejected["memory.per-gpu"].count > 0
    assert "ETP" in found.rejected["megatron.transformer-config"].example
    lines = table_lines(found, current_layout(loaded.recipe), top=10)
    assert any(line.endswith(f"(rank {_rank(found, PR2139) + 1})") for line in lines)


def _ranked_rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line[:4].strip().isdigit()]


@pytest.mark.parametrize("gpus", [24, 48, 64])
def test_gpu_counts_the_launch_script_refuses_get_layouts(cli, gpus):
    proc = cli("layouts", str(AMD), "--gpus", str(gpus), "--top", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _ranked_rows(proc.stdout)
    assert len(rows) == 3 and f"on {gpus} GPUs ({gpus // 8} nodes x 8)" in proc.stdout
    # every row's layout multiplies out within the GPU count and shows its memory margin
    for row in rows:
        tp, pp, cp = (int(re.search(rf"\b{k}(\d+)", row)[1]) for k in ("TP", "PP", "CP"))
        assert gpus % (tp * pp * cp) == 0 and "% free)" in row, row


def test_16_gpus_fit_only_with_a_memory_knob_and_the_explorer_names_it(cli, tmp_path):
    # 2.84e11 parameters over 16 GPUs: at least 17.8e9 a GPU (weights 2 B + fp32 gradients
    # 4 B + a quarter of Adam's 12 B) = 160 GB, beside SGLang's static 0.5 x 288 GB that
    # no-offload-train keeps resident: 304 GB > 274 GB (95 %). No layout can shard further.
    none = cli("layouts", str(AMD), "--gpus", "16")
    assert none.returncode == 1, none.stdout + none.stderr
    assert "0 valid and fitting" in none.stdout
    assert "no layout fits memory with this recipe's settings" in none.stdout
    assert re.search(r"needs 30\d GB per GPU against 274 GB", none.stdout), none.stdout
    knobs = re.findall(r"--arg (\S+)=(\S+):", none.stdout)
    assert {flag for flag, _ in knobs} == {
        "optimizer-offload-fraction",
        "no-offload-train",
        "sglang-mem-fraction-static",
    }, none.stdout
    # The knob it names is enough: with it, layouts come out and are emitted with it.
    offload = dict(knobs)["optimizer-offload-fraction"]
    fits = cli(
        "layouts", str(AMD), "--gpus", "16", "--top", "2",
        "--arg", f"optimizer-offload-fraction={offload}", "--emit", str(tmp_path / "emit"),
    )  # fmt: skip
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert len(_ranked_rows(fits.stdout)) == 2
    variants = [load_recipe(p).recipe for p in sorted((tmp_path / "emit").glob("*.yaml"))]
    assert len(variants) == 2
    assert all(v.args["optimizer-offload-fraction"] == float(offload) for v in variants)
    assert all(
        v.world_size == 16
        and v.sweep.keys == ["args.optimizer-offload-fraction", "cluster", "parallel"]
        for v in variants
    )
    # Emitting again with fewer layouts leaves only those: the sweep runs every recipe there.
    (tmp_path / "emit" / "mine.yaml").write_text("name: mine\n")
    # a user's file of any shape stays, and is no traceback (RecursionError before)
    deep = "a: " + "[" * 5000 + "]" * 5000 + "\n"
    (tmp_path / "emit" / "deep.yaml").write_text(deep)
    again = cli(
        "layouts", str(AMD), "--gpus", "16", "--top", "1",
        "--arg", f"optimizer-offload-fraction={offload}", "--emit", str(tmp_path / "emit"),
    )  # fmt: skip
    assert again.returncode == 0 and "(removed 1 an earlier --emit left there)" in again.stdout
    assert (tmp_path / "emit" / "deep.yaml").read_text() == deep
    (tmp_path / "emit" / "deep.yaml").unlink()
    assert len([p for p in (tmp_path / "emit").glob("*.yaml") if p.name != "mine.yaml"]) == 1
    assert (tmp_path / "emit" / "mine.yaml").read_text() == "name: mine\n"
    # A variant explored again into its own folder stays: the new variants extend it.
    (source,) = [p for p in (tmp_path / "emit").glob("*.yaml") if p.name != "mine.yaml"]
    third = cli("layouts", str(source), "--top", "2", "--emit", str(tmp_path / "emit"))
    assert third.returncode == 0 and "removed" not in third.stdout, third.stdout + third.stderr
    emitted = [p for p in (tmp_path / "emit").glob("*.yaml") if p.name != "mine.yaml"]
    assert source in emitted and len(emitted) == 3
    assert all(load_recipe(p).recipe.world_size == 16 for p in emitted)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("optimizer-offload-fraction", "write FLAG=VALUE"),
        ("tensor-model-parallel-size=2", "derives this flag from parallel.tp"),
        ("sglang-mem-fraction-static=[1", "is not a value"),
        ("lr=2001-02-30", "is not a value"),  # YAML's date, out of range
        ("seed=" + "9" * 5000, "is not a value"),  # past Python's int() digit limit
        ("micro-batch-size=abc", "--arg micro-batch-size=abc: not a whole number"),
        ("micro-batch-size=2.0", "--arg micro-batch-size=2.0: not a whole number"),
        ("lr=.nan", "--arg lr: expected a string, number"),
    ],
)
def test_bad_arg_is_refused_before_exploring(cli, arg, message):
    proc = cli("layouts", str(AMD), "--gpus", "32", "--arg", arg)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "0"], "--gpus 0: give a GPU count from 1 to 2147483647"),
        (["--gpus", "-8"], "--gpus -8: give a GPU count from 1 to"),
        (["--gpus", "8589934592"], "--gpus 8589934592: give a GPU count from 1 to"),  # hung
        (["--nodes", "0"], "--nodes 0: give a node count from 1 to"),
        (["--nodes", "-2"], "--nodes -2: give a node count from 1 to"),
        (["--gpus", "12"], "--gpus 12 is not a whole number of the recipe's 8-GPU nodes"),
        (["--gpus", "99999999999999"], "--gpus 99999999999999: give a GPU count from 1 to"),
        (["--history", "/etc/hostname"], "--history /etc/hostname: not a folder"),
    ],
)
def test_a_count_the_recipe_cannot_take_is_refused(cli, argv, message):
    """0 is a bad count, not "the recipe's own" (which the option left out means); GPUs that
    fill no whole number of the recipe's nodes were explored as one node of them all, or named
    a --nodes the user never gave."""
    proc = cli("layouts", str(AMD), *argv)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("command", ["layouts", "ablate"])
def test_emit_into_a_path_that_cannot_be_a_folder_is_refused(cli, tmp_path, command):
    """Checked before any exploring: it ended in a traceback (exit 1), and "" wrote into the
    working directory."""
    (tmp_path / "afile").write_text("")
    recipes = [str(AMD)] * (2 if command == "ablate" else 1)
    for emit, message in [(tmp_path / "afile/x", "which is not a folder"), ("", "is empty")]:
        proc = cli(command, *recipes, "--emit", str(emit))
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr


def test_env_check_fails_rollout_engines_that_do_not_tile_the_gpus(cli, tmp_path):
    recipe = tmp_path / "engines-of-3.yaml"
    recipe.write_text(
        f"name: engines-of-3\nextends: {AMD}\n"
        "args: {rollout-num-gpus-per-engine: 3, sglang-tp-size: 3}\n"
    )
    proc = cli("env-check", "--recipe", str(recipe), "--static", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = read_result(tmp_path / "r.json")
    (check,) = [c for c in result.checks if c.id == "rollout.engine-tiling"]
    assert not check.ok and check.severity == "error"
    assert check.key == "args.rollout-num-gpus-per-engine"
    assert "do not tile 4 nodes x 8 GPUs" in check.message
    assert "use one of: 1, 2, 4, 8, 16, 32" in check.message
    assert f"{recipe}:3" in check.message


@pytest.mark.parametrize("count", [0, -8])
def test_env_check_fails_a_non_colocated_recipe_without_rollout_gpus(cli, tmp_path, count):
    """Not colocated, miles' placement group holds the trainer's GPUs plus rollout-num-gpus:
    with none, no engine starts. It used to be read as unset and tiled the whole cluster."""
    recipe = tmp_path / "no-rollout-gpus.yaml"
    recipe.write_text(
        f"name: no-rollout-gpus\nextends: {AMD}\n"
        f"args: {{colocate: false, rollout-num-gpus: {count}}}\n"
    )
    proc = cli("env-check", "--recipe", str(recipe), "--static", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (check,) = [
        c for c in read_result(tmp_path / "r.json").checks if c.id == "rollout.engine-tiling"
    ]
    assert not check.ok and check.key == "args.rollout-num-gpus"
    assert f"rollout-num-gpus {count}: without colocate" in check.message
    assert f"{recipe}:3" in check.message


def test_emitted_layouts_change_only_the_parallel_flags(amd_32, tmp_path):
    loaded, found = amd_32
    (path,) = emit_layouts(found, loaded, tmp_path / "emit", top=1)
    variant = load_recipe(path)
    assert variant.recipe.sweep is not None and variant.recipe.sweep.rank == 1
    before = render(resolve(loaded.recipe, "bench")).argv
    after = render(resolve(variant.recipe, "bench")).argv
    # the runtime env file lies in each recipe's own results folder, so its path differs too
    changed = {
        w
        for w in set(after) ^ set(before)
        if w.startswith("--") and not w.startswith("--runtime-env=")
    }
    parallel_flags = {
        "--tensor-model-parallel-size",
        "--sequence-parallel",
        "--pipeline-model-parallel-size",
        "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers",
        "--context-parallel-size",
        "--expert-model-parallel-size",
        "--expert-tensor-parallel-size",
    }
    assert changed <= parallel_flags
    assert len(before) != len(after) or before != after


def test_calibration_recovers_the_scales_of_measured_runs():
    costs = [
        Cost({"compute": 10.0, "tp": 1.0}),
        Cost({"compute": 8.0, "ep": 4.0}),
        Cost({"compute": 12.0, "cp": 0.5}),
    ]
    measured = [2 * c.compute + 3 * c.communication for c in costs]
    fitted = calibrate(costs, measured)
    assert fitted.compute_scale == pytest.approx(2) and fitted.communication_scale == pytest.approx(
        3
    )
    assert fitted.apply(costs[0]) == pytest.approx(measured[0])
    single = calibrate(costs[:1], [22.0])
    assert single.compute_scale == single.communication_scale == pytest.approx(2)


def test_a_fixed_layout_engine_sweeps_its_speed_knobs(tmp_path):
    loaded = load_recipe(TINY)
    paths = emit_knobs(loaded, engine_for("reference").speed_knobs, tmp_path, top=None)
    assert len(paths) == 2 * 2 * 2 - 1  # every combination but the recipe's own
    variants = [load_recipe(p).recipe for p in paths]
    assert all(v.sweep is not None and v.sweep.kind == "layouts" for v in variants)
    # Each variant sets only what it changes: the bf16 one nothing but train-dtype.
    bf16 = next(p for p in paths if p.stem == "tiny-grpo-cpu--train-dtype-bfloat16")
    assert "args: {train-dtype: bfloat16}" in bf16.read_text()


@pytest.mark.parametrize("option", ["--gpus", "--nodes"])
def test_a_fixed_layout_engine_refuses_a_cluster_size(cli, tmp_path, option):
    """The knobs are explored on the recipe's own devices; a GPU count was silently ignored."""
    proc = cli("layouts", str(TINY), option, "4", "--emit", str(tmp_path / "emit"))
    assert proc.returncode == 2 and f"{option}: the reference engine's layout is fixed" in (
        proc.stderr
    ), proc.stderr
    assert not (tmp_path / "emit").exists()


def test_a_folder_where_a_variant_goes_is_one_line_and_leaves_no_partial_file(cli, tmp_path):
    small = REPO / "recipes/amd/deepseek-v4-flash-4layer-1node.yaml"
    first = cli("layouts", str(small), "--top", "1", "--emit", str(tmp_path / "one"))
    assert first.returncode == 0, first.stdout + first.stderr
    (name,) = [p.name for p in (tmp_path / "one").glob("*.yaml")]
    (tmp_path / "two" / name).mkdir(parents=True)
    proc = cli("layouts", str(small), "--top", "1", "--emit", str(tmp_path / "two"))
    assert proc.returncode == 2 and f"cannot write {name}" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert [p.name for p in (tmp_path / "two").iterdir()] == [name]
