"""One run of one recipe, as publish sees it: the stage results folded into a flat record that
the tables, the history and the regression verdict share."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from recipeval.errors import unreadable_reason
from recipeval.names import UnsafeName, check_name
from recipeval.recipe.schema import STAGE_GATES, STAGES
from recipeval.result import StageResult, read_result
from recipeval.secrets import fingerprint_secret, fingerprint_secrets

RECORD_SCHEMA = 1
# Provenance fields "what changed" compares besides packages.
PROVENANCE_FIELDS = ("launcher_revision", "host", "gpu", "python")
# Keys of a metric's dict that hold its estimate and interval (analysis.steady_state's shape).
_ESTIMATE, _LOW, _HIGH = "estimate", "low", "high"


class StageSummary(BaseModel):
    status: str
    message: str = ""
    failed_checks: list[str] = Field(default_factory=list)
    started: str | None = None
    finished: str | None = None


class RunRecord(BaseModel):
    """What the history keeps of one run of one recipe."""

    schema_version: int = RECORD_SCHEMA
    run_id: str
    recipe: str
    recipe_sha256: str
    recipe_path: str | None = None
    date: str | None = None
    platform: str | None = None
    gpu: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    layout: str | None = None
    max_response_len: int | None = None
    stages: dict[str, StageSummary] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    intervals: dict[str, tuple[float, float]] = Field(default_factory=dict)
    expect: dict[str, str] = Field(default_factory=dict, description="check id -> message")
    packages: dict[str, str] = Field(default_factory=dict)
    provenance: dict[str, str | None] = Field(default_factory=dict)
    recipe_values: dict[str, Any] = Field(default_factory=dict)
    upstream: dict[str, str] = Field(
        default_factory=dict,
        description="env_check's drift check: 'commit' (upstream's) and each drifted flag or "
        "env var -> 'upstream -> ours'; empty where no checkout was configured",
    )

    def stage_ok(self, stage: str) -> bool:
        outcome = self.stages.get(stage)
        return outcome is not None and outcome.status == "pass"

    @property
    def failed(self) -> bool:
        return any(o.status in ("fail", "error") for o in self.stages.values())


# env_check's upstream-drift check ids end so (checks/drift.py: `<engine>.drift`).
DRIFT_CHECK_SUFFIX = ".drift"


def _number(value: Any) -> float | None:
    """A finite number as float, else None: a nan or inf (a stage that measured a NaN loss)
    is the stage's own failure to report, not a level the history can hold or compare."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def summary_metrics(
    stage: str, summary: dict[str, Any]
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Numeric leaves of a stage summary as `<stage>.<path>`; a dict with an `estimate` is one
    metric whose `low`/`high` become its interval."""
    metrics: dict[str, float] = {}
    intervals: dict[str, tuple[float, float]] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            est = _number(node.get(_ESTIMATE))
            if est is not None:
                metrics[path] = est
                low, high = _number(node.get(_LOW)), _number(node.get(_HIGH))
                if low is not None and high is not None:
                    intervals[path] = (low, high)
                return
            for key, value in node.items():
                walk(value, f"{path}.{key}")
            return
        num = _number(node)
        if num is not None:
            metrics[path] = num

    walk(summary, stage)
    return metrics, intervals


def recipe_facts(results: list[StageResult]) -> dict[str, Any]:
    """The recipe facts the stages recorded as they ran, in stage order, a later stage's
    winning (the bench's response length is the one its step times were measured at)."""
    facts: dict[str, Any] = {}
    for res in results:
        facts |= {k: v for k, v in res.recipe_facts.items() if k in RunRecord.model_fields}
    if "recipe_values" in facts:
        facts["recipe_values"] = fingerprint_secrets(facts["recipe_values"])
    return facts


def _run_id(results: list[StageResult]) -> str:
    """Stable for the same set of results, so publishing twice never adds a second history
    entry for one run."""
    key = [
        (r.stage, r.provenance.recipe_sha256, r.provenance.started, r.provenance.finished, r.status)
        for r in results
    ]
    return hashlib.sha256(json.dumps(sorted(key, key=str)).encode()).hexdigest()[:16]


def upstream_of(drift: dict[str, Any]) -> dict[str, str]:
    """The drift check's value as the history keeps it: the upstream commit, and each flag or
    env var that differs (`flag.lr`, `env.NCCL_X`) as 'upstream -> ours', secrets fingerprinted
    on both sides."""
    out: dict[str, Any] = {"commit": str(drift.get("upstream_commit", ""))}
    for diff in drift.get("differences", []):
        name = f"{diff.get('kind', '')}.{diff.get('name', '')}"
        upstream = fingerprint_secret(name, diff.get("expected"))
        ours = fingerprint_secret(name, diff.get("actual"))
        out[name] = f"{upstream!r} -> {ours!r}"
    return out


def build_record(results: Iterable[StageResult]) -> RunRecord:
    """Fold one recipe's stage results (any subset of the stages) into a RunRecord."""
    ordered = sorted(results, key=lambda r: STAGES.index(r.stage) if r.stage in STAGES else 99)
    if not ordered:
        raise ValueError("no stage results")
    first = ordered[0]
    metrics: dict[str, float] = {}
    intervals: dict[str, tuple[float, float]] = {}
    stages: dict[str, StageSummary] = {}
    packages: dict[str, str] = {}
    provenance: dict[str, str | None] = {}
    expect: dict[str, str] = {}
    upstream: dict[str, str] = {}
    for res in ordered:
        prov = res.provenance
        stages[res.stage] = StageSummary(
            status=res.status,
            message=res.message,
            failed_checks=[
                f"{c.id}: {c.message}" if c.message else c.id for c in res.failed_checks()
            ],
            started=prov.started,
            finished=prov.finished,
        )
        m, iv = summary_metrics(res.stage, res.summary)
        metrics.update(m)
        intervals.update(iv)
        packages.update(prov.packages)
        for name in PROVENANCE_FIELDS:
            if getattr(prov, name, None):
                provenance[name] = getattr(prov, name)
        for check in res.checks:
            if "expect" in check.id:
                expect[check.id] = "ok" if check.ok else (check.message or "outside the band")
            if check.id.endswith(DRIFT_CHECK_SUFFIX) and isinstance(check.value, dict):
                upstream = upstream_of(check.value)
    dates = [r.provenance.finished or r.provenance.started for r in ordered]
    facts = recipe_facts(ordered)
    return RunRecord(
        run_id=_run_id(ordered),
        recipe=first.recipe,
        recipe_sha256=first.provenance.recipe_sha256,
        recipe_path=first.provenance.recipe_path,
        date=max((d for d in dates if d), default=None),
        stages=stages,
        metrics=metrics,
        intervals=intervals,
        expect=expect,
        packages=packages,
        provenance=provenance,
        upstream=upstream,
        **facts,
    )


def result_files(paths: Iterable[Path]) -> list[Path]:
    """The stage result files publish reads from `paths`: a directory is a results folder
    (`<dir>/*/<stage>.json`) or one recipe's folder (`<dir>/<stage>.json`)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(
                p
                for stage in STAGES
                for pattern in (f"*/{stage}.json", f"{stage}.json")
                for p in path.glob(pattern)
            )
        else:
            files.append(path)
    return files


# Stages of one run may start on different hosts (env_check on the submit host, the others on
# a compute node), whose clocks may disagree by a little; a result from an earlier run is
# older than its gate by the time between two runs.
STALE_AFTER = timedelta(minutes=5)


def _started(result: StageResult) -> datetime | None:
    # Provenance took only times with a UTC offset, so any two compare.
    started = result.provenance.started
    return datetime.fromisoformat(started) if started else None


def stale_results(results: list[StageResult]) -> list[tuple[StageResult, StageResult]]:
    """(result, gate) pairs of one recipe's results where the result started more than
    STALE_AFTER before a stage that gates it (directly or through another) started: a result
    left from an earlier run after its gate ran again (a killed nightly), which is not a
    measurement of this run."""
    by_stage = {result.stage: result for result in results}

    def gates(stage: str) -> list[str]:
        direct = STAGE_GATES.get(stage, ())
        return [*direct, *(g for gate in direct for g in gates(gate))]

    stale = []
    for result in results:
        started = _started(result)
        for gate in gates(result.stage):
            gate_started = _started(by_stage[gate]) if gate in by_stage else None
            if started and gate_started and gate_started - started > STALE_AFTER:
                stale.append((result, by_stage[gate]))
                break
    return stale


def collect_results(paths: Iterable[Path]) -> dict[str, list[StageResult]]:
    """Read the stage result files of `paths` (result_files) grouped by recipe."""
    grouped: dict[str, list[StageResult]] = {}
    for file in result_files(paths):
        try:
            res = _locate_artifacts(read_result(file), file.parent)
        except OSError as err:
            raise ValueError(f"{file}: {unreadable_reason(err)}") from None
        except ValueError as err:  # read_result validates every field publish uses
            raise ValueError(
                f"{file}: {unreadable_reason(err)}; correct it or run its stage again"
            ) from None
        try:
            check_name(res.recipe)
        except UnsafeName as err:
            raise ValueError(f"{file}: {err}") from None
        grouped.setdefault(res.recipe, []).append(res)
    return grouped


def _locate_artifacts(res: StageResult, folder: Path) -> StageResult:
    """A stage records its artifacts' paths as it saw them (relative to where it ran); one that
    does not resolve from here is taken from beside the result file, where stages write them,
    so publish works from any directory and on a copied results folder."""
    found = {
        key: str(folder / Path(value).name)
        for key, value in res.artifacts.items()
        if not Path(value).exists() and (folder / Path(value).name).is_file()
    }
    return res.model_copy(update={"artifacts": {**res.artifacts, **found}}) if found else res
