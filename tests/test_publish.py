"""publish over StageResult files in tmp dirs: tables, history, verdict, what changed, JUnit."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from publish_fixtures import AMD_RECIPE, night, write_run

from recipeval.analysis.regression import RegressionSettings
from recipeval.publish.publisher import PublishOutputs, publish
from recipeval.result import Check


def _publish_night(tmp: Path, n: int, plots: bool = False, **kwargs) -> tuple[Path, object]:
    """Plots are left out of the nights that only build history (they cost ~0.3 s each)."""
    results = tmp / f"night{n}"
    write_run(results, AMD_RECIPE, night(n), **kwargs)
    out = PublishOutputs.under(results, tmp / "history")
    return results, publish([results], out, RegressionSettings(), plots)


def test_sglang_bump_jump_is_flagged_first_night_and_points_at_the_package(tmp_path: Path) -> None:
    # miles #2040: 0.045 for a week on SGLang 0.5.16, then 0.213 after a bump, recipe unchanged.
    for n, value in enumerate([0.045, 0.046, 0.044, 0.045, 0.047, 0.044, 0.045]):
        _, outcome = _publish_night(tmp_path, n, logprob=value)
        assert outcome.ok
    bumped = {"sglang": "0.5.17", "torch": "2.9.1", "megatron-core": "0.16.0"}
    results, outcome = _publish_night(tmp_path, 7, plots=True, logprob=0.213, packages=bumped)
    assert not outcome.ok
    (verdict,) = outcome.verdicts.values()
    assert verdict.status == "regressed"
    (reg,) = verdict.regressions
    assert reg.metric == "logprob_diff.train_rollout_logprob_abs_diff"
    # Only headline numbers and steady-state estimates are judged, not every summary number.
    judged = {m.metric for m in verdict.metrics}
    assert judged == {
        "logprob_diff.train_rollout_logprob_abs_diff",
        "bench.metrics.perf/rollout_time",
        "bench.metrics.perf/actor_train_time",
        "bench.metrics.cycle_time",
    }
    assert reg.rel_change == pytest.approx(0.213 / 0.045 - 1, rel=1e-3)  # against the median
    changes = {(c.kind, c.key): (c.before, c.after) for c in verdict.changes}
    assert changes == {("package", "sglang"): ("0.5.16", "0.5.17")}
    doc = json.loads((results / "regression.json").read_text())
    assert doc["ok"] is False and doc["recipes"][0]["changes"][0]["after"] == "0.5.17"
    html = (results / "tables/benchmarks.html").read_text()
    assert "0.5.17" in html and "regression" in html
    assert html.count('src="data:image/png;base64,') >= 2  # embedded: works opened from disk
    # The same plots as files: `snakemake --report` items, one folder per recipe.
    plots = {
        str(p.relative_to(results / "tables/plots"))
        for p in (results / "tables/plots").rglob("*.png")
    }
    assert "_overview/steady-state-times.png" in plots
    assert (
        "deepseek-v4-flash-4node-mi355x/history-logprob_diff.train_rollout_logprob_abs_diff.png"
        in plots
    )


def _drift(commit: str, *lr: str) -> list[Check]:
    """env_check's upstream-drift warning as checks/drift.py writes it."""
    diffs = [
        {"kind": "flag", "name": "lr", "change": "changed", "expected": lr[0], "actual": lr[1]}
        for _ in lr[:1]
    ]
    return [
        Check(
            id="miles.drift",
            ok=not lr,
            severity="warning",
            key="source",
            value={"upstream_commit": commit, "differences": diffs},
        )
    ]


def test_upstream_drift_is_published_and_named_in_what_changed(tmp_path: Path) -> None:
    """The nightly shows drift per recipe, and a jump that came with an upstream change names
    the new upstream commit and the flag the recipe no longer matches."""
    old, new = "a" * 40, "b" * 40
    for n, value in enumerate([0.045, 0.046, 0.044, 0.045, 0.047, 0.044, 0.045]):
        _, outcome = _publish_night(tmp_path, n, logprob=value, env_checks=_drift(old))
        assert outcome.ok
    results, outcome = _publish_night(
        tmp_path, 7, logprob=0.213, env_checks=_drift(new, "1e-6", "2e-6")
    )
    (verdict,) = outcome.verdicts.values()
    assert verdict.status == "regressed"
    changes = {(c.kind, c.key): (c.before, c.after) for c in verdict.changes}
    assert changes == {
        ("upstream", "commit"): (old, new),
        ("upstream", "flag.lr"): (None, "'1e-6' -> '2e-6'"),
    }
    table = (results / "tables/benchmarks.md").read_text()
    assert "| 1: flag.lr at bbbbbbbbbbbb |" in table


