"""The recipe format: pydantic models that are the single source of truth for validation
and for the exported JSON Schema."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from recipeval.names import SAFE_NAME_PATTERN

# The stages, in pipeline order: the one list every other module (and the Snakefile) reads.
Stage = Literal["env_check", "smoke", "logprob_diff", "bench"]
STAGES: tuple[str, ...] = get_args(Stage)
# The stages whose pass each stage requires (the workflow's --require; publish's staleness).
STAGE_GATES: dict[str, tuple[str, ...]] = {
    "env_check": (),
    "smoke": ("env_check",),
    "logprob_diff": ("smoke",),
    "bench": ("smoke",),
}

# Statistics stages.logprob_diff.thresholds may put a limit on (analysis.logprob computes them;
# tests/test_recipe_cli.py keeps the two lists equal), and the key that sets the |d| cutoff.
LOGPROB_STATISTICS = (
    "first_rollout_abs_mean_diff",
    "frac_above_cutoff",
    "k3_kl",
    "max_abs_diff",
    "mean_abs_diff",
    "mean_diff",
    "p50_abs_diff",
    "p99_abs_diff",
    "position_spearman",
    "prob_abs_diff_mean",
    "token_mean_abs_diff",
    "token_mult_prob_error",
    "worst_rollout_abs_mean_diff",
    "rollout_growth",
)
ABS_DIFF_CUTOFF = "abs_diff_cutoff"
# analysis.steady_state needs three steady steps for an interval with a spread.
MIN_STEADY_STEPS = 3

Scalar = str | int | float | bool
# A flag value: scalar, list of scalars (repeated words), or null/false to drop the flag.
ArgValueShape = Scalar | list[str | int | float] | None

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
            'environment values are strings; quote YAML booleans (write "true", not true) '
            "so the value the program reads is unambiguous"
        )
    if isinstance(value, int | float):
        return str(value)
    return value


# Counts are bounded so that a typo or a hostile file (nodes: 1e20, a 4000-digit layer count)
# is refused here instead of overflowing a check later; the bound is far above any real run.
MAX_COUNT = 2**31 - 1
PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
NonNegativeInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
MAX_TIMEOUT_S = 30 * 86400
# POSIX environment names: anything else (A=B, BAD$(x), A B) cannot be exported as given.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


# Integer flag values are bounded by what the trainer stack can hold (miles, Megatron and torch
# keep counts, sizes and seeds in at most 64 bits); a longer number is a typo or a hostile file.
MIN_ARG_INT = -(2**63)
MAX_ARG_INT = 2**63 - 1
# Shell metacharacters that end a command, start another or redirect one: miles pastes its
# launch script's arguments into a shell command unquoted, so these would change what it runs.
SHELL_METACHARACTERS = ";&|`$<>\n\x00"


def _refuse_nul(text: str, what: str) -> None:
    """A NUL byte cannot pass through a process's argv or environment (C strings end at it)."""
    if "\x00" in text:
        raise ValueError(f"{what} cannot contain a NUL byte")


def _no_nul(value: str) -> str:
    _refuse_nul(value, "environment values")
    return value


def _looks_like_a_flag(word: str) -> bool:
    """Whether argparse would read `word` as an option rather than a value: a leading '-' not
    on a number ("-1e-5" is a value, "--num-rollout" and "-x" are not; "-" alone is a value)."""
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def _arg_value(value: Any) -> Any:
    """Each word of a flag value: no NUL, nothing the trainer would read as a flag of its own,
    and an integer within 64 bits."""
    words = value if isinstance(value, list) else [value]
    for number, word in enumerate(words, 1):
        if isinstance(word, str):
            _refuse_nul(word, "flag values")
            if _looks_like_a_flag(word):
                which = f"word {number} of {len(words)}" if isinstance(value, list) else "it"
                raise ValueError(
                    f"{which} starts with '-': the trainer would read it as a flag of its own, "
                    "not as this flag's value; write that flag as a key of its own"
                )
        elif isinstance(word, int) and not MIN_ARG_INT <= word <= MAX_ARG_INT:
            raise ValueError("integer flag values must fit in 64 bits (-2^63 to 2^63-1)")
    return value


def source_word(word: str) -> str:
    """`word`, a miles launch script's argument, when no shell metacharacter is in it; else
    ValueError saying why."""
    found = sorted({c for c in word if c in SHELL_METACHARACTERS})
    if found:
        shown = " ".join(repr(c) for c in found)
        raise ValueError(
            f"holds {shown}: miles pastes the script's arguments into a shell command unquoted, "
            "so a shell metacharacter (; & | ` $ < > newline NUL) would change what it runs; "
            "write the argument without it"
        )
    return word


def _arg_name(name: str) -> str:
    if not name or name != name.strip() or any(c in name for c in "=\x00 \t\n"):
        raise ValueError("flag names are non-empty words without spaces, '=' or NUL")
    return name


Duration = Annotated[float, BeforeValidator(_duration_seconds), Field(gt=0, le=MAX_TIMEOUT_S)]
EnvName = Annotated[str, Field(pattern=ENV_NAME)]
EnvValue = Annotated[str, BeforeValidator(_env_value), AfterValidator(_no_nul)]
EnvMap = dict[EnvName, EnvValue]
ArgName = Annotated[str, AfterValidator(_arg_name)]
ArgValue = Annotated[ArgValueShape, AfterValidator(_arg_value)]
ArgMap = dict[ArgName, ArgValue]
SourceWord = Annotated[str, AfterValidator(source_word)]


