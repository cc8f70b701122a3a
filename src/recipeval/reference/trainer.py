"""The trainer: its own float32 copy of the weights (compute in the train dtype via autocast),
recomputes the rollout's logprobs with one full forward pass over prompt + response, and takes
one GRPO step (group-normalised advantages, clipped policy-gradient loss, optional k3 KL to the
initial policy, AdamW, gradient clipping). Logs miles' `rollout N`, `step N` and trainer-side
`perf N` lines with miles' metric definitions."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from recipeval.reference import grpo
from recipeval.reference.config import EngineConfig
from recipeval.reference.logfmt import TRAINER, configure_logging, metrics_message
from recipeval.reference.modeling import DTYPES, build_model, resolve_device
from recipeval.reference.rollout import RolloutBatch, limit_cpu_threads
from recipeval.reference.tokenizer import PAD_ID

logger = logging.getLogger(TRAINER)


@dataclass
class TrainResult:
    rollout_metrics: dict[str, float]
    step_metrics: dict[str, float]
    train_logprobs: torch.Tensor  # (N, R) recomputed before the update, float32 CPU


class Trainer:
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
        model = build_model(config.model, config.seed, config.train_attn_implementation)
        model.load_state_dict(state)
        self.model = model.to(self.device)
        if config.recompute_activations:
            self.model.gradient_checkpointing_enable()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.weight_decay,
        )
        self.reference: torch.nn.Module | None = None
        if config.kl_loss_coef > 0:
            reference = build_model(config.model, config.seed, config.train_attn_implementation)
            reference.load_state_dict(state)
            self.reference = reference.to(self.device).requires_grad_(False)
        self._last_train_end = time.perf_counter()
        self._pending: dict[str, float] = {}

    def weights(self) -> dict[str, torch.Tensor]:
        """Current weights for the rollout worker (detached; on the trainer's device)."""
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def cpu_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        dtype = DTYPES[self.config.train_dtype]
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _micro_batches(self, n: int) -> Iterator[slice]:
        size = self.config.micro_batch_size or n
        for start in range(0, n, size):
            yield slice(start, min(start + size, n))

    def _logprobs(
        self, model: torch.nn.Module, sequences: torch.Tensor, responses: torch.Tensor
    ) -> torch.Tensor:
        """logp of each response token from one full forward over prompt + response."""
        length = responses.shape[1]
        with self._autocast():
            logits = model(input_ids=sequences, logits_to_keep=length + 1).logits[:, :-1]
        return grpo.token_logprobs(logits, responses, self.config.rollout_temperature)

    def recompute(self, batch: RolloutBatch, model: torch.nn.Module | None = None) -> torch.Tensor:
        """Trainer-side logprobs of the batch (no update), float32 on CPU."""
        model = model or self.model
        sequences, responses = self._inputs(batch)
        out = []
        with torch.no_grad():
            for part in self._micro_batches(len(sequences)):
                out.append(self._logprobs(model, sequences[part], responses[part]).float().cpu())
        return torch.cat(out)

    def _inputs(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        responses = batch.response_ids.masked_fill(batch.response_mask == 0, PAD_ID)
        sequences = torch.cat([batch.prompt_ids, responses], dim=1)
        return sequences.to(self.device), responses.to(self.device)

    def train(self, batch: RolloutBatch) -> TrainResult:
        config = self.config
        train_start = time.perf_counter()
        wait_time = train_start - self._last_train_end
        self.model.train()
        mask = batch.response_mask.to(self.device)
        rollout_logp = batch.rollout_logprobs.to(self.device)
        n = len(mask)

        log_probs_start = time.perf_counter()
        old_logp = self.recompute(batch).to(self.device)
        log_probs_time = time.perf_counter() - log_probs_start
        ref_logp = self.recompute(batch, self.reference).to(self.device) if self.reference else None

        advantages = grpo.group_advantages(batch.rewards, config.n_samples_per_prompt).to(
            self.device
        )
        sequences, responses = self._inputs(batch)
        actor_start = time.perf_counter()
        sums = {
            "loss": 0.0,
            "pg_loss": 0.0,
            "pg_clipfrac": 0.0,
            "ppo_kl": 0.0,
            "kl_loss": 0.0,
            "entropy": 0.0,
        }
        self.optimizer.zero_grad(set_to_none=True)
        for part in self._micro_batches(n):
            m = mask[part]
            length = responses.shape[1]
            with self._autocast():
                logits = self.model(input_ids=sequences[part], logits_to_keep=length + 1).logits[
                    :, :-1
                ]
            scaled = logits.float() / config.rollout_temperature
            log_dist = torch.log_softmax(scaled, dim=-1)
            logp = log_dist.gather(-1, responses[part].unsqueeze(-1)).squeeze(-1)
            token_loss, clipped, ppo_kl = grpo.policy_loss(
                logp, old_logp[part], advantages[part], config.eps_clip, config.eps_clip_high
            )
            pg_loss = grpo.sample_mean(token_loss, m)
            loss = pg_loss
            if ref_logp is not None:
                kl_loss = grpo.sample_mean(grpo.k3_kl(logp, ref_logp[part]), m)
                loss = loss + config.kl_loss_coef * kl_loss
                sums["kl_loss"] += kl_loss.sum().item()
            (loss.sum() / n).backward()
            with torch.no_grad():
                entropy = -(log_dist.exp() * log_dist).sum(-1)
                sums["loss"] += loss.sum().item()
                sums["pg_loss"] += pg_loss.sum().item()
                sums["pg_clipfrac"] += grpo.sample_mean(clipped, m).sum().item()
                sums["ppo_kl"] += grpo.sample_mean(ppo_kl, m).sum().item()
                sums["entropy"] += grpo.sample_mean(entropy, m).sum().item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_grad)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        actor_train_time = time.perf_counter() - actor_start

        rollout_id = batch.rollout_id
        per_sample = lambda values: grpo.sample_mean(values, mask).mean().item()
        diff = old_logp - rollout_logp
        rollout_metrics = {
            "rollout/log_probs": per_sample(old_logp),
            "rollout/rollout_log_probs": per_sample(rollout_logp),
            "rollout/raw_reward": batch.rewards.mean().item(),
            "rollout/rewards": advantages.mean().item(),
            "rollout/response_lengths": mask.sum(-1).mean().item(),
        }
        if ref_logp is not None:
            rollout_metrics["rollout/ref_log_probs"] = per_sample(ref_logp)
        step_metrics = {
            "train/loss": sums["loss"] / n,
            "train/pg_loss": sums["pg_loss"] / n,
            "train/entropy_loss": sums["entropy"] / n,
            "train/pg_clipfrac": sums["pg_clipfrac"] / n,
            "train/ppo_kl": sums["ppo_kl"] / n,
            "train/train_rollout_logprob_abs_diff": per_sample(diff.abs()),
            "train/train_rollout_kl": per_sample(grpo.k3_kl(rollout_logp, old_logp)),
            "train/grad_norm": float(grad_norm),
            "train/lr-pg_0": config.lr,  # miles logs one rate per param group
        }
        if ref_logp is not None:
            step_metrics["train/kl_loss"] = sums["kl_loss"] / n
        logger.info(metrics_message("rollout", rollout_id, rollout_metrics))
        logger.info(metrics_message("step", rollout_id, step_metrics))

        self._last_train_end = time.perf_counter()
        train_time = self._last_train_end - train_start
        tokens = n * sequences.shape[1]
        self._pending = {
            "perf/train_wait_time": wait_time,
            "perf/train_time": train_time,
            "perf/log_probs_time": log_probs_time,
            "perf/actor_train_time": actor_train_time,
            "perf/actor_train_tok_per_s": tokens / actor_train_time,
            "perf/step_time": wait_time + train_time,
            "perf/wait_time_ratio": wait_time / (wait_time + train_time),
        }
        return TrainResult(rollout_metrics, step_metrics, old_logp.cpu())

    def log_perf(self, rollout_id: int, update_weights_time: float) -> dict[str, float]:
        """The trainer's `perf N` line, once this rollout's weight sync (if any) is done."""
        perf = {**self._pending, "perf/update_weights_time": update_weights_time}
        logger.info(metrics_message("perf", rollout_id, perf))
        return perf