def test_stage_plots_become_plot_files_and_stale_ones_go(tmp_path: Path) -> None:
    results = tmp_path / "night0"
    folder = write_run(results, AMD_RECIPE, night(0)) / "deepseek-v4-flash-4node-mi355x"
    bench = json.loads((folder / "bench.json").read_text())
    drawn = folder / "bench.steps.png"
    drawn.write_bytes(b"\x89PNG\r\n\x1a\nstep-time plot")
    bench["artifacts"] = {"plot": str(drawn), "steps": str(folder / "bench.steps.parquet")}
    (folder / "bench.json").write_text(json.dumps(bench))
    outputs = PublishOutputs.under(results, tmp_path / "history")
    publish([results], outputs, RegressionSettings(), True)
    copied = results / "tables/plots/deepseek-v4-flash-4node-mi355x/bench-plot.png"
    assert copied.read_bytes() == drawn.read_bytes()
    html = (results / "tables/benchmarks.html").read_text()
    assert 'alt="deepseek-v4-flash-4node-mi355x bench plot"' in html
    # The next publish draws no bench plot: the last one's goes. What publish never wrote
    # there (--plot-dir may be a folder of the user's pictures) stays; it deleted them before.
    mine = results / "tables/plots/vacation/beach.png"
    mine.parent.mkdir()
    mine.write_bytes(b"mine")
    (results / "tables/plots/empty-album").mkdir()
    bench["artifacts"] = {"steps": str(folder / "bench.steps.parquet")}
    (folder / "bench.json").write_text(json.dumps(bench))
    publish([results], outputs, RegressionSettings(), True)
    assert not copied.exists() and not copied.parent.exists()  # the group it emptied, too
    assert mine.read_bytes() == b"mine" and (results / "tables/plots/empty-album").is_dir()


def test_stage_plots_are_found_beside_a_moved_results_folder(tmp_path: Path) -> None:
    # The stage ran elsewhere and recorded a relative path; the folder was then copied here.
    results = tmp_path / "copied"
    folder = write_run(results, AMD_RECIPE, night(0)) / "deepseek-v4-flash-4node-mi355x"
    (folder / "bench.steps.png").write_bytes(b"\x89PNG\r\n\x1a\nmoved plot")
    bench = json.loads((folder / "bench.json").read_text())
    bench["artifacts"] = {"plot": "ran-elsewhere/deepseek-v4-flash-4node-mi355x/bench.steps.png"}
    (folder / "bench.json").write_text(json.dumps(bench))
    publish(
        [results], PublishOutputs.under(results, tmp_path / "history"), RegressionSettings(), True
    )
    plot = results / "tables/plots/deepseek-v4-flash-4node-mi355x/bench-plot.png"
    assert plot.read_bytes() == b"\x89PNG\r\n\x1a\nmoved plot"


def _night_on(tmp_path: Path, gpu: str) -> tuple[object, pd.Series]:
    """A week on the recipe's MI355X, then a slower night whose bench ran on `gpu`."""
    for n, cycle in enumerate([474.0, 478.0, 471.0, 476.0, 473.0, 477.0, 475.0]):
        _, outcome = _publish_night(tmp_path, n, cycle=cycle)
        assert outcome.ok
    results = tmp_path / "night7"
    folder = write_run(results, AMD_RECIPE, night(7), cycle=600.0) / AMD_RECIPE.stem
    bench = json.loads((folder / "bench.json").read_text())
    bench["provenance"]["gpu"] = gpu
    (folder / "bench.json").write_text(json.dumps(bench))
    outcome = publish(
        [results], PublishOutputs.under(results, tmp_path / "history"), RegressionSettings(), False
    )
    (verdict,) = outcome.verdicts.values()
    assert verdict.status == "regressed"
    return verdict, pd.read_csv(results / "tables/benchmarks.csv", dtype=str).iloc[0]


