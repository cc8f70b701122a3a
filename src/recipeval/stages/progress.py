"""Progress of a running stage on the terminal: one update per finished rollout.

Interactive (a terminal): a rich progress bar. Otherwise (snakemake's job output, a CI log,
Slurm): one plain line per rollout, e.g.

    bench tiny-grpo-cpu: rollout 6/20, 18.2 s a step, interval 12.5% (rel_ci 10 %), ETA 1m05s

The bench adds the widest watched interval against its rel_ci and an estimate of the steps
left (an interval narrows as 1/sqrt(steps)); other stages count rollouts against their total.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import pandas as pd

# A rollout is finished once its training metrics are logged (the last lines of a rollout).
_DONE_PREFIXES = ("train/", "perf/step_time", "perf/actor_train_time")


@dataclass(frozen=True)
class Precision:
    """How precise the bench's watched metrics are so far."""

    rel_width: float  # the widest watched interval, relative to its value (inf: not yet formed)
    rel_ci: float
    steady_steps: int
    min_steps: int
    max_steps: int


def finished_rollouts(steps: pd.DataFrame) -> int:
    """Rollout rows whose training metrics were logged."""
    columns = [c for c in steps.columns if c.startswith(_DONE_PREFIXES)]
    if steps.empty or not columns:
        return 0
    return int(steps[columns].notna().any(axis=1).sum())


def steps_left(precision: Precision, done: int) -> int:
    """Bench steps still to run: until min_steps steady steps, and until the widest interval
    narrows to rel_ci (width ~ 1/sqrt(steps)); never past max_steps."""
    cap = max(precision.max_steps - done, 0)
    wanted = max(precision.min_steps - precision.steady_steps, 0)
    width, used = precision.rel_width, precision.steady_steps
    if math.isfinite(width) and used > 0 and width > precision.rel_ci:
        wanted = max(wanted, math.ceil(used * (width / precision.rel_ci) ** 2) - used)
    elif not math.isfinite(width):
        wanted = max(wanted, 1)
    return min(wanted, cap)


def _duration(seconds: float) -> str:
    seconds = max(round(seconds), 0)
    minutes, secs = divmod(seconds, 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class StageProgress:
    """Call `update(steps, precision)` whenever the step table changed; a line (or the bar)
    moves only when a rollout finished."""

    def __init__(
        self, stage: str, recipe: str, total: int | None, stream: TextIO | None = None
    ) -> None:
        self.stage, self.recipe, self.total = stage, recipe, total
        self.stream = stream or sys.stderr
        self.done = 0
        self.started = time.monotonic()
        self.last = self.started
        self.step_times: list[float] = []
        self._bar = None
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._bar.add_task(f"{stage} {recipe}", total=total, detail="starting")
            self._bar.start()

    def update(self, steps: pd.DataFrame, precision: Precision | None = None) -> str | None:
        """Report a newly finished rollout; returns the line written (None: nothing new)."""
        done = finished_rollouts(steps)
        if done <= self.done:
            return None
        now = time.monotonic()
        self.step_times.append((now - self.last) / (done - self.done))
        self.done, self.last = done, now
        detail = self._detail(precision)
        if self._bar is not None:
            total = (
                self.total if precision is None else self.done + steps_left(precision, self.done)
            )
            self._bar.update(self._task, completed=self.done, total=total, detail=detail)
            return detail
        of = f"/{self.total}" if self.total else ""
        line = f"{self.stage} {self.recipe}: rollout {self.done}{of}, {detail}"
        print(line, file=self.stream, flush=True)
        return line

    def _detail(self, precision: Precision | None) -> str:
        recent = self.step_times[-5:]
        step = sum(recent) / len(recent)
        parts = [f"{step:.1f} s a step"]
        if precision is not None:
            width = (
                "not formed yet"
                if not math.isfinite(precision.rel_width)
                else f"{precision.rel_width:.1%}"
            )
            parts.append(f"interval {width} (rel_ci {precision.rel_ci * 100:g} %)")
            left = steps_left(precision, self.done)
        else:
            left = max((self.total or self.done) - self.done, 0)
        if left:
            parts.append(f"ETA {_duration(left * step)}")
        return ", ".join(parts)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


__all__ = ["Precision", "StageProgress", "finished_rollouts", "steps_left"]
