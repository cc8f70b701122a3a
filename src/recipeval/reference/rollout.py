"""The rollout worker: its own copy of the weights (in the rollout dtype and attention path),
samples a batch of task prompts with the static-cache decoder, scores them with the rule-based
reward, and logs miles' rollout-side `perf N` line."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from recipeval.reference.config import ConfigError, EngineConfig
from recipeval.reference.decode import Generation, StaticCacheDecoder
from recipeval.reference.dump import Responses
from recipeval.reference.logfmt import ROLLOUT, configure_logging, metrics_message
from recipeval.reference.modeling import DTYPES, build_model, cast_weights, resolve_device
from recipeval.reference.task import PROMPT_TOKENS, problems, reward

logger = logging.getLogger(ROLLOUT)


@dataclass
class RolloutBatch:
    """One rollout on CPU: samples ordered prompt-major (n_samples_per_prompt per prompt)."""

    rollout_id: int
    prompt_ids: torch.Tensor  # (N, P)
    response_ids: torch.Tensor  # (N, R)
    response_mask: torch.Tensor  # (N, R) float32
    rollout_logprobs: torch.Tensor  # (N, R) float32
    rewards: torch.Tensor  # (N,) float32
    rollout_time: float


def check_rollout_device(config: EngineConfig, device: torch.device) -> None:
    """Rollout flags that need a CUDA device, named when the device is not one."""
    if device.type == "cuda":
        return
    if config.rollout_cuda_graph:
        raise ConfigError(
            f"--rollout-cuda-graph needs a CUDA device, but the rollout runs on {device}; "
            "drop rollout-cuda-graph from the recipe's args or set device: cuda"
        )
    # Triton's interpreter runs the kernel on CPU tensors (slowly): how CI tests it.
    if config.rollout_attention_backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(
            f"--rollout-attention-backend triton needs a CUDA device, but the rollout runs on "
            f"{device}; set rollout-attention-backend: torch or device: cuda"
        )


class RolloutWorker:
    def __init__(
        self,
        config: EngineConfig,
        state: dict[str, torch.Tensor],
        device: torch.device | None = None,
    ) -> None:
        configure_logging()
        limit_cpu_threads(config)
        self.config = config
        self.device = device or resolve_device(config)
        model = build_model(config.model, config.seed, config.rollout_attn_implementation)
        model.load_state_dict(state)
        self.model = cast_weights(model, self.device, DTYPES[config.rollout_dtype]).eval()
        self.decoder = StaticCacheDecoder(
            self.model,
            batch_size=config.samples_per_rollout,
            prompt_len=PROMPT_TOKENS,
            max_new=config.rollout_max_response_len,
            temperature=config.rollout_temperature,
            top_p=config.rollout_top_p,
            ignore_eos=config.rollout_ignore_eos,
            attention=config.rollout_attn_implementation,
            cuda_graph=config.rollout_cuda_graph,
            compile_step=config.rollout_compile,
            # Graphs and compiled steps need a few fixed shapes; eager steps read exactly the
            # written slots.
            window_bucket=1024 if config.rollout_cuda_graph or config.rollout_compile else 1,
            attention_backend=config.rollout_attention_backend,
        )

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """In-place copy (and cast): captured graphs keep pointing at the same storage."""
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                tensor.copy_(state[name], non_blocking=True)
            self.decoder.refresh_weights()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def generate(self, rollout_id: int, given: Responses | None = None) -> RolloutBatch:
        """Sample this rollout's responses, or with `given` (another run's responses to the
        same prompts) score those under this rollout path instead of sampling."""
        config = self.config
        start = time.perf_counter()
        batch = problems(config.seed, "rollout", rollout_id, config.rollout_batch_size)
        expanded = [p for p in batch for _ in range(config.n_samples_per_prompt)]
        prompt_ids = torch.tensor([p.prompt_ids() for p in expanded])
        if given is None:
            torch.manual_seed(config.seed * 1_000_003 + rollout_id)
            generation = self.decoder.generate(prompt_ids)
        else:
            tokens, mask = torch.from_numpy(given.token_ids), torch.from_numpy(given.loss_mask)
            generation = Generation(
                tokens, self.decoder.score(prompt_ids, tokens).cpu() * mask, mask
            )
        # .to(cpu) then clone: plain tensors (not inference-mode ones) that autograd may use.
        response_ids = generation.tokens.cpu().clone()
        rewards = torch.tensor(
            [reward(p, ids.tolist()) for p, ids in zip(expanded, response_ids)], dtype=torch.float32
        )
        rollout_time = time.perf_counter() - start
        mask = generation.mask.cpu().clone()
        lengths = mask.sum(dim=-1)
        devices = 1
        if self.device.type == "cuda":
            # miles divides by the rollout's own GPUs: all of them when colocated.
            devices = config.rollout_num_gpus if config.noncolocated else max(config.num_gpus, 1)
        logger.info(
            metrics_message(
                "perf",
                rollout_id,
                {
                    "perf/rollout_time": rollout_time,
                    "perf/tokens_per_gpu_per_sec": lengths.sum().item() / rollout_time / devices,
                    "perf/longest_sample_tokens_per_sec": lengths.max().item() / rollout_time,
                    "rollout/response_len/mean": lengths.mean().item(),
                    "rollout/response_len/max": lengths.max().item(),
                },
            )
        )
        return RolloutBatch(
            rollout_id=rollout_id,
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=mask,
            rollout_logprobs=generation.logprobs.cpu().clone(),
            rewards=rewards,
            rollout_time=rollout_time,
        )


def limit_cpu_threads(config: EngineConfig) -> None:
    """Decode steps on tiny matrices run faster on one thread than on contended OpenMP teams."""
    if config.cpu_threads > 0:
        torch.set_num_threads(config.cpu_threads)