def test_a_night_on_another_card_is_shown_and_named_as_what_changed(tmp_path: Path) -> None:
    verdict, row = _night_on(tmp_path, "AMD Instinct MI300X")
    assert ("provenance", "gpu", "MI355X", "AMD Instinct MI300X") in [
        (c.kind, c.key, c.before, c.after) for c in verdict.changes
    ]
    assert row["GPUs"] == "MI355X x 32; ran on AMD Instinct MI300X"


def test_the_same_card_named_as_ray_names_it_is_no_change(tmp_path: Path) -> None:
    """A run on an external Ray cluster records Ray's accelerator type; a run on a head recipeval
    started records the driver's name. Moving between the two was named as a card change."""
    verdict, row = _night_on(tmp_path, "AMD-Instinct-MI355X-OAM")
    assert not [c for c in verdict.changes if c.key == "gpu"], verdict.changes
    assert row["GPUs"] == "MI355X x 32"


def test_tables_show_gate_failure_and_reason(tmp_path: Path) -> None:
    results, outcome = _publish_night(
        tmp_path, 0, smoke_status="fail", smoke_message="loss is nan at step 1"
    )
    table = pd.read_csv(results / "tables/benchmarks.csv", dtype=str)
    row = table.iloc[0]
    assert row["recipe"] == "deepseek-v4-flash-4node-mi355x"
    assert row["GPUs"] == "MI355X x 32" and row["layout"] == "TP4/PP4/CP1/EP8/ETP1"
    assert row["max response len"] == "8192"
    assert row["smoke"] == "fail: loss is nan at step 1"
    assert row["bench"].startswith("skipped: gate smoke is fail")
    assert row["vs history"] == "failed: smoke fail"
    md = (results / "tables/benchmarks.md").read_text()
    assert "| fail: loss is nan at step 1 |" in md
    assert not outcome.ok


def test_publish_reads_only_the_results_not_the_recipe_files(tmp_path: Path) -> None:
    """The recipe facts come from the results (taken when the stages ran): a recipe file that
    has since changed, or is gone, changes nothing in the table."""
    recipe = tmp_path / "recipes" / "amd" / AMD_RECIPE.name
    shutil.copytree(AMD_RECIPE.parents[1], tmp_path / "recipes")
    results = tmp_path / "night0"
    write_run(results, recipe, night(0))
    recipe.write_text(recipe.read_text().replace("tp: 4", "tp: 8"))
    publish(
        [results], PublishOutputs.under(results, tmp_path / "history"), RegressionSettings(), False
    )
    shutil.rmtree(tmp_path / "recipes")
    publish(
        [results], PublishOutputs.under(results, tmp_path / "history2"), RegressionSettings(), False
    )
    row = pd.read_csv(results / "tables/benchmarks.csv", dtype=str).iloc[0]
    assert row["GPUs"] == "MI355X x 32" and row["layout"] == "TP4/PP4/CP1/EP8/ETP1"
    assert row["max response len"] == "8192"


def test_long_messages_are_cut_to_one_line_in_the_table(tmp_path: Path) -> None:
    tail = (
        "Traceback (most recent call last):\n" + "  File x.py, line 1\n" * 40 + "RuntimeError: boom"
    )
    results, _ = _publish_night(tmp_path, 0, smoke_status="error", smoke_message=tail)
    row = pd.read_csv(results / "tables/benchmarks.csv", dtype=str).iloc[0]
    assert row["smoke"].startswith("error: Traceback (most recent call last): File x.py")
    assert len(row["smoke"]) <= 110 and row["smoke"].endswith("…")
    assert row["bench"].startswith("skipped: gate smoke is error") and "\n" not in row["bench"]
    md = (results / "tables/benchmarks.md").read_text().splitlines()
    assert len(md) == 3  # header, rule, one row: no message breaks a Markdown row


def test_table_values_intervals_and_packages(tmp_path: Path) -> None:
    results, outcome = _publish_night(tmp_path, 0)
    row = pd.read_csv(results / "tables/benchmarks.csv", dtype=str).iloc[0]
    assert row["cycle time (s)"] == "474 [464.5, 483.5]"
    assert row["rollout time (s)"] == "150 [147, 153]"
    assert row["logprob diff"] == "0.045"
    assert row["vs expect"] == "ok" and row["vs history"] == "first run"
    assert "sglang 0.5.16" in row["packages"]
    assert outcome.ok


