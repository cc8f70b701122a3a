"""miles' log line format, so one parser reads both engines:
`[<asctime>.<msecs> <logger name>] <file>:<line> - <message>`, with per rollout id the messages
`perf N: {...}`, `rollout N: {...}` and `step N: {...}` (values: a Python dict repr)."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping

LINE_FORMAT = "[%(asctime)s.%(msecs)03d %(name)s] %(filename)s:%(lineno)d - %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

# Logger names as miles' process identities spell them.
MAIN = "main"
ROLLOUT = "rollout_manager"
TRAINER = "actor_cell0_rank0"


def configure_logging() -> None:
    """One handler on stdout for every logger of this process (idempotent: Ray actors call it)."""
    root = logging.getLogger()
    if any(getattr(h, "_recipeval_reference", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(LINE_FORMAT, datefmt=DATE_FORMAT))
    handler._recipeval_reference = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def metrics_message(kind: str, rollout_id: int, metrics: Mapping[str, float]) -> str:
    """`perf 3: {'perf/rollout_time': 1.25, ...}` with plain Python numbers in the repr."""
    return f"{kind} {rollout_id}: {_plain(metrics)}"


def _plain(metrics: Mapping[str, float]) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for key, value in metrics.items():
        number = value.item() if hasattr(value, "item") else value
        out[key] = number if isinstance(number, int) or not math.isfinite(number) else float(number)
    return out
