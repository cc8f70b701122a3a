"""Memory per GPU: the training state under the parallel layout next to the rollout engine's
static fraction, against the GPU's memory. A first-order model: it counts parameters,
gradients and optimizer state (not activations, which recompute and micro-batching bound), and
says so in every message."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any

from recipeval.checks.subject import Subject
from recipeval.result import Check

GB = 1e9
# Vendor-stated memory per GPU, in GB (1e9 bytes). Unknown models get an info check, not a guess.
GPU_MEMORY_GB: dict[str, float] = {
    "MI355X": 288,
    "MI350X": 288,
    "MI325X": 256,
    "MI300X": 192,
    "MI300A": 128,
    "MI250X": 128,
    "H100": 80,
    "H100-NVL": 94,
    "H200": 141,
    "H20": 96,
    "GH200": 96,
    "B200": 180,
    "B300": 288,
    "GB200": 186,
    "A100": 80,
    "L40S": 48,
}
# Within this fraction of the GPU's memory the plan has no room for activations and
# fragmentation: a warning, not yet an error.
NEAR_FULL = 0.95
# Adam keeps an fp32 master copy plus two fp32 moments; SGD a master copy and a momentum.
OPTIMIZER_BYTES = {"adam": 12, "sgd": 8}


def gpu_memory_gb(gpu: str | None) -> float | None:
    if not gpu:
        return None
    name = gpu.upper().replace(" ", "-")
    for model in sorted(GPU_MEMORY_GB, key=len, reverse=True):
        if model in name:
            return GPU_MEMORY_GB[model]
    return None


@dataclass(frozen=True)
class TrainState:
    """Per-GPU bytes of the training state and the assumptions behind them."""

    params_per_gpu: float
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float  # on the GPU, after CPU offload
    optimizer_full_bytes: float  # before offload: what offloading can move
    assumptions: list[str]

    @property
    def total(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


def moe_layers(subject: Subject) -> int:
    layers = subject.recipe.model.layers
    freq = subject.recipe.model.args.get("moe-layer-freq")
    if isinstance(freq, str) and freq.strip().startswith("["):
        try:
            return sum(1 for x in ast.literal_eval(freq) if x)
        except (ValueError, SyntaxError):
            return layers
    if isinstance(freq, int) and freq > 0:
        return layers // freq
    return layers


def expert_parameters(subject: Subject) -> float:
    """Routed-expert weights: per MoE layer, experts x (gate + up + down) projections."""
    m = subject.recipe.model
    if not m.experts or not m.moe_ffn_hidden_size:
        return 0.0
    gated = bool(m.args.get("swiglu"))
    return (
        moe_layers(subject)
        * m.experts
        * (3 if gated else 2)
        * m.hidden_size
        * m.moe_ffn_hidden_size
    )


def distributed_optimizer(subject: Subject) -> bool:
    """Megatron's distributed optimizer shards the optimizer state over the data-parallel
    ranks. miles turns it on itself for Adam (its set_default_megatron_args), so a trainer-stack
    recipe has it without the flag."""
    if subject.flag_on("use-distributed-optimizer"):
        return True
    return subject.engine.trainer_stack_checks and str(subject.arg("optimizer", "adam")) == "adam"


def train_state(subject: Subject) -> TrainState | None:
    r = subject.recipe
    m, p = r.model, r.parallel
    if not m.parameters:
        return None
    experts = min(expert_parameters(subject), m.parameters)
    dense = m.parameters - experts
    per_gpu = dense / (p.tp * p.pp) + experts / (p.ep * p.etp * p.pp)
    half = subject.flag_on("bf16") or subject.flag_on("fp16")
    param_b = 2 if half else 4
    grad_b = 4 if (subject.flag_on("accumulate-allreduce-grads-in-fp32") or not half) else 2
    optimizer = str(subject.arg("optimizer", "adam"))
    opt_b = OPTIMIZER_BYTES.get(optimizer, 12)
    notes = [
        (
            f"{m.parameters:.3g} parameters, {experts:.3g} in routed experts (sharded by EP x ETP x "
            f"PP = {p.ep * p.etp * p.pp}), the rest by TP x PP = {p.tp * p.pp}: {per_gpu:.3g} per GPU"
        ),
        f"weights {param_b} B, gradients {grad_b} B, {optimizer} state {opt_b} B per parameter",
    ]
    optimizer_params = per_gpu
    if distributed_optimizer(subject):
        # Dense state over the DP x CP ranks of its TP x PP shard, expert state over the expert
        # data-parallel ranks of its EP x ETP x PP shard: either way, all parameters / world.
        optimizer_params = m.parameters / r.world_size
        notes.append(
            f"distributed optimizer: state sharded over all {r.world_size} GPUs "
            f"({optimizer_params:.3g} parameters' state per GPU)"
        )
    full = optimizer_params * opt_b
    on_gpu = 1.0
    if subject.flag_on("optimizer-cpu-offload"):
        fraction = _fraction(subject.arg("optimizer-offload-fraction", 1.0))
        fraction = 1.0 if fraction is None else min(max(fraction, 0.0), 1.0)
        on_gpu = 1.0 - fraction
        notes.append(
            f"optimizer offload fraction {fraction:g}: {on_gpu:g} of the optimizer state on GPU"
        )
    notes.append("activations not counted")
    return TrainState(per_gpu, per_gpu * param_b, per_gpu * grad_b, full * on_gpu, full, notes)


def _fraction(value: object) -> float | None:
    """The static fraction as a number; None when unset or not a number (SGLang's parser
    reports that value as sglang.bad-value)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _train_resident_during_rollout(subject: Subject) -> bool:
    """miles colocates training and rollout on the same GPUs with --colocate; it offloads the
    training state during rollout unless --no-offload-train (its default under colocate)."""
    return subject.flag_on("colocate") and subject.flag_on("no-offload-train")