def test_history_is_append_only_and_idempotent(tmp_path: Path) -> None:
    results, first = _publish_night(tmp_path, 0)
    files = sorted((tmp_path / "history").glob("*/*.json"))
    assert len(files) == 1 and first.added_to_history == 1
    before = files[0].read_bytes()
    again = publish(
        [results], PublishOutputs.under(results, tmp_path / "history"), RegressionSettings()
    )
    assert again.added_to_history == 0
    assert sorted((tmp_path / "history").glob("*/*.json")) == files
    assert files[0].read_bytes() == before
    _publish_night(tmp_path, 1)
    assert len(list((tmp_path / "history").glob("*/*.json"))) == 2
    frame = pd.read_parquet(tmp_path / "history/history.parquet")
    assert set(frame["run_id"]) == {
        p.stem.split("-")[-1] for p in (tmp_path / "history").glob("*/*.json")
    }
    assert "bench.metrics.cycle_time" in set(frame["metric"])


def test_junit_one_case_per_recipe_and_stage(tmp_path: Path) -> None:
    results, _ = _publish_night(tmp_path, 0, smoke_status="fail", smoke_message="boom")
    root = ET.parse(results / "junit.xml").getroot()
    stages = root.find("testsuite[@name='stages']")
    names = [tc.get("name") for tc in stages.iter("testcase")]
    assert names == ["env_check", "smoke", "logprob_diff", "bench"]
    assert stages.get("failures") == "1" and stages.get("skipped") == "2"
    smoke = stages.find("testcase[@name='smoke']")
    assert smoke.find("failure").get("message") == "boom"


def test_junit_is_scrubbed_like_every_other_output(tmp_path: Path, monkeypatch) -> None:
    """A secret in a stage's message (a URL's password, the caller's token by name) is ***
    in junit.xml as in the tables, the page and the verdict."""
    monkeypatch.setenv("WANDB_API_KEY", "callers-wandb-key-31337")
    leaky = "push to https://u:pw-123-secret@host/x failed; key callers-wandb-key-31337"
    results = tmp_path / "night0"
    write_run(results, AMD_RECIPE, night(0), smoke_status="fail", smoke_message="boom")
    # stage results are scrubbed when written; one written by another tool may not be
    smoke = next(results.glob("*/smoke.json"))
    smoke.write_text(smoke.read_text().replace('"boom"', json.dumps(leaky)))
    publish([results], PublishOutputs.under(results, tmp_path / "history"), RegressionSettings())
    junit = (results / "junit.xml").read_text()
    assert "pw-123-secret" not in junit and "callers-wandb-key-31337" not in junit
    assert "push to https://" in junit and "***" in junit


def test_a_nan_measurement_is_left_out_of_the_history_not_written_as_null(tmp_path: Path) -> None:
    """A NaN logprob diff in a stage result (JSON's NaN, as Python's json writes it) was stored
    as null: publish then crashed drawing 'what changed', and every later publish skipped the
    record as unreadable."""
    history = tmp_path / "history"
    for n in range(5):
        results = write_run(tmp_path / f"n{n}", AMD_RECIPE, night(n), logprob=0.045)
        result = next(results.glob("*/logprob_diff.json"))
        summary = json.loads(result.read_text())
        summary["summary"]["train_rollout_logprob_abs_diff"] = math.nan
        result.write_text(json.dumps(summary))
        proc = _cli("publish", str(results), "--history", str(history), "--no-plots")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "skipped" not in proc.stderr, proc.stderr
    records = [json.loads(p.read_text()) for p in history.glob("*/*.json")]
    assert len(records) == 5
    assert all("logprob_diff.train_rollout_logprob_abs_diff" not in r["metrics"] for r in records)
    assert all("bench.metrics.cycle_time" in r["metrics"] for r in records)


