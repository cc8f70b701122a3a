"""Parallel layout: the arithmetic Megatron does at start-up, then megatron-core's own
validation (its TransformerConfig, and initialize_model_parallel under a fake process group of
the recipe's world size), with each exception turned into a check on the recipe key to fix."""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
import warnings
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from recipeval.checks.fastimport import import_leaf
from recipeval.checks.subject import Subject
from recipeval.recipe.resolve import flag_present
from recipeval.result import Check

# Flags whose values megatron's argument parsing copies into TransformerConfig under another
# name or shape; flags not listed (and fork-only flags) stay out, so upstream megatron-core
# never judges a value only the trainer's fork understands. FP8 flags stay out too: megatron
# judges them against the Transformer Engine installed here, not the one on the cluster.
MEGATRON_FIELDS: dict[str, str] = {
    "q-lora-rank": "q_lora_rank",
    "kv-lora-rank": "kv_lora_rank",
    "qk-head-dim": "qk_head_dim",
    "qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
    "v-head-dim": "v_head_dim",
    "moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
    "moe-layer-freq": "moe_layer_freq",
    "recompute-granularity": "recompute_granularity",
    "recompute-method": "recompute_method",
    "recompute-num-layers": "recompute_num_layers",
    "account-for-embedding-in-pipeline-split": "account_for_embedding_in_pipeline_split",
    "account-for-loss-in-pipeline-split": "account_for_loss_in_pipeline_split",
    "pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
}

# Which recipe key a megatron-core message is about (first match wins).
MESSAGE_KEYS: list[tuple[str, str]] = [
    (r"sequence.parallel", "parallel.sequence_parallel"),
    (r"num_attention_heads", "parallel.tp"),
    (r"num_query_groups", "model.kv_heads"),
    (r"first.pipeline.stage|first stage", "parallel.pp_first_stage_layers"),
    (r"last.pipeline.stage|last stage", "parallel.pp_last_stage_layers"),
    (r"middle", "parallel.pp_first_stage_layers"),
    (r"pipeline_dtype", "args.bf16"),
    (r"expert", "parallel.ep"),
    (r"moe_ffn_hidden_size", "model.moe_ffn_hidden_size"),
    (r"recompute", "args.recompute-granularity"),
    (r"world_size", "parallel"),
]


@dataclass(frozen=True)
class Megatron:
    """The megatron-core pieces env_check uses."""

    version: str
    transformer_config: type
    mla_transformer_config: type
    parallel_state: ModuleType
    microbatches_calculator: type


def load_megatron() -> Megatron:
    """Import megatron-core's validators without its package __init__ and with its JIT fuser
    off (torch.compile'd fusions are never run here; compiling pulls in torch._inductor)."""
    from importlib.metadata import version

    packages = ("megatron", "megatron.core", "megatron.core.transformer")
    state = import_leaf("megatron.core.parallel_state", packages)
    jit = import_leaf("megatron.core.jit", packages)
    jit.disable_jit_fuser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = import_leaf("megatron.core.transformer.transformer_config", packages)
        micro = import_leaf("megatron.core.num_microbatches_calculator", packages)
    return Megatron(
        version("megatron-core"),
        config.TransformerConfig,
        config.MLATransformerConfig,
        state,
        micro.ConstantNumMicroBatchesCalculator,
    )


def data_parallel_size(subject: Subject) -> int | None:
    p = subject.recipe.parallel
    model = p.model_parallel_size
    return subject.recipe.world_size // model if subject.recipe.world_size % model == 0 else None