def memory_checks(subject: Subject) -> list[Check]:
    r = subject.recipe
    if r.platform == "cpu" or not r.cluster.gpus_per_node:
        return [
            subject.check(
                "memory.gpu-known", True, "CPU recipe: no GPU memory to budget", severity="info"
            )
        ]
    total_gb = gpu_memory_gb(r.cluster.gpu)
    if total_gb is None:
        return [
            subject.check(
                "memory.gpu-known",
                False,
                f"GPU {r.cluster.gpu!r} is not in the memory table ({', '.join(GPU_MEMORY_GB)}); "
                "memory not budgeted",
                key="cluster.gpu",
                severity="info",
                value=r.cluster.gpu,
            )
        ]
    checks = [
        subject.check(
            "memory.gpu-known",
            True,
            f"{r.cluster.gpu}: {total_gb:g} GB per GPU",
            severity="info",
            value=total_gb,
        )
    ]
    state = train_state(subject)
    fraction_flag = "sglang-mem-fraction-static"
    fraction = _fraction(subject.arg(fraction_flag))
    rollout_gb = fraction * total_gb if fraction is not None else None
    if state is None:
        checks.append(
            subject.check(
                "memory.train-state",
                False,
                "model.parameters not set: training memory not budgeted",
                key="model.parameters",
                severity="info",
            )
        )
        return checks
    train_gb = state.total / GB
    resident = _train_resident_during_rollout(subject) and rollout_gb is not None
    need_gb = train_gb + (rollout_gb if resident else 0.0)
    parts = (
        f"training state {train_gb:.1f} GB/GPU (weights {state.param_bytes / GB:.1f}, "
        f"gradients {state.grad_bytes / GB:.1f}, optimizer {state.optimizer_bytes / GB:.1f})"
    )
    if resident:
        parts += (
            f" stays on the GPU during rollout (colocate, no-offload-train) next to SGLang's "
            f"static {fraction:g} x {total_gb:g} = {rollout_gb:.1f} GB"
        )
    message = f"{parts}: {need_gb:.1f} of {total_gb:g} GB. Assumes: {'; '.join(state.assumptions)}"
    key = subject.arg_key(fraction_flag) if resident else "parallel"
    ok, severity = need_gb <= total_gb * NEAR_FULL, "error" if need_gb > total_gb else "warning"
    checks.append(
        subject.check(
            "memory.per-gpu",
            ok,
            message
            if ok
            else f"{'over budget' if severity == 'error' else 'near full'}: {message}",
            key=key,
            severity=severity if not ok else "error",
            value=round(need_gb, 1),
            threshold=round(total_gb * (1 if severity == "error" else NEAR_FULL), 1),
        )
    )
    checks.extend(_rollout_weights(subject, total_gb, rollout_gb, fraction_flag))
    return checks


def _fp8_checkpoint(subject: Subject) -> bool:
    return "fp8" in subject.recipe.model.name.lower()


