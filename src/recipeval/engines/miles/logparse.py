"""Read a miles or slime training log (and the reference engine's, which writes miles' format)
into tables: one row per rollout id (`steps`), and one row per optimizer step
(`optimizer_steps`).

What the trainers write (facts from their sources; loglines.py reads one record):
- `step N: {...}` and, for other roles, `<role>-step N: {...}` (`critic-step N`): one line per
  optimizer step. N counts optimizer steps, not rollouts: it is
  `rollout_id * num_steps_per_rollout + step_id` (miles: backends/training_utils/log_utils.py
  log_train_step, again in backends/megatron_utils/model.py; slime: backends/megatron_utils/
  model.py), also in the dict as `train/step`. A step line is filed under rollout
  `N // steps_per_rollout`. steps_per_rollout is the recipe's num-steps-per-rollout when the
  caller knows it; otherwise it is inferred from the log: the trainer logs `rollout R`
  (log_rollout_data) before the actor's steps of rollout R and its own `perf R` (with
  perf/step_time or perf/train_time) after them and after the critic's, so most steps are seen
  with their rollout id (the rollout manager's perf lines say nothing here: asynchronous runs
  log them ahead); the inferred value is the one that files the most of those steps under the
  right rollout (1 when the log holds no such line).
  With a dynamic global batch size (`variable_steps`: --use-dynamic-global-batch-size,
  --allow-partial-train-step; miles' multi-LoRA turns the first on itself) each rollout has its
  own number of steps, and miles still writes `rollout_id * <this rollout's steps> + step_id`:
  ids skip and repeat across rollouts. Then a step is filed under the rollout it was logged
  under, and two lines are one step only when they share the id and that rollout; the
  per-step table numbers the steps in log order (`train/step` keeps miles' id).
- `perf N`, `rollout N`, `eval N`, `multi_turn N`, `passrate N` (slime; miles logs pass@k in
  the rollout manager's perf line since 2026-07): one line per rollout id N (perf comes twice:
  from the rollout manager and from the trainer; their keys differ). `eval N` can come twice
  for the run's first rollout id: before its training (unless --skip-eval-before-train) and
  after it when the eval interval falls on it (miles and slime train.py). The first of two
  such lines that differ is kept as `eval_before_train/<name>` (from `eval/<name>`), so the
  policy the run started from is not overwritten by the trained one.

How a rollout's row aggregates its lines, per metric kind (ROLLUP below, first match wins):

| kind                    | key                          | rollout value                      |
|-------------------------|------------------------------|------------------------------------|
| step (any role)         | `train/step`                 | last: the rollout's last step      |
| step (any role)         | `*lr-*`                      | last: the rate the rollout ends at |
| step (any role)         | `*ppo_kl`, `*pg_clipfrac`    | first: see below                   |
| step (any role)         | any other                    | mean over the rollout's steps      |
| perf, rollout, eval,    | any                          | last line logged for that id       |
| multi_turn, passrate    |                              |                                    |

ppo_kl and pg_clipfrac compare the trained policy with the one that sampled the rollout: at
the rollout's first step they are zero up to round-off (the trainers' CI asserts it at
step_id 0), later steps add the update's own drift, so the row keeps the first step (the
per-step table keeps them all). A mean is non-finite as soon as one step is, so a nan or inf
step is never hidden.

Time: `timestamp` is the end of the rollout: the time of the trainer's `perf N` line (logged
after its training) when there is one, else of its latest line (eval lines left out:
evaluation runs every eval-interval rollouts after training). `cycle_time` is the time from
the end of one rollout to the end of the next (NaN for the first row and where ids are
missing in between). Lines without timestamps (no header, Python's default format) take the
rollout's perf/step_time instead, which the trainer measures the same way (waiting for the
rollout plus training; else the sum perf/train_wait_time + perf/train_time).

Nothing vanishes silently: `counts` holds per kind (role tag included) the metric lines
recognised and dropped; a line of a kind this parser does not know, or whose dict cannot be
read, is dropped and counted (unreadable ones also listed in `malformed`: a killed run often
ends in half a line). Dicts printed over several lines are joined first (the trainers print
one line each; a pretty-printed or wrapped log still reads).

Known limit: with a dynamic global batch size and a critic, rollouts the critic trains alone
(--num-critic-only-steps) have no line of their own, so their critic steps are filed under the
next rollout that has one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path

import pandas as pd

from recipeval.atomic import atomic_write
from recipeval.engines.miles.loglines import (
    MetricMessage,
    clean_line,
    continuation,
    metric_message,
    open_brackets,
    parse_metric_dict,
    read_header,
    split_records,
)

ROLLOUT_ID, TIMESTAMP, CYCLE_TIME = "rollout_id", "timestamp", "cycle_time"
OPTIMIZER_STEP = "step"
STEP_KIND = "step"
ROLLOUT_KINDS = frozenset({"perf", "rollout", "eval", "multi_turn", "passrate"})
# Logged by the trainer before the actor's optimizer steps of that rollout.
OPENING_KINDS = frozenset({"rollout", "multi_turn", "passrate"})
EVAL_KIND = "eval"
# Where the evaluation before training goes when the first rollout id is evaluated twice.
EVAL_BEFORE_TRAIN = "eval_before_train/"
# Keys only the trainer's perf line has (the rollout manager's has perf/rollout_time).
TRAINER_PERF_KEYS = ("perf/step_time", "perf/train_time", "perf/actor_train_time")
STEP_TIME = "perf/step_time"
STEP_TIME_PARTS = ("perf/train_wait_time", "perf/train_time")
# Dicts printed over more lines than this are taken as broken.
MAX_CONTINUATION_LINES = 1000
ID_MAX = 2**63 - 1  # the step table's ids are int64


@dataclass(frozen=True)
class Rollup:
    kind: str
    key: str  # a shell-style pattern of metric keys
    how: str  # first | last | mean

    def matches(self, kind: str, key: str) -> bool:
        return kind == self.kind and fnmatchcase(key, self.key)


ROLLUP = (
    Rollup(STEP_KIND, "train/step", "last"),
    Rollup(STEP_KIND, "*lr-*", "last"),
    Rollup(STEP_KIND, "*ppo_kl", "first"),
    Rollup(STEP_KIND, "*pg_clipfrac", "first"),
    Rollup(STEP_KIND, "*", "mean"),
    *(Rollup(kind, "*", "last") for kind in sorted(ROLLOUT_KINDS)),
)


@cache
def rollup(kind: str, key: str) -> str:
    """How a rollout's row aggregates `key` of lines of `kind` (see ROLLUP)."""
    return next(rule.how for rule in ROLLUP if rule.matches(kind, key))


