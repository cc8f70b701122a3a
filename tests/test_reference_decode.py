"""The rollout's own decode path (its KV cache and forward) against transformers' full forward
of the same model: every attention window and attention implementation gives the same logprobs
to float32 round-off, and an in-place weight update reaches the decoder's fused weights."""

from __future__ import annotations

import pytest
import torch

from recipeval.reference.config import ModelShape
from recipeval.reference.decode import StaticCacheDecoder, sampler_logprobs
from recipeval.reference.modeling import build_model
from recipeval.reference.task import PROMPT_TOKENS, problems

pytestmark = pytest.mark.reference_engine

NEW = 40
SHAPE = ModelShape(2, 64, 256, 4, 2, 512, PROMPT_TOKENS + NEW + 8)


def model_and_prompts(attention: str) -> tuple[torch.nn.Module, torch.Tensor]:
    model = build_model(SHAPE, 3, attention)
    prompts = torch.tensor([q.prompt_ids() for q in problems(0, "test", 0, 3)])
    return model, prompts


def full_forward_logprobs(
    model: torch.nn.Module, prompts: torch.Tensor, responses: torch.Tensor
) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.cat([prompts, responses], dim=1)).logits
    logp = sampler_logprobs(logits[:, PROMPT_TOKENS - 1 : -1], 1.0)
    return logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("bucket", [1, 16, 4096])
def test_sampled_logprobs_match_the_full_forward(attention, bucket):
    model, prompts = model_and_prompts(attention)
    decoder = StaticCacheDecoder(
        model,
        3,
        PROMPT_TOKENS,
        NEW,
        1.0,
        1.0,
        ignore_eos=True,
        attention=attention,
        window_bucket=bucket,
    )
    torch.manual_seed(0)
    generation = decoder.generate(prompts)
    assert generation.tokens.shape == (3, NEW)
    assert len(set(generation.tokens.flatten().tolist())) > 10  # a real sample, not one token
    reference = full_forward_logprobs(model, prompts, generation.tokens)
    assert (generation.logprobs - reference).abs().max().item() < 1e-4
    # Re-scoring the sampled tokens runs the same steps: bitwise the sampled logprobs.
    assert torch.equal(decoder.score(prompts, generation.tokens), generation.logprobs)


def test_weight_update_in_place_reaches_the_decoder():
    model, prompts = model_and_prompts("sdpa")
    decoder = StaticCacheDecoder(model, 3, PROMPT_TOKENS, NEW, 1.0, 1.0, ignore_eos=True)
    torch.manual_seed(0)
    tokens = decoder.generate(prompts).tokens
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if "proj" in name:
                tensor.mul_(1.5)
    decoder.refresh_weights()
    scored = decoder.score(prompts, tokens)
    assert (scored - full_forward_logprobs(model, prompts, tokens)).abs().max().item() < 1e-4


def test_compiled_layer_pieces_give_the_eager_logprobs():
    """--rollout-compile fuses the norms, RoPE and MLP around attention (torch.compile); the
    sampled logprobs stay those of the full forward, and re-scoring stays bitwise."""
    model, prompts = model_and_prompts("sdpa")
    decoder = StaticCacheDecoder(
        model, 3, PROMPT_TOKENS, 8, 1.0, 1.0, ignore_eos=True, compile_step=True, window_bucket=16
    )
    torch.manual_seed(0)
    generation = decoder.generate(prompts)
    reference = full_forward_logprobs(model, prompts, generation.tokens)
    assert (generation.logprobs - reference).abs().max().item() < 1e-4
    assert torch.equal(decoder.score(prompts, generation.tokens), generation.logprobs)