def arithmetic_checks(subject: Subject) -> list[Check]:
    """What Megatron computes at start-up from the layout, before any config object exists."""
    r = subject.recipe
    p, m = r.parallel, r.model
    world = r.world_size
    checks: list[Check] = []
    gpus = f"{r.cluster.nodes} nodes x {r.cluster.gpus_per_node} GPUs = {world}"

    model_size = p.model_parallel_size
    checks.append(
        subject.check(
            "layout.world-size",
            world % model_size == 0,
            f"{gpus}; TP {p.tp} x PP {p.pp} x CP {p.cp} = {model_size} must divide it"
            + (f" (DP {world // model_size})" if world % model_size == 0 else ""),
            key="parallel",
            value=world,
            threshold=model_size,
        )
    )

    expert_size = p.etp * p.ep * p.pp
    checks.append(
        subject.check(
            "layout.expert-world-size",
            world % expert_size == 0,
            f"{gpus}; ETP {p.etp} x EP {p.ep} x PP {p.pp} = {expert_size} must divide it",
            key="parallel.ep",
            value=world,
            threshold=expert_size,
        )
    )
    if m.experts:
        checks.append(
            subject.check(
                "layout.experts-divisible",
                m.experts % p.ep == 0,
                f"{m.experts} experts over EP {p.ep}: each expert rank holds the same number",
                key="parallel.ep",
                value=m.experts,
                threshold=p.ep,
            )
        )
    elif p.ep > 1:
        checks.append(
            subject.check(
                "layout.experts-divisible",
                False,
                f"EP {p.ep} on a dense model (model.experts is 0): expert parallelism needs experts",
                key="parallel.ep",
                value=0,
                threshold=p.ep,
            )
        )

    checks.append(
        subject.check(
            "layout.heads-divisible",
            m.attention_heads % p.tp == 0,
            f"{m.attention_heads} attention heads over TP {p.tp}",
            key="parallel.tp",
            value=m.attention_heads,
            threshold=p.tp,
        )
    )
    groups = m.kv_heads or m.attention_heads
    checks.append(
        subject.check(
            "layout.query-groups-divisible",
            groups % p.tp == 0 or p.tp % groups == 0,
            f"{groups} query groups and TP {p.tp}: one must divide the other",
            key="model.kv_heads" if m.kv_heads else "parallel.tp",
            value=groups,
            threshold=p.tp,
        )
    )

    if p.sequence_parallel and p.tp == 1:
        checks.append(
            subject.check(
                "layout.sequence-parallel",
                False,
                "sequence parallelism splits along the tensor-parallel group and needs TP > 1",
                key="parallel.sequence_parallel",
                value=True,
                threshold="tp > 1",
            )
        )
    elif p.ep > 1 and p.tp > 1 and not p.sequence_parallel:
        checks.append(
            subject.check(
                "layout.sequence-parallel",
                False,
                f"EP {p.ep} with TP {p.tp} needs sequence parallelism (Megatron warns, MoE token "
                "dispatch assumes it)",
                key="parallel.sequence_parallel",
                severity="warning",
                value=False,
                threshold=True,
            )
        )
    else:
        checks.append(
            subject.check(
                "layout.sequence-parallel",
                True,
                f"sequence_parallel {p.sequence_parallel} with TP {p.tp}",
                key="parallel.sequence_parallel",
                value=p.sequence_parallel,
            )
        )

    checks.append(_pipeline_split(subject))
    return checks


def _pipeline_split(subject: Subject) -> Check:
    p, layers = subject.recipe.parallel, subject.recipe.model.layers
    first, last = p.pp_first_stage_layers, p.pp_last_stage_layers
    set_keys = [
        k
        for k, v in (
            ("parallel.pp_first_stage_layers", first),
            ("parallel.pp_last_stage_layers", last),
        )
        if v is not None
    ]
    key = set_keys[0] if set_keys else "parallel.pp"
    if not set_keys:
        ok = layers % p.pp == 0
        return subject.check(
            "layout.pipeline-split",
            ok,
            f"{layers} layers over PP {p.pp} even stages"
            + ("" if ok else ": not divisible; set pp_first/last_stage_layers for an uneven split"),
            key=key,
            value=layers,
            threshold=p.pp,
        )
    middle_layers = layers - (first or 0) - (last or 0)
    middle_stages = p.pp - len(set_keys)
    split = " + ".join(
        [str(first)] * (first is not None)
        + ([f"{middle_stages} x {middle_layers / middle_stages:g}"] if middle_stages > 0 else [])
        + [str(last)] * (last is not None)
    )
    if middle_stages < 0 or middle_layers < 0:
        ok, why = False, "more first/last stage layers or stages than the model has"
    elif bool(middle_layers) != bool(middle_stages):
        ok, why = False, f"{middle_layers} middle layers for {middle_stages} middle stages"
    elif middle_stages and middle_layers % middle_stages:
        ok, why = (
            False,
            f"{middle_layers} middle layers do not divide over {middle_stages} middle stages",
        )
    else:
        ok, why = True, "adds up"
    return subject.check(
        "layout.pipeline-split",
        ok,
        f"{layers} layers over PP {p.pp}: first + middle + last = {split}: {why}",
        key=key,
        value={"first": first, "middle": middle_layers, "last": last, "layers": layers},
        threshold={"pp": p.pp},
    )


