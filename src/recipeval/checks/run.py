"""Assemble env_check: load the recipes, start SGLang's flag parser in a worker while
megatron-core imports here, run every check per recipe, and build one StageResult each."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipeval.checks import context, layout, memory, rules
from recipeval.checks.drift import drift_check
from recipeval.checks.exec_env import exec_env_checks
from recipeval.checks.sglang_flags import FlagChecker, FlagReport, flag_checks, sglang_words
from recipeval.checks.subject import Subject
from recipeval.recipe import STAGES, LoadedRecipe, RecipeErrors, load_recipe
from recipeval.result import (
    Check,
    Provenance,
    StageResult,
    now_iso,
    provenance,
    status_from_checks,
    write_result,
)

STAGE = "env_check"
# Checks that fail when a validator could not run at all: the stage could not judge.
UNJUDGED = {"megatron.available", "sglang.flags", "rules.file"}


@dataclass
class Outcome:
    results: list[StageResult] = field(default_factory=list)
    bad_input: list[str] = field(default_factory=list)


@dataclass
class _Validators:
    megatron: layout.Megatron | None = None
    megatron_error: str | None = None
    sglang: FlagReport | None = None
    timings: dict[str, float] = field(default_factory=dict)


def load_all(paths: list[Path], stage: str | None) -> tuple[list[LoadedRecipe], list[str]]:
    loaded, bad = [], []
    if stage is not None and stage not in STAGES:
        return [], [f"--stage {stage!r} is not a stage; choose one of: {', '.join(STAGES)}"]
    for path in paths:
        try:
            loaded.append(load_recipe(path))
        except RecipeErrors as errs:
            bad.extend(str(e) for e in errs.errors)
    return loaded, bad


def _prepare(
    subjects: list[Subject], checker: FlagChecker | None
) -> tuple[_Validators, dict[int, dict[str, list[str]]]]:
    """Import megatron-core while SGLang's worker imports, then collect SGLang's verdicts."""
    validators = _Validators()
    miles = [i for i, s in enumerate(subjects) if s.recipe.engine == "miles"]
    flags = {i: sglang_words(subjects[i].args) for i in miles}
    try:
        if miles:
            start = time.perf_counter()
            try:
                validators.megatron = layout.load_megatron()
            except Exception as err:  # noqa: BLE001 - reported as "could not judge"
                validators.megatron_error = f"{type(err).__name__}: {err}"
            validators.timings["megatron_import_s"] = round(time.perf_counter() - start, 2)
        if checker is not None and any(flags.values()):
            start = time.perf_counter()
            validators.sglang = checker.judge(
                {f"{i}:{flag}": words for i, fl in flags.items() for flag, words in fl.items()}
            )
            validators.timings["sglang_wait_s"] = round(time.perf_counter() - start, 2)
            if validators.sglang.cpu_s is not None:
                validators.timings["sglang_worker_cpu_s"] = validators.sglang.cpu_s
    finally:
        if checker is not None:
            checker.close()
    return validators, flags


def static_checks(
    subject: Subject, validators: _Validators, flags: dict[str, list[str]] | None, index: int
) -> list[Check]:
    checks = layout.arithmetic_checks(subject)
    if subject.recipe.engine == "miles":
        if validators.megatron is not None:
            checks += layout.megatron_checks(subject, validators.megatron)
        else:
            checks.append(
                subject.check(
                    "megatron.available",
                    False,
                    f"megatron-core not importable ({validators.megatron_error}); "
                    "install it: pip install 'recipeval[checks]'",
                )
            )
        if flags:
            checks += flag_checks(subject, flags, validators.sglang, f"{index}:")
        if (upstream := drift_check(subject.resolved)) is not None:
            checks.append(upstream)
    try:
        checks += rules.rule_checks(subject)
    except rules.RuleFileError as err:
        checks.append(subject.check("rules.file", False, str(err)))
    checks += memory.memory_checks(subject)
    checks += exec_env_checks(subject)
    checks += context.context_checks(subject)
    checks += context.batch_checks(subject)
    global_batch = context.global_batch(subject)
    if validators.megatron is not None and subject.recipe.engine == "miles" and global_batch:
        micro = layout.microbatch_check(subject, validators.megatron, global_batch)
        if micro is not None:
            checks.append(micro)
    return checks


def _summary(checks: list[Check]) -> dict[str, Any]:
    failed = [c for c in checks if not c.ok]
    return {
        "checks": len(checks),
        "errors": sum(c.severity == "error" for c in failed),
        "warnings": sum(c.severity == "warning" for c in failed),
        "infos": sum(c.severity == "info" for c in failed),
        "failed": sorted({c.id for c in failed}),
    }


def build_result(
    subject: Subject, checks: list[Check], template: Provenance, static: bool, extra: dict[str, Any]
) -> StageResult:
    """`template`: provenance shared by the recipes of one call (packages, host, revision)."""
    unjudged = [c for c in checks if not c.ok and c.id in UNJUDGED]
    status = "error" if unjudged else status_from_checks(checks)
    summary = {**_summary(checks), "static": static, "stage_overlay": subject.stage, **extra}
    errors = [c for c in checks if not c.ok and c.severity == "error"]
    if unjudged:
        message = unjudged[0].message
    elif errors:
        message = f"{len(errors)} error(s): " + "; ".join(
            f"{c.id}: {c.message}" for c in errors[:3]
        )
    else:
        message = f"no error; {summary['warnings']} warning(s)"
    prov = template.model_copy(
        update={
            "recipe": subject.recipe.name,
            "recipe_path": str(subject.loaded.path),
            "recipe_sha256": subject.loaded.sha256,
            "finished": now_iso(),
        }
    )
    return StageResult(
        stage=STAGE,
        recipe=subject.recipe.name,
        status=status,
        checks=checks,
        summary=summary,
        provenance=prov,
        message=message,
    )


def env_check(
    paths: list[Path],
    static: bool = True,
    stage: str | None = None,
    found: dict[str, Any] | None = None,
) -> Outcome:
    """Check every recipe; `found` is a probe already taken (else one is taken when not static)."""
    started = now_iso()
    # SGLang's worker starts before anything else: its import is the longest single step and
    # overlaps recipe loading and megatron-core's import here; stopped unused if no recipe has
    # --sglang-* flags.
    checker = FlagChecker()
    try:
        loaded, bad = load_all(paths, stage)
    except BaseException:
        checker.close()
        raise
    outcome = Outcome(bad_input=bad)
    subjects = [Subject.of(item, stage or STAGE) for item in loaded]
    validators, flags = _prepare(subjects, checker)
    if not static and found is None and subjects:
        from recipeval.checks.probe import probe

        found = probe()
    template = provenance("", "", STAGE, None, started)
    for index, subject in enumerate(subjects):
        checks = static_checks(subject, validators, flags.get(index), index)
        extra: dict[str, Any] = {"timings": validators.timings}
        if not static and found is not None:
            from recipeval.checks.live import live_checks

            checks += live_checks(subject, found)
            extra["probe"] = found
        result = build_result(subject, checks, template, static, extra)
        if found is not None and not static:
            names = sorted({d.get("name") for d in (found.get("torch") or {}).get("devices", [])})
            result.provenance.gpu = ", ".join(n for n in names if n) or None
        outcome.results.append(result)
    return outcome


def output_paths(results: list[StageResult], out: Path) -> list[Path]:
    """--out FILE.json (one recipe), DIR/env_check.json (one recipe), or
    DIR/<recipe>/env_check.json (several)."""
    if out.suffix == ".json":
        if len(results) > 1:
            raise ValueError(
                f"--out {out}: a .json file holds one recipe's result; give a folder "
                f"for {len(results)} recipes"
            )
        return [out]
    if len(results) == 1:
        return [out / f"{STAGE}.json"]
    names = [r.recipe for r in results]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"recipes share the name {', '.join(duplicates)}: their results would "
            "overwrite each other in --out; check them in separate calls"
        )
    return [out / r.recipe / f"{STAGE}.json" for r in results]


def report_lines(result: StageResult) -> list[str]:
    lines = [
        f"{STAGE} {result.status}: {result.recipe}: {result.message.splitlines()[0] if result.message else ''}"
    ]
    for check in result.checks:
        if not check.ok and check.severity != "info":
            lines.append(f"  {check.severity.upper():7} {check.id}: {check.message}")
    return lines


def write_outputs(outcome: Outcome, out: Path) -> list[Path]:
    paths = output_paths(outcome.results, out)
    for result, path in zip(outcome.results, paths):
        log = path.with_suffix(".log")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = log.with_name(f".{log.name}.tmp")
        tmp.write_text("\n".join(report_lines(result)) + "\n")
        tmp.replace(log)
        result.artifacts["log"] = str(log)
        write_result(result, path)
    return paths


def exit_code(outcome: Outcome, exit_zero: bool) -> int:
    """0 pass, 1 an error-severity check failed, 2 unusable input, 3 could not judge."""
    if outcome.bad_input:
        return 2
    if exit_zero:
        return 0
    statuses = {r.status for r in outcome.results}
    if "error" in statuses:
        return 3
    return 1 if "fail" in statuses else 0
