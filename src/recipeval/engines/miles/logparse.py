"""Read miles' training log (and the reference engine's, which uses the same format) into a
step table: one row per rollout id, one column per metric key.

The lines that matter are logger records such as
`[2026-08-05 12:34:56.789 name] rollout.py:123 - perf 3: {'perf/rollout_time': 150.2, ...}`,
possibly behind a Ray actor prefix `(RolloutManager pid=123, ip=...)` and ANSI colours.
Everything else in the log is ignored; a metric line whose dict cannot be read is skipped and
counted (a killed run often ends in half a line).
"""

from __future__ import annotations

import ast
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Ray's log deduplication appends this to a line it folded.
RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
RAY_ACTOR_PREFIX = r"\([^()]*\bpid=\d+[^()]*\)\s*"
LOG_TIMESTAMP = r"\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}"
# Where a new record starts inside a physical line (two processes writing one stream can
# glue a record onto the unfinished previous one).
RECORD_START = re.compile(rf"(?:{RAY_ACTOR_PREFIX})?{LOG_TIMESTAMP}")
HEADER = re.compile(
    rf"^(?:{RAY_ACTOR_PREFIX})?\[(?P<ts>\d{{4}}-\d{{2}}-\d{{2}}[ T]\d{{2}}:\d{{2}}:\d{{2}}(?:[.,]\d+)?)"
    r"(?: [^\]]*)?\]\s+\S+:\d+ - (?P<message>.*)$"
)
METRIC_MESSAGE = re.compile(
    rf"^(?:{RAY_ACTOR_PREFIX})?(?P<kind>perf|rollout|step) (?P<id>\d+): (?P<body>\{{.*)$"
)
# numpy 2 scalar reprs (`np.float64(0.5)`) and torch's `tensor(0.5)` wrap a plain number.
NUMBER_WRAPPERS = re.compile(r"^(?:(?:np|numpy)\.(?:float\d*|u?int\d*|bool_?)|tensor|float|int)$")
NON_FINITE = {
    "nan": math.nan,
    "inf": math.inf,
    "infinity": math.inf,
    "NaN": math.nan,
    "Infinity": math.inf,
}

ROLLOUT_ID, TIMESTAMP, CYCLE_TIME = "rollout_id", "timestamp", "cycle_time"


class _Literals(ast.NodeTransformer):
    """Rewrite the non-literal spellings miles' dicts contain into constants, so that
    ast.literal_eval (never eval) can read them."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in NON_FINITE:
            return ast.copy_location(ast.Constant(NON_FINITE[node.id]), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = ast.unparse(node.func)
        if NUMBER_WRAPPERS.match(name) and len(node.args) == 1 and not node.keywords:
            arg = self.visit(node.args[0])
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                # float('nan'), float('inf')
                return ast.copy_location(
                    ast.Constant(NON_FINITE.get(arg.value.lower(), arg.value)), node
                )
            return arg
        return node


def parse_metric_dict(body: str) -> dict[str, float]:
    """`{'a': 1.0, 'b': nan, 'c': np.float64(2.0)}` -> {'a': 1.0, 'b': nan, 'c': 2.0}.
    Non-numeric values (lists, strings) are dropped. Raises ValueError when body is not a dict."""
    try:
        tree = ast.parse(body.strip(), mode="eval")
        value = ast.literal_eval(_Literals().visit(tree))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as err:
        raise ValueError(f"not a metric dict: {err}") from None
    if not isinstance(value, dict):
        raise ValueError("not a dict")  # noqa: TRY004 - callers catch ValueError for any bad line
    out: dict[str, float] = {}
    for key, item in value.items():
        if isinstance(item, bool | int | float):
            out[str(key)] = float(item)
    return out


@dataclass
class Malformed:
    line_number: int
    text: str


@dataclass
class MilesLogParser:
    """Incremental parser: feed lines as they arrive (a runner streams them), read the table
    at any time."""

    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    first_seen: dict[int, pd.Timestamp] = field(default_factory=dict)
    lines: int = 0
    malformed: list[Malformed] = field(default_factory=list)

    def feed(self, line: str) -> int | None:
        """Take one physical log line; returns the rollout id it updated, if any."""
        self.lines += 1
        updated = None
        for record in split_records(clean_line(line)):
            rollout_id = self._record(record)
            updated = rollout_id if rollout_id is not None else updated
        return updated

    def feed_all(self, lines: Iterable[str]) -> MilesLogParser:
        for line in lines:
            self.feed(line)
        return self

    def _record(self, record: str) -> int | None:
        header = HEADER.match(record)
        message = header.group("message") if header else record
        match = METRIC_MESSAGE.match(message.strip())
        if match is None:
            return None
        try:
            values = parse_metric_dict(match.group("body"))
        except ValueError:
            self.malformed.append(Malformed(self.lines, record[:200]))
            return None
        rollout_id = int(match.group("id"))
        self.metrics.setdefault(rollout_id, {}).update(values)
        if header is not None:
            stamp = pd.Timestamp(header.group("ts").replace(",", "."))
            seen = self.first_seen.get(rollout_id)
            if seen is None or stamp < seen:
                self.first_seen[rollout_id] = stamp
        return rollout_id

    @property
    def malformed_count(self) -> int:
        return len(self.malformed)

    def table(self) -> pd.DataFrame:
        """One row per rollout id (sorted), metric columns sorted by name, plus `timestamp`
        (first log record of that rollout) and `cycle_time` (seconds since the previous
        rollout's timestamp; NaN for the first row and where ids are missing in between)."""
        ids = sorted(self.metrics)
        frame = pd.DataFrame.from_dict(
            {i: self.metrics[i] for i in ids}, orient="index", dtype="float64"
        )
        frame = frame.reindex(columns=sorted(frame.columns))
        frame.index = pd.Index(ids, name=ROLLOUT_ID, dtype="int64")
        stamps = pd.Series([self.first_seen.get(i, pd.NaT) for i in ids], index=frame.index)
        stamps = pd.to_datetime(stamps)
        consecutive = pd.Series(frame.index.to_numpy(), index=frame.index).diff() == 1
        cycle = stamps.diff().dt.total_seconds().where(consecutive)
        frame.insert(0, CYCLE_TIME, cycle.astype("float64"))
        frame.insert(0, TIMESTAMP, stamps)
        return frame.reset_index()


def clean_line(line: str) -> str:
    return RAY_REPEATED.sub("", ANSI_ESCAPE.sub("", line.rstrip("\r\n")))


def split_records(line: str) -> list[str]:
    starts = [m.start() for m in RECORD_START.finditer(line)]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return [line[a:b] for a, b in zip(starts, [*starts[1:], len(line)]) if line[a:b].strip()]


@dataclass
class ParsedLog:
    steps: pd.DataFrame
    lines: int
    malformed: list[Malformed]

    @property
    def malformed_count(self) -> int:
        return len(self.malformed)


def parse_lines(lines: Iterable[str]) -> ParsedLog:
    parser = MilesLogParser().feed_all(lines)
    return ParsedLog(parser.table(), parser.lines, parser.malformed)


def parse_log(path: Path) -> ParsedLog:
    """Parse a log file; undecodable bytes are replaced, never fatal."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        return parse_lines(fh)


def write_steps(steps: pd.DataFrame, path: Path) -> Path:
    """Write the step table as .parquet or .csv (by suffix), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if path.suffix == ".parquet":
        steps.to_parquet(tmp, index=False)
    elif path.suffix == ".csv":
        steps.to_csv(tmp, index=False)
    else:
        raise ValueError(f"{path}: the step table is written as .parquet or .csv")
    os.replace(tmp, path)
    return path
