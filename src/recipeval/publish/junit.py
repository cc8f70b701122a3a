"""JUnit XML for CI systems: one test case per recipe x stage, plus one per judged metric."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from recipeval.publish.compare import RecipeVerdict
from recipeval.publish.records import RunRecord


def _seconds(started: str | None, finished: str | None) -> str:
    from datetime import datetime

    try:
        delta = datetime.fromisoformat(finished) - datetime.fromisoformat(started)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "0"
    return f"{max(delta.total_seconds(), 0):.3f}"


def junit_xml(records: list[RunRecord], verdicts: dict[str, RecipeVerdict]) -> ET.ElementTree:
    root = ET.Element("testsuites", name="recipeval")
    stages = ET.SubElement(root, "testsuite", name="stages")
    history = ET.SubElement(root, "testsuite", name="regression")
    counts = {stages: [0, 0, 0, 0], history: [0, 0, 0, 0]}  # tests, failures, errors, skipped

    def case(suite: ET.Element, classname: str, name: str, time: str = "0") -> ET.Element:
        counts[suite][0] += 1
        return ET.SubElement(suite, "testcase", classname=classname, name=name, time=time)

    for rec in records:
        for stage, outcome in rec.stages.items():
            tc = case(stages, rec.recipe, stage, _seconds(outcome.started, outcome.finished))
            detail = "\n".join(outcome.failed_checks)
            if outcome.status == "fail":
                counts[stages][1] += 1
                ET.SubElement(tc, "failure", message=outcome.message or "fail").text = detail
            elif outcome.status == "error":
                counts[stages][2] += 1
                ET.SubElement(tc, "error", message=outcome.message or "error").text = detail
            elif outcome.status == "skipped":
                counts[stages][3] += 1
                ET.SubElement(tc, "skipped", message=outcome.message or "skipped")
        verdict = verdicts.get(rec.run_id)
        for mv in verdict.metrics if verdict else []:
            tc = case(history, rec.recipe, mv.metric)
            if mv.kind == "regression":
                counts[history][1] += 1
                changes = "\n".join(
                    f"{c.kind} {c.key}: {c.before} -> {c.after}" for c in verdict.changes
                )
                ET.SubElement(tc, "failure", message=mv.reason).text = changes
            elif mv.kind == "no_history":
                counts[history][3] += 1
                ET.SubElement(tc, "skipped", message=mv.reason)
            else:
                ET.SubElement(tc, "system-out").text = f"{mv.kind}: {mv.reason}"
    for suite, (tests, failures, errors, skipped) in counts.items():
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", str(skipped))
    ET.indent(root)
    return ET.ElementTree(root)


def junit_text(records: list[RunRecord], verdicts: dict[str, RecipeVerdict]) -> str:
    """The JUnit document as text (the publisher scrubs it, as every output it writes)."""
    root = junit_xml(records, verdicts).getroot()
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
