"""miles log parsing on fixtures written from the documented format."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import PR_RECIPE, files_of_at_most

from recipeval.engines.miles import log_parser
from recipeval.engines.miles.logparse import (
    MilesLogParser,
    ParsedLog,
    parse_lines,
    parse_log,
    parse_metric_dict,
)
from recipeval.recipe import load_recipe, resolve

LOGS = Path(__file__).parent / "fixtures" / "logs"
RECIPEVAL = str(Path(sys.executable).parent / "recipeval")


def row(steps: pd.DataFrame, rollout_id: int) -> pd.Series:
    return steps.set_index("rollout_id").loc[rollout_id]


def test_clean_log_one_row_per_rollout_with_both_perf_lines_merged():
    parsed = parse_log(LOGS / "miles_clean.log")
    steps = parsed.steps
    assert list(steps["rollout_id"]) == [0, 1, 2]
    assert parsed.malformed_count == 0
    r1 = row(steps, 1)
    # rollout manager's perf line and the trainer's perf line for the same id, merged
    assert r1["perf/rollout_time"] == 151.0
    assert r1["perf/actor_train_time"] == 181.5
    assert r1["train/grad_norm"] == 0.794
    assert r1["rollout/rollout_log_probs"] == -0.4387
    assert r1["response_len/mean"] == 3990.0


def test_cycle_time_is_wall_time_from_end_to_end_of_consecutive_rollouts():
    steps = parse_log(LOGS / "miles_clean.log").steps
    assert math.isnan(steps["cycle_time"].iloc[0])
    # a rollout ends with the trainer's perf line: 10:05:33.1, 10:13:27.1, 10:21:21.1
    assert list(steps["cycle_time"].iloc[1:]) == pytest.approx([474.0, 474.0])
    assert steps["timestamp"].iloc[0] == pd.Timestamp("2026-08-05 10:05:33.100")


def test_irregular_ray_log():
    """Actor prefixes, ANSI colours, interleaving, repeats (verbatim and Ray-folded),
    nan/inf, numpy scalar reprs, two records glued into one line, truncated last line."""
    parsed = parse_log(LOGS / "miles_ray_irregular.log")
    steps = parsed.steps
    assert list(steps["rollout_id"]) == [0, 1, 2]
    r0, r1, r2 = (row(steps, i) for i in (0, 1, 2))
    assert r0["perf/tokens_per_gpu_per_sec"] == 812.0  # np.float64(812.0)
    assert r0["perf/actor_train_time"] == 182.0  # repeated three times, read once
    assert math.isnan(r1["train/loss"])
    assert r1["train/train_rollout_logprob_abs_diff"] == math.inf
    assert r1["train/grad_norm"] == -math.inf
    # lines out of order: the rollout ends with the trainer's perf line, wherever it is
    assert r1["timestamp"] == pd.Timestamp("2026-08-05 10:13:27.100")
    assert r1["perf/actor_train_time"] == 181.5  # the complete record after the glued one
    assert "perf/longest_sample_tokens_per_sec" not in steps.columns
    assert r2["perf/rollout_time"] == 150.5
    assert math.isnan(r2["train/loss"])  # the truncated step 2 line was skipped
    assert parsed.malformed_count == 2
    assert [m.line_number for m in parsed.malformed] == [12, 18]
    assert parsed.lines == 18


def test_parse_metric_dict_never_evaluates_code(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ValueError):
        parse_metric_dict(f"{{'a': __import__('os').system('touch {marker}')}}")
    assert not marker.exists()
    assert parse_metric_dict(
        "{'a': float('nan'), 'b': -inf, 'c': [1, 2], 'd': 'x', 'e': True}"
    ) == {
        "a": pytest.approx(math.nan, nan_ok=True),
        "b": -math.inf,
        "e": 1.0,
    }


def test_incremental_feed_matches_whole_file():
    lines = (LOGS / "miles_clean.log").read_text().splitlines()
    parser = MilesLogParser()
    updated = [parser.feed(line) for line in lines]
    assert [u for u in updated if u is not None][:3] == [0, 0, 0]
    pd.testing.assert_frame_equal(parser.table(), parse_lines(lines).steps)


def test_an_id_past_the_tables_int64_is_a_malformed_line_not_the_end_of_the_parse():
    """A 20-digit step id (or train/step) ended the parse in OverflowError: parse-log and every
    --from-log stage died on one corrupt line."""
    parsed = parse_lines(
        [
            "step 9223372036854775808: {'train/loss': 1.0}",
            "step 1: {'train/loss': 2.0, 'train/step': 1e300}",
            "step 2: {'train/loss': 3.0}",
        ]
    )
    assert parsed.steps["train/loss"].tolist() == [3.0]
    assert [bad.line_number for bad in parsed.malformed] == [1, 2]


def test_empty_log_gives_empty_table_with_fixed_columns():
    steps = parse_lines(["no metrics here", ""]).steps
    assert list(steps.columns) == ["rollout_id", "timestamp", "cycle_time"]
    assert steps.empty


def test_a_log_without_one_metric_line_is_written_and_said(tmp_path):
    """Random bytes or a run that died before its first rollout: an empty table, and a line
    saying so (it was reported like any log: "0 rollouts, ...")."""
    log = tmp_path / "garbage.log"
    log.write_bytes(bytes(range(256)) * 40 + b"\nno metrics here\n")
    out = tmp_path / "steps.csv"
    proc = subprocess.run(
        [RECIPEVAL, "parse-log", str(log), "--out", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "0 rollouts" in proc.stdout, proc.stderr
    assert re.fullmatch(
        rf"recipeval: warning: {re.escape(str(log))}: not one miles metric line \(rollout, step, "
        r"perf\) in \d+ lines: a run that died before its first rollout, or not a training log\n",
        proc.stderr,
    ), proc.stderr
    assert pd.read_csv(out).empty


def test_parse_log_cli_writes_csv_and_parquet_and_reports_malformed(tmp_path):
    for name in ("steps.csv", "steps.parquet"):
        out = tmp_path / name
        proc = subprocess.run(
            [RECIPEVAL, "parse-log", str(LOGS / "miles_ray_irregular.log"), "--out", str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "3 rollouts" in proc.stdout and "2 malformed" in proc.stdout
        table = pd.read_csv(out) if name.endswith(".csv") else pd.read_parquet(out)
        assert list(table["rollout_id"]) == [0, 1, 2]
    bad = subprocess.run(
        [RECIPEVAL, "parse-log", str(tmp_path / "missing.log"), "--out", str(tmp_path / "x.csv")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "no such file" in bad.stderr and "Traceback" not in bad.stderr
    # a folder or a FIFO named as the log: said so (both were "no such log file")
    (tmp_path / "logs").mkdir()
    os.mkfifo(tmp_path / "fifo.log")
    for log, problem in [("logs", "is a folder"), ("fifo.log", "is not a regular file (a FIFO")]:
        proc = subprocess.run(
            [RECIPEVAL, "parse-log", str(tmp_path / log), "--out", str(tmp_path / "x.csv")],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"recipeval: {tmp_path / log}: {problem}"), proc.stderr
    # an --out that cannot be a file: refused naming it, before reading (tracebacks before)
    (tmp_path / "folder.csv").mkdir()
    (tmp_path / "afile").write_text("")
    for out, problem in [
        (tmp_path / "folder.csv", "exists and is not a regular file"),
        (tmp_path / "afile/x.csv", "which is not a folder"),
    ]:
        proc = subprocess.run(
            [RECIPEVAL, "parse-log", str(LOGS / "miles_clean.log"), "--out", str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 2 and problem in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    # a table the disk cannot take: one line naming it (a traceback before), the old one kept
    kept = tmp_path / "kept.csv"
    kept.write_text("rollout_id\n7\n")
    proc = subprocess.run(
        [RECIPEVAL, "parse-log", str(LOGS / "miles_clean.log"), "--out", str(kept)],
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=files_of_at_most(100),
    )
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == f"recipeval: {kept}: File too large\n"
    assert kept.read_text() == "rollout_id\n7\n"
    # the longest name the system allows: its temporary sibling must fit too
    longest = tmp_path / ("a" * 247 + ".parquet")
    proc = subprocess.run(
        [RECIPEVAL, "parse-log", str(LOGS / "miles_clean.log"), "--out", str(longest)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and len(pd.read_parquet(longest)) > 0, proc.stderr
    assert [p.name for p in tmp_path.glob(".*")] == []


# --- the real trainers' formats (fixtures cite the source lines or threads they come from) --

PPO_LOG = LOGS / "miles_ppo_critic_2steps.log"


def test_ppo_log_with_two_optimizer_steps_per_rollout_gives_one_row_per_rollout():
    """`step N` counts optimizer steps (rollout_id * 2 + step_id): 12 step ids, 6 rollouts."""
    parsed = parse_log(PPO_LOG)
    steps = parsed.steps
    assert parsed.steps_per_rollout == 2  # inferred from the trainer's rollout/perf lines
    assert list(steps["rollout_id"]) == [0, 1, 2, 3, 4, 5]
    r3 = row(steps, 3)
    # the actor's steps 6 and 7 land on rollout 3: the mean of their losses, the last step id
    assert r3["train/loss"] == pytest.approx((0.014 + 0.013) / 2)
    assert r3["train/grad_norm"] == pytest.approx((0.8 + 0.9) / 2)
    assert r3["train/step"] == 7
    # policy-vs-sampler metrics keep the rollout's first step, where they are zero
    assert list(steps["train/ppo_kl"]) == [0.0] * 6
    assert list(steps["train/pg_clipfrac"]) == [0.0] * 6
    # the critic's role-tagged lines land on the same rollouts
    assert r3["train/critic-value_loss"] == pytest.approx((0.38 + 0.36) / 2)
    assert r3["train/critic-lr-pg_0"] == 1e-05
    assert r3["perf/rollout_time"] == 150.0 and r3["rollout/raw_reward"] == pytest.approx(0.4)
    # a rollout ends with the trainer's perf line: the cycle is 487 s, not half of it
    assert steps["cycle_time"].iloc[1:].tolist() == pytest.approx([487.0] * 5)
    assert math.isnan(steps["cycle_time"].iloc[0])
    assert steps["timestamp"].iloc[0] == pd.Timestamp("2026-08-05 09:08:06.500")
    # evaluations: before training (0) and every 2 rollouts, not moving a rollout's end
    assert steps.set_index("rollout_id")["eval/gsm8k"].dropna().to_dict() == pytest.approx(
        {0: 0.3125, 1: 0.4, 3: 0.5, 5: 0.6}
    )


def test_ppo_log_keeps_every_optimizer_step_and_counts_every_kind():
    parsed = parse_log(PPO_LOG)
    per_step = parsed.optimizer_steps
    assert list(per_step["step"]) == list(range(12))
    assert list(per_step["rollout_id"]) == [i // 2 for i in range(12)]
    assert list(per_step["train/ppo_kl"]) == [0.0, 0.0004] * 6
    assert per_step["train/critic-value_loss"].iloc[7] == pytest.approx(0.36)
    assert per_step["timestamp"].iloc[1] == pd.Timestamp("2026-08-05 09:06:40")
    # miles logs each step line twice (log_utils.py and model.py): both counted, read once
    assert parsed.counts == {
        "critic-step": {"recognised": 24, "dropped": 0},
        "eval": {"recognised": 4, "dropped": 0},
        "perf": {"recognised": 12, "dropped": 0},
        "rollout": {"recognised": 6, "dropped": 0},
        "step": {"recognised": 24, "dropped": 0},
    }
    assert parsed.malformed_count == 0


def test_recipe_steps_per_rollout_wins_over_inference():
    lines = PPO_LOG.read_text().splitlines()
    given = parse_lines(lines, steps_per_rollout=2)
    pd.testing.assert_frame_equal(given.steps, parse_lines(lines).steps)
    assert given.steps_per_rollout == 2
    # a recipe saying 1 step per rollout files each step id as its own rollout
    assert len(MilesLogParser(steps_per_rollout=1).feed_all(lines).table()) == 12
    with pytest.raises(ValueError, match="positive"):
        MilesLogParser(steps_per_rollout=0)


def test_step_rollouts_are_right_while_the_run_is_still_logging():
    lines = PPO_LOG.read_text().splitlines()
    parser = MilesLogParser()
    end_of_rollout_1 = next(
        i for i, line in enumerate(lines) if "train_metric_utils.py:56 - perf 1:" in line
    )
    updated = [parser.feed(line) for line in lines[: end_of_rollout_1 + 1]]
    assert list(parser.table()["rollout_id"]) == [0, 1]
    assert parser.table()["train/step"].tolist() == [1.0, 3.0]
    # every step line reported the rollout it belongs to
    assert [u for u, line in zip(updated, lines) if " step " in f" {line.split(' - ')[-1]}"] == [
        0,
        0,
        0,
        0,
        1,
        1,
        1,
        1,
    ]
    parser.feed_all(lines[end_of_rollout_1 + 1 :])
    pd.testing.assert_frame_equal(parser.table(), parse_log(PPO_LOG).steps)


def test_slime_lines_without_header_default_format_multiline_and_numpy_torch_reprs():
    parsed = parse_log(LOGS / "slime_plain_multiline.log")
    steps = parsed.steps
    assert parsed.malformed_count == 0
    assert parsed.steps_per_rollout == 2
    assert list(steps["rollout_id"]) == [0, 1, 2]
    r0, r1, r2 = (row(steps, i) for i in (0, 1, 2))
    assert r0["train/loss"] == pytest.approx(0.02)  # steps 0 and 1, printed bare
    assert r1["train/loss"] == pytest.approx(0.03)  # INFO:name:step 2/3
    assert r1["rollout/raw_reward"] == 0.55
    assert r0["multi_turn/multi_turn_metric/round_number_mean"] == 2.5  # np.float64(2.5)
    assert r0["multi_turn/multi_turn_metric/round_number_max"] == 4.0  # np.int64(4)
    assert r0["passrate/pass@4"] == 0.75
    # pretty-printed dicts with tensor(x, device=...), np.float32, np.True_, np.False_
    assert r2["rollout/log_probs"] == -0.47
    assert r2["rollout/truncated"] == 0.0
    assert r2["train/finite"] == 1.0
    assert r2["train/loss"] == pytest.approx((0.015 + 0.025) / 2)
    assert r2["perf/step_time"] == 182.0
    # no timestamps: the trainer's own step_time, else train_wait_time + train_time
    assert steps["timestamp"].isna().all()
    assert steps["cycle_time"].tolist() == [180.0, 182.0, 182.0]
    assert parsed.counts["multi_turn"] == {"recognised": 1, "dropped": 0}
    assert parsed.counts["passrate"] == {"recognised": 1, "dropped": 0}
    assert parsed.counts["step"] == {"recognised": 6, "dropped": 0}


def test_real_slime_perf_line_from_a_public_issue():
    parsed = parse_log(LOGS / "slime_issue_1837_excerpt.log")
    steps = parsed.steps
    assert list(steps["rollout_id"]) == [0]
    assert row(steps, 0)["perf/rollout_time"] == pytest.approx(371.1796889305115)
    assert row(steps, 0)["rollout/response_len/max"] == 4096.0
    # slime's header has no milliseconds
    assert row(steps, 0)["timestamp"] == pd.Timestamp("2026-04-15 07:57:53")
    assert parsed.counts == {"perf": {"recognised": 1, "dropped": 0}}


def test_real_bare_slime_step_lines_from_a_public_issue():
    parsed = parse_log(LOGS / "slime_prorl_issue_40_excerpt.log")
    per_step = parsed.optimizer_steps.set_index("step")
    assert list(per_step.index) == [1, 28]
    assert per_step.loc[1, "train/grad_norm"] == pytest.approx(2955012562.8240876)
    assert per_step.loc[28, "train/kl_loss"] == pytest.approx(0.0007035313756205142)
    # nothing says how many steps a rollout has: one each, as logged
    assert list(parsed.steps["rollout_id"]) == [1, 28]
    assert list(
        parse_log(LOGS / "slime_prorl_issue_40_excerpt.log", steps_per_rollout=4).steps[
            "rollout_id"
        ]
    ) == [0, 7]


def test_unknown_unreadable_and_unfinished_lines_are_counted_as_dropped():
    header = "[2026-08-05 10:00:00.000 actor] x.py:1 - "
    lines = [
        f"{header}agent 3: {{'agent/turns': 4}}",  # a kind this parser does not know
        f"{header}critic-perf 3: {{'perf/x': 1.0}}",  # a role tag on a per-rollout kind
        f"{header}step 0: {{'train/loss': 0.1,",  # cut off by the next record
        f"{header}perf 0: {{'perf/step_time': 10.0}}",
        "(MegatronTrainRayActor pid=7) step 1: {'train/loss': 0.3,",  # continued with Ray's prefix
        "(MegatronTrainRayActor pid=7)  'train/grad_norm': 1.5}",
        "perf 1: {'perf/step_time': 11.0, 'perf/x': <object at 0x1>}",  # unreadable value
        "step 2: {'train/loss': 0.2,",  # the log ends inside the dict
    ]
    glued = (
        f"{header}perf 2: {{'perf/a': 1.0,{header}perf 2: {{'perf/b': 2.0,"  # two cut-off records
    )
    parsed = parse_lines(lines)
    assert parsed.counts == {
        "agent": {"recognised": 0, "dropped": 1},
        "critic-perf": {"recognised": 0, "dropped": 1},
        "perf": {"recognised": 1, "dropped": 1},
        "step": {"recognised": 1, "dropped": 2},
    }
    assert [m.line_number for m in parsed.malformed] == [3, 7, 8]
    assert parse_lines([glued]).counts == {"perf": {"recognised": 0, "dropped": 2}}
    assert list(parsed.optimizer_steps["step"]) == [1]
    assert parsed.optimizer_steps["train/grad_norm"].tolist() == [1.5]


def test_numpy2_and_torch_reprs():
    assert parse_metric_dict(
        "{'a': np.True_, 'b': np.False_, 'c': tensor(0.5, device='cuda:0'), 'd': np.float64(nan),"
        " 'e': tensor(2, device='cuda:0', dtype=torch.int32), 'f': np.inf, 'g': tensor([1., 2.]),"
        " 'h': tensor(0.25, device='cuda:0', grad_fn=<MeanBackward0>)}"
    ) == {
        "a": 1.0,
        "b": 0.0,
        "c": 0.5,
        "d": pytest.approx(math.nan, nan_ok=True),
        "e": 2.0,
        "f": math.inf,
        "h": 0.25,
    }


def test_inference_holds_when_generation_runs_ahead_or_the_critic_trains_alone():
    """Asynchronous training logs the rollout manager's perf N+1 before the trainer's lines of
    rollout N; --num-critic-only-steps leaves the first rollouts without actor lines."""
    lines = PPO_LOG.read_text().splitlines()
    generation = [line for line in lines if "metrics.py:89" in line]
    ahead = [generation[0]]
    for line in (line for line in lines if "metrics.py:89" not in line):
        ahead.append(line)
        if "log_utils.py:123 - rollout " in line:
            rollout_id = int(line.split(" - rollout ")[1].split(":")[0])
            ahead += generation[rollout_id + 1 : rollout_id + 2]
    parsed = parse_lines(ahead)
    assert parsed.steps_per_rollout == 2
    assert list(parsed.steps["rollout_id"]) == list(range(6))
    assert parsed.steps["cycle_time"].iloc[1:].tolist() == pytest.approx([487.0] * 5)

    def actor_line_of_first_two_rollouts(line: str) -> bool:
        return "actor_cell0_rank0" in line and any(
            f" - {what}:" in line
            for r in (0, 1)
            for what in (f"rollout {r}", f"perf {r}", f"step {2 * r}", f"step {2 * r + 1}")
        )

    critic_first = parse_lines(
        [line for line in lines if not actor_line_of_first_two_rollouts(line)]
    )
    assert critic_first.steps_per_rollout == 2
    assert list(critic_first.optimizer_steps["rollout_id"]) == [i // 2 for i in range(12)]


def test_a_nan_step_counter_falls_back_to_the_line_id():
    parsed = parse_lines(["step 3: {'train/loss': 0.5, 'train/step': nan}"])
    assert list(parsed.optimizer_steps["step"]) == [3]


def _dynamic_batch_log() -> list[str]:
    """miles' lines for three rollouts of 3, 2 and 1 optimizer steps (a dynamic global batch
    size): the step id is rollout_id * <that rollout's steps> + step_id, so ids 2 and 3 come
    again, and miles logs each step twice (log_utils.py and model.py)."""
    head = (
        "(MegatronTrainRayActor pid=1, ip=10.0.0.2) [2026-08-05 09:{:02d}:00.000 actor_cell0_rank0]"
    )
    lines = []
    for rollout_id, steps in enumerate((3, 2, 1)):
        minute = 10 * rollout_id
        lines.append(f"{head.format(minute)} log_utils.py:123 - rollout {rollout_id}: {{}}")
        for step_id in range(steps):
            accumulated = rollout_id * steps + step_id
            values = {"train/loss": 10.0 * rollout_id + step_id, "train/step": accumulated}
            for where in ("log_utils.py:542", "model.py:854"):
                lines.append(f"{head.format(minute + 1)} {where} - step {accumulated}: {values}")
        perf = {"perf/step_time": 60.0}
        lines.append(f"{head.format(minute + 2)} log_utils.py:542 - perf {rollout_id}: {perf}")
    return lines


def test_steps_of_a_dynamic_global_batch_go_to_the_rollout_they_were_logged_under(tmp_path):
    parsed = ParsedLog.of(MilesLogParser(variable_steps=True).feed_all(_dynamic_batch_log()))
    assert parsed.steps["train/loss"].tolist() == [1.0, 10.5, 20.0]
    per_step = parsed.optimizer_steps
    assert per_step["rollout_id"].tolist() == [0, 0, 0, 1, 1, 2]
    assert per_step["train/step"].tolist() == [0, 1, 2, 2, 3, 2]
    assert parsed.steps_per_rollout is None
    # read by step id alone, rollout 1's first step overwrites rollout 0's last
    assert parse_lines(_dynamic_batch_log()).steps["train/loss"].tolist() != [1.0, 10.5, 20.0]
    # the stages' parser turns this on from the recipe's flags
    recipe = tmp_path / "dynamic.yaml"
    recipe.write_text(f"extends: {PR_RECIPE}\nargs: {{use-dynamic-global-batch-size: true}}\n")
    assert log_parser(resolve(load_recipe(recipe).recipe)).variable_steps
    assert not log_parser(resolve(load_recipe(PR_RECIPE).recipe)).variable_steps
    # and so does parse-log, given the recipe (it read by step id alone)
    log = tmp_path / "dynamic.log"
    log.write_text("\n".join(_dynamic_batch_log()) + "\n")
    out = tmp_path / "steps.csv"
    for stage in ([], ["--stage", "bench"]):
        argv = [RECIPEVAL, "parse-log", str(log), "--out", str(out), "--recipe", str(recipe)]
        proc = subprocess.run(argv + stage, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert pd.read_csv(out)["train/loss"].tolist() == [1.0, 10.5, 20.0]
    proc = subprocess.run(
        [RECIPEVAL, "parse-log", str(log), "--out", str(out), "--stage", "bench"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "give the recipe with --recipe" in proc.stderr


RAY_DEDUP_NOTE = (
    " (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or "
    "see https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html"
    "#log-deduplication for more options.)"
)


def test_a_ray_folded_line_with_the_sessions_dedup_note_is_read():
    """Ray appends, to the first line it folds in a session, a note on how to turn folding
    off; the line was taken as malformed and its rollout dropped."""
    line = (
        "\x1b[33m(MegatronTrainRayActor pid=6)\x1b[0m [2026-08-21 10:05:00.000 "
        "actor_cell0_rank0] log_utils.py:123 - rollout 1: {'rollout/log_probs': -0.4}"
        f"\x1b[2m [repeated 2x across cluster]{RAY_DEDUP_NOTE}\x1b[0m\n"
    )
    parsed = parse_lines([line])
    assert parsed.malformed_count == 0
    assert row(parsed.steps, 1)["rollout/log_probs"] == -0.4


def test_the_first_rollout_evaluated_before_and_after_training_keeps_both():
    """miles and slime evaluate the first rollout id before training and again after it when
    the eval interval falls on it: two `eval 0` lines, and the second overwrote the first."""

    def line(minute: int, name: str, message: str) -> str:
        return f"[2026-08-21 10:{minute:02d}:00.000 {name}] x.py:1 - {message}\n"

    manager, trainer = "rollout_manager", "actor_cell0_rank0"
    evals = [
        "{'eval/gsm8k': 0.31, 'eval/gsm8k-truncated_ratio': 0.0}",
        "{'eval/gsm8k': 0.40, 'eval/gsm8k-truncated_ratio': 0.0}",
        "{'eval/gsm8k': 0.45, 'eval/gsm8k-truncated_ratio': 0.1}",
    ]
    lines = [line(0, manager, f"eval 0: {evals[0]}")]
    for rollout in (0, 1):
        lines += [
            line(10 * rollout + 1, manager, f"perf {rollout}: {{'perf/rollout_time': 60.0}}"),
            line(10 * rollout + 2, trainer, f"rollout {rollout}: {{'rollout/log_probs': -0.4}}"),
            line(10 * rollout + 3, trainer, f"step {rollout}: {{'train/loss': 0.1}}"),
            line(10 * rollout + 4, trainer, f"perf {rollout}: {{'perf/step_time': 180.0}}"),
            line(10 * rollout + 5, manager, f"eval {rollout}: {evals[rollout + 1]}"),
        ]
    steps = parse_lines(lines).steps
    r0, r1 = row(steps, 0), row(steps, 1)
    assert (r0["eval_before_train/gsm8k"], r0["eval/gsm8k"]) == (0.31, 0.40)
    assert r0["eval_before_train/gsm8k-truncated_ratio"] == 0.0
    assert r1["eval/gsm8k"] == 0.45 and math.isnan(r1["eval_before_train/gsm8k"])
    # a verbatim repeat of one evaluation (Ray) is one evaluation
    repeated = parse_lines([lines[0], *lines[:5]]).steps
    assert "eval_before_train/gsm8k" not in repeated.columns
    assert row(repeated, 0)["eval/gsm8k"] == 0.31