def _rollout_weights_gb(subject: Subject) -> float | None:
    """Per GPU, the weights of one SGLang engine (1 B/param from an FP8 checkpoint, else 2)."""
    m = subject.recipe.model
    engine_gpus = subject.int_arg("rollout-num-gpus-per-engine")
    if not engine_gpus or engine_gpus < 1 or not m.parameters:
        return None
    return m.parameters * (1 if _fp8_checkpoint(subject) else 2) / engine_gpus / GB


def _rollout_weights(
    subject: Subject, total_gb: float, rollout_gb: float | None, fraction_flag: str
) -> list[Check]:
    """SGLang's static fraction holds the engine's weights plus the KV cache: the weights alone
    must fit, with room left for KV."""
    engine_gpus = subject.int_arg("rollout-num-gpus-per-engine")
    weights_gb = _rollout_weights_gb(subject)
    if rollout_gb is None or weights_gb is None:
        return []
    fp8 = _fp8_checkpoint(subject)
    ok = weights_gb < rollout_gb
    return [
        subject.check(
            "memory.rollout-weights",
            ok,
            f"SGLang engine over {engine_gpus} GPUs holds {weights_gb:.1f} GB of weights per GPU "
            f"({'1 B/param: FP8 checkpoint' if fp8 else '2 B/param'}) in its static "
            f"{rollout_gb:.1f} GB; {'leaves ' + format(rollout_gb - weights_gb, '.1f') + ' GB for the KV cache' if ok else 'no room for the KV cache'}",
            key=subject.arg_key(fraction_flag),
            value=round(weights_gb, 1),
            threshold=round(rollout_gb, 1),
        )
    ]


@dataclass(frozen=True)
class Remedy:
    """One change of the memory knobs miles offers (flag -> value) and what it frees."""

    args: dict[str, Any]
    why: str


def remedies(subject: Subject) -> tuple[float, list[Remedy]]:
    """For a layout over its memory budget (NEAR_FULL of the GPU): the GB it needs, and each
    single change of miles' memory knobs that would bring it within that budget (optimizer CPU
    offload, offloading the training state during rollout, SGLang's static fraction).
    Recompute and micro-batching change only activations, which this model does not count."""
    r = subject.recipe
    total_gb = gpu_memory_gb(r.cluster.gpu)
    state = train_state(subject)
    if total_gb is None or state is None:
        return 0.0, []
    budget = total_gb * NEAR_FULL
    fraction_flag = "sglang-mem-fraction-static"
    fraction = _fraction(subject.arg(fraction_flag))
    resident = _train_resident_during_rollout(subject) and fraction is not None
    rollout_gb = fraction * total_gb if resident and fraction is not None else 0.0
    fixed_gb = (state.param_bytes + state.grad_bytes) / GB
    optimizer_gb = state.optimizer_bytes / GB
    need_gb = fixed_gb + optimizer_gb + rollout_gb
    found: list[Remedy] = []
    room = budget - fixed_gb - rollout_gb
    full_gb = state.optimizer_full_bytes / GB
    if 0 < room < optimizer_gb and full_gb > 0:
        offload = min(math.ceil((1 - room / full_gb) * 100) / 100, 1.0)
        change: dict[str, Any] = {"optimizer-offload-fraction": offload}
        if not subject.flag_on("optimizer-cpu-offload"):
            change = {
                "optimizer-cpu-offload": True,
                "use-precision-aware-optimizer": True,
                **change,
            }
        found.append(
            Remedy(
                change,
                f"optimizer state on the GPU {optimizer_gb:.0f} -> {full_gb * (1 - offload):.0f} GB",
            )
        )
    if resident and fixed_gb + optimizer_gb <= budget:
        found.append(
            Remedy(
                {"no-offload-train": False},
                f"the training state ({fixed_gb + optimizer_gb:.0f} GB) leaves the GPU while "
                f"SGLang's {rollout_gb:.0f} GB generate (slower weight sync)",
            )
        )
    if resident and fraction is not None:
        largest = math.floor((budget - fixed_gb - optimizer_gb) / total_gb * 100) / 100
        weights = (_rollout_weights_gb(subject) or 0.0) / total_gb
        if weights < largest < fraction:
            found.append(
                Remedy(
                    {fraction_flag: largest},
                    f"SGLang's static memory {fraction:g} -> {largest:g} of the GPU (its weights "
                    f"take {weights:.2f}; {largest - weights:.2f} left for the KV cache)",
                )
            )
    return need_gb, found
