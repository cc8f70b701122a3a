"""Recognise one metric record in a miles or slime log: strip what Ray and terminals add,
find the logger header (miles' and slime's own format, or Python's default), split the message
`<kind> <id>: {...}` into its parts and read the dict repr safely (never eval).

The header formats (facts from the trainers' sources, not copied):
- miles (miles/utils/logging_utils.py): `[<date> <time>.<msecs> <name>] <file>:<line> - <message>`
- slime (slime/observability/logging_utils.py): `[<date> <time>] <file>:<line> - <message>`
- Python's logging.basicConfig() default: `<LEVEL>:<logger name>:<message>` (no time)
- no header at all: a message printed bare, or pasted alone.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

import pandas as pd

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Ray's log deduplication appends this to a line it folded, and to the first such line of a
# session a note on how to turn it off (ray/_private/ray_logging: DedupState, _warn_once).
RAY_REPEATED = re.compile(
    r"\s*\[repeated \d+x across cluster\](?: \(Ray deduplicates logs by default\..*\))?\s*$"
)
RAY_ACTOR_PREFIX = r"\([^()]*\bpid=\d+[^()]*\)\s*"
LOG_TIMESTAMP = r"\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}"
# Where a new record starts inside a physical line (two processes writing one stream can
# glue a record onto the unfinished previous one).
RECORD_START = re.compile(rf"(?:{RAY_ACTOR_PREFIX})?{LOG_TIMESTAMP}")
ACTOR_PREFIX = re.compile(rf"^{RAY_ACTOR_PREFIX}")
HEADER = re.compile(
    rf"^(?:{RAY_ACTOR_PREFIX})?\[(?P<ts>\d{{4}}-\d{{2}}-\d{{2}}[ T]\d{{2}}:\d{{2}}:\d{{2}}(?:[.,]\d+)?)"
    r"(?: [^\]]*)?\]\s+\S+:\d+ - (?P<message>.*)$"
)
DEFAULT_HEADER = re.compile(
    rf"^(?:{RAY_ACTOR_PREFIX})?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[^:\s]*:(?P<message>.*)$"
)
# `step 12: {`, `critic-step 12: {`, `perf 3: {`, `multi_turn 3: {`: an optional role tag,
# a kind word, an id, a dict. Kinds this parser does not know still match, to be counted.
METRIC_MESSAGE = re.compile(
    r"^(?:(?P<role>[A-Za-z][\w.]*)-)?(?P<kind>[A-Za-z_]\w*) (?P<id>\d+): (?P<body>\{.*)$"
)
# A line that carries on a dict printed over several lines (pprint style). miles and slime
# print each dict on one line; a log that went through a pretty-printer or a wrapping
# terminal still reads.
CONTINUATION = re.compile(
    r"""^\s*(?:['"{}\[\]()\d.+-]|(?:np|numpy|tensor|float|int|nan|inf|True|False|None)\b)"""
)
# numpy 2 scalar reprs (`np.float64(0.5)`), torch's `tensor(0.5, device='cuda:0')` and
# float('nan') wrap a plain number.
NUMBER_WRAPPERS = re.compile(r"^(?:(?:np|numpy)\.(?:float\d*|u?int\d*|bool_?)|tensor|float|int)$")
# torch prints the autograd node of a tensor that requires grad as `<MeanBackward0>`, which no
# Python parser reads; it says nothing about the value.
GRAD_FN = re.compile(r",\s*grad_fn=<\w+>")
NAMED_CONSTANTS = {
    "nan": math.nan,
    "NaN": math.nan,
    "inf": math.inf,
    "infinity": math.inf,
    "Infinity": math.inf,
    "np.nan": math.nan,
    "np.inf": math.inf,
    "numpy.nan": math.nan,
    "numpy.inf": math.inf,
    "np.True_": True,
    "np.False_": False,
    "numpy.True_": True,
    "numpy.False_": False,
}


@dataclass(frozen=True)
class MetricMessage:
    """`critic-step 12: {...}` -> role 'critic', kind 'step', id 12, body '{...}'."""

    role: str | None
    kind: str
    id: int
    body: str

    @property
    def label(self) -> str:
        """The kind as the log spells it, role tag included (`critic-step`)."""
        return f"{self.role}-{self.kind}" if self.role else self.kind


def clean_line(line: str) -> str:
    return RAY_REPEATED.sub("", ANSI_ESCAPE.sub("", line.rstrip("\r\n")))


def split_records(line: str) -> list[str]:
    starts = [m.start() for m in RECORD_START.finditer(line)]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return [line[a:b] for a, b in zip(starts, [*starts[1:], len(line)]) if line[a:b].strip()]


def read_header(record: str) -> tuple[pd.Timestamp | None, str]:
    """(time of the record if its header has one, the message)."""
    header = HEADER.match(record)
    if header is not None:
        return pd.Timestamp(header.group("ts").replace(",", ".")), header.group("message")
    default = DEFAULT_HEADER.match(record)
    if default is not None:
        return None, default.group("message")
    return None, ACTOR_PREFIX.sub("", record)


def metric_message(message: str) -> MetricMessage | None:
    match = METRIC_MESSAGE.match(message.strip())
    if match is None:
        return None
    return MetricMessage(
        match.group("role"), match.group("kind"), int(match.group("id")), match.group("body")
    )


def continuation(line: str) -> str | None:
    """The text of a line that may carry on an unfinished dict, or None when the line is a
    record of its own (a header, a metric message) or plainly something else."""
    text = ACTOR_PREFIX.sub("", line)
    if HEADER.match(line) or DEFAULT_HEADER.match(line) or metric_message(text):
        return None
    return text if CONTINUATION.match(text) else None


def open_brackets(text: str) -> int:
    """How many brackets are still open at the end of text (quotes respected): > 0 means the
    dict goes on in the next line."""
    depth, quote, escaped = 0, "", False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "{[(":
            depth += 1
        elif char in "}])":
            depth -= 1
    return depth


class _Literals(ast.NodeTransformer):
    """Rewrite the non-literal spellings the trainers' dicts contain (nan, np.float64(x),
    np.True_, tensor(x, device=...)) into constants, so that ast.literal_eval can read them."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in NAMED_CONSTANTS:
            return ast.copy_location(ast.Constant(NAMED_CONSTANTS[node.id]), node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        name = ast.unparse(node)
        if name in NAMED_CONSTANTS:
            return ast.copy_location(ast.Constant(NAMED_CONSTANTS[name]), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = ast.unparse(node.func)
        # torch's repr adds device=/dtype=/requires_grad=; they say nothing about the value
        if (
            NUMBER_WRAPPERS.match(name)
            and len(node.args) == 1
            and (name == "tensor" or not node.keywords)
        ):
            arg = self.visit(node.args[0])
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                # float('nan'), float('inf')
                return ast.copy_location(
                    ast.Constant(NAMED_CONSTANTS.get(arg.value.lower(), arg.value)), node
                )
            return arg
        return node


def parse_metric_dict(body: str) -> dict[str, float]:
    """`{'a': 1.0, 'b': nan, 'c': np.float64(2.0)}` -> {'a': 1.0, 'b': nan, 'c': 2.0}.
    Non-numeric values (lists, strings) are dropped. Raises ValueError when body is not a dict."""
    try:
        tree = ast.parse(GRAD_FN.sub("", body).strip(), mode="eval")
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
