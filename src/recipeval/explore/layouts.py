"""`recipeval layouts`: every parallel layout of a recipe's model on N GPUs that the real
validators accept and that fits memory, ranked by the cost model (explore.cost).

The space: TP, CP and PP whose product divides the GPU count (CP up to 8, PP up to the layer
count); ETP 1 or TP; EP dividing GPUs / (ETP x PP), 1 for a dense model; sequence parallelism
on whenever TP > 1 (it moves the same bytes as TP alone and holds fewer activations, so a
layout without it is never better); pipeline splits even, or with every stage within one layer
of the even share and equal middle stages (as 11+11+11+10 for 43 layers).

Each candidate goes through env_check's own checks, cheapest first, and is rejected at the
first that fails: the layout arithmetic Megatron does at start-up, the rollout engines tiling
the GPUs, the memory model, megatron-core's micro-batch calculator, then megatron-core's
TransformerConfig and initialize_model_parallel (under a fake process group).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from recipeval.checks import context, layout, memory
from recipeval.checks.arg_types import INTEGER_FLAGS, reads_as_int
from recipeval.checks.subject import Subject
from recipeval.explore.cost import (
    Calibration,
    Cost,
    Placement,
    Workload,
    calibrate,
    hardware_for,
    predict,
)
from recipeval.explore.emit import prepare_folder, write_variant
from recipeval.recipe import LoadedRecipe
from recipeval.recipe.load import DERIVED_FLAGS, validation_messages
from recipeval.recipe.schema import MAX_COUNT, Cluster, Parallel, Recipe, Sweep
from recipeval.recipe.yamlfile import key_text
from recipeval.result import Check

MAX_CP = 8
# A long exploration (thousands of GPUs: 100,000s of layouts, about 4,500 judged a second on
# one core) says how far it is this often.
PROGRESS_EVERY_S = 10.0
# The metric a layout's prediction is calibrated against: training time per rollout.
MEASURED_METRIC = "bench.metrics.perf/actor_train_time"


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending, in O(sqrt(n)) steps (a count of 2**33 GPUs took minutes
    by trial division up to n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    first: int | None = None  # decoder layers of the first / last pipeline stage (None: even)
    last: int | None = None

    @property
    def sp(self) -> bool:
        return self.tp > 1

    def parallel(self) -> Parallel:
        return Parallel(
            tp=self.tp,
            sequence_parallel=self.sp,
            pp=self.pp,
            pp_first_stage_layers=self.first,
            pp_last_stage_layers=self.last,
            cp=self.cp,
            ep=self.ep,
            etp=self.etp,
        )

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        if self.pp == 1:
            return (layers,)
        if self.first is None:
            return (layers // self.pp,) * self.pp
        assert self.last is not None
        middle = self.pp - 2
        share = (layers - self.first - self.last) // middle if middle else 0
        return (self.first, *([share] * middle), self.last)

    def describe(self, layers: int) -> str:
        split = "+".join(map(str, self.stage_layers(layers)))
        sp = " SP" if self.sp else ""
        return f"TP{self.tp}{sp} PP{self.pp} ({split}) CP{self.cp} EP{self.ep} ETP{self.etp}"

    def slug(self) -> str:
        split = f"-{self.first}-{self.last}" if self.first is not None else ""
        sp = "-sp" if self.sp else ""
        return f"tp{self.tp}{sp}-pp{self.pp}{split}-cp{self.cp}-ep{self.ep}-etp{self.etp}"


def pipeline_splits(layers: int, pp: int) -> list[tuple[int | None, int | None]]:
    if pp == 1:
        return [(None, None)]
    splits: list[tuple[int | None, int | None]] = [(None, None)] if layers % pp == 0 else []
    even = layers / pp
    near = range(max(math.ceil(even - 1), 1), math.floor(even + 1) + 1)
    stages = pp - 2
    for first in near:
        for last in near:
            middle = layers - first - last
            if stages == 0:
                fits = middle == 0
            else:
                fits = middle > 0 and middle % stages == 0 and middle // stages in near
            uniform = first == last == even and (not stages or middle // stages == even)
            if fits and not uniform:
                splits.append((first, last))
    return splits


def candidate_layouts(recipe: Recipe, gpus: int) -> Iterator[Layout]:
    model = recipe.model
    for tp in divisors(gpus):
        for cp in (d for d in divisors(gpus // tp) if d <= MAX_CP):
            for pp in (d for d in divisors(gpus // (tp * cp)) if d <= model.layers):
                for etp in sorted({1, tp}) if model.experts else [1]:
                    if gpus % (etp * pp):
                        continue
                    experts = divisors(gpus // (etp * pp)) if model.experts else [1]
                    for ep in experts:
                        for first, last in pipeline_splits(model.layers, pp):
                            yield Layout(tp, pp, cp, ep, etp, first, last)


@dataclass(frozen=True)
class Measured:
    """A measured run of this model: its layout and training seconds per rollout."""

    parallel: Parallel
    cluster: Cluster
    seconds: float


def measurements(records: Iterable[Any], recipe: Recipe) -> list[Measured]:
    """Runs in the history (publish's RunRecords) of the same model on the same GPU model with
    a measured training time."""
    found = []
    for rec in records:
        values = rec.recipe_values
        if values.get("model.name") != recipe.model.name or MEASURED_METRIC not in rec.metrics:
            continue
        if values.get("cluster.gpu") != recipe.cluster.gpu:
            continue
        keys = {
            f.removeprefix("parallel."): v for f, v in values.items() if f.startswith("parallel.")
        }
        found.append(
            Measured(
                Parallel(**keys),
                Cluster(
                    **{
                        k.removeprefix("cluster."): v
                        for k, v in values.items()
                        if k.startswith("cluster.")
                    }
                ),
                float(rec.metrics[MEASURED_METRIC]),
            )
        )
    return found


@dataclass
class Ranked:
    layout: Layout
    cost: Cost
    seconds: float  # the calibrated prediction
    memory_gb: float | None
    memory_limit_gb: float | None
    warnings: list[str] = field(default_factory=list)

    @property
    def headroom(self) -> float | None:
        if self.memory_gb is None or not self.memory_limit_gb:
            return None
        return 1 - self.memory_gb / self.memory_limit_gb


@dataclass
class Rejection:
    count: int = 0
    example: str = ""


@dataclass
class Exploration:
    recipe: str
    gpus: int
    nodes: int
    gpus_per_node: int
    layers: int
    kept: list[Ranked]
    rejected: dict[str, Rejection]
    candidates: int
    calibration: Calibration
    seconds: float
    memory: MemoryAdvice | None = None  # set when memory rejected every layout


@dataclass(frozen=True)
class MemoryAdvice:
    """Why nothing fits: the layout that needs least memory among those every other check
    accepts, what it needs against the budget, and the knob changes that would each fit it."""

    layout: Layout
    need_gb: float
    budget_gb: float
    remedies: list[memory.Remedy]


class LayoutError(ValueError):
    """A GPU or node count the explorer cannot use."""


def _variant(loaded: LoadedRecipe, base: Subject, layout_: Layout, cluster: Cluster) -> Subject:
    recipe = loaded.recipe.model_copy(update={"parallel": layout_.parallel(), "cluster": cluster})
    return Subject(
        dataclasses.replace(loaded, recipe=recipe),
        dataclasses.replace(base.resolved, recipe=recipe),
    )


def workload(subject: Subject) -> Workload:
    """What one rollout's training costs, from the recipe's model and batch flags."""
    m = subject.recipe.model
    vocab = m.vocab_size or 0
    experts = memory.expert_parameters(subject)
    if m.parameters:
        total = m.parameters
    else:
        ffn = m.ffn_hidden_size or 4 * m.hidden_size
        total = (
            m.layers * (4 * m.hidden_size**2 + 3 * m.hidden_size * ffn) + 2 * vocab * m.hidden_size
        )
        total += experts
    experts = min(experts, total)
    topk = m.moe_router_topk or 1
    active = total - experts + (experts * topk / m.experts if m.experts else 0)
    per_layer = max(active - 2 * vocab * m.hidden_size, active / 2) / m.layers
    samples = (subject.int_arg("rollout-batch-size") or 1) * (
        subject.int_arg("n-samples-per-prompt") or 1
    )
    steps = subject.int_arg("num-steps-per-rollout") or 1
    seq = (subject.int_arg("rollout-max-response-len") or 1024) + (
        subject.int_arg("rollout-max-prompt-len") or 0
    )
    dynamic = subject.flag_on("use-dynamic-batch-size")
    recompute = subject.arg("recompute-granularity") == "full" or subject.flag_on(
        "recompute-activations"
    )
    return Workload(
        layers=m.layers,
        moe_layers=memory.moe_layers(subject) if m.experts else 0,
        hidden=m.hidden_size,
        active_params=active,
        total_params=total,
        expert_params=experts,
        output_layer_units=vocab * m.hidden_size / per_layer,
        topk=topk,
        tokens=samples * seq,
        steps=steps,
        global_batch=context.global_batch(subject) or samples,
        micro_batch=subject.int_arg("micro-batch-size", 1) or 1,
        max_tokens_per_gpu=subject.int_arg("max-tokens-per-gpu") if dynamic else None,
        recompute=recompute,
    )


def _placement(layout_: Layout, layers: int, gpus: int, per_node: int) -> Placement:
    return Placement(
        layout_.tp,
        layout_.pp,
        layout_.cp,
        layout_.ep,
        layout_.etp,
        layout_.stage_layers(layers),
        gpus,
        per_node,
    )


def _first_failure(checks: list[Check]) -> Check | None:
    return next((c for c in checks if not c.ok and c.severity == "error"), None)


def explore(
    loaded: LoadedRecipe,
    gpus: int,
    nodes: int | None = None,
    measured: list[Measured] | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> Exploration:
    """Every valid layout on `gpus` GPUs over `nodes` nodes (default: the recipe's GPUs per
    node), ranked by predicted training seconds per rollout; raises LayoutError. `progress`
    hears (layouts judged, layouts in all, seconds so far) every PROGRESS_EVERY_S."""
    start = time.perf_counter()
    recipe = loaded.recipe
    if not 1 <= gpus <= MAX_COUNT:
        raise LayoutError(f"--gpus {gpus}: give a GPU count from 1 to {MAX_COUNT}")
    if nodes is not None and not 1 <= nodes <= MAX_COUNT:
        raise LayoutError(f"--nodes {nodes}: give a node count from 1 to {MAX_COUNT}")
    if nodes is None:
        per_node = recipe.cluster.gpus_per_node or gpus
        if gpus > per_node and gpus % per_node:
            # One node of all of them would be a machine the recipe's cluster does not have.
            raise LayoutError(
                f"--gpus {gpus} is not a whole number of the recipe's {per_node}-GPU nodes; "
                "give --nodes too"
            )
        nodes = max(gpus // per_node, 1)
    if gpus % nodes:
        raise LayoutError(f"--gpus {gpus} does not split over --nodes {nodes}")
    per_node = gpus // nodes
    cluster = Cluster(nodes=nodes, gpus_per_node=per_node, gpu=recipe.cluster.gpu)
    base = Subject.of(loaded, "bench")
    megatron = layout.load_megatron()
    hw = hardware_for(recipe.cluster.gpu)
    work = workload(base)
    layers = recipe.model.layers
    kept: list[Ranked] = []
    rejected: dict[str, Rejection] = {}
    over_memory: list[tuple[float, Layout]] = []  # (GB needed, layout) of memory rejections
    candidates = 0
    # Counting first costs a second per 400,000 layouts, a tenth of judging them.
    total = sum(1 for _ in candidate_layouts(recipe, gpus)) if progress else 0
    reported = time.perf_counter()
    for candidate in candidate_layouts(recipe, gpus):
        if progress and time.perf_counter() - reported >= PROGRESS_EVERY_S:
            reported = time.perf_counter()
            progress(candidates, total, reported - start)
        candidates += 1
        subject = _variant(loaded, base, candidate, cluster)
        checks = layout.arithmetic_checks(subject) + context.rollout_engine_checks(subject)
        mem = memory.memory_checks(subject)
        checks += mem
        failed = _first_failure(checks)
        if failed is None:
            global_batch = context.global_batch(subject)
            micro = (
                layout.microbatch_check(subject, megatron, global_batch) if global_batch else None
            )
            checks += [micro] if micro else []
            failed = _first_failure(checks)
        if failed is None:
            checks += layout.megatron_checks(subject, megatron)
            failed = _first_failure(checks)
        if failed is not None:
            slot = rejected.setdefault(failed.id, Rejection(example=failed.message))
            slot.count += 1
            if failed.id == "memory.per-gpu" and isinstance(failed.value, int | float):
                over_memory.append((float(failed.value), candidate))
            continue
        per_gpu = next((c for c in mem if c.id == "memory.per-gpu"), None)
        limit = memory.gpu_memory_gb(recipe.cluster.gpu)
        cost = predict(work, _placement(candidate, layers, gpus, per_node), hw)
        warnings = [c.message for c in checks if not c.ok and c.severity == "warning"]
        kept.append(
            Ranked(
                candidate,
                cost,
                cost.total,
                float(per_gpu.value) if per_gpu and per_gpu.value is not None else None,
                limit,
                warnings,
            )
        )
    calibration = _calibration(measured or [], work, layers, hw)
    for ranked in kept:
        ranked.seconds = calibration.apply(ranked.cost)
    kept.sort(key=lambda r: (round(r.seconds, 6), -(r.headroom or 0.0)))
    advice = None
    if not kept and over_memory:
        advice = _memory_advice(loaded, base, cluster, megatron, over_memory)
    return Exploration(
        recipe.name,
        gpus,
        nodes,
        per_node,
        layers,
        kept,
        rejected,
        candidates,
        calibration,
        time.perf_counter() - start,
        advice,
    )


def _memory_advice(
    loaded: LoadedRecipe,
    base: Subject,
    cluster: Cluster,
    megatron: Any,
    over_memory: list[tuple[float, Layout]],
) -> MemoryAdvice | None:
    """The least memory-hungry of the layouts memory rejected that pass every later check
    (megatron-core's included), with the knob changes that would make it fit."""
    for _, candidate in sorted(over_memory, key=lambda item: item[0]):
        subject = _variant(loaded, base, candidate, cluster)
        global_batch = context.global_batch(subject)
        micro = layout.microbatch_check(subject, megatron, global_batch) if global_batch else None
        later = ([micro] if micro else []) + layout.megatron_checks(subject, megatron)
        if _first_failure(later) is not None:
            continue
        need_gb, remedies = memory.remedies(subject)
        limit = memory.gpu_memory_gb(loaded.recipe.cluster.gpu) or 0.0
        return MemoryAdvice(candidate, need_gb, limit * memory.NEAR_FULL, remedies)
    return None


def with_args(loaded: LoadedRecipe, changes: dict[str, Any]) -> LoadedRecipe:
    """The recipe with flags set (a value of None or false drops a bare flag), validated as a
    recipe file would be; raises LayoutError naming the flag."""
    if not changes:
        return loaded
    derived = [flag for flag in changes if flag in DERIVED_FLAGS]
    if derived:
        key = DERIVED_FLAGS[derived[0]]
        raise LayoutError(
            f"--arg {derived[0]}: render derives this flag from {key}; the explorer varies the "
            "layout itself, other keys are set in the recipe"
        )
    data = loaded.recipe.model_dump()
    data["args"] = {**data["args"], **changes}
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as err:
        loc, message = validation_messages(err)[0]
        raise LayoutError(f"--arg {key_text(loc).removeprefix('args.')}: {message}") from None
    for flag, value in changes.items():
        if flag in INTEGER_FLAGS and value is not None and not reads_as_int(value):
            raise LayoutError(
                f"--arg {flag}={value}: not a whole number; the launcher reads it with int()"
            )
    return dataclasses.replace(loaded, recipe=recipe)


def _calibration(measured: list[Measured], work: Workload, layers: int, hw: Any) -> Calibration:
    predicted = []
    for run in measured:
        p = run.parallel
        run_layout = Layout(
            p.tp, p.pp, p.cp, p.ep, p.etp, p.pp_first_stage_layers, p.pp_last_stage_layers
        )
        gpus = run.cluster.nodes * run.cluster.gpus_per_node
        predicted.append(
            predict(work, _placement(run_layout, layers, gpus, run.cluster.gpus_per_node), hw)
        )
    return calibrate(predicted, [m.seconds for m in measured])


def current_layout(recipe: Recipe) -> Layout:
    p = recipe.parallel
    return Layout(p.tp, p.pp, p.cp, p.ep, p.etp, p.pp_first_stage_layers, p.pp_last_stage_layers)


COST_MODEL = (
    "predicted training seconds per rollout = compute (6 x active parameters x tokens "
    "at 35 % of the GPU's BF16 peak, stretched by pipeline imbalance and the 1F1B bubble) "
    "+ communication: tp (SP all-gather/reduce-scatter), cp (ring attention K/V), ep "
    "(MoE all-to-all), pp (stage activations), dp (gradients); intra-node vs network "
    "bandwidth by placement. Memory: weights, gradients, optimizer state (sharded by the "
    "distributed optimizer) and SGLang's static fraction, not activations"
)


def table_lines(found: Exploration, current: Layout | None, top: int | None) -> list[str]:
    """The report `recipeval layouts` prints: header, ranked table, rejections per reason."""
    kept = found.kept[:top] if top else found.kept
    rejected = sum(r.count for r in found.rejected.values())
    lines = [
        (
            f"{found.recipe}: {found.candidates} layouts on {found.gpus} GPUs ({found.nodes} nodes x "
            f"{found.gpus_per_node}), {len(found.kept)} valid and fitting, {rejected} rejected "
            f"({found.seconds:.1f} s)"
        ),
        f"cost model: {COST_MODEL}",
        f"calibration: {found.calibration.describe()}",
        "",
        f"{'rank':>4}  {'layout':42} {'predicted s':>11}  {'parts (s)':44} {'memory GB/GPU':>14}",
    ]
    for rank, item in enumerate(kept, 1):
        mark = " *" if current is not None and item.layout == current else ""
        parts = " ".join(f"{k} {v:.2f}" for k, v in item.cost.parts.items())
        memory_ = (
            f"{item.memory_gb:.0f}/{item.memory_limit_gb:.0f} ({item.headroom:.0%} free)"
            if item.headroom is not None
            else "-"
        )
        lines.append(
            f"{rank:>4}  {item.layout.describe(found.layers) + mark:42} "
            f"{item.seconds:11.2f}  {parts:44} {memory_:>14}"
        )
    if len(kept) < len(found.kept):
        lines.append(f"      ... {len(found.kept) - len(kept)} more (--top)")
    if current is not None:
        where = next((i for i, r in enumerate(found.kept, 1) if r.layout == current), None)
        lines.append(
            f"* the recipe's own layout{f' (rank {where})' if where else ': not among the valid ones'}"
        )
    if found.memory is not None:
        lines += memory_advice_lines(found.memory, found.layers)
    lines.append("")
    lines.append("rejected, by the first check that failed:")
    for reason, rej in sorted(found.rejected.items(), key=lambda kv: -kv[1].count):
        lines.append(f"  {rej.count:6}  {reason}: e.g. {rej.example.split(' [')[0][:160]}")
    return lines


def _arg_text(flag: str, value: Any) -> str:
    return f"--arg {flag}={str(value).lower() if isinstance(value, bool) else value}"


def memory_advice_lines(advice: MemoryAdvice, layers: int) -> list[str]:
    """Why no layout fits, and the knob values that would make one fit."""
    lines = [
        "",
        (
            f"no layout fits memory with this recipe's settings: the least memory-hungry that "
            f"every other check accepts, {advice.layout.describe(layers)}, needs "
            f"{advice.need_gb:.0f} GB per GPU against {advice.budget_gb:.0f} GB "
            f"({memory.NEAR_FULL:.0%} of the GPU)"
        ),
    ]
    if not advice.remedies:
        lines.append(
            "  no single memory knob of miles makes it fit (optimizer CPU offload, offloading "
            "training during rollout, SGLang's static fraction; recompute and micro-batches "
            "change only activations, not counted): give it more GPUs"
        )
        return lines
    lines.append("  any one of these makes it fit (run again with it; --emit writes it too):")
    for remedy in advice.remedies:
        flags = " ".join(_arg_text(f, v) for f, v in remedy.args.items())
        lines.append(f"    {flags}: {remedy.why}")
    return lines


def emit_layouts(
    found: Exploration,
    loaded: LoadedRecipe,
    folder: Path,
    top: int | None,
    args: dict[str, Any] | None = None,
) -> list[Path]:
    """One recipe per kept layout (the best `top`): extends the original, changes `parallel`
    (and `cluster` when the GPU count differs, and `args` the exploration set)."""
    recipe = loaded.recipe
    cluster = {
        "nodes": found.nodes,
        "gpus_per_node": found.gpus_per_node,
        "gpu": recipe.cluster.gpu,
    }
    same_cluster = (recipe.cluster.nodes, recipe.cluster.gpus_per_node) == (
        found.nodes,
        found.gpus_per_node,
    )
    prepare_folder(folder)
    written = []
    for rank, item in enumerate(found.kept[:top] if top else found.kept, 1):
        changes: dict[str, Any] = {} if same_cluster else {"cluster": cluster}
        changes["parallel"] = item.layout.parallel().model_dump(exclude_none=True)
        if args:
            changes["args"] = dict(args)
        sweep = Sweep(
            kind="layouts",
            base=recipe.name,
            rank=rank,
            predicted_s=round(item.seconds, 3),
            keys=sorted([k for k in changes if k != "args"] + [f"args.{f}" for f in args or {}]),
        )
        comment = (
            f"recipeval layouts: rank {rank} of {len(found.kept)} for {recipe.name} on "
            f"{found.gpus} GPUs: {item.layout.describe(found.layers)}; predicted "
            f"{item.seconds:.2f} s training per rollout ({found.calibration.describe()})"
        )
        written.append(
            write_variant(
                loaded.path, folder, f"{recipe.name}--{item.layout.slug()}", changes, sweep, comment
            )
        )
    return written


def knob_variants(recipe: Recipe, knobs: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    """For an engine whose layout is fixed: every combination of its speed knobs (flag ->
    values, the engine's default first) other than the recipe's own settings; each variant
    sets only the flags it changes."""
    own = {flag: recipe.args.get(flag, values[0]) for flag, values in knobs.items()}
    return [
        {flag: v for flag, v in zip(knobs, values, strict=True) if v != own[flag]}
        for values in itertools.product(*knobs.values())
        if values != tuple(own.values())
    ]


def _slug(value: Any) -> str:
    text = str(value).lower() if not isinstance(value, bool) else ("on" if value else "off")
    return "".join(c if c.isalnum() or c in "._" else "_" for c in text)


def emit_knobs(
    loaded: LoadedRecipe, knobs: dict[str, tuple[Any, ...]], folder: Path, top: int | None
) -> list[Path]:
    """One recipe per knob combination (the first `top`); their rank is measured, not predicted."""
    recipe = loaded.recipe
    prepare_folder(folder)
    written = []
    for args in knob_variants(recipe, knobs)[:top] if top else knob_variants(recipe, knobs):
        name = recipe.name + "--" + "-".join(f"{flag}-{_slug(v)}" for flag, v in args.items())
        sweep = Sweep(kind="layouts", base=recipe.name, keys=[f"args.{flag}" for flag in args])
        comment = (
            f"recipeval layouts: a speed-knob variant of {recipe.name} (the engine's layout "
            "is fixed); ranked by measured time"
        )
        written.append(write_variant(loaded.path, folder, name, {"args": args}, sweep, comment))
    return written


__all__ = [
    "Exploration",
    "Layout",
    "LayoutError",
    "Measured",
    "MemoryAdvice",
    "Ranked",
    "candidate_layouts",
    "current_layout",
    "emit_knobs",
    "emit_layouts",
    "explore",
    "knob_variants",
    "measurements",
    "memory_advice_lines",
    "pipeline_splits",
    "table_lines",
    "with_args",
    "workload",
]
