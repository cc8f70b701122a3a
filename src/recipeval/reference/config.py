"""The reference engine's command line: miles' flag names where miles has one, our own otherwise.

Parsing is argparse (unknown flags are an error naming the flag); the result is a frozen
EngineConfig that every other module takes. Light imports only: no torch here.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION = ("eager", "sdpa")
ATTENTION_BACKENDS = ("torch", "triton")


class ConfigError(ValueError):
    """A setting the engine cannot run with; the message says which flag and what to do."""


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    max_position_embeddings: int


@dataclass(frozen=True)
class EngineConfig:
    model: ModelShape
    num_rollout: int
    rollout_batch_size: int
    n_samples_per_prompt: int
    rollout_max_response_len: int
    rollout_temperature: float
    rollout_top_p: float
    rollout_ignore_eos: bool
    eps_clip: float
    eps_clip_high: float
    kl_loss_coef: float
    lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    clip_grad: float
    micro_batch_size: int
    recompute_activations: bool
    seed: int
    device: str
    rollout_dtype: str
    train_dtype: str
    rollout_attn_implementation: str
    train_attn_implementation: str
    rollout_cuda_graph: bool
    rollout_compile: bool
    rollout_attention_backend: str
    skip_weight_sync: bool
    dump_logprobs: Path | None
    score_tokens: Path | None
    cache_dir: Path
    warm_start_steps: int
    warm_start_lr: float
    warm_start_batch_size: int
    ray: str
    num_gpus: int
    cpu_threads: int
    colocate: bool
    rollout_num_gpus: int | None
    weight_sync_timeout: float

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def noncolocated(self) -> bool:
        """miles' placement rule: `--colocate` shares the devices; without it the rollout gets
        `--rollout-num-gpus` devices of its own. With neither, the reference engine keeps its
        single-device default (colocated)."""
        return not self.colocate and self.rollout_num_gpus is not None

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def _bool_word(value: str) -> bool:
    """Recipe booleans render as bare flags; an explicit word is accepted too."""
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return number


def _default_cache_dir() -> Path:
    root = os.environ.get("RECIPEVAL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "recipeval"
    )
    return Path(root) / "reference"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2: the launcher's bad-input code
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m recipeval.reference",
        description="A small, real GRPO loop (rollout worker + trainer) logging in miles' format.",
        allow_abbrev=False,
    )
    flag = p.add_argument
    model = p.add_argument_group("model (Megatron names, from the recipe's model section)")
    model.add_argument("--num-layers", type=_positive_int, required=True)
    model.add_argument("--hidden-size", type=_positive_int, required=True)
    model.add_argument("--ffn-hidden-size", type=_positive_int)
    model.add_argument("--num-attention-heads", type=_positive_int, required=True)
    model.add_argument("--num-query-groups", type=_positive_int)
    model.add_argument("--group-query-attention", action="store_true")
    model.add_argument("--vocab-size", type=_positive_int, default=512)
    model.add_argument("--max-position-embeddings", type=_positive_int, required=True)
    cluster = p.add_argument_group("cluster (accepted for miles compatibility)")
    cluster.add_argument("--actor-num-nodes", type=int, default=1)
    cluster.add_argument("--actor-num-gpus-per-node", type=int, default=0)
    cluster.add_argument("--num-gpus-per-node", type=int, default=0)
    cluster.add_argument(
        "--colocate",
        nargs="?",
        const=True,
        default=False,
        type=_bool_word,
        help="rollout worker and trainer share one device, weights copied in process",
    )
    cluster.add_argument(
        "--rollout-num-gpus",
        type=_positive_int,
        help="without --colocate: the rollout worker's own devices (its own process; weights "
        "broadcast through torch.distributed, NCCL on GPUs, gloo on CPU); the reference engine "
        "rolls out on exactly 1",
    )
    cluster.add_argument(
        "--weight-sync-timeout",
        type=float,
        default=300.0,
        help="seconds a torch.distributed collective of the non-colocated mode may wait",
    )

    flag("--num-rollout", type=_positive_int, default=1)
    flag("--rollout-batch-size", type=_positive_int, default=8, help="prompts per rollout")
    flag("--n-samples-per-prompt", type=_positive_int, default=4)
    flag("--rollout-max-response-len", type=_positive_int, default=16)
    flag("--rollout-temperature", type=float, default=1.0)
    flag("--rollout-top-p", type=float, default=1.0)
    flag(
        "--rollout-ignore-eos",
        nargs="?",
        const=True,
        default=False,
        type=_bool_word,
        help="always sample rollout-max-response-len tokens (benchmarks)",
    )
    flag("--eps-clip", type=float, default=0.2)
    flag("--eps-clip-high", type=float)
    flag("--kl-loss-coef", type=float, default=0.0)
    flag("--lr", type=float, default=1e-6)
    flag("--weight-decay", type=float, default=0.0)
    flag("--adam-beta1", type=float, default=0.9)
    flag("--adam-beta2", type=float, default=0.98)
    flag("--clip-grad", type=float, default=1.0)
    flag("--micro-batch-size", type=int, default=0, help="samples per forward; 0 = all")
    flag(
        "--recompute-activations",
        nargs="?",
        const=True,
        default=False,
        type=_bool_word,
        help="gradient checkpointing in the trainer",
    )
    flag("--seed", type=int, default=1234)
    flag("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    flag("--rollout-dtype", choices=DTYPES, default="float32")
    flag("--train-dtype", choices=DTYPES, default="float32")
    flag("--attn-implementation", choices=ATTENTION, default="sdpa")
    flag("--rollout-attn-implementation", choices=ATTENTION)
    flag("--train-attn-implementation", choices=ATTENTION)
    flag(
        "--rollout-cuda-graph",
        nargs="?",
        const=True,
        default=False,
        type=_bool_word,
        help="replay each decode step as one CUDA graph (CUDA only)",
    )
    flag(
        "--rollout-compile",
        nargs="?",
        const=True,
        default=False,
        type=_bool_word,
        help="torch.compile the per-layer pieces around attention (norms, RoPE, MLP)",
    )
    flag(
        "--rollout-attention-backend",
        choices=ATTENTION_BACKENDS,
        default="torch",
        help="decode steps' attention: torch (the attn implementation over a window of the "
        "cache) or triton (split-KV kernel over exactly the written slots; CUDA only)",
    )
    flag(
        "--skip-weight-sync",
        nargs="?",
        const=True,
        default=False,
        type=_bool_word,
        help="planted fault: never push trained weights to the rollout worker",
    )
    flag("--dump-logprobs", type=Path, help="write per-token logprobs to this Parquet file")
    flag(
        "--score-tokens",
        type=Path,
        help="score the responses of this --dump-logprobs file instead of sampling (same seed "
        "and batch shape as the run that wrote it)",
    )
    flag("--cache-dir", type=Path, default=None, help="warm-start cache folder")
    flag("--warm-start-steps", type=int, default=300)
    flag("--warm-start-lr", type=float, default=3e-3)
    flag("--warm-start-batch-size", type=_positive_int, default=64)
    flag(
        "--cpu-threads",
        type=int,
        default=1,
        help="torch intra-op threads (0 = torch's default); small CPU decodes run best on 1",
    )
    flag(
        "--ray",
        choices=("auto", "on", "off"),
        default="auto",
        help="auto: Ray actors when running inside a Ray job",
    )
    return p


def parse_args(argv: list[str]) -> EngineConfig:
    """Parse the rendered command line; raises ConfigError for values that parse but cannot run."""
    ns = build_parser().parse_args(argv)
    heads = ns.num_attention_heads
    groups = ns.num_query_groups if ns.group_query_attention and ns.num_query_groups else heads
    shape = ModelShape(
        num_layers=ns.num_layers,
        hidden_size=ns.hidden_size,
        ffn_hidden_size=ns.ffn_hidden_size or 4 * ns.hidden_size,
        num_attention_heads=heads,
        num_query_groups=groups,
        vocab_size=ns.vocab_size,
        max_position_embeddings=ns.max_position_embeddings,
    )
    config = EngineConfig(
        model=shape,
        num_rollout=ns.num_rollout,
        rollout_batch_size=ns.rollout_batch_size,
        n_samples_per_prompt=ns.n_samples_per_prompt,
        rollout_max_response_len=ns.rollout_max_response_len,
        rollout_temperature=ns.rollout_temperature,
        rollout_top_p=ns.rollout_top_p,
        rollout_ignore_eos=ns.rollout_ignore_eos,
        eps_clip=ns.eps_clip,
        eps_clip_high=ns.eps_clip if ns.eps_clip_high is None else ns.eps_clip_high,
        kl_loss_coef=ns.kl_loss_coef,
        lr=ns.lr,
        weight_decay=ns.weight_decay,
        adam_beta1=ns.adam_beta1,
        adam_beta2=ns.adam_beta2,
        clip_grad=ns.clip_grad,
        micro_batch_size=ns.micro_batch_size,
        recompute_activations=ns.recompute_activations,
        seed=ns.seed,
        device=ns.device,
        rollout_dtype=ns.rollout_dtype,
        train_dtype=ns.train_dtype,
        rollout_attn_implementation=ns.rollout_attn_implementation or ns.attn_implementation,
        train_attn_implementation=ns.train_attn_implementation or ns.attn_implementation,
        rollout_cuda_graph=ns.rollout_cuda_graph,
        rollout_compile=ns.rollout_compile,
        rollout_attention_backend=ns.rollout_attention_backend,
        skip_weight_sync=ns.skip_weight_sync,
        dump_logprobs=ns.dump_logprobs,
        score_tokens=ns.score_tokens,
        cache_dir=ns.cache_dir or _default_cache_dir(),
        warm_start_steps=ns.warm_start_steps,
        warm_start_lr=ns.warm_start_lr,
        warm_start_batch_size=ns.warm_start_batch_size,
        ray=ns.ray,
        num_gpus=max(ns.actor_num_nodes * ns.actor_num_gpus_per_node, 0),
        cpu_threads=ns.cpu_threads,
        colocate=ns.colocate,
        rollout_num_gpus=ns.rollout_num_gpus,
        weight_sync_timeout=ns.weight_sync_timeout,
    )
    check(config)
    return config


def check(config: EngineConfig) -> None:
    """Settings that parse but cannot run: say which flag and what to do."""
    from recipeval.reference.task import PROMPT_TOKENS
    from recipeval.reference.tokenizer import TOKENIZER_SIZE

    m = config.model
    if m.vocab_size < TOKENIZER_SIZE:
        raise ConfigError(
            f"--vocab-size {m.vocab_size} is smaller than the byte tokenizer's "
            f"{TOKENIZER_SIZE} tokens; set model.vocab_size to at least {TOKENIZER_SIZE}"
        )
    if m.hidden_size % m.num_attention_heads:
        raise ConfigError(
            f"--hidden-size {m.hidden_size} is not a multiple of --num-attention-heads "
            f"{m.num_attention_heads}; pick sizes that divide"
        )
    if m.num_attention_heads % m.num_query_groups:
        raise ConfigError(
            f"--num-attention-heads {m.num_attention_heads} is not a multiple of "
            f"--num-query-groups {m.num_query_groups}"
        )
    needed = PROMPT_TOKENS + config.rollout_max_response_len
    if needed > m.max_position_embeddings:
        raise ConfigError(
            f"--rollout-max-response-len {config.rollout_max_response_len} plus the "
            f"{PROMPT_TOKENS}-token prompt needs {needed} positions but the model has "
            f"--max-position-embeddings {m.max_position_embeddings}; lower the response length "
            f"or raise model.max_position_embeddings to at least {needed}"
        )
    if not 0 < config.rollout_top_p <= 1:
        raise ConfigError(f"--rollout-top-p must be in (0, 1], got {config.rollout_top_p}")
    if config.rollout_temperature <= 0:
        raise ConfigError(f"--rollout-temperature must be > 0, got {config.rollout_temperature}")
    if config.micro_batch_size < 0:
        raise ConfigError(f"--micro-batch-size must be >= 0, got {config.micro_batch_size}")
    if config.warm_start_steps < 0:
        raise ConfigError(f"--warm-start-steps must be >= 0, got {config.warm_start_steps}")
    if config.noncolocated:
        check_noncolocated(config)


def check_noncolocated(config: EngineConfig) -> None:
    if config.rollout_num_gpus != 1:
        raise ConfigError(
            f"--rollout-num-gpus {config.rollout_num_gpus}: the reference engine rolls out on "
            "one device; set rollout-num-gpus to 1 (or colocate: true)"
        )
    if config.ray == "on":
        raise ConfigError(
            "--ray on with --rollout-num-gpus (non-colocated): the rollout worker then runs as "
            "a process of its own, not a Ray actor; drop --ray on or set colocate: true"
        )
    if not 0 < config.weight_sync_timeout < float("inf"):
        raise ConfigError(
            f"--weight-sync-timeout must be a positive number of seconds, got "
            f"{config.weight_sync_timeout}"
        )
