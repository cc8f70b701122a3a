"""The policy model: a Qwen2-style causal LM from transformers, built from qwen2_base.json (in
this folder) plus the recipe's sizes, with a seeded init. No downloads."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from recipeval.reference.config import EngineConfig, ModelShape

BASE_CONFIG = Path(__file__).with_name("qwen2_base.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_config(shape: ModelShape, attn_implementation: str = "sdpa") -> Qwen2Config:
    base = json.loads(BASE_CONFIG.read_text())
    base.pop("model_type")
    config = Qwen2Config(
        **base,
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.ffn_hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_query_groups,
        max_position_embeddings=shape.max_position_embeddings,
    )
    config._attn_implementation = attn_implementation
    return config


def build_model(shape: ModelShape, seed: int, attn_implementation: str) -> Qwen2ForCausalLM:
    """Same seed and shape -> same initial weights, on CPU in float32."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(model_config(shape, attn_implementation))
    return model.eval()


def resolve_device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        from recipeval.reference.config import ConfigError

        raise ConfigError(f"--device {config.device} asked for CUDA but torch sees no GPU")
    return device


def placement(config: EngineConfig) -> tuple[torch.device, torch.device]:
    """(trainer device, rollout device). Colocated: one device for both. Non-colocated: on CPU
    two processes share it; on CUDA the trainer takes the named (or first) GPU and the rollout
    worker the next one, as miles gives the actors the first GPUs and the rollout the rest."""
    device = resolve_device(config)
    if not config.noncolocated or device.type == "cpu":
        return device, device
    first = device.index or 0
    visible = torch.cuda.device_count()
    if first + 2 > visible:
        from recipeval.reference.config import ConfigError

        raise ConfigError(
            f"--rollout-num-gpus {config.rollout_num_gpus} without --colocate needs a GPU for "
            f"the trainer and one for the rollout worker (cuda:{first} and cuda:{first + 1}) "
            f"but torch sees {visible}; run on 2 GPUs or set colocate: true"
        )
    return torch.device("cuda", first), torch.device("cuda", first + 1)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def cast_weights(
    model: torch.nn.Module, device: torch.device, dtype: torch.dtype
) -> torch.nn.Module:
    """Move to `device` and cast the weights to `dtype`, keeping buffers (RoPE's inverse
    frequencies) in float32: in bfloat16 they are off by ~0.4 %, a phase error of tens of
    radians by position 8k, which inference engines avoid by computing RoPE in float32."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to(device=device, dtype=dtype)
    for name, value in buffers.items():
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        owner._buffers[attr] = value.to(device)
    return model