def test_results_left_from_an_earlier_run_are_not_published_as_this_run(tmp_path: Path) -> None:
    """A nightly killed during smoke leaves a new env_check beside the last run's logprob_diff
    and bench: publishing the folder filed that bench again as a new run's measurement."""
    results = write_run(tmp_path / "r", AMD_RECIPE, night(0))
    fresh = write_run(tmp_path / "next", AMD_RECIPE, night(1))
    (folder,) = results.iterdir()
    shutil.copy(next(fresh.glob("*/env_check.json")), folder / "env_check.json")
    (folder / "smoke.json").unlink()
    proc = _cli("publish", str(results), "--history", str(tmp_path / "h"), "--no-plots")
    assert proc.returncode == 0, proc.stderr
    for stage in ("logprob_diff", "bench"):
        assert f"its {stage} result" in proc.stderr and "predates its gate env_check" in proc.stderr
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "h").glob("*/*.json")]
    assert list(record["stages"]) == ["env_check"]
    assert not any(key.startswith(("bench.", "logprob_diff.")) for key in record["metrics"])


def test_shift_stays_reported_names_its_cause_and_ends_when_acknowledged(tmp_path: Path) -> None:
    import numpy as np

    from recipeval.publish import history

    rng = np.random.default_rng(7)
    noise = lambda: float(1 + 0.01 * rng.standard_normal())
    for n in range(10):
        _publish_night(tmp_path, n, cycle=474 * noise())
    bumped = {"sglang": "0.5.16", "torch": "2.9.2", "megatron-core": "0.16.0"}
    statuses = []
    for n in range(10, 15):  # +6 % from night 10, with a torch bump; 1 % noise
        _, outcome = _publish_night(tmp_path, n, cycle=474 * 1.06 * noise(), packages=bumped)
        (v,) = outcome.verdicts.values()
        statuses.append(v.status)
    assert statuses[2:] == ["regressed"] * 3  # caught by the third night and kept
    assert [m.metric for m in v.regressions] == ["bench.metrics.cycle_time"]
    # "What changed" compares with the last run before the change point, not last night's run.
    assert {(c.kind, c.key): c.after for c in v.changes} == {("package", "torch"): "2.9.2"}
    assert v.change_run is not None
    history.acknowledge(tmp_path / "history", v.recipe, v.change_run, note="torch bump")
    history.acknowledge(tmp_path / "history", v.recipe, v.change_run, note="torch 2.9.2")
    # The same change acknowledged twice is one entry, with the later note.
    acks = history.acknowledgements(tmp_path / "history")
    assert [(a.run_id, a.metric, a.note) for a in acks] == [(v.change_run, None, "torch 2.9.2")]
    _, after = _publish_night(tmp_path, 15, cycle=474 * 1.06 * noise(), packages=bumped)
    assert after.ok and next(iter(after.verdicts.values())).status == "ok"
    _, fast = _publish_night(tmp_path, 16, cycle=474 * 0.80, packages=bumped)
    (v,) = fast.verdicts.values()
    assert v.status == "improved" and [m.metric for m in v.improvements] == [
        "bench.metrics.cycle_time"
    ]


@pytest.mark.parametrize(
    ("acknowledged", "message"),
    [
        ('[{"recipe": "x"}]', "acknowledged.json: 0.run_id: Field required"),
        (b"\xff", "acknowledged.json: top level: Invalid JSON"),
        (None, "acknowledged.json: not a regular file"),
    ],
)
def test_bad_acknowledgement_file_is_one_line_and_leaves_the_history(
    tmp_path: Path, acknowledged: str | bytes | None, message: str
) -> None:
    """Read before the run is appended: a bad file used to leave the history one run longer
    with no tables or verdict for it; a folder in its place was ignored silently."""
    _publish_night(tmp_path, 0)
    ack = tmp_path / "history" / "acknowledged.json"
    if acknowledged is None:
        ack.mkdir()
    elif isinstance(acknowledged, bytes):
        ack.write_bytes(acknowledged)
    else:
        ack.write_text(acknowledged)
    runs_before = sorted((tmp_path / "history").glob("*/*.json"))
    results = tmp_path / "n1"
    write_run(results, AMD_RECIPE, night(1))
    proc = _cli(
        "publish",
        str(results),
        "--history",
        str(tmp_path / "history"),
        "--tables",
        str(results / "t"),
        "--junit",
        str(results / "j.xml"),
        "--verdict",
        str(results / "v.json"),
        "--no-plots",
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted((tmp_path / "history").glob("*/*.json")) == runs_before


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("recipeval")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, check=False)


