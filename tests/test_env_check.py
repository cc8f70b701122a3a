"""env_check in-process: the broken corpus, every rule, the real validators, environment
readers against SGLang's own, memory/context/batch arithmetic, and the live probe. The corpus and
the real recipes go through one `env_check` call (megatron-core and SGLang import once)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from recipeval.checks import live, memory, rules
from recipeval.checks.env_check import (
    EnvCheckReport,
    _Validators,
    env_check,
    env_check_stage,
    exit_status,
)
from recipeval.checks.layout import load_megatron, parallel_state_verdict
from recipeval.checks.probe import probe, ray_cluster
from recipeval.checks.subject import Subject
from recipeval.recipe import load_recipe
from recipeval.result import StageResult, read_result
from recipeval.stages.common import StageRequest
from recipeval.stages.driver import run

REPO = Path(__file__).resolve().parents[1]
BROKEN = REPO / "tests" / "recipes" / "broken"
PR_RECIPE = REPO / "recipes" / "amd" / "deepseek-v4-flash-4node-mi355x.yaml"
H200_RECIPE = REPO / "recipes" / "nvidia" / "deepseek-v4-flash-8node-h200.yaml"
TINY_RECIPE = REPO / "recipes" / "local" / "tiny-grpo-cpu.yaml"
REAL = [
    PR_RECIPE,
    H200_RECIPE,
    REPO / "recipes" / "amd" / "deepseek-v4-flash-4layer-1node.yaml",
    TINY_RECIPE,
]

# broken variant -> (check id, recipe key, severity) it must fail with
EXPECTED = {
    "unified-kv-without-compressor-v2": (
        "rule.rocm-unified-kv-needs-compressor-v2",
        "env.SGLANG_OPT_USE_COMPRESSOR_V2",
        "error",
    ),
    "jit-norm-on-triton-path": (
        "rule.rocm-jit-norm-on-triton-path",
        "env.SGLANG_OPT_USE_JIT_NORM",
        "warning",
    ),
    "hisparse-with-unified-kv": (
        "rule.rocm-hisparse-with-unified-kv",
        "args.sglang-enable-hisparse",
        "error",
    ),
    "aiter-on-cuda": ("rule.aiter-on-non-rocm", "env.AITER_BF16_FP8_MOE_BOUND", "warning"),
    "deterministic-nccl-tree": ("rule.deterministic-needs-nccl-ring", "env.NCCL_ALGO", "warning"),
    "deterministic-nvte-allowed": (
        "rule.deterministic-needs-nvte-deterministic",
        "env.NVTE_ALLOW_NONDETERMINISTIC_ALGO",
        "warning",
    ),
    "deterministic-cublas-default": (
        "rule.deterministic-needs-cublas-workspace",
        "env.CUBLAS_WORKSPACE_CONFIG",
        "warning",
    ),
    "dp-attention-missing": ("rule.miles-dp-attention-required", "args.sglang-dp-size", "error"),
    "dp-attention-deprecated-flag": (
        "sglang.deprecated-flag",
        "args.sglang-enable-dp-attention",
        "warning",
    ),
    "sglang-tp-overridden": (
        "rule.miles-sglang-tp-follows-engine-gpus",
        "args.sglang-tp-size",
        "warning",
    ),
    "nvte-value-unreadable": (
        "env.value-readable",
        "env.NVTE_ALLOW_NONDETERMINISTIC_ALGO",
        "error",
    ),
    "pipeline-split-does-not-add-up": (
        "layout.pipeline-split",
        "parallel.pp_first_stage_layers",
        "error",
    ),
    "layout-does-not-fit-gpus": ("layout.world-size", "parallel", "error"),
    "experts-not-divisible": ("layout.experts-divisible", "parallel.ep", "error"),
    "heads-not-divisible": ("layout.heads-divisible", "parallel.tp", "error"),
    "sequence-parallel-without-tp": (
        "layout.sequence-parallel",
        "parallel.sequence_parallel",
        "error",
    ),
    "tiny-sequence-parallel-without-tp": (
        "layout.sequence-parallel",
        "parallel.sequence_parallel",
        "error",
    ),
    "sglang-impossible-value": ("sglang.bad-value", "args.sglang-attention-backend", "error"),
    "sglang-wrong-type": ("sglang.bad-value", "args.sglang-mem-fraction-static", "error"),
    "sglang-unknown-flag": ("sglang.unknown-flag", "args.sglang-mem-fraction", "error"),
    "sglang-miles-managed-flag": ("sglang.miles-managed-flag", "args.sglang-model-path", "error"),
    "memory-fraction-cannot-fit": ("memory.per-gpu", "args.sglang-mem-fraction-static", "error"),
    "memory-fraction-near-full": ("memory.per-gpu", "args.sglang-mem-fraction-static", "warning"),
    "context-too-long": ("context.positions", "args.rollout-max-response-len", "error"),
    "batch-steps-not-whole": ("batch.steps-per-rollout", "args.num-steps-per-rollout", "error"),
    "micro-batches-not-whole": ("megatron.microbatches", "args.micro-batch-size", "error"),
    "count-flag-not-a-number": ("args.integers", "args.n-samples-per-prompt", "error"),
    "rollout-count-not-whole": ("args.integers", "args.num-rollout", "error"),
}
# What megatron-core itself says about the layout variants (its exception, on the recipe key).
MEGATRON_VERDICTS = {
    "pipeline-split-does-not-add-up": (
        "megatron.transformer-config",
        "parallel.pp_first_stage_layers",
    ),
    "heads-not-divisible": ("megatron.transformer-config", "parallel.tp"),
    "sequence-parallel-without-tp": ("megatron.transformer-config", "parallel.sequence_parallel"),
    "layout-does-not-fit-gpus": ("megatron.parallel-state", "parallel"),
    "experts-not-divisible": ("megatron.parallel-state", "parallel.ep"),
}


@pytest.fixture(scope="module")
def results():
    outcome = env_check(sorted(BROKEN.glob("*.yaml")) + REAL, static=True)
    assert outcome.bad_input == []
    return {r.recipe: r for r in outcome.results}


@pytest.fixture(scope="module")
def machine():
    return probe(environ={})


def _failed(result, check_id):
    return [c for c in result.checks if c.id == check_id and not c.ok]


def test_corpus_is_complete():
    names = {p.stem for p in BROKEN.glob("*.yaml")}
    assert names == set(EXPECTED) | {"smoke-overlay-memory"}
    assert len(EXPECTED) >= 12


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_broken_variant_fails_with_expected_check(results, name):
    check_id, key, severity = EXPECTED[name]
    result = results[name]
    hits = [c for c in _failed(result, check_id) if c.key == key]
    assert hits, f"{name}: no failing {check_id} on {key}; failed: {result.summary['failed']}"
    assert hits[0].severity == severity
    assert f"broken/{name}.yaml" in hits[0].message or "recipes/" in hits[0].message
    assert result.status == ("fail" if severity == "error" else "pass")


@pytest.mark.parametrize("name", sorted(MEGATRON_VERDICTS))
def test_megatron_core_rejects_layout_on_recipe_key(results, name):
    check_id, key = MEGATRON_VERDICTS[name]
    hits = _failed(results[name], check_id)
    assert hits and hits[0].key == key, [c.message for c in hits]
    assert "megatron-core 0.16.1" in hits[0].message


def test_every_rule_in_the_rule_base_is_exercised():
    exercised = {check_id for check_id, _, _ in EXPECTED.values()}
    assert {f"rule.{r.id}" for r in rules.rule_base().rules} <= exercised


def test_issue_rules_are_in_the_rule_base():
    ids = {r.id for r in rules.rule_base().rules}
    assert {
        "rocm-unified-kv-needs-compressor-v2",
        "rocm-jit-norm-on-triton-path",
        "aiter-on-non-rocm",
        "deterministic-needs-nccl-ring",
        "deterministic-needs-nvte-deterministic",
        "deterministic-needs-cublas-workspace",
    } <= ids


@pytest.mark.parametrize("recipe", [p.stem for p in REAL])
def test_real_recipes_have_no_error(results, recipe):
    result = results[recipe]
    assert result.status == "pass", result.message
    assert result.summary["errors"] == 0


def test_pr_recipe_judged_by_real_validators(results):
    result = results["deepseek-v4-flash-4node-mi355x"]
    by_id = {c.id: c for c in result.checks}
    assert result.summary["warnings"] == 0
    assert by_id["megatron.transformer-config"].ok
    assert "MLATransformerConfig" in by_id["megatron.transformer-config"].message
    assert by_id["megatron.parallel-state"].value == {"dp": 2, "expert_dp": 1}
    assert by_id["layout.pipeline-split"].value == {
        "first": 11,
        "middle": 22,
        "last": 10,
        "layers": 43,
    }
    assert "SGLang 0.5.23" in by_id["sglang.flags"].message and by_id["sglang.flags"].value == 5
    assert by_id["memory.per-gpu"].ok and 200 < by_id["memory.per-gpu"].value < 260


def test_deprecated_sglang_flag_is_only_a_warning(results):
    result = results["dp-attention-deprecated-flag"]
    assert not _failed(result, "rule.miles-dp-attention-required")
    assert result.status == "pass"


def _subject(tmp_path: Path, body: str, stage: str | None = None) -> Subject:
    path = tmp_path / "variant.yaml"
    path.write_text(f"extends: {PR_RECIPE}\n{body}")
    return Subject.of(load_recipe(path), stage)


@pytest.mark.parametrize(
    "value, fires",
    [
        ("true", False),
        ("True", False),
        ("YES", False),
        ("y", False),
        ("1", False),
        ("0", True),
        ("false", True),
        ("No", True),
        ("ture", True),  # EnvBool: invalid -> default (false)
    ],
)
def test_compressor_v2_read_as_sglang_envbool(tmp_path, value, fires):
    subject = _subject(tmp_path, f'env: {{SGLANG_OPT_USE_COMPRESSOR_V2: "{value}"}}\n')
    check = next(
        c for c in rules.rule_checks(subject) if c.id == "rule.rocm-unified-kv-needs-compressor-v2"
    )
    assert check.ok is not fires
    readable = [c for c in rules.rule_checks(subject) if c.id == "env.value-readable" and not c.ok]
    assert bool(readable) == (value == "ture")


def test_readers_match_sglang_source(monkeypatch):
    """Our readers agree with SGLang's own EnvBool.parse and get_bool_env_var (0.5.23)."""
    from recipeval.checks.fastimport import import_leaf

    environ = import_leaf("sglang.srt.environ", ("sglang",))
    common = import_leaf("sglang.srt.utils.common", ("sglang",))
    base = rules.rule_base()
    base_with = base.model_copy(
        update={
            "variables": {
                "X_ENVBOOL": rules.Variable(reader="sglang-envbool", default="false"),
                "X_GETBOOL": rules.Variable(reader="sglang-get-bool-env-var", default="false"),
            }
        }
    )
    for value in ["true", "TRUE", "1", "yes", "Y", "false", "0", "no", "n", "on", "2", "ture", ""]:
        try:
            expected = environ.EnvBool(False).parse(value)
        except ValueError:
            expected = False  # EnvField.get falls back to the default (False here)
        assert rules.read_bool(base_with, "X_ENVBOOL", value) == expected, value
        monkeypatch.setenv("X_GETBOOL", value)
        assert rules.read_bool(base_with, "X_GETBOOL", value) == common.get_bool_env_var(
            "X_GETBOOL"
        ), value


