"""The end of a run: verdict lines per recipe and stage, and publish of one recipe's folder."""

from __future__ import annotations

import os
import time
from pathlib import Path

from publish_fixtures import AMD_RECIPE, night, write_run

from recipeval.analysis.regression import RegressionSettings
from recipeval.publish.publisher import PublishOutputs, publish
from recipeval.publish.summary import verdict_lines


def test_publish_takes_one_recipes_folder(tmp_path: Path) -> None:
    results = tmp_path / "results"
    recipe_folder = write_run(results, AMD_RECIPE, night(0)) / "deepseek-v4-flash-4node-mi355x"
    outcome = publish(
        [recipe_folder],
        PublishOutputs.under(results, tmp_path / "history"),
        RegressionSettings(),
        plots=False,
    )
    assert [r.recipe for r in outcome.records] == ["deepseek-v4-flash-4node-mi355x"]


def test_verdict_lines_name_every_stage_and_the_page(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_run(results, AMD_RECIPE, night(0), smoke_status="fail", smoke_message="loss nan")
    publish(
        [results],
        PublishOutputs.under(results, tmp_path / "history"),
        RegressionSettings(),
        plots=False,
    )
    lines = verdict_lines(results)
    assert lines[0].startswith("deepseek-v4-flash-4node-mi355x  env_check pass   smoke fail")
    assert "logprob_diff skipped" in lines[0]
    assert lines[1] == f"verdict: FAILED or REGRESSED ({results / 'regression.json'})"
    assert lines[2] == f"tables and plots: {results / 'tables' / 'benchmarks.html'}"


def test_an_empty_results_folder_says_so(tmp_path: Path) -> None:
    assert verdict_lines(tmp_path) == [f"no stage results under {tmp_path}"]


def test_what_an_interrupted_run_did_not_replace_is_marked_earlier(tmp_path: Path) -> None:
    """After a run stopped before publish, the summary showed the last run's verdict and
    stage results as this run's."""
    results = tmp_path / "results"
    write_run(results, AMD_RECIPE, night(0))
    publish([results], PublishOutputs.under(results, tmp_path / "h"), RegressionSettings(), False)
    this_run = time.time() + 1
    fresh = results / "deepseek-v4-flash-4node-mi355x" / "env_check.json"
    os.utime(fresh, (this_run + 1, this_run + 1))  # rewritten by this run
    lines = verdict_lines(results, since=this_run)
    assert "env_check pass   smoke pass (earlier run)" in lines[0]
    assert lines[1] == f"verdict: ok ({results / 'regression.json'}) (earlier run)"