def test_cli_publish_bad_input_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "r" / "smoke.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    proc = _cli(
        "publish",
        str(bad),
        "--tables",
        str(tmp_path / "t"),
        "--history",
        str(tmp_path / "h"),
        "--junit",
        str(tmp_path / "j.xml"),
        "--verdict",
        str(tmp_path / "v.json"),
    )
    assert proc.returncode == 2
    # the file and what is wrong with it, not pydantic's "1 validation error" header
    assert proc.stderr.startswith(f"recipeval: unreadable stage result {bad}: Invalid JSON")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    missing = _cli("publish", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "nope.json: no such result file" in missing.stderr


def test_cli_publish_refuses_unusable_output_paths_before_writing(tmp_path: Path) -> None:
    """A file where a folder goes (or a folder where a file goes) is one line naming the
    option, exit 2, and nothing written: not even the history publish appends to first."""
    results = write_run(tmp_path / "n0", AMD_RECIPE, night(0))
    a_file, a_folder = tmp_path / "a_file", tmp_path / "a_folder"
    a_file.write_text("kept\n")
    a_folder.mkdir()
    usable = {
        "--tables": tmp_path / "t",
        "--history": tmp_path / "h",
        "--junit": tmp_path / "j.xml",
        "--verdict": tmp_path / "v.json",
        "--plot-dir": tmp_path / "p",
    }
    unusable = {
        "--tables": a_file,
        "--history": a_file,
        "--plot-dir": a_file,
        "--junit": a_folder,
        "--verdict": a_folder,
    }
    for option, bad in unusable.items():
        paths = {**usable, option: bad}
        argv = [word for name, path in paths.items() for word in (name, str(path))]
        proc = _cli("publish", str(results), *argv)
        assert proc.returncode == 2, (option, proc.stderr)
        assert proc.stderr.startswith(f"recipeval: {option} {bad}: exists and is not a ")
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert not any(p.exists() for p in usable.values()), option
    assert a_file.read_text() == "kept\n" and not any(a_folder.iterdir())
    # A folder where publish writes one of its tables is caught before the history grows too.
    tables = tmp_path / "tables"
    (tables / "benchmarks.md").mkdir(parents=True)
    argv = [word for name, path in usable.items() for word in (name, str(path))]
    proc = _cli("publish", str(results), *argv, "--tables", str(tables))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"recipeval: --tables {tables / 'benchmarks.md'}: exists and")
    assert not (tmp_path / "h").exists()
    # An output that is a stage result this publish reads, or another output's file.
    smoke = next(results.glob("*/smoke.json"))
    kept = smoke.read_text()
    clashes = [
        ({"--verdict": smoke}, f"--verdict {smoke}: is a stage result this publish reads"),
        ({"--junit": usable["--verdict"]}, f"--verdict {usable['--verdict']}: --junit writes"),
    ]
    for change, message in clashes:
        paths = {**usable, **change}
        argv = [word for name, path in paths.items() for word in (name, str(path))]
        proc = _cli("publish", str(results), *argv)
        assert proc.returncode == 2 and proc.stderr.startswith(f"recipeval: {message}"), proc.stderr
        assert not (tmp_path / "h").exists()
    assert smoke.read_text() == kept


def test_cli_publish_history_it_cannot_write_is_one_line(tmp_path: Path) -> None:
    """A history folder publish cannot add to (here a file where the recipe's folder goes;
    also a read-only or immutable folder) was a traceback."""
    results = write_run(tmp_path / "n0", AMD_RECIPE, night(0))
    history = tmp_path / "h"
    history.mkdir()
    (history / "deepseek-v4-flash-4node-mi355x").write_text("not a folder\n")
    proc = _cli("publish", str(results), "--history", str(history), "--no-plots")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        proc.stderr.startswith("recipeval: cannot write the history")
        and "Traceback" not in proc.stderr
    )


