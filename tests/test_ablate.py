"""Ablation planning: one variant per changed key, keys bound by env_check kept together, every
emitted variant a valid recipe that extends BEFORE."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeval.explore.ablate import (
    AblationError,
    changed_keys,
    emit,
    plan,
    plan_lines,
    static_judge,
)
from recipeval.recipe import load_recipe
from recipeval.recipe.load import canonical_json
from recipeval.recipe.schema import Sweep

REPO = Path(__file__).resolve().parents[1]
# The seed pair: miles' AMD launch just before PR #2139 and as the PR left it (both imported
# from miles' launch script at those commits).
BEFORE = REPO / "recipes/amd/deepseek-v4-flash-4node-mi355x-before-pr2139.yaml"
AFTER = REPO / "recipes/amd/deepseek-v4-flash-4node-mi355x-pr2139.yaml"
TINY = REPO / "recipes/local/tiny-grpo-cpu.yaml"


@pytest.fixture(scope="module")
def judge():
    return static_judge()


def test_the_compressor_travels_with_unified_kv(tmp_path, judge):
    before, after = load_recipe(BEFORE), load_recipe(AFTER)
    ablation = plan(before, after, judge)
    groups = {tuple(g.keys): g for g in ablation.groups}
    kv = groups[("env.SGLANG_HACK_FLASHMLA_BACKEND", "env.SGLANG_OPT_USE_COMPRESSOR_V2")]
    assert "rocm-unified-kv-needs-compressor-v2" in kv.reasons[0]
    # The PR's other changes stand alone: each is a variant env_check accepts.
    assert set(groups) == {
        kv_keys := ("env.SGLANG_HACK_FLASHMLA_BACKEND", "env.SGLANG_OPT_USE_COMPRESSOR_V2"),
        ("parallel.tp",),
        ("env.SGLANG_OPT_USE_JIT_NORM",),
        ("args.rollout-max-response-len",),
        ("args.sglang-mem-fraction-static",),
    }
    assert groups[kv_keys] is kv
    assert "kept together: alone, env_check fails rule.rocm" in "\n".join(plan_lines(ablation))
    paths = emit(ablation, tmp_path / "variants")
    assert len(paths) == len(ablation.groups) + 2  # none, each group, all
    # Each variant says which ablation it belongs to (publish groups them by base and after)
    # and what it changes: BEFORE as is, each group, then every change.
    wanted = [[], *(g.keys for g in ablation.groups), sorted(ablation.changes)]
    for path, keys in zip(paths, wanted, strict=True):
        variant = load_recipe(path).recipe
        assert variant.sweep is not None and variant.sweep.kind == "ablation"
        assert variant.sweep.base == before.recipe.name
        assert variant.sweep.after == after.recipe.name
        assert sorted(variant.sweep.keys) == sorted(keys)
        assert not [
            c
            for c in judge(variant)
            if not c.ok
            and c.severity == "error"
            and c.id.startswith(("rule.", "megatron.", "layout."))
        ]
    everything = load_recipe(paths[-1]).recipe
    assert changed_keys(everything, after.recipe) == {}


def test_grouping_on_request_and_bad_pairs(judge):
    before = load_recipe(BEFORE)
    ablation = plan(
        before,
        load_recipe(AFTER),
        judge,
        together=[["parallel", "args.sglang-mem-fraction-static"]],
    )
    assert ["args.sglang-mem-fraction-static", "parallel.tp"] in [g.keys for g in ablation.groups]
    with pytest.raises(AblationError, match="no changed key"):
        plan(before, load_recipe(AFTER), judge, together=[["cluster"]])
    with pytest.raises(AblationError, match="same recipe"):
        plan(before, before, judge)
    with pytest.raises(AblationError, match="one model"):
        plan(load_recipe(TINY), load_recipe(AFTER), judge)


def test_a_group_that_names_no_key_is_shown_as_typed(cli):
    """`--group ,,,` was reported as `--group : no changed key matches`."""
    proc = cli("ablate", str(BEFORE), str(AFTER), "--group", ",,,")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "recipeval: --group ',,,': names no key; give KEY,KEY (keys or key prefixes)\n"
    )


def test_a_sweep_without_after_keeps_its_hash():
    """`sweep.after` came later: unset, it stays out of the identity (layout variants emitted
    before it keep their hash)."""
    tiny = load_recipe(TINY).recipe
    swept = tiny.model_copy(update={"sweep": Sweep(kind="layouts", base=tiny.name, rank=1)})
    assert '"after"' not in canonical_json(swept)
    named = swept.model_copy(update={"sweep": Sweep(kind="ablation", base="a", after="b")})
    assert '"after":"b"' in canonical_json(named)