def test_int_reader_crashes_like_transformer_engine():
    base = rules.rule_base()
    assert rules.read_bool(base, "NVTE_ALLOW_NONDETERMINISTIC_ALGO", None) is True  # default "1"
    assert rules.read_bool(base, "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0") is False
    with pytest.raises(rules.Unreadable):
        rules.read_bool(base, "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "false")


def test_stage_overlay_is_checked_on_its_own_key(results, tmp_path):
    assert results["smoke-overlay-memory"].status == "pass"
    subject = Subject.of(load_recipe(BROKEN / "smoke-overlay-memory.yaml"), "smoke")
    check = next(c for c in memory.memory_checks(subject) if c.id == "memory.per-gpu")
    assert not check.ok and check.severity == "error"
    assert check.key == "stages.smoke.args.sglang-mem-fraction-static"


def test_unknown_gpu_is_info_not_a_guess(tmp_path):
    subject = _subject(tmp_path, "cluster: {gpu: Z9000}\n")
    checks = memory.memory_checks(subject)
    assert [(c.id, c.ok, c.severity) for c in checks] == [("memory.gpu-known", False, "info")]


def judged(
    subject: Subject, validators: _Validators, flags: dict | None, tmp_path: Path
) -> StageResult:
    """One recipe's env_check through the stage driver, as `env_check` runs it."""
    stage = env_check_stage(subject, validators, flags, 0, static=True, found=None)
    return run(stage, StageRequest(stage="env_check", loaded=subject.loaded, out=tmp_path / "out"))


def test_missing_validator_means_could_not_judge(tmp_path):
    subject = _subject(tmp_path, "")
    validators = _Validators(megatron_error="ModuleNotFoundError: No module named 'megatron'")
    result = judged(subject, validators, None, tmp_path)
    assert result.status == "error" and "pip install" in result.message
    assert read_result(tmp_path / "out" / "env_check.json") == result
    assert "env_check error" in (tmp_path / "out" / "env_check.log").read_text()
    assert exit_status(EnvCheckReport(results=[result]), exit_zero=False) == 3


def test_sglang_parser_missing_means_could_not_judge(tmp_path):
    from recipeval.checks.sglang_flags import FlagReport, sglang_words

    subject = _subject(tmp_path, "")
    flags = sglang_words(subject.args)
    validators = _Validators(sglang=FlagReport(None, {}, "cannot import SGLang's ServerArgs"))
    result = judged(subject, validators, flags, tmp_path)
    assert result.status == "error"
    assert "envs/sglang-cpu.txt" in _failed(result, "sglang.flags")[0].message


def test_live_probe_passes_cpu_recipe(machine):
    assert machine["platform"] == "cpu"
    checks = live.live_checks(Subject.of(load_recipe(TINY_RECIPE), None), machine)
    assert all(c.ok for c in checks), [c.message for c in checks if not c.ok]


def test_live_probe_fails_gpu_recipe_on_cpu_machine(machine):
    checks = live.live_checks(Subject.of(load_recipe(PR_RECIPE), None), machine)
    failed = {c.id: c for c in checks if not c.ok}
    assert failed["probe.platform"].severity == "error"
    assert "8 x MI355X per node (rocm)" in failed["probe.platform"].message
    assert "no GPU" in failed["probe.platform"].message


def test_live_probe_compares_gpu_model_and_count():
    h200_node = {
        "platform": "cuda",
        "torch": {
            "version": "2.9.1",
            "cuda": "13.0",
            "devices": [
                {"index": i, "name": "NVIDIA H200", "memory_bytes": 150_000_000_000}
                for i in range(8)
            ],
        },
        "packages": {
            "torch": "2.9.1",
            "sglang": "0.5.16",
            "megatron-core": "0.16.0",
            "ray": "2.55.1",
        },
    }
    ok = live.live_checks(Subject.of(load_recipe(H200_RECIPE), None), h200_node)
    assert not [c for c in ok if not c.ok and c.severity == "error"], [c.message for c in ok]
    wrong = {
        c.id
        for c in live.live_checks(Subject.of(load_recipe(PR_RECIPE), None), h200_node)
        if not c.ok
    }
    assert {"probe.platform", "probe.gpu-model"} <= wrong


# `python -m recipeval.checks.probe` on the lent H200 machine (one GPU), trimmed to what is compared.
H200_MACHINE = {
    "platform": "cuda",
    "torch": {
        "version": "2.11.0+cu130",
        "cuda": "13.0",
        "hip": None,
        "devices": [
            {"index": 0, "name": "NVIDIA H200", "memory_bytes": 150109880320, "arch": "sm_90"}
        ],
    },
    "nvml": {
        "driver": "580.159.04",
        "cuda_driver": "13.0",
        "devices": [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 150754820096}],
    },
    "packages": {
        "torch": "2.11.0",
        "sglang": None,
        "megatron-core": None,
        "ray": None,
        "transformers": "5.17.0",
        "triton": "3.6.0",
        "nvidia-ml-py": "13.610.43",
        "miles": None,
    },
    "ray": None,
}