class Strict(BaseModel):
    # allow_inf_nan: no count, fraction, size or duration is meaningfully inf or nan.
    model_config = ConfigDict(extra="forbid", strict=False, frozen=False, allow_inf_nan=False)


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

    @property
    def model_parallel_size(self) -> int:
        """GPUs one model replica spans (TP x PP x CP); the world divides into DP of these."""
        return self.tp * self.pp * self.cp

    @property
    def layout(self) -> str:
        return f"TP{self.tp}/PP{self.pp}/CP{self.cp}/EP{self.ep}/ETP{self.etp}"


class Overlay(Strict):
    """Changes to args and env; null (or false for a flag) removes an inherited entry."""

    args: ArgMap = Field(default_factory=dict)
    env: dict[EnvName, EnvValue | None] = Field(default_factory=dict)


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
    # At least one: a bench with none measured nothing and passed with zero checks.
    metrics: list[str] = Field(
        default_factory=lambda: ["perf/rollout_time", "perf/actor_train_time", "cycle_time"],
        min_length=1,
    )
    # From benchmarks/steady_state_coverage.py (section 4): correlation between steps can only
    # be checked from 10 steady steps on, and a drift or a recurring slow step needs 40 to show.
    # rel_ci 5 %: the window interval is 2-3 times as wide as the level's; at 3 % most runs
    # ran to max_steps.
    min_steps: Annotated[int, Field(ge=MIN_STEADY_STEPS)] = 10
    max_steps: PositiveInt = 40
    rel_ci: Annotated[float, Field(gt=0, lt=1)] = 0.05
    interval: Literal["window", "level"] = Field(
        "window",
        description="what the interval covers: 'window', the level at every step of the run "
        "with an allowance for a trend too small to call (2-3 times as wide); 'level', the "
        "mean level, taking the steps as free of any trend",
    )
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


class Sweep(Strict):
    """Where a generated variant came from (`recipeval layouts --emit`, `recipeval ablate
    --emit`): publish ranks layouts and attributes ablations by it."""

    kind: Literal["layouts", "ablation"]
    base: str = Field(description="the recipe the variant was made from")
    rank: PositiveInt | None = Field(None, description="the layout's rank by predicted cost")
    predicted_s: Annotated[float, Field(ge=0)] | None = Field(
        None, description="predicted training seconds per rollout (layouts)"
    )
    keys: list[str] = Field(default_factory=list, description="the keys this variant changes")
    after: str | None = Field(
        None,
        description="ablation: the name of the recipe after the change (with `base`, the one "
        "ablation this variant belongs to)",
    )


class Source(Strict):
    """The upstream launch a recipe describes: `script args` at `commit` of `repo`. Provenance
    only: render ignores it; `recipeval drift` re-records it."""

    repo: str = "radixark/miles"
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{7,40}$")]
    script: str = Field(description="launch script, relative to the checkout")
    args: list[SourceWord] = Field(default_factory=list, description="the script's arguments")
    probed: dict[str, str] = Field(
        default_factory=dict,
        description="env var or flag -> the node probe miles decides it with (not frozen here)",
    )


class Recipe(Strict):
    name: Annotated[str, Field(pattern=f"^{SAFE_NAME_PATTERN}$")]
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
    allow_exec_env: list[EnvName] = Field(
        default_factory=list,
        description="env names that make a shell or loader run code (BASH_ENV, LD_PRELOAD, ...) "
        "this recipe sets on purpose; refused otherwise",
    )
    stages: Stages = Field(default_factory=Stages)
    expect: dict[Stage, dict[str, float]] = Field(
        default_factory=dict, description="stage -> metric -> expected value (e.g. seconds)"
    )
    sweep: Sweep | None = None
    source: Source | None = Field(None, description="the upstream launch this recipe describes")

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * max(self.cluster.gpus_per_node, 1)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        """Rules between keys that a stage would otherwise refuse only when it runs; each
        error names the key to fix, so `recipeval validate` reports it with file and line."""
        problems = cross_field_problems(self)
        if problems:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError("cross_field", message), loc=loc, input=value
                    )
                    for loc, message, value in problems
                ],
            )
        return self


def cross_field_problems(recipe: Recipe) -> list[tuple[tuple[str, ...], str, Any]]:
    """(key path, message, offending value) for each rule between keys the recipe breaks."""
    from recipeval.recipe.resolve import resolve

    problems: list[tuple[tuple[str, ...], str, Any]] = []
    bench = recipe.stages.bench
    if bench.max_steps < bench.min_steps:
        problems.append(
            (
                ("stages", "bench", "max_steps"),
                f"max_steps must be at least min_steps ({bench.min_steps})",
                bench.max_steps,
            )
        )
    rollouts = resolve(recipe, "smoke").arg("num-rollout")
    if isinstance(rollouts, bool) or not isinstance(rollouts, int) or rollouts < 1:
        problems.append(
            (
                ("stages", "smoke", "args", "num-rollout"),
                (
                    "the smoke stage needs a positive integer num-rollout (set it in the "
                    "smoke overlay)"
                ),
                rollouts,
            )
        )
    for name in recipe.stages.logprob_diff.thresholds:
        if name not in (*LOGPROB_STATISTICS, ABS_DIFF_CUTOFF):
            problems.append(
                (
                    ("stages", "logprob_diff", "thresholds", name),
                    (
                        f"{name!r} is no logprob statistic; use one of: "
                        f"{', '.join(sorted(LOGPROB_STATISTICS))} (or {ABS_DIFF_CUTOFF})"
                    ),
                    name,
                )
            )
    return problems
