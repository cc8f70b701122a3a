"""The HTML page: summary, table, what changed, plots; self-contained (inline CSS, PNGs as
data URIs), so it works opened from disk and as a CI artifact."""

from __future__ import annotations

import base64
import html

import pandas as pd

from recipeval.exit_codes import FAILING_VERDICTS
from recipeval.publish.compare import RecipeVerdict
from recipeval.publish.figures import Figure
from recipeval.publish.records import RunRecord
from recipeval.publish.tables import short, to_html

STYLE = """
body { font: 14px/1.4 system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.meta { color: #666; font-size: 0.9em; }
.verdict { display: inline-block; padding: 0.2em 0.6em; border-radius: 4px; font-weight: 600; }
.scroll { overflow-x: auto; }
table.results { border-collapse: collapse; font-size: 11.5px; }
table.results th, table.results td { border: 1px solid #ccc; padding: 3px 6px; vertical-align: top; }
table.results th { background: #f0f0f0; position: sticky; top: 0; }
table.results td.nowrap { white-space: nowrap; }
table.results td.msg { min-width: 7em; max-width: 16em; overflow-wrap: anywhere; }
td.pass, .verdict.pass { background: #e3f4e6; } td.fail, .verdict.fail { background: #fbe3e1; }
td.skip { background: #f4f4f4; color: #666; } td.better, .verdict.better { background: #e1edfb; }
table.changes { border-collapse: collapse; font-size: 12px; margin: 0.4em 0 1em; }
table.changes td, table.changes th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
.plots figure { display: inline-block; vertical-align: top; margin: 4px; max-width: 100%; }
.plots img { border: 1px solid #eee; max-width: 100%; }
.plots figcaption { font-size: 0.85em; color: #555; }
"""


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _changes_html(verdict: RecipeVerdict) -> str:
    lines = []
    for m in verdict.regressions + verdict.improvements:
        lines.append(
            f"<li><b>{html.escape(m.kind)}</b> {html.escape(m.metric)}: "
            f"{m.value:.4g} vs {m.baseline:.4g} ({html.escape(m.reason)})</li>"
        )
    for failure in verdict.failures:
        lines.append(f"<li><b>failure</b> {html.escape(short(failure, 600))}</li>")
    out = f"<h3>{html.escape(verdict.recipe)}: {html.escape(verdict.status)}</h3><ul>{''.join(lines)}</ul>"
    if verdict.last_good_run is None:
        return out + "<p>No earlier good run to compare with.</p>"
    before = f"<code>{html.escape(verdict.last_good_run)}</code>"
    # With a change point, "what changed" is against the last run before the earliest night it
    # may have started on: last night's run may already be at the new level.
    if verdict.change_run:
        first, last = verdict.change_span or (verdict.change_run, verdict.change_run)
        span = (
            f", or anywhere from <code>{html.escape(first)}</code> to <code>{html.escape(last)}</code>"
            if first != last
            else ""
        )
        against = (
            f"the last run before the change point, {before} (the change point is at "
            f"<code>{html.escape(verdict.change_run)}</code>{span})"
        )
    else:
        against = f"the last good run {before}"
    if not verdict.changes:
        return out + (f"<p>Nothing differs from {against} in recipe, packages or provenance.</p>")
    rows = "".join(
        f"<tr><td>{html.escape(c.kind)}</td><td>{html.escape(str(c.key))}</td>"
        f"<td>{html.escape(str(c.before))}</td><td>{html.escape(str(c.after))}</td></tr>"
        for c in verdict.changes
    )
    return out + (
        f"<p>What changed since {against}:</p>"
        f'<table class="changes"><tr><th>what</th><th>key</th><th>before</th><th>now</th></tr>'
        f"{rows}</table>"
    )


def _plots_html(figures: list[Figure]) -> str:
    if not figures:
        return "<p>No metrics to plot yet.</p>"
    return (
        '<div class="plots">'
        + "".join(
            f"<figure>{_img(f.png, f.title)}<figcaption>{html.escape(f.title)}</figcaption></figure>"
            for f in figures
        )
        + "</div>"
    )


def render_page(
    records: list[RunRecord],
    verdicts: dict[str, RecipeVerdict],
    table: pd.DataFrame,
    generated: str,
    figures: list[Figure] | None,
) -> str:
    """`figures` None: plots left out on request (--no-plots)."""
    statuses = [v.status for v in verdicts.values()]
    bad = sum(s in FAILING_VERDICTS for s in statuses)
    overall, cls = (
        (
            "attention: "
            + ", ".join(f"{statuses.count(s)} {s}" for s in FAILING_VERDICTS if statuses.count(s)),
            "fail",
        )
        if bad
        else ("all recipes ok", "pass")
    )
    notable = [v for v in verdicts.values() if v.status != "ok"]
    changed = (
        "".join(_changes_html(v) for v in notable)
        or "<p>No failures, regressions or improvements.</p>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>recipeval benchmarks</title>
<style>{STYLE}</style></head><body>
<h1>recipeval benchmarks</h1>
<p class="meta">{len(records)} recipe(s) &middot; generated {html.escape(generated)}</p>
<p><span class="verdict {cls}">{html.escape(overall)}</span></p>
<h2>Results</h2>
<div class="scroll">{to_html(table)}</div>
<h2>What changed</h2>
{changed}
<h2>Plots</h2>
{"<p>Plots left out (--no-plots).</p>" if figures is None else _plots_html(figures)}
</body></html>
"""


def table_page(title: str, caption: str, frame: pd.DataFrame) -> str:
    """A self-contained HTML page of one table, in the benchmark page's style."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{html.escape(title)}</h1><p class="meta">{html.escape(caption)}</p>'
        f'<div class="scroll">{to_html(frame)}</div></body></html>\n'
    )
