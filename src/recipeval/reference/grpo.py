"""GRPO's arithmetic as pure tensor functions, with miles' definitions (facts page):
group-normalised advantages, the clipped policy-gradient loss with an asymmetric clip, the k3 KL
estimator, and the per-sample masked mean that every logged token metric is reduced with."""

from __future__ import annotations

import torch

KL_CLAMP = 10.0  # miles clamps the low_var_kl estimate per token
LOG_RATIO_CLAMP = 20.0  # ...and the log ratio before exp (miles #1363)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(target) under softmax(logits / T), in float32 whatever the compute dtype: the same
    function on both sides, so any difference comes from the logits themselves."""
    scaled = logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps) for consecutive groups of `group_size` samples."""
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if group_size > 1:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def sample_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample mean over the loss mask, shape (samples,); an empty mask gives 0."""
    return (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


def k3_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor) -> torch.Tensor:
    """miles' compute_approx_kl(log_probs, log_probs_base, "low_var_kl"), the k3 estimator of
    KL(log_probs || base): exp(x) - 1 - x with x = log_probs_base - log_probs clamped to
    [-20, 20], the estimate clamped per token to [-10, 10]."""
    x = (log_probs_base - log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(x) - 1 - x).clamp(-KL_CLAMP, KL_CLAMP)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss max(-A r, -A clip(r, 1-eps, 1+eps_high)), whether the clip bound
    (clipfrac), and the ppo_kl term old_logp - logp."""
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    adv = advantages.unsqueeze(-1)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - eps_clip, 1 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).float()
    return loss, clipfrac, -log_ratio