def _dtype_flags(subject: Subject) -> dict[str, Any]:
    import torch

    if subject.flag_on("bf16"):
        return {"bf16": True, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16}
    if subject.flag_on("fp16"):
        return {"fp16": True, "params_dtype": torch.float16, "pipeline_dtype": torch.float16}
    return {"pipeline_dtype": torch.float32}


def _flag_value(value: Any) -> Any:
    """Flag text as megatron's argparse would hand it over (lists written as '[1,1]')."""
    if isinstance(value, str) and value.startswith("["):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def transformer_config_kwargs(subject: Subject, field_names: set[str]) -> dict[str, Any]:
    r = subject.recipe
    m, p = r.model, r.parallel
    kwargs: dict[str, Any] = {
        "num_layers": m.layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.attention_heads,
        "ffn_hidden_size": m.ffn_hidden_size,
        "num_query_groups": m.kv_heads,
        "tensor_model_parallel_size": p.tp,
        "pipeline_model_parallel_size": p.pp,
        "context_parallel_size": p.cp,
        "expert_model_parallel_size": p.ep,
        "expert_tensor_parallel_size": p.etp,
        "sequence_parallel": p.sequence_parallel,
        "num_layers_in_first_pipeline_stage": p.pp_first_stage_layers,
        "num_layers_in_last_pipeline_stage": p.pp_last_stage_layers,
        **_dtype_flags(subject),
    }
    if m.experts:
        kwargs |= {
            "num_moe_experts": m.experts,
            "moe_ffn_hidden_size": m.moe_ffn_hidden_size,
            "moe_router_topk": m.moe_router_topk or 2,
        }
    flags = {**m.args, **subject.args}
    for flag, field in MEGATRON_FIELDS.items():
        if flag_present(flags.get(flag)):
            kwargs[field] = _flag_value(flags[flag])
    return {k: v for k, v in kwargs.items() if k in field_names and v is not None}


def _message_key(message: str, subject: Subject) -> str:
    for pattern, key in MESSAGE_KEYS:
        if re.search(pattern, message, re.IGNORECASE):
            if (
                key == "parallel.pp_first_stage_layers"
                and subject.recipe.parallel.pp_first_stage_layers is None
            ):
                return (
                    "parallel.pp_last_stage_layers"
                    if subject.recipe.parallel.pp_last_stage_layers
                    else "parallel.pp"
                )
            return key
    return "parallel"


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text}"


def megatron_checks(subject: Subject, megatron: Megatron) -> list[Check]:
    """megatron-core's own verdict on the recipe's model shape and layout."""
    multi_latent = bool(subject.recipe.model.args.get("multi-latent-attention"))
    config_cls = megatron.mla_transformer_config if multi_latent else megatron.transformer_config
    names = {f.name for f in dataclasses.fields(config_cls)}
    kwargs = transformer_config_kwargs(subject, names)
    label = f"megatron-core {megatron.version} {config_cls.__name__}"
    checks = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config_cls(**kwargs)
    except Exception as err:  # noqa: BLE001 - every exception megatron raises is a verdict
        checks.append(
            subject.check(
                "megatron.transformer-config",
                False,
                f"{label} rejects the recipe: {_one_line(err)}",
                key=_message_key(str(err), subject),
            )
        )
    else:
        checks.append(
            subject.check(
                "megatron.transformer-config", True, f"{label} accepts the model shape and layout"
            )
        )
    checks.append(_parallel_state_check(subject, megatron))
    return checks


