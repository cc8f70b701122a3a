"""The starting policy: a brief supervised warm start on the task, cached by config hash.

Why a warm start and not a non-flat init. A freshly initialised LM puts nearly uniform mass on
every token; then logprobs are all about -log(vocab), any two compute paths agree trivially and
a logprob check passes whatever the bug. A non-flat init (larger weight scale) fixes the
flatness but gives an arbitrary, unnatural distribution: rewards stay at zero so GRPO has no
signal, and the spread of logprobs looks nothing like a real policy's. A few hundred steps of
teacher forcing on imperfect demonstrations of the task (task.py) give what production RL starts
from, an SFT'd model: peaked, task-shaped distributions (entropy well below uniform), partial accuracy
(rewards between 0 and 1 with spread inside each group, so advantages are non-zero), and room
for RL to improve. It costs seconds on the tiny CPU model and the result is cached in
`--cache-dir` under a hash of everything that determines it (model shape, base config, task,
seed, warm-start settings), so repeated stages start from identical weights without retraining.
The file is written atomically (temporary name, then rename): concurrent runs cannot read a
half-written cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from recipeval.reference.config import ConfigError, EngineConfig
from recipeval.reference.logfmt import MAIN
from recipeval.reference.modeling import BASE_CONFIG, build_model
from recipeval.reference.task import PROMPT_TOKENS, TASK_NAME, problems
from recipeval.reference.tokenizer import PAD_ID

logger = logging.getLogger(MAIN)
CACHE_FORMAT = 1


def warm_start_key(config: EngineConfig) -> str:
    identity = {
        "format": CACHE_FORMAT,
        "task": TASK_NAME,
        "shape": asdict(config.model),
        "base": json.loads(BASE_CONFIG.read_text()),
        "seed": config.seed,
        "steps": config.warm_start_steps,
        "lr": config.warm_start_lr,
        "batch": config.warm_start_batch_size,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def initial_state(config: EngineConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """float32 CPU state dict both workers load: seeded init, then the (cached) warm start."""
    model = build_model(config.model, config.seed, "sdpa")
    if config.warm_start_steps == 0:
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    path = config.cache_dir / f"warmstart-{warm_start_key(config)}.safetensors"
    try:  # before the warm start's steps, which the cache exists to save
        config.cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"--cache-dir {config.cache_dir}: cannot make the warm-start cache folder "
            f"({err.strerror or err}); it defaults to $RECIPEVAL_CACHE_DIR/reference, else "
            "$XDG_CACHE_HOME/recipeval/reference: point it at a folder this user can write"
        ) from None
    if path.exists():
        load_model(model, str(path))
        logger.info(f"warm start: loaded {path}")
    else:
        accuracy = _supervise(model, config, device)
        _save_atomically(model, path)
        logger.info(
            f"warm start: {config.warm_start_steps} steps, greedy answer accuracy "
            f"{accuracy:.3f}, cached at {path}"
        )
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def _batch(config: EngineConfig, index: int, clean: bool = False) -> torch.Tensor:
    batch = problems(config.seed, "warmstart", index, config.warm_start_batch_size)
    if clean:
        return torch.tensor([p.prompt_ids() + p.answer_ids() for p in batch])
    rng = random.Random(f"{config.seed}/demonstrations/{index}")
    return torch.tensor([p.demonstration_ids(rng) for p in batch])


def _supervise(model: torch.nn.Module, config: EngineConfig, device: torch.device) -> float:
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.warm_start_lr, weight_decay=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        for step in range(config.warm_start_steps):
            ids = _batch(config, step).to(device)
            logits = model(input_ids=ids).logits[:, PROMPT_TOKENS - 1 : -1].float()
            targets = ids[:, PROMPT_TOKENS:]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=PAD_ID
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    model.eval()
    with torch.no_grad():
        ids = _batch(config, -1, clean=True).to(device)
        logits = model(input_ids=ids).logits[:, PROMPT_TOKENS - 1 : -1]
        accuracy = (logits.argmax(-1) == ids[:, PROMPT_TOKENS:]).all(-1).float().mean().item()
    model.to("cpu")
    return accuracy


def _save_atomically(model: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        save_model(model, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