def test_live_probe_of_a_one_gpu_h200_against_the_8_gpu_recipe():
    checks = {
        c.id: c for c in live.live_checks(Subject.of(load_recipe(H200_RECIPE), None), H200_MACHINE)
    }
    assert checks["probe.platform"].ok and checks["probe.gpu-model"].ok
    assert not checks["probe.gpu-count"].ok and checks["probe.gpu-count"].value == 1
    assert not checks["probe.packages"].ok and "sglang" in checks["probe.packages"].message
    trainer = checks["probe.trainer-env"]
    assert (
        not trainer.ok
        and trainer.severity == "warning"
        and "transformers 5.17.0" in trainer.message
    )


def test_unreachable_ray_cluster_fails_the_probe():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    found = {
        "platform": "cpu",
        "torch": {},
        "packages": {"torch": "x", "transformers": "y"},
        "ray": ray_cluster(f"127.0.0.1:{port}"),
    }
    check = next(
        c
        for c in live.live_checks(Subject.of(load_recipe(TINY_RECIPE), None), found)
        if c.id == "probe.ray"
    )
    assert not check.ok and f"127.0.0.1:{port}" in check.message and "refused" in check.message


def test_layout_probes_leave_the_process_excepthook_as_it_was():
    """torch wraps sys.excepthook on every init_process_group: after the explorer's probes a
    traceback carried one "[rank0]:" per probe on every line."""
    hook = sys.excepthook
    megatron = load_megatron()
    for tp, world in ((3, 6), (5, 10), (7, 14)):  # sizes no other test probes (cached)
        parallel_state_verdict(megatron, world, tp, 1, 1, 1, 1)
    assert sys.excepthook is hook