def test_cli_publish_output_it_cannot_write_is_one_line(tmp_path: Path) -> None:
    """A place the checks before writing cannot judge (root may write anywhere by permission,
    yet /proc refuses new files): one line naming the file and saying the history already holds
    the run, exit 2, no traceback; publishing again once the path is fixed completes."""
    results = write_run(tmp_path / "n0", AMD_RECIPE, night(0))
    argv = ["--tables", str(tmp_path / "t"), "--history", str(tmp_path / "h"), "--no-plots"]
    argv += ["--junit", str(tmp_path / "j.xml")]
    proc = _cli("publish", str(results), *argv, "--verdict", "/proc/recipeval-verdict.json")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("recipeval: ") and "/proc" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    again = _cli("publish", str(results), *argv, "--verdict", str(tmp_path / "v.json"))
    assert again.returncode == 0, again.stderr
    assert len(list((tmp_path / "h").glob("*/*.json"))) == 1 and (tmp_path / "v.json").is_file()


def test_cli_publish_refuses_out_of_range_regression_settings(tmp_path: Path) -> None:
    """The config schema's bounds hold on the command line too: alpha 2 would call every night
    a change. One line naming the option, exit 2, nothing written."""
    results = write_run(tmp_path / "n0", AMD_RECIPE, night(0))
    outputs = {"--history": tmp_path / "h", "--verdict": tmp_path / "v.json"}
    argv = [word for name, path in outputs.items() for word in (name, str(path))]
    for option, value in [
        ("--alpha", "2"),
        ("--alpha", "0"),
        ("--alpha", "nan"),
        ("--min-change", "-0.1"),
        ("--min-history", "1"),
        ("--short-history-band", "-1"),
    ]:
        proc = _cli("publish", str(results), *argv, option, value, "--no-plots")
        assert proc.returncode == 2, (option, value, proc.stderr)
        assert proc.stderr.startswith(f"recipeval: {option} {value}: must be ")
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert not any(p.exists() for p in outputs.values())


def test_cli_publish_fail_on_regression_exit_status(tmp_path: Path) -> None:
    for n, value in enumerate([0.045, 0.046, 0.044]):
        _publish_night(tmp_path, n, logprob=value)
    write_run(tmp_path / "n3", AMD_RECIPE, night(3), logprob=0.213)
    args = [
        str(tmp_path / "n3"),
        "--history",
        str(tmp_path / "history"),
        "--tables",
        str(tmp_path / "n3/t"),
        "--junit",
        str(tmp_path / "n3/j.xml"),
        "--verdict",
        str(tmp_path / "n3/v.json"),
        "--no-plots",
    ]
    proc = _cli("publish", *args, "--fail-on-regression")
    assert proc.returncode == 1, proc.stderr
    assert "regressed" in proc.stdout and "train_rollout_logprob_abs_diff" in proc.stdout
    # Without --fail-on-regression (as the Snakemake rule runs it) the outputs are what count.
    shutil.rmtree(tmp_path / "n3" / "t")
    assert _cli("publish", *args).returncode == 0
    assert (tmp_path / "n3/t/benchmarks.md").is_file()


