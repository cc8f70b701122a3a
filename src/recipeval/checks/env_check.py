"""env_check as a stage: load the recipes, start SGLang's flag parser in a worker while
megatron-core imports here, then run each recipe's checks through the stage driver
(stages.driver.run), which builds and writes its StageResult as for every other stage."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipeval.atomic import atomic_write_text
from recipeval.checks import context, layout, memory, rules
from recipeval.checks.arg_types import integer_flag_checks
from recipeval.checks.drift import drift_check
from recipeval.checks.exec_env import exec_env_checks
from recipeval.checks.sglang_flags import FlagChecker, FlagReport, flag_checks, sglang_words
from recipeval.checks.subject import Subject
from recipeval.errors import UsageError
from recipeval.exit_codes import EXIT_BAD_INPUT, exit_code
from recipeval.recipe import STAGES, InvalidRecipe, LoadedRecipe, load_recipe
from recipeval.result import Check, StageResult
from recipeval.stages.common import Judgement, StageRequest
from recipeval.stages.driver import Stage, Verdict, run

STAGE = "env_check"
# Checks that fail when a validator could not run at all: the stage could not judge.
UNJUDGED = {"megatron.available", "sglang.flags", "rules.file"}


@dataclass
class EnvCheckReport:
    results: list[StageResult] = field(default_factory=list)
    bad_input: list[str] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)  # the result files, when --out was given


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
        except InvalidRecipe as errs:
            bad.extend(str(e) for e in errs.errors)
    return loaded, bad


def _prepare(
    subjects: list[Subject], checker: FlagChecker | None
) -> tuple[_Validators, dict[int, dict[str, list[str]]]]:
    """Import megatron-core while SGLang's worker imports, then collect SGLang's verdicts."""
    validators = _Validators()
    stack = [i for i, s in enumerate(subjects) if s.engine.trainer_stack_checks]
    flags = {i: sglang_words(subjects[i].args) for i in stack}
    try:
        if stack:
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
    # The rollout engines' tiling sits beside the layout arithmetic: both are checked before a
    # job starts, so a recipe miles would refuse at start-up fails here (the explorer runs both).
    checks = integer_flag_checks(subject)
    checks += layout.arithmetic_checks(subject) + context.rollout_engine_checks(subject)
    if subject.engine.trainer_stack_checks:
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
    if validators.megatron is not None and subject.engine.trainer_stack_checks and global_batch:
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


def judge(subject: Subject, checks: list[Check], static: bool, extra: dict[str, Any]) -> Judgement:
    """A check that could not run at all makes the stage unable to judge (status error)."""
    unjudged = [c for c in checks if not c.ok and c.id in UNJUDGED]
    summary = {**_summary(checks), "static": static, "stage_overlay": subject.stage, **extra}
    errors = [c for c in checks if not c.ok and c.severity == "error"]
    if errors:
        message = f"{len(errors)} error(s): " + "; ".join(
            f"{c.id}: {c.message}" for c in errors[:3]
        )
    else:
        message = f"no error; {summary['warnings']} warning(s)"
    return Judgement(
        checks=checks,
        summary=summary,
        message=message,
        error=unjudged[0].message if unjudged else None,
    )


def env_check_stage(
    subject: Subject,
    validators: _Validators,
    flags: dict[str, list[str]] | None,
    index: int,
    static: bool,
    found: dict[str, Any] | None,
) -> Stage:
    """env_check of one recipe as a Stage: it launches nothing; it runs the checks and writes
    the report lines beside its result as the stage log."""

    def execute(request: StageRequest) -> Verdict:
        checks = static_checks(subject, validators, flags, index)
        extra: dict[str, Any] = {"timings": validators.timings}
        gpu = None
        if not static and found is not None:
            from recipeval.checks.live import live_checks

            checks += live_checks(subject, found)
            extra["probe"] = found
            names = sorted({d.get("name") for d in (found.get("torch") or {}).get("devices", [])})
            gpu = ", ".join(n for n in names if n) or None
        judgement = judge(subject, checks, static, extra)
        if request.out is not None:
            lines = report_lines(judgement.status, subject.recipe.name, judgement.verdict, checks)
            atomic_write_text(request.artifact(".log"), "\n".join(lines) + "\n")
        return Verdict(judgement, gpu=gpu)

    return Stage(name=STAGE, execute=execute)


def env_check(
    paths: list[Path],
    static: bool = True,
    stage: str | None = None,
    found: dict[str, Any] | None = None,
    out: Path | None = None,
) -> EnvCheckReport:
    """Check every recipe, each through the stage driver; `found` is a probe already taken
    (else one is taken when not static); `out` as output_paths says (None: write nothing)."""
    # SGLang's worker starts before anything else: its import is the longest single step and
    # overlaps recipe loading and megatron-core's import here; stopped unused if no recipe has
    # --sglang-* flags.
    checker = FlagChecker()
    try:
        loaded, bad = load_all(paths, stage)
        files = (
            output_paths([item.recipe.name for item in loaded], out) if out is not None else None
        )
    except BaseException:
        checker.close()
        raise
    report = EnvCheckReport(bad_input=bad)
    subjects = [Subject.of(item, stage or STAGE) for item in loaded]
    validators, flags = _prepare(subjects, checker)
    if not static and found is None and subjects:
        from recipeval.checks.probe import probe

        found = probe()
    for index, subject in enumerate(subjects):
        result_file = files[index] if files is not None else None
        request = StageRequest(
            stage=STAGE,
            loaded=subject.loaded,
            out=result_file.parent if result_file else None,
            result_file=result_file,
        )
        env_stage = env_check_stage(subject, validators, flags.get(index), index, static, found)
        report.results.append(run(env_stage, request))
        if result_file is not None:
            report.written.append(result_file)
    return report


def output_paths(names: list[str], out: Path) -> list[Path]:
    """--out FILE.json (one recipe), DIR/env_check.json (one recipe), or
    DIR/<recipe>/env_check.json (several); UsageError when that cannot hold them."""
    if out.suffix == ".json":
        if len(names) > 1:
            raise UsageError(
                f"--out {out}: a .json file holds one recipe's result; give a folder "
                f"for {len(names)} recipes"
            )
        return [out]
    if len(names) == 1:
        return [out / f"{STAGE}.json"]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UsageError(
            f"recipes share the name {', '.join(duplicates)}: their results would "
            "overwrite each other in --out; check them in separate calls"
        )
    return [out / name / f"{STAGE}.json" for name in names]


def report_lines(status: str, recipe: str, message: str, checks: list[Check]) -> list[str]:
    lines = [f"{STAGE} {status}: {recipe}: {message.splitlines()[0] if message else ''}"]
    for check in checks:
        if not check.ok and check.severity != "info":
            lines.append(f"  {check.severity.upper():7} {check.id}: {check.message}")
    return lines


def exit_status(report: EnvCheckReport, exit_zero: bool) -> int:
    """2 when a recipe could not be read, else the stage results' code (exit_codes)."""
    if report.bad_input:
        return EXIT_BAD_INPUT
    return exit_code([r.status for r in report.results], exit_zero)