@dataclass
class Malformed:
    line_number: int
    text: str


@dataclass
class _Pending:
    """A metric record whose dict goes on in the next lines."""

    line_number: int
    stamp: pd.Timestamp | None
    message: MetricMessage
    text: list[str]  # the lines as logged, for the malformed list
    body: list[str]  # the dict's parts


def infer_steps_per_rollout(pairs: dict[int, int]) -> int:
    """The steps-per-rollout k that files the most (step id, rollout id) pairs as
    step // k == rollout (smallest k on a tie; 1 without pairs). Candidates are the bounds
    each pair puts on k: rollout * k <= step < (rollout + 1) * k."""
    candidates = {1}
    for step, rollout in pairs.items():
        candidates.add(-(-(step + 1) // (rollout + 1)))
        if rollout > 0:
            candidates.add(max(step // rollout, 1))
    return max(sorted(candidates), key=lambda k: sum(s // k == r for s, r in pairs.items()))


def _ids_fit(logged_id: int, values: dict[str, float]) -> bool:
    """Whether the line's id and its train/step fit the step table's int64 ids (a corrupt
    line's 20-digit id would otherwise end the whole parse)."""
    step = values.get("train/step", math.nan)
    return 0 <= logged_id <= ID_MAX and (not math.isfinite(step) or abs(step) <= ID_MAX)


@dataclass
class MilesLogParser:
    """Incremental parser: feed lines as they arrive (a runner streams them), read the tables
    at any time. steps_per_rollout: the recipe's num-steps-per-rollout; None infers it.
    variable_steps: the number of steps differs between rollouts (module docstring)."""

    steps_per_rollout: int | None = None
    variable_steps: bool = False
    lines: int = 0
    # per rollout id: values of its own lines, the time of its latest line (eval left out) and
    # of the trainer's perf line that closes it
    _rollout_metrics: dict[int, dict[str, float]] = field(
        default_factory=dict, init=False, repr=False
    )
    _latest: dict[int, pd.Timestamp] = field(default_factory=dict, init=False, repr=False)
    _closed_at: dict[int, pd.Timestamp] = field(default_factory=dict, init=False, repr=False)
    # per optimizer step id: values, time of its line, the rollout it was logged under
    _step_metrics: dict[int, dict[str, float]] = field(default_factory=dict, init=False, repr=False)
    _step_stamps: dict[int, pd.Timestamp] = field(default_factory=dict, init=False, repr=False)
    _step_rollouts: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    # per kind as logged: metric lines read, and dropped
    _recognised: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _dropped: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _malformed: list[Malformed] = field(default_factory=list, init=False, repr=False)
    _pending: _Pending | None = field(default=None, init=False, repr=False)
    _open_rollout: int | None = field(default=None, init=False, repr=False)
    _unclosed_steps: list[int] = field(default_factory=list, init=False, repr=False)
    # variable_steps: a step's number in log order, by (rollout it was logged under, or the
    # count of closed rollouts before it when none was open; miles' id)
    _step_keys: dict[tuple[int | str, int], int] = field(
        default_factory=dict, init=False, repr=False
    )
    _closes: int = field(default=0, init=False, repr=False)
    # the first eval line of the first rollout id evaluated (see EVAL_BEFORE_TRAIN)
    _first_eval: tuple[int, dict[str, float]] | None = field(default=None, init=False, repr=False)
    # the inferred steps per rollout, and the count of changes to _step_rollouts it saw
    _pairs_changed: int = field(default=0, init=False, repr=False)
    _inferred: tuple[int, int] = field(default=(-1, 1), init=False, repr=False)

    def __post_init__(self) -> None:
        if self.steps_per_rollout is not None and self.steps_per_rollout < 1:
            raise ValueError(
                f"steps_per_rollout must be a positive integer, not {self.steps_per_rollout}"
            )

    def feed(self, line: str) -> int | None:
        """Take one physical log line; returns the rollout id it updated, if any (for a step
        line, the rollout it was logged under, else the best guess so far)."""
        self.lines += 1
        text = clean_line(line)
        updated = None
        if self._pending is not None:
            more = continuation(text)
            if more is not None:
                return self._carry_on(more)
            self._drop_pending()
        for record in split_records(text):
            rollout_id = self._record(record)
            updated = rollout_id if rollout_id is not None else updated
        return updated

    def feed_all(self, lines: Iterable[str]) -> MilesLogParser:
        for line in lines:
            self.feed(line)
        return self

    @property
    def malformed(self) -> list[Malformed]:
        """Metric lines whose dict could not be read, an unfinished last one included."""
        if self._pending is None:
            return list(self._malformed)
        pending = self._pending
        return [*self._malformed, Malformed(pending.line_number, "\n".join(pending.text)[:200])]

    @property
    def malformed_count(self) -> int:
        return len(self.malformed)

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        """Per kind as logged (`step`, `critic-step`, `perf`, ...): metric lines recognised
        and dropped (unreadable, unfinished or of a kind not known here)."""
        dropped = dict(self._dropped)
        if self._pending is not None:
            label = self._pending.message.label
            dropped[label] = dropped.get(label, 0) + 1
        return {
            kind: {"recognised": self._recognised.get(kind, 0), "dropped": dropped.get(kind, 0)}
            for kind in sorted({*self._recognised, *dropped})
        }

    def _record(self, record: str) -> int | None:
        stamp, message = read_header(record)
        parsed = metric_message(message)
        if parsed is None:
            return None
        if self._pending is not None:  # glued behind an unfinished record in the same line
            self._drop_pending()
        if open_brackets(parsed.body) > 0:
            self._pending = _Pending(self.lines, stamp, parsed, [record.strip()], [parsed.body])
            return None
        return self._metric(parsed, parsed.body, stamp, record)

    def _carry_on(self, more: str) -> int | None:
        assert self._pending is not None
        pending = self._pending
        pending.text.append(more)
        pending.body.append(more)
        body = "\n".join(pending.body)
        if open_brackets(body) > 0:
            if len(pending.body) > MAX_CONTINUATION_LINES:
                self._drop_pending()
            return None
        self._pending = None
        return self._metric(
            pending.message, body, pending.stamp, "\n".join(pending.text), pending.line_number
        )

    def _drop_pending(self) -> None:
        pending = self._pending
        assert pending is not None
        self._pending = None
        self._malformed.append(Malformed(pending.line_number, "\n".join(pending.text)[:200]))
        self._count(self._dropped, pending.message.label)

    @staticmethod
    def _count(counter: dict[str, int], label: str) -> None:
        counter[label] = counter.get(label, 0) + 1

    def _metric(
        self,
        message: MetricMessage,
        body: str,
        stamp: pd.Timestamp | None,
        record: str,
        line_number: int | None = None,
    ) -> int | None:
        known = message.kind == STEP_KIND or (
            message.role is None and message.kind in ROLLOUT_KINDS
        )
        if not known:
            self._count(self._dropped, message.label)
            return None
        try:
            values = parse_metric_dict(body)
        except ValueError:
            values = None
        if values is None or not _ids_fit(message.id, values):
            self._malformed.append(Malformed(line_number or self.lines, record[:200]))
            self._count(self._dropped, message.label)
            return None
        self._count(self._recognised, message.label)
        if message.kind == STEP_KIND:
            return self._step(message.id, values, stamp)
        return self._rollout_line(message.kind, message.id, values, stamp)

    def _step(self, step_id: int, values: dict[str, float], stamp: pd.Timestamp | None) -> int:
        logged = values.get("train/step", math.nan)
        step = int(logged) if math.isfinite(logged) else step_id
        if self.variable_steps:
            under = self._open_rollout if self._open_rollout is not None else f"c{self._closes}"
            step = self._step_keys.setdefault((under, step), len(self._step_keys))
        self._step_metrics.setdefault(step, {}).update(values)
        if stamp is not None:
            seen = self._step_stamps.get(step)
            self._step_stamps[step] = stamp if seen is None else max(seen, stamp)
        if self._open_rollout is not None:
            self._step_rollouts[step] = self._open_rollout
            self._pairs_changed += 1
        self._unclosed_steps.append(step)
        if self.variable_steps:
            return self._rollout_of(step, 1)
        if self.steps_per_rollout is not None:
            return step // self.steps_per_rollout
        # the rollout it was logged under; inferring k on every line would cost O(steps)
        return self._step_rollouts.get(step, step // self._inferred[1])

    def _rollout_of(self, step: int, per_rollout: int) -> int:
        """The rollout a step is filed under: its id // steps per rollout, or with
        variable_steps the rollout it was logged under (else the latest rollout seen)."""
        if not self.variable_steps:
            return step // per_rollout
        if step in self._step_rollouts:
            return self._step_rollouts[step]
        return max(self._rollout_metrics, default=0)

    def _rollout_line(
        self, kind: str, rollout_id: int, values: dict[str, float], stamp: pd.Timestamp | None
    ) -> int:
        row = self._rollout_metrics.setdefault(rollout_id, {})
        if kind == EVAL_KIND:
            self._keep_eval_before_train(rollout_id, values, row)
        # logged once per rollout id: a repeat (Ray repeats lines) folds into the value so far
        for key, value in values.items():
            row[key] = _fold(rollup(kind, key), [row[key], value]) if key in row else value
        closing = kind == "perf" and any(key in values for key in TRAINER_PERF_KEYS)
        if kind in OPENING_KINDS:
            self._open_rollout = rollout_id
        if closing:
            for step in self._unclosed_steps:
                self._step_rollouts[step] = rollout_id
            self._pairs_changed += len(self._unclosed_steps)
            self._unclosed_steps.clear()
            self._open_rollout = None
            self._closes += 1
        if stamp is not None and kind != "eval":
            seen = self._latest.get(rollout_id)
            self._latest[rollout_id] = stamp if seen is None else max(seen, stamp)
            if closing:
                self._closed_at[rollout_id] = stamp
        return rollout_id

    def _keep_eval_before_train(
        self, rollout_id: int, values: dict[str, float], row: dict[str, float]
    ) -> None:
        """A second, different `eval N` for the first rollout id evaluated: the first one was
        the evaluation before training; it is kept under EVAL_BEFORE_TRAIN."""
        if self._first_eval is None:
            before_any_other = not self._rollout_metrics.keys() - {rollout_id}
            self._first_eval = (rollout_id, values) if before_any_other else (-1, {})
            return
        first_id, first = self._first_eval
        if first_id != rollout_id or first == values:
            return
        for key, value in first.items():
            row.setdefault(EVAL_BEFORE_TRAIN + key.removeprefix("eval/"), value)

    def steps_per_rollout_in_use(self) -> int:
        """The recipe's value when given, else the one inferred from the log so far."""
        if self.steps_per_rollout is not None:
            return self.steps_per_rollout
        seen, value = self._inferred
        if seen != self._pairs_changed:
            value = infer_steps_per_rollout(self._step_rollouts)
            self._inferred = (self._pairs_changed, value)
        return value

    def optimizer_steps(self) -> pd.DataFrame:
        """One row per optimizer step id (sorted): `step`, its `rollout_id`, `timestamp` (of
        its line), metric columns sorted by name (role tags keep roles apart:
        train/critic-loss)."""
        per_rollout = self.steps_per_rollout_in_use()
        ids = sorted(self._step_metrics)
        frame = _metric_frame(self._step_metrics, ids)
        frame.insert(
            0,
            TIMESTAMP,
            pd.to_datetime(
                pd.Series(
                    [self._step_stamps.get(i, pd.NaT) for i in ids],
                    index=frame.index,
                    dtype="object",
                )
            ),
        )
        frame.insert(
            0,
            ROLLOUT_ID,
            pd.Series(
                [self._rollout_of(i, per_rollout) for i in ids], index=frame.index, dtype="int64"
            ),
        )
        frame.index = pd.Index(ids, name=OPTIMIZER_STEP, dtype="int64")
        return frame.reset_index()

    def table(self) -> pd.DataFrame:
        """One row per rollout id (sorted): `rollout_id`, `timestamp` (end of the rollout),
        `cycle_time` (see the module docstring), metric columns sorted by name."""
        per_rollout = self.steps_per_rollout_in_use()
        rolled = _rollup_steps(
            self._step_metrics, {s: self._rollout_of(s, per_rollout) for s in self._step_metrics}
        )
        ids = sorted({*self._rollout_metrics, *rolled})
        # a key both kinds log (none in miles or slime) is taken from the per-rollout line
        frame = _metric_frame(
            {i: {**rolled.get(i, {}), **self._rollout_metrics.get(i, {})} for i in ids}, ids
        )
        frame.index = pd.Index(ids, name=ROLLOUT_ID, dtype="int64")
        ends = pd.to_datetime(
            pd.Series(self._end_times(ids, per_rollout), index=frame.index, dtype="object")
        )
        frame.insert(0, CYCLE_TIME, _cycle_times(frame, ends))
        frame.insert(0, TIMESTAMP, ends)
        return frame.reset_index()

    def _end_times(self, ids: list[int], per_rollout: int) -> list[pd.Timestamp]:
        """Per rollout id: the trainer's closing perf line, else its latest line or step."""
        latest = dict(self._latest)
        for step, stamp in self._step_stamps.items():
            rollout_id = self._rollout_of(step, per_rollout)
            latest[rollout_id] = max(latest.get(rollout_id, stamp), stamp)
        return [self._closed_at.get(i, latest.get(i, pd.NaT)) for i in ids]


def _metric_frame(metrics: dict[int, dict[str, float]], ids: list[int]) -> pd.DataFrame:
    frame = pd.DataFrame.from_dict(
        {i: metrics.get(i, {}) for i in ids}, orient="index", dtype="float64"
    )
    frame = frame.reindex(index=ids, columns=sorted(frame.columns))
    return frame.astype("float64")


def _rollup_steps(
    metrics: dict[int, dict[str, float]], rollout_of: dict[int, int]
) -> dict[int, dict[str, float]]:
    """The optimizer steps folded to one row per rollout id (`rollout_of` each step's), each
    key as ROLLUP says, over the steps that logged it (a nan or inf among them stays in a
    mean: never hidden)."""
    logged: dict[int, dict[str, list[float]]] = {}
    for step in sorted(metrics):
        row = logged.setdefault(rollout_of[step], {})
        for key, value in metrics[step].items():
            row.setdefault(key, []).append(value)
    return {
        rollout_id: {key: _fold(rollup(STEP_KIND, key), values) for key, values in row.items()}
        for rollout_id, row in logged.items()
    }


def _fold(how: str, values: list[float]) -> float:
    """One value from a key's values in the order logged, as ROLLUP says."""
    if how == "first":
        return values[0]
    if how == "last":
        return values[-1]
    return sum(values) / len(values)


def _cycle_times(frame: pd.DataFrame, ends: pd.Series) -> pd.Series:
    consecutive = pd.Series(frame.index.to_numpy(), index=frame.index).diff() == 1
    cycle = ends.diff().dt.total_seconds().where(consecutive & ends.shift().notna())
    measured = (
        frame[STEP_TIME] if STEP_TIME in frame.columns else pd.Series(math.nan, index=frame.index)
    )
    if all(part in frame.columns for part in STEP_TIME_PARTS):
        measured = measured.fillna(frame[list(STEP_TIME_PARTS)].sum(axis=1, min_count=2))
    return cycle.where(ends.notna(), measured).astype("float64")


@dataclass
class ParsedLog:
    steps: pd.DataFrame
    lines: int
    malformed: list[Malformed]
    optimizer_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    steps_per_rollout: int | None = None

    @property
    def malformed_count(self) -> int:
        return len(self.malformed)

    @classmethod
    def of(cls, parser: MilesLogParser) -> ParsedLog:
        return cls(
            parser.table(),
            parser.lines,
            parser.malformed,
            parser.optimizer_steps(),
            parser.counts,
            None if parser.variable_steps else parser.steps_per_rollout_in_use(),
        )


def parse_lines(lines: Iterable[str], steps_per_rollout: int | None = None) -> ParsedLog:
    return ParsedLog.of(MilesLogParser(steps_per_rollout).feed_all(lines))


def parse_log(path: Path, steps_per_rollout: int | None = None) -> ParsedLog:
    """Parse a log file; undecodable bytes are replaced, never fatal."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        return parse_lines(fh, steps_per_rollout)


def write_steps(steps: pd.DataFrame, path: Path) -> Path:
    """Write a table (rollouts or optimizer steps) as .parquet or .csv (by suffix), atomically."""
    if path.suffix == ".parquet":
        return atomic_write(path, lambda tmp: steps.to_parquet(tmp, index=False))
    if path.suffix == ".csv":
        return atomic_write(path, lambda tmp: steps.to_csv(tmp, index=False))
    raise ValueError(f"{path}: the step table is written as .parquet or .csv")