def test_an_unreadable_history_file_is_skipped_with_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated record and a folder named like one: publish goes on, and says which file and
    what is wrong on stderr (the folder ended in a traceback; a record's reason was pydantic's
    "1 validation error" header, on stdout)."""
    _publish_night(tmp_path, 0)
    (record,) = (tmp_path / "history").glob("*/*.json")
    (record.parent / "20250101T000000Z-truncated.json").write_text(record.read_text()[:100])
    (record.parent / "20250102T000000Z-folder.json").mkdir()
    capsys.readouterr()
    _, outcome = _publish_night(tmp_path, 1)
    assert outcome.ok
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    folder_line = f"recipeval: skipping history file {record.parent}/20250102T000000Z-folder.json: is a directory"
    assert lines.count(folder_line) == 1, lines  # once, though publish reads the folder twice
    assert sum("20250101T000000Z-truncated.json: Invalid JSON" in line for line in lines) == 1
    assert "skipping" not in captured.out


def _publish_cli(results: Path, history: Path, *extra: str) -> subprocess.CompletedProcess:
    """publish with every output beside `results` (never the working directory's results/)."""
    outputs = ("--tables", results / "tables", "--junit", results / "junit.xml")
    verdict = ("--verdict", results / "regression.json", "--history", history)
    return _cli("publish", str(results), *map(str, outputs + verdict), *extra)


def _edit_result(results: Path, stage: str, path: str, value: object) -> Path:
    """Set the dotted `path` of one stage's result file to `value`, as a hand edit would."""
    file = next(results.glob(f"*/{stage}.json"))
    data = json.loads(file.read_text())
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[leaf] = value
    file.write_text(json.dumps(data))
    return file


@pytest.mark.parametrize(
    ("stage", "field", "value"),
    [
        ("bench", "recipe_facts.recipe_values", []),
        ("bench", "recipe_facts.recipe_values", None),
        ("bench", "recipe_facts.recipe_values", "x"),
        ("bench", "recipe_facts.recipe_values", 3),
        ("bench", "recipe_facts.nodes", "two"),
        # No UTC offset: compared with the other stages' times, a guessed zone could leave the
        # result out as stale, so it is refused.
        ("smoke", "provenance.started", "2026-12-07T02:38:27"),
        ("smoke", "provenance.finished", "yesterday"),
    ],
)
def test_a_hand_edited_result_field_is_one_line_naming_file_and_field(
    tmp_path: Path, stage: str, field: str, value: object
) -> None:
    results = write_run(tmp_path / "r", AMD_RECIPE, night(0))
    file = _edit_result(results, stage, field, value)
    history = tmp_path / "history"
    proc = _publish_cli(results, history, "--no-plots")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"recipeval: unreadable stage result {file}: {field}: ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not list(history.glob("*/*.json"))


def test_an_interval_that_leaves_out_its_estimate_is_still_drawn(tmp_path: Path) -> None:
    """low above the estimate (a hand edit) made a negative error bar: plotting crashed after
    the history was written, leaving half the outputs."""
    results = write_run(tmp_path / "r", AMD_RECIPE, night(0))
    _edit_result(results, "bench", "summary.metrics.cycle_time.low", 500.0)
    proc = _publish_cli(results, tmp_path / "history")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (results / "tables/plots/_overview/steady-state-times.png").is_file()
    assert json.loads((results / "regression.json").read_text())["ok"]


def test_a_value_matplotlib_cannot_lay_out_leaves_out_its_figures_not_the_outputs(
    tmp_path: Path,
) -> None:
    """A hand-edited estimate near the largest float overflowed matplotlib's axis code after the
    history was written: a traceback, and no tables, page or verdict for the night."""
    history = tmp_path / "history"
    for n, cycle in enumerate([474.0, 475.0, 1.6e308]):
        results = write_run(tmp_path / f"n{n}", AMD_RECIPE, night(n), cycle=cycle)
        proc = _publish_cli(results, history)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    skipped = [line for line in proc.stderr.splitlines() if "cannot draw it" in line]
    assert len(skipped) == 2 and "RuntimeWarning" not in proc.stderr, proc.stderr
    assert skipped[0].startswith("recipeval: figure 'steady-state times': cannot draw it (")
    assert "bench.metrics.cycle_time'" in skipped[1]
    plots = results / "tables/plots"
    assert not (plots / "_overview/steady-state-times.png").exists()
    assert len(list(plots.glob("*/history-*.png"))) == 3  # the other metrics still drawn
    assert "regression bench.metrics.cycle_time: 3.4e+307% vs the mean" in proc.stdout
    assert not _strict_json((results / "regression.json").read_text())["ok"]
    assert "deepseek" in (results / "tables/benchmarks.html").read_text()


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_change_from_a_baseline_of_zero_has_no_relative_change(tmp_path: Path) -> None:
    """A baseline level of 0 made rel_change +inf, written as a bare Infinity: regression.json
    was not JSON."""
    history = tmp_path / "history"
    for n, cycle in enumerate([0.0, 0.0, 474.0]):
        results = write_run(tmp_path / f"n{n}", AMD_RECIPE, night(n), cycle=cycle)
        proc = _publish_cli(results, history, "--no-plots")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    verdict = _strict_json((results / "regression.json").read_text())
    (cycle_verdict,) = [
        m for m in verdict["recipes"][0]["metrics"] if m["metric"] == "bench.metrics.cycle_time"
    ]
    assert cycle_verdict["kind"] == "regression" and cycle_verdict["rel_change"] is None
    assert "regression metrics.cycle_time n/a" in (results / "tables/benchmarks.md").read_text()
