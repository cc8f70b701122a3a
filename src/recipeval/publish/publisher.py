"""`recipeval publish`: stage results -> history, regression verdict, tables, page, JUnit."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipeval.analysis.regression import RegressionSettings
from recipeval.atomic import atomic_write_text
from recipeval.exit_codes import FAILING_VERDICTS
from recipeval.names import UnsafeName
from recipeval.publish import attribution, history, layout_table, tables
from recipeval.publish.compare import RecipeVerdict, judge_run
from recipeval.publish.figures import all_figures, write_figures
from recipeval.publish.junit import junit_text
from recipeval.publish.page import render_page
from recipeval.publish.records import RunRecord, build_record, collect_results, stale_results
from recipeval.result import StageResult, now_iso
from recipeval.secrets import scrub, secret_values


class PublishError(Exception):
    """Input publish cannot use, or an output it cannot write (one line, names the file)."""


PAGE_TABLES = ("benchmarks.md", "benchmarks.csv", "benchmarks.html")


@dataclass(frozen=True)
class PublishOutputs:
    tables: Path
    history: Path
    junit: Path
    verdict: Path
    plot_dir: Path | None = None  # None: <tables>/plots

    @property
    def plots(self) -> Path:
        return self.plot_dir or self.tables / "plots"

    def table_files(self) -> list[Path]:
        """Every file publish may write or remove in the tables folder."""
        names = (*PAGE_TABLES, *layout_table.FILES, *attribution.FILES)
        return [self.tables / name for name in names]

    @classmethod
    def under(cls, results: Path, history_dir: Path | None = None) -> PublishOutputs:
        return cls(
            results / "tables",
            history_dir or results / "history",
            results / "junit.xml",
            results / "regression.json",
        )


@dataclass
class PublishReport:
    records: list[RunRecord]
    verdicts: dict[str, RecipeVerdict]
    added_to_history: int

    @property
    def ok(self) -> bool:
        return not any(v.status in FAILING_VERDICTS for v in self.verdicts.values())


def _write_text(path: Path, text: str) -> None:
    atomic_write_text(path, scrub(text, secret_values()))


def _stage_results(inputs: list[Path]) -> dict[str, list[StageResult]]:
    for path in inputs:
        if not path.exists():
            raise PublishError(f"{path}: no such result file or directory")
    try:
        grouped = collect_results(inputs)
    except (ValueError, OSError) as err:  # ValueError names the file (collect_results)
        raise PublishError(f"unreadable stage result {err}") from None
    if not grouped:
        raise PublishError("no stage results found in " + ", ".join(map(str, inputs)))
    for name, results in grouped.items():
        for result, gate in stale_results(results):
            print(
                f"recipeval: {name}: its {result.stage} result ({result.provenance.started}) "
                f"predates its gate {gate.stage} ({gate.provenance.started}), so it is an earlier "
                f"run's; left out of this run",
                file=sys.stderr,
            )
            results.remove(result)
    return dict(sorted(grouped.items()))


def verdict_document(outcome: PublishReport, generated: str) -> dict:
    return {
        "generated": generated,
        "ok": outcome.ok,
        "recipes": [v.to_dict() for v in outcome.verdicts.values()],
    }


def publish(
    inputs: list[Path], out: PublishOutputs, settings: RegressionSettings, plots: bool = True
) -> PublishReport:
    grouped = _stage_results(inputs)
    records = [build_record(results) for results in grouped.values()]
    try:  # before the history grows: a bad file must leave it as it was
        acks = history.acknowledgements(out.history)
    except ValueError as err:
        raise PublishError(str(err)) from None
    try:
        added = sum(history.append(out.history, rec) for rec in records)
    except OSError as err:  # a history folder it may not write (read-only, immutable, full)
        raise PublishError(
            f"cannot write the history {err.filename or out.history}: {err.strerror or err}; "
            "publish again once it can be written (a run already added is not added twice)"
        ) from None
    except UnsafeName as err:  # a recipe's folder in the history links elsewhere
        raise PublishError(f"{err}; make it a folder of the history") from None
    runs = history.load(out.history)
    verdicts = {rec.run_id: judge_run(rec, runs, settings, acks) for rec in records}
    outcome = PublishReport(records, verdicts, added)
    try:
        _write_outputs(out, outcome, runs, grouped, plots)
    except OSError as err:  # the checks before could not see it: a full disk, a read-only mount
        raise PublishError(
            f"cannot write {err.filename or out.tables}: {err.strerror or err}; the history "
            "already holds this run, so publish again once the outputs can be written"
        ) from None
    return outcome


def _write_outputs(
    out: PublishOutputs,
    outcome: PublishReport,
    runs: list[RunRecord],
    grouped: dict[str, list[StageResult]],
    plots: bool,
) -> None:
    records, verdicts = outcome.records, outcome.verdicts
    generated = now_iso()
    frame = tables.table(records, verdicts)
    history_frame = history.to_frame(runs)
    _write_text(out.tables / "benchmarks.md", tables.to_markdown(frame))
    _write_text(out.tables / "benchmarks.csv", frame.to_csv(index=False))
    # Tables that exist only for some runs (a layouts sweep, an ablation): an earlier
    # publish's copy goes when this one has none, so a table never shows runs it did not see.
    for names, files in (
        (layout_table.FILES, layout_table.outputs(records)),
        (attribution.FILES, attribution.outputs(records, grouped)),
    ):
        for name in names:
            if name in files:
                _write_text(out.tables / name, files[name])
            else:
                (out.tables / name).unlink(missing_ok=True)
    figures = None
    if plots:
        stage_results = [r for results in grouped.values() for r in results]
        figures = all_figures(records, verdicts, history_frame, stage_results)
        write_figures(figures, out.plots)
    _write_text(
        out.tables / "benchmarks.html", render_page(records, verdicts, frame, generated, figures)
    )
    history.rebuild_parquet(out.history)
    _write_text(out.junit, junit_text(records, verdicts))
    document = _finite(verdict_document(outcome, generated))
    verdict = json.dumps(document, indent=1, default=str, allow_nan=False)
    _write_text(out.verdict, verdict + "\n")


def _finite(value: Any) -> Any:
    """`value` with each NaN or infinity as None: JSON has neither, so a reader of the verdict
    (nightly, CI) would reject the file, and failing here would leave the history updated and
    the outputs half written."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def summary_lines(outcome: PublishReport) -> list[str]:
    """What a terminal or a CI log shows: one line per recipe, then what changed."""
    lines = []
    for verdict in outcome.verdicts.values():
        lines.append(f"{verdict.status:9} {verdict.recipe}")
        for failure in verdict.failures:
            lines.append(f"          {failure}")
        for m in verdict.regressions + verdict.improvements:
            lines.append(f"          {m.kind} {m.metric}: {m.reason}")
        for c in verdict.changes:
            lines.append(f"          changed {c.kind} {c.key}: {c.before} -> {c.after}")
    return [scrub(line, secret_values()) for line in lines]