# initialize_model_parallel builds every rank group: time grows with the world size (about
# 0.5 ms a rank; 800 000 ranks took 100 s). Above this, only the arithmetic checks judge.
MAX_SIMULATED_WORLD = 4096


def _parallel_state_check(subject: Subject, megatron: Megatron) -> Check:
    p = subject.recipe.parallel
    world = subject.recipe.world_size
    label = f"megatron-core {megatron.version} initialize_model_parallel (world size {world})"
    if world > MAX_SIMULATED_WORLD:
        return subject.check(
            "megatron.parallel-state",
            False,
            f"{label} not simulated: above {MAX_SIMULATED_WORLD} ranks; the layout arithmetic "
            "checks still apply",
            key="cluster.nodes",
            severity="info",
        )
    try:
        error, groups = parallel_state_verdict(megatron, world, p.tp, p.pp, p.cp, p.ep, p.etp)
    except (RuntimeError, ValueError) as err:
        # torch.distributed already set up in this process (an embedding caller's own group)
        return subject.check(
            "megatron.available",
            False,
            f"cannot run initialize_model_parallel here: {_one_line(err)}",
        )
    if error is not None:
        return subject.check(
            "megatron.parallel-state",
            False,
            f"{label} fails: {error}",
            key=_message_key(error, subject),
        )
    return subject.check(
        "megatron.parallel-state",
        True,
        f"{label}: DP {groups['dp']}, expert DP {groups['expert_dp']}",
        value=groups,
    )


@cache
def parallel_state_verdict(
    megatron: Megatron, world: int, tp: int, pp: int, cp: int, ep: int, etp: int
) -> tuple[str | None, dict[str, int] | None]:
    """initialize_model_parallel on rank 0 of a fake process group of the recipe's world size:
    megatron's own world-size, expert-layout and rank-group arithmetic, no GPU, no network.
    Returns (error, None) or (None, group sizes); cached per layout."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    state = megatron.parallel_state
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process")
    # Each init wraps sys.excepthook to prefix "[rank0]:" and never unwraps it: after n probes
    # a traceback carried n prefixes on every line.
    excepthook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        state.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            create_gloo_process_groups=False,
        )
        return None, {
            "dp": state.get_data_parallel_world_size(),
            "expert_dp": state.get_expert_data_parallel_world_size(),
        }
    except Exception as err:  # noqa: BLE001 - every exception megatron raises is a verdict
        return _one_line(err), None
    finally:
        state.destroy_model_parallel()
        dist.destroy_process_group()
        sys.excepthook = excepthook


def microbatch_check(subject: Subject, megatron: Megatron, global_batch: int) -> Check | None:
    """megatron's microbatch calculator: global batch / (micro batch x DP) must be whole."""
    if subject.flag_on("use-dynamic-batch-size"):
        return None
    micro = subject.int_arg("micro-batch-size", 1)
    dp = data_parallel_size(subject)
    if dp is None or not micro:
        return None
    try:
        megatron.microbatches_calculator(global_batch, micro, dp, False, 0)
    except Exception as err:  # noqa: BLE001
        return subject.check(
            "megatron.microbatches",
            False,
            f"megatron-core {megatron.version}: {_one_line(err)}",
            key=subject.arg_key("micro-batch-size"),
            value=global_batch,
            threshold=micro * dp,
        )
    return subject.check(
        "megatron.microbatches",
        True,
        f"global batch {global_batch} = {global_batch // (micro * dp)} micro-batches "
        f"of {micro} x DP {dp}",
        value=global_batch,
        threshold=micro * dp,
    )
