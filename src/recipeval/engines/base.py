"""The engine interface: what the rest of recipeval may ask of an engine. Stages, checks and
the CLI hold an `Engine` (from `recipeval.engines.engine_for`) and ask it; none of them compares
an engine's name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from recipeval.engines.launch import Launch
from recipeval.recipe.resolve import Resolved

if TYPE_CHECKING:  # rendering never needs pandas; only a parser's table does
    import pandas as pd


class LogParser(Protocol):
    """An incremental log parser: feed lines as they arrive, read the step table any time."""

    lines: int
    malformed: list[Any]  # the records it could not read, in order

    def feed(self, line: str) -> int | None: ...

    def table(self) -> pd.DataFrame: ...

    @property
    def malformed_count(self) -> int: ...


# (resolved, environ (None: os.environ), the stage's results folder for files the launch reads
# (None: results/<recipe name>)) -> the launch.
Render = Callable[[Resolved, Mapping[str, str] | None, Path | None], Launch]
# Builds a parser for one launch's log; None: a log with no recipe at hand (parse-log).
ParserFactory = Callable[[Resolved | None], LogParser]
# Extra flags for a launch: the path a per-token dump goes to, or the dump to re-score.
DumpArgs = Callable[[Path], dict[str, Any]]


@dataclass(frozen=True)
class UpstreamDrift:
    """A recipe's render against the upstream launch it names, as that launch is built today.
    `differences`: one plain dict per flag or env var that differs; `error`: why the upstream
    launch could not be rebuilt (then there are no differences to report)."""

    upstream_commit: str | None
    differences: list[dict[str, Any]]
    lines: list[str]
    error: str | None = None

    @property
    def drifted(self) -> bool:
        return bool(self.differences)


# Compares a recipe with its upstream launch; None: nothing to compare with here (the recipe
# names no upstream launch, or no upstream checkout is configured).
DriftCheck = Callable[[Resolved, Mapping[str, str]], UpstreamDrift | None]


@dataclass(frozen=True)
class Engine:
    """One trainer recipeval can launch and judge. A capability an engine lacks is None."""

    name: str
    render: Render
    parser: ParserFactory
    # Flags that make a run dump every token's train and rollout logprob to a parquet file.
    dump_args: DumpArgs | None = None
    # Flags that make a one-rollout run score a dump's responses instead of sampling its own.
    rescore_args: DumpArgs | None = None
    # Its layout and flags are the trainer stack's (megatron-core, SGLang): env_check runs them
    # through that stack's own validation.
    trainer_stack_checks: bool = False
    # Python distributions a node needs to run it (the live probe looks for them).
    packages: tuple[str, ...] = ()
    # Upstream drift: env_check warns when the recipe no longer renders its upstream launch.
    drift: DriftCheck | None = None
    # An engine whose parallel layout is fixed names the flags that change its speed instead
    # (flag -> values, its default first): what `recipeval layouts` sweeps for it.
    speed_knobs: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def token_dumps(self) -> bool:
        return self.dump_args is not None

    @property
    def rescoring(self) -> bool:
        return self.rescore_args is not None
