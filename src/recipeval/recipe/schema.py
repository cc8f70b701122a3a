"""The recipe format: pydantic models that are the single source of truth for validation
and for the exported JSON Schema."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
)

STAGES = ("env_check", "smoke", "logprob_diff", "bench")
Stage = Literal["env_check", "smoke", "logprob_diff", "bench"]

Scalar = str | int | float | bool
# A flag value: scalar, list of scalars (repeated words), or null/false to drop the flag.
ArgValue = Scalar | list[str | int | float] | None

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def _duration_seconds(value: Any) -> Any:
    """'90m', '2h', '45s' or a number of seconds -> seconds (float)."""
    if isinstance(value, bool):
        # ValueError, not TypeError: pydantic turns only the former into a validation error.
        raise ValueError("expected a duration such as 90m, 2h or 600")  # noqa: TRY004
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and (m := _DURATION.match(value)):
        return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    raise ValueError("expected a duration such as 90m, 2h, 45s or a number of seconds")


def _env_value(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(  # noqa: TRY004 - see _duration_seconds
            "environment values are strings; quote YAML booleans (write \"true\", not true) "
            "so the value the program reads is unambiguous"
        )
    if isinstance(value, int | float):
        return str(value)
    return value


Duration = Annotated[float, BeforeValidator(_duration_seconds), Field(gt=0)]
EnvValue = Annotated[str, BeforeValidator(_env_value)]
EnvMap = dict[str, EnvValue]
ArgMap = dict[str, ArgValue]
Fraction = Annotated[float, Field(gt=0, le=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=False)


class Cluster(Strict):
    nodes: PositiveInt = 1
    gpus_per_node: NonNegativeInt = Field(8, description="0 for a CPU-only recipe")
    gpu: str | None = Field(None, description="GPU model, e.g. MI355X, H200; null for CPU")


class Model(Strict):
    name: str
    megatron_model_type: str | None = Field(
        None, description="miles' scripts/models/<type> this model corresponds to"
    )
    layers: PositiveInt
    hidden_size: PositiveInt
    ffn_hidden_size: PositiveInt | None = None
    attention_heads: PositiveInt
    kv_heads: PositiveInt | None = Field(None, description="query groups (GQA); null = heads")
    experts: NonNegativeInt = Field(0, description="routed experts; 0 for a dense model")
    moe_ffn_hidden_size: PositiveInt | None = None
    moe_router_topk: PositiveInt | None = None
    vocab_size: PositiveInt | None = None
    max_position_embeddings: PositiveInt
    parameters: Annotated[float, Field(gt=0)] | None = Field(
        None, description="total parameter count (e.g. 2.84e11), for the memory model"
    )
    args: ArgMap = Field(
        default_factory=dict,
        description="further Megatron model-shape flags, without '--' (as miles' scripts/models)",
    )


class Parallel(Strict):
    tp: PositiveInt = 1
    sequence_parallel: bool = False
    pp: PositiveInt = 1
    pp_first_stage_layers: PositiveInt | None = None
    pp_last_stage_layers: PositiveInt | None = None
    cp: PositiveInt = 1
    ep: PositiveInt = 1
    etp: PositiveInt = 1


class Overlay(Strict):
    """Changes to args and env; null (or false for a flag) removes an inherited entry."""

    args: ArgMap = Field(default_factory=dict)
    env: dict[str, EnvValue | None] = Field(default_factory=dict)


class StageOptions(Overlay):
    timeout: Duration | None = Field(None, description="wall-clock limit, e.g. 90m")


class EnvCheckStage(StageOptions):
    pass


class SmokeStage(StageOptions):
    pass


class LogprobDiffStage(StageOptions):
    variants: dict[str, Overlay] = Field(
        default_factory=dict,
        description="name -> overlay; 'baseline' (or the first) is the reference",
    )
    thresholds: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description="check id -> limit, overriding the defaults"
    )


class BenchStage(StageOptions):
    metrics: list[str] = Field(
        default_factory=lambda: ["perf/rollout_time", "perf/actor_train_time", "cycle_time"]
    )
    # From benchmarks/steady_state_coverage.py (section 4): correlation between steps can only
    # be checked from 10 steady steps on, and a drift or a recurring slow step needs 40 to show.
    min_steps: PositiveInt = 10
    max_steps: PositiveInt = 40
    rel_ci: Annotated[float, Field(gt=0, lt=1)] = 0.03
    on_max_steps: Literal["fail", "warn"] = "warn"
    tolerance: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.10, description="relative band around `expect` values"
    )


class Stages(Strict):
    env_check: EnvCheckStage = Field(default_factory=EnvCheckStage)
    smoke: SmokeStage = Field(default_factory=SmokeStage)
    logprob_diff: LogprobDiffStage = Field(default_factory=LogprobDiffStage)
    bench: BenchStage = Field(default_factory=BenchStage)


class Paths(Strict):
    """Where the trainer's checkouts live on the cluster nodes. Null: taken from the
    environment at render time (MILES_DIR, MEGATRON_PATH), as miles' launcher does."""

    miles: str | None = None
    megatron: str | None = None


class Recipe(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    extends: str | list[str] | None = Field(
        None, description="parent recipe file(s), relative to this file; deep-merged, later wins"
    )
    description: str | None = None
    engine: Literal["miles", "reference"]
    platform: Literal["rocm", "cuda", "cpu"]
    cluster: Cluster = Field(default_factory=Cluster)
    model: Model
    parallel: Parallel = Field(default_factory=Parallel)
    paths: Paths = Field(default_factory=Paths)
    args: ArgMap = Field(default_factory=dict, description="flags without '--'; true = bare flag")
    env: EnvMap = Field(default_factory=dict)
    stages: Stages = Field(default_factory=Stages)
    expect: dict[Stage, dict[str, float]] = Field(
        default_factory=dict, description="stage -> metric -> expected value (e.g. seconds)"
    )

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * max(self.cluster.gpus_per_node, 1)
