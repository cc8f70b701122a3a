"""The benchmark table: one row per recipe and run, as Markdown, CSV and an HTML fragment."""

from __future__ import annotations

import html
import math
import re

import pandas as pd

from recipeval.publish.compare import RecipeVerdict
from recipeval.publish.records import RunRecord
from recipeval.recipe.facts import gpu_model_matches
from recipeval.recipe.schema import STAGES

# Column -> metric name endings to look for in a record, first match wins.
TIMING_COLUMNS = {
    "rollout time (s)": ("perf/rollout_time",),
    "actor train time (s)": ("perf/actor_train_time",),
    "cycle time (s)": ("cycle_time", "perf/step_time"),
    "tokens/s/GPU": ("tokens_per_gpu_per_sec", "perf/tokens_per_gpu_per_sec"),
}
LOGPROB_COLUMN = ("train_rollout_logprob_abs_diff",)
PACKAGES_SHOWN = ("sglang", "megatron-core", "torch", "ray", "transformers")
# A table cell keeps the start of a stage's message; the full text is in its result file.
CELL_CHARS = 110
# "(results/x/smoke.json)" in a gate message: the table's own columns already say which.
_RESULT_PATH = re.compile(r" \([^()\s]*\.json\)")
# Nested gate messages repeat their status ("skipped: skipped: gate ...").
_REPEATED_WORD = re.compile(r"\b(\w+: )(?:\1)+")


def short(text: str, limit: int = CELL_CHARS) -> str:
    """One line of at most `limit` characters (messages may carry log tails)."""
    flat = _RESULT_PATH.sub("", " ".join(text.split()))
    flat = _REPEATED_WORD.sub(r"\1", flat)
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def find_metric(
    record: RunRecord, endings: tuple[str, ...], stage: str | None = None
) -> str | None:
    for ending in endings:
        for name in sorted(record.metrics):
            if (stage is None or name.startswith(stage + ".")) and name.endswith(ending):
                return name
    return None


def _fmt(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return ""
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def with_interval(record: RunRecord, metric: str | None) -> str:
    """The metric's value with its 95 % interval in brackets, as the tables show it."""
    if metric is None:
        return ""
    text = _fmt(record.metrics[metric])
    if metric in record.intervals:
        low, high = record.intervals[metric]
        text += f" [{_fmt(low)}, {_fmt(high)}]"
    return text


def _history_text(verdict: RecipeVerdict | None) -> str:
    if verdict is None:
        return ""
    if verdict.status == "failed":
        return "failed: " + ", ".join(f.split(":", 1)[0] for f in verdict.failures)
    notes = [
        f"{m.kind} {m.metric.split('.', 1)[-1]} "
        + ("n/a" if m.rel_change is None else f"{m.rel_change:+.1%}")  # n/a: a baseline of 0
        for m in verdict.regressions + verdict.improvements
    ]
    if notes:
        return "; ".join(notes)
    if verdict.metrics and all(m.kind == "no_history" for m in verdict.metrics):
        return "first run"
    return "ok"


def _expect_text(record: RunRecord) -> str:
    if not record.expect:
        return ""
    off = [f"{k}: {v}" for k, v in record.expect.items() if v != "ok"]
    return "ok" if not off else "; ".join(off)


def _stage_text(record: RunRecord, stage: str) -> str:
    outcome = record.stages.get(stage)
    if outcome is None:
        return ""
    if outcome.status == "pass":
        return "pass"
    reason = outcome.message or "; ".join(outcome.failed_checks)
    # Stages may already start their message with the status ("skipped: gate ...").
    reason = reason.removeprefix(f"{outcome.status}:").strip()
    return short(f"{outcome.status}: {reason}") if reason else outcome.status


def _drift_text(rec: RunRecord) -> str:
    """Against the upstream launch at its commit: 'none', or the names that differ; empty when
    no checkout was configured."""
    if not rec.upstream:
        return ""
    names = [n for n in rec.upstream if n != "commit"]
    at = f" at {rec.upstream.get('commit', '')[:12]}"
    return (f"{len(names)}: {', '.join(names)}" if names else "none") + at


def _gpus_text(rec: RunRecord) -> str:
    """The recipe's GPUs, and the card the stages saw where it is not the recipe's: numbers
    from an MI300X night must not pass for MI355X numbers."""
    if not (rec.gpu and rec.nodes and rec.gpus_per_node):
        return "CPU"
    text = f"{rec.gpu} x {rec.nodes * rec.gpus_per_node}"
    seen = rec.provenance.get("gpu")
    if seen and not gpu_model_matches(rec.gpu, seen.split(", ")):
        text += f"; ran on {seen}"
    return text


def table(records: list[RunRecord], verdicts: dict[str, RecipeVerdict]) -> pd.DataFrame:
    rows = []
    for rec in records:
        # Verdicts first, then results, then what identifies the run: a screen shows the
        # columns that matter before it needs a scroll.
        row: dict[str, object] = {
            "recipe": rec.recipe,
            "vs history": _history_text(verdicts.get(rec.run_id)),
            "vs expect": _expect_text(rec),
        }
        for stage in STAGES:
            row[stage] = _stage_text(rec, stage)
        for column, endings in TIMING_COLUMNS.items():
            row[column] = with_interval(rec, find_metric(rec, endings, "bench"))
        row["logprob diff"] = with_interval(rec, find_metric(rec, LOGPROB_COLUMN, "logprob_diff"))
        row["upstream drift"] = _drift_text(rec)
        row.update(
            {
                "platform": rec.platform or "",
                "GPUs": _gpus_text(rec),
                "layout": rec.layout or "",
                "max response len": rec.max_response_len or "",
                "date": (rec.date or "")[:16].replace("T", " "),
                "recipe sha256": rec.recipe_sha256[:12],
                "packages": ", ".join(
                    f"{p} {rec.packages[p]}" for p in PACKAGES_SHOWN if p in rec.packages
                ),
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured table (pasteable into a PR or a release note)."""
    header = "| " + " | ".join(_md_cell(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join(_md_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)
    ]
    return "\n".join([header, rule, *body]) + "\n"


def to_html(frame: pd.DataFrame) -> str:
    """An HTML table whose status cells carry a class for colour."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for row in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, row):
            text = str(value)
            cls = _cell_class(column, text)
            cells.append(f'<td class="{cls}">{html.escape(text)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="results"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


# Columns whose text may be long (messages, package lists) wrap; the others stay on one line.
WRAPPING = (*STAGES, "vs history", "vs expect", "upstream drift", "packages")


def _cell_class(column: str, text: str) -> str:
    classes = ["msg" if column in WRAPPING else "nowrap"]
    if column in STAGES or column in ("vs history", "vs expect"):
        for word, cls in (
            ("pass", "pass"),
            ("ok", "pass"),
            ("fail", "fail"),
            ("error", "fail"),
            ("regression", "fail"),
            ("skipped", "skip"),
            ("improvement", "better"),
            ("first run", "skip"),
        ):
            if text.startswith(word):
                classes.append(cls)
                break
    return " ".join(classes)
